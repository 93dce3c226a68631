"""A failure stays in its group on PostgreSQL too: a record the database refuses
fails that group's call, the group is reloaded, and no partition is dropped (before,
the shared writer failed every partition's write of the transaction and each of
those partitions was dropped and reloaded by its next owner)."""

from __future__ import annotations

import asyncio
import itertools

from cluster_kit import Node, commit, fetch, heartbeat, stable_member, stop_all, wait_for

from coordinator.storage.postgres import connect, partition_of
from protocol.errors import ErrorCode
from protocol.messages import FetchResponse

P = 6


def group_in(partition: int, prefix: str) -> str:
    return next(g for g in (f"{prefix}{n}" for n in itertools.count())
                if partition_of(g, P) == partition)


async def test_a_record_postgresql_refuses_fails_its_group_and_drops_no_partition(
        pg_url: str) -> None:
    a = await Node.start(pg_url, "a", partitions=P)
    try:
        bad = "bad"
        neighbour = group_in(partition_of(bad, P), "neighbour")    # bad's partition
        other = group_in((partition_of(bad, P) + 1) % P, "other")   # another partition
        members = {g: await stable_member(a.runtime_for(g), g) for g in (bad, neighbour, other)}
        for group, (member, generation) in members.items():
            assert (await commit(a.runtime_for(group), group, member, generation, 1)).error \
                is None
        epochs = {n: p.lease.epoch for n, p in a.host.partitions.items()}
        conn = await connect(pg_url)
        try:
            await conn.execute("ALTER TABLE checkpoints ADD CONSTRAINT refuse_bad "
                               "CHECK (group_id <> 'bad') NOT VALID")
        finally:
            await conn.close()
        answers = await asyncio.gather(*(
            commit(a.runtime_for(g), g, m, gen, 2) for g, (m, gen) in members.items()))
        assert [x.error for x in answers] == [ErrorCode.UNKNOWN_SERVER_ERROR, None, None]
        # Every partition still served, under the same lease: none was dropped.
        assert a.owned() == set(range(P))
        assert {n: p.lease.epoch for n, p in a.host.partitions.items()} == epochs
        runtime = a.runtime_for(bad)
        await wait_for(lambda: runtime.core.describe_group(bad) is not None, 10,
                       "the group reloaded")
        for group, value in ((bad, 1), (neighbour, 2), (other, 2)):
            fetched = await fetch(a.runtime_for(group), group)
            assert isinstance(fetched, FetchResponse)
            assert fetched.checkpoints == (("orders", 0, value),), group
        member, generation = members[bad]
        assert (await heartbeat(runtime, bad, member, generation)).error is None
    finally:
        await stop_all(a)
