"""Several coordinators in one process on a real PostgreSQL: leases, hand-off,
fencing, takeover, routing and the shared catalog (coordinator/cluster/host.py).

The real-process suite (kill -9, SIGSTOP, rolling restarts, a PostgreSQL
restart, members in their own processes) is tests/cluster/test_cluster_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

import pytest
from cluster_kit import (
    LEASE_MS,
    Node,
    commit,
    fetch,
    heartbeat,
    stable_member,
    stop_all,
    wait_for,
)
from pg_harness import PostgresServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "chaos"))
from proxy import FaultProxy

from coordinator.cluster.host import writer_settings
from coordinator.core.commands import Heartbeat, PutResource, RemoveMember
from coordinator.core.effects import AdminResult
from coordinator.storage.leases import LocalLease
from coordinator.storage.postgres import PostgresStorage, connect, partition_of
from protocol.catalog import Placement, Weights, Zones
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitResponse,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotCoordinatorAnswer,
)

P = 6


async def test_coordinators_share_the_partitions_and_never_own_one_together(pg_url: str
                                                                            ) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    assert a.owned() == set(range(P))              # alone: it takes every partition
    b = await Node.start(pg_url, "b", partitions=P)
    c = None
    try:
        overlaps: list[set[int]] = []

        async def watch() -> None:
            while True:
                nodes = [n for n in (a, b, c) if n is not None]
                for i, x in enumerate(nodes):
                    for y in nodes[i + 1:]:
                        if x.owned() & y.owned():
                            overlaps.append(x.owned() & y.owned())
                await asyncio.sleep(0.005)

        watcher = asyncio.ensure_future(watch())
        # The newcomer takes its share by an orderly hand-off, within a few rounds.
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        c = await Node.start(pg_url, "c", partitions=P)
        await wait_for(lambda: [len(n.owned()) for n in (a, b, c)] == [2, 2, 2], 10,
                       "2, 2 and 2")
        assert a.owned() | b.owned() | c.owned() == set(range(P))
        # A coordinator stopped with SIGTERM hands its partitions off: the others
        # take them at once, not after its leases ran out.
        stopped_at = time.monotonic()
        await c.stop()
        await wait_for(lambda: a.owned() | b.owned() == set(range(P)), 10, "a and b own all")
        assert time.monotonic() - stopped_at < LEASE_MS / 1000
        watcher.cancel()
        assert overlaps == []
    finally:
        await stop_all(a, b)


async def test_an_owner_stops_answering_when_its_lease_may_have_run_out(pg_url: str) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    try:
        runtime = a.runtime_for("g")
        member_id, generation = await stable_member(runtime, "g")
        assert (await heartbeat(runtime, "g", member_id, generation)).error is None
        a.pause()                                  # no renewal any more (paused, cut off)
        granted = a.host.partitions[partition_of("g", P)].lease
        await asyncio.sleep(max(0.0, granted.valid_until - time.monotonic()) + 0.01)
        # By its own clock the lease may have run out: it answers nothing for the
        # partition, heartbeats included, although nobody else took it yet.
        answer = a.host.route("g")
        assert isinstance(answer, NotCoordinatorAnswer)
        assert answer.error is ErrorCode.NOT_COORDINATOR
        assert partition_of("g", P) not in a.host.partitions
    finally:
        await stop_all(a)


async def test_a_deposed_owner_cannot_write_and_drops_the_partition(pg_url: str) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    b = None
    try:
        number = partition_of("g", P)
        runtime = a.runtime_for("g")
        member_id, generation = await stable_member(runtime, "g")
        assert (await commit(runtime, "g", member_id, generation, 1)).error is None
        a.pause()
        # Make a believe it still holds the lease (its clock runs slow, say), so it
        # keeps serving the partition after the database gave it to b...
        partition = a.host.partitions[number]
        partition.lease = LocalLease(number, partition.lease.epoch, LEASE_MS,
                                     time.monotonic() + 60)
        b = await Node.start(pg_url, "b", partitions=P)
        await wait_for(lambda: number in b.owned(), 10, "b takes the partition over")
        assert a.host.route("g") is runtime
        # ...its write is fenced by the epoch in the database all the same: not
        # acknowledged (the member finds the coordinator again and retries there).
        answer = await commit(runtime, "g", member_id, generation, 2)
        assert isinstance(answer, CommitResponse)
        assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        await wait_for(lambda: number not in a.host.partitions, 5, "a drops the partition")
        # Nothing of the fenced write is in the database: the new owner has 1.
        fetched = await fetch(b.runtime_for("g"), "g")
        assert isinstance(fetched, FetchResponse)
        assert fetched.checkpoints == (("orders", 0, 1),)
    finally:
        await stop_all(a, *([b] if b else []))


async def test_takeover_resumes_a_stable_group_without_a_rebalance(pg_url: str) -> None:
    """The new owner serves the group at its generation, with its checkpoints;
    and a commit the member gave up on before the hand-off, delayed past it, is
    not applied over the newer one (the commit sequence is stored with the
    checkpoints: docs/coordinator-semantics.md, "The commit sequence")."""
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        first = a if partition_of("g", P) in a.owned() else b
        second = b if first is a else a
        runtime = first.runtime_for("g")
        member_id, generation = await stable_member(runtime, "g")
        assert (await commit(runtime, "g", member_id, generation, 7, sequence=2)).error is None
        await first.stop()                         # SIGTERM: an orderly hand-off
        await wait_for(lambda: partition_of("g", P) in second.owned(), 10, "takeover")
        taken = second.runtime_for("g")
        view = taken.core.describe_group("g")
        assert view is not None and view.state == "Stable"
        assert view.generation_id == generation
        assert [m.assignment for m in view.members] == [b"A"]
        # The member's heartbeat at its generation is answered as if nothing happened.
        assert (await heartbeat(taken, "g", member_id, generation)).error is None
        fetched = await fetch(taken, "g")
        assert isinstance(fetched, FetchResponse)
        assert fetched.checkpoints == (("orders", 0, 7),)
        # The member's commit 1, given up on before commit 2, reaches the new owner.
        assert (await commit(taken, "g", member_id, generation, 5, sequence=1)).error is None
        fetched = await fetch(taken, "g")
        assert isinstance(fetched, FetchResponse)
        assert fetched.checkpoints == (("orders", 0, 7),)
    finally:
        await stop_all(a, b)


async def test_find_coordinator_and_not_coordinator_name_the_owner(pg_url: str) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        await wait_for(lambda: all(row.held for row in a.host.lease_rows.values())
                       and all(row.held for row in b.host.lease_rows.values()), 5, "reads")
        for group in ("g", "h", "orders-7", "x"):
            owner = a if partition_of(group, P) in a.owned() else b
            other = b if owner is a else a
            for node in (a, b):
                found = node.service.find_coordinator(group)
                assert found.error is None
                assert found.url == f"http://{owner.name}:9080"
                assert found.partition == partition_of(group, P)
            answer = other.host.route(group)
            assert answer == NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR,
                                                  f"http://{owner.name}:9080")
            assert other.service.owner_admin_url(group) == f"http://{owner.name}:9081"
            assert owner.service.owner_admin_url(group) is None
    finally:
        await stop_all(a, b)


async def test_an_owner_late_with_its_round_is_still_named_for_admin_calls(pg_url: str
                                                                          ) -> None:
    # A coordinator is live while seen within lease_ms / 2; its leases are held for
    # lease_ms. When its round runs late (a loaded machine), the others stop counting
    # it live while its leases are still held: for that moment find_coordinator and
    # NOT_COORDINATOR name it, and admin calls about its groups must be forwarded to
    # it all the same (this flaked in test_find_coordinator_and_not_coordinator_...).
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        group = next(g for g in (f"g{i}" for i in range(100))
                     if partition_of(g, P) in b.owned())
        mine = next(g for g in (f"g{i}" for i in range(100))
                    if partition_of(g, P) in a.owned())
        for node in (a, b):     # both loops stopped: a's rounds are the test's own
            task = node.task
            assert task is not None
            node.pause()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # A statement on the lease connection: anything sent on it before (a
            # renewal, a heartbeat cut short) has been run or cancelled by now.
            await node.host.leases.leases()
        # b was last seen an hour ago, and still holds its leases (database clock).
        conn = await connect(pg_url)
        try:
            await conn.execute("UPDATE coordinators SET last_seen = now() - interval '1 hour' "
                               "WHERE id = 'b'")
            await conn.execute("UPDATE partition_leases SET expires_at = now() + "
                               "interval '1 hour' WHERE owner_id = 'b'")
        finally:
            await conn.close()
        await a.host._round()
        assert [c.id for c in a.host.coordinators] == ["a"]     # b is not live
        assert a.service.find_coordinator(group).url == "http://b:9080"
        assert a.host.route(group) == NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR,
                                                           "http://b:9080")
        assert a.service.owner_admin_url(group) == "http://b:9081"
        assert a.service.owner_admin_url(mine) is None
    finally:
        await stop_all(a, b)


async def test_an_admin_call_runs_where_its_group_is_served_with_an_id_unique_there(
        pg_url: str) -> None:
    """The admin edge builds its command, the id minted by the service, before the
    service routes it: the id must not be one a partition runtime gives a protocol
    call, whichever partition (loaded now or later) runs it."""
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        await wait_for(lambda: all(row.held for row in a.host.lease_rows.values()), 5, "reads")
        mine = next(g for g in (f"g{i}" for i in range(100)) if partition_of(g, P) in a.owned())
        theirs = next(g for g in (f"g{i}" for i in range(100))
                      if partition_of(g, P) in b.owned())
        runtime = a.runtime_for(mine)
        member, generation = await stable_member(runtime, mine)
        # A long-poll heartbeat parked in the partition's runtime, then the removal
        # of its member through the service: that answers the heartbeat at once.
        parked = runtime.request(Heartbeat(runtime.new_request_id(), HeartbeatRequest(
            mine, member, generation, wait_ms=30_000)))
        assert isinstance(parked, asyncio.Future)
        removed = await a.service.call(RemoveMember(a.service.new_request_id(), mine, member))
        assert isinstance(removed, AdminResult) and removed.error is None
        beat = await asyncio.wait_for(parked, 5)
        assert isinstance(beat, HeartbeatResponse)
        assert beat.error is ErrorCode.UNKNOWN_MEMBER_ID
        assert runtime.core.describe_group(mine).members == ()  # type: ignore[union-attr]
        # A group served by b: answered NOT_COORDINATOR (the admin app forwards it).
        elsewhere = await a.service.call(RemoveMember(a.service.new_request_id(), theirs, "m"))
        assert elsewhere.error is ErrorCode.NOT_COORDINATOR
        # Ids minted by the service and by each partition runtime never meet.
        ids = [a.service.new_request_id()]
        for number in sorted(a.owned()):
            partition_runtime = a.host.partitions[number].runtime
            assert partition_runtime is not None
            ids += [partition_runtime.new_request_id(), a.service.new_request_id()]
        assert len(set(ids)) == len(ids) == 7
    finally:
        await stop_all(a, b)


async def test_a_catalog_change_through_one_coordinator_reaches_the_others(pg_url: str
                                                                          ) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        put = await a.service.call(PutResource(a.service.new_request_id(), "orders", 4))
        assert put == AdminResult(None, 1)
        put = await b.service.call(PutResource(b.service.new_request_id(), "users", 2))
        assert put == AdminResult(None, 2)         # ordered by the database, not per process
        await wait_for(lambda: a.host.resources_epoch == 2, 5, "a adopts epoch 2")
        for node in (a, b):
            assert dict(node.service.core.catalog()) == {"orders": 4, "users": 2}
            for number in node.owned():
                core = node.host.partitions[number].runtime.core  # type: ignore[union-attr]
                assert core.resources_epoch == 2
                assert dict(core.catalog()) == {"orders": 4, "users": 2}
        bad = await a.service.call(PutResource(a.service.new_request_id(), "orders", 0))
        assert isinstance(bad, AdminResult) and bad.error is ErrorCode.INVALID_REQUEST
        store = await PostgresStorage.open(pg_url)
        try:
            assert await store.catalog_state() == ({"orders": 4, "users": 2}, {}, 2)
        finally:
            await store.close()
    finally:
        await stop_all(a, b)


async def test_weights_and_zones_changed_through_one_coordinator_reach_the_others(
        pg_url: str) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    hot = Placement(Weights(1.0, ((3, 40.0), (7, 12.5))), Zones(None, ((3, ("eu-1a",)),)))
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        put = await a.service.call(PutResource(a.service.new_request_id(), "orders", 8, hot.weights,
                                                           hot.zones))
        assert put == AdminResult(None, 1)
        # b learns it from the database at its next round, and so do its partitions.
        await wait_for(lambda: b.host.resources_epoch == 1, 5, "b adopts epoch 1")
        for node in (a, b):
            assert dict(node.service.core.catalog_placement()) == {"orders": hot}
            for number in node.owned():
                core = node.host.partitions[number].runtime.core  # type: ignore[union-attr]
                assert core.catalog_placement() == {"orders": hot}
        # A PUT through b without them keeps them (b read the row in its transaction);
        # a shrink that leaves index 7 outside is refused, through either.
        grown = await b.service.call(PutResource(b.service.new_request_id(), "orders", 16))
        assert grown == AdminResult(None, 2)
        refused = await a.service.call(PutResource(a.service.new_request_id(), "orders", 5))
        assert isinstance(refused, AdminResult) and refused.error is ErrorCode.INVALID_REQUEST
        assert refused.message.startswith("weights.overrides: the set has an override for "
                                          "index 7")
        await wait_for(lambda: a.host.resources_epoch == 2, 5, "a adopts epoch 2")
        assert a.host.catalog == {"orders": 16} and a.host.placement == {"orders": hot}
        store = await PostgresStorage.open(pg_url)
        try:
            assert await store.catalog_state() == ({"orders": 16}, {"orders": hot}, 2)
            # A coordinator's round reads only the epoch while it has not moved.
            assert await store.catalog_since(2) is None
        finally:
            await store.close()
        # The weights cleared through a: b's partitions serve the default weights.
        cleared = await a.service.call(PutResource(a.service.new_request_id(), "orders", 16,
                                                   Weights()))
        assert cleared == AdminResult(None, 3)
        zoned = Placement(zones=hot.zones)
        await wait_for(lambda: b.host.resources_epoch == 3, 5, "b adopts epoch 3")
        for number in b.owned():
            core = b.host.partitions[number].runtime.core  # type: ignore[union-attr]
            assert core.catalog_placement() == {"orders": zoned}
    finally:
        await stop_all(a, b)
    # Every coordinator restarted: the catalog is the database's.
    c = await Node.start(pg_url, "c", partitions=P)
    try:
        assert (c.host.catalog, c.host.placement, c.host.resources_epoch) == (
            {"orders": 16}, {"orders": zoned}, 3)
        await wait_for(lambda: all(c.host.partitions[n].runtime is not None
                                   for n in c.owned()), 10, "c serves its partitions")
        for number in c.owned():
            core = c.host.partitions[number].runtime.core  # type: ignore[union-attr]
            assert core.catalog_placement() == {"orders": zoned}
    finally:
        await stop_all(c)


async def test_after_a_postgresql_restart_the_coordinator_serves_its_groups_again(
        pg_url: str, postgres_server: PostgresServer) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    try:
        number = partition_of("g", P)
        runtime = a.runtime_for("g")
        member_id, generation = await stable_member(runtime, "g")
        assert (await commit(runtime, "g", member_id, generation, 5)).error is None
        epoch = a.host.partitions[number].lease.epoch
        await asyncio.to_thread(postgres_server.stop, "fast")
        # Without the database nothing renews: every partition is dropped once its
        # lease may have run out, and nothing is answered from memory after that.
        await wait_for(lambda: not a.owned(), 5, "partitions dropped")
        assert isinstance(a.host.route("g"), NotCoordinatorAnswer)
        await asyncio.to_thread(postgres_server.start)
        # Back: acquired again (a new epoch), reloaded, the group as it was.
        await wait_for(lambda: a.owned() == set(range(P)), 15, "every partition again")
        assert a.host.partitions[number].lease.epoch > epoch
        taken = a.runtime_for("g")
        assert (await heartbeat(taken, "g", member_id, generation)).error is None
        fetched = await fetch(taken, "g")
        assert isinstance(fetched, FetchResponse)
        assert fetched.checkpoints == (("orders", 0, 5),)
    finally:
        await stop_all(a)


async def test_a_coordinator_paused_mid_write_holds_up_no_one(pg_url: str) -> None:
    """A coordinator paused inside a write transaction holds its lease rows locked
    (the fence reads them FOR SHARE): the others' rounds must not wait on that."""
    a = await Node.start(pg_url, "a", partitions=P)
    b = await Node.start(pg_url, "b", partitions=P)
    try:
        await wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 10, "3 and 3")
        mine = set(b.owned())
        a.pause()
        # a's writer, frozen after its fence read: the rows stay locked until the
        # server ends the idle transaction (writer_settings).
        frozen = await connect(pg_url, settings=writer_settings(LEASE_MS))
        transaction = frozen.transaction()
        await transaction.start()
        await frozen.fetch("SELECT partition FROM partition_leases WHERE partition = ANY($1) "
                           "FOR SHARE", sorted(a.owned()))
        dropped: list[int] = []
        started = time.monotonic()
        while b.owned() != set(range(P)):
            assert time.monotonic() - started < 10, "b did not take a's partitions over"
            dropped += sorted(mine - b.owned())
            await asyncio.sleep(0.01)
        assert dropped == []                       # b kept serving its own all along
        frozen.terminate()
    finally:
        await stop_all(a, b)


async def test_a_database_that_stops_answering_does_not_stall_the_coordinator(
        pg_url: str, postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A cut that drops packets silently (no reset): statements would wait for TCP to
    give up (minutes). The coordinator gives up on them instead, keeps its rounds
    going, drops what it cannot renew, and serves again once the database answers."""
    async with FaultProxy("127.0.0.1", postgres_server.port) as proxy:
        url = pg_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        a = await Node.start(url, "a", partitions=P)
        try:
            runtime = a.runtime_for("g")
            member_id, generation = await stable_member(runtime, "g")
            caplog.clear()
            proxy.partition(60)                    # silence, both ways
            pending = asyncio.ensure_future(commit(runtime, "g", member_id, generation, 3))
            await wait_for(lambda: not a.owned(), 3 * LEASE_MS / 1000, "partitions dropped")
            answer = await pending                 # refused, not acknowledged
            assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
            # The lease loop goes on (each statement gives up after half a lease)...
            await wait_for(lambda: sum("lease round failed" in r.message
                                       for r in caplog.records) >= 2, 4 * LEASE_MS / 1000,
                           "two failed rounds")
            proxy.heal(cut=True)                   # the stalled connections are reset
            # ...and takes every partition back once the database answers again.
            await wait_for(lambda: a.owned() == set(range(P)), 15, "every partition again")
            taken = a.runtime_for("g")
            assert (await heartbeat(taken, "g", member_id, generation)).error is None
        finally:
            await stop_all(a)
