"""Final commits from ``on_revoked`` while the member closes (docs/client.md,
"Final commits").

A worker whose ``on_revoked`` takes a few seconds and commits at its end is
closed (Ctrl-C) while it revokes for a rebalance a new member started: the
close's own ``on_revoked(everything left)`` follows the rebalance's at once.
The member used to send no heartbeat while a callback ran, so the two
callbacks back to back outlasted the session timeout with nothing renewing
the lease, and the close's final commit was refused locally with
``NotOwnedError`` although the coordinator still counted the member in.
Now the side channel heartbeats while a callback awaits, and a final commit
that truly cannot be stored says so: a WARNING naming the resources and the
reason, and an exception that says why. Also closes racing a rebalance:
while syncing, with a join whose answer is on the way, with a parked join,
at every moment of one (the close first takes the rebalance to a generation
whose commits the coordinator takes), and a close that times out in
``on_revoked``.

In virtual time (``virtual_time.py``): the callbacks' seconds, the sessions
and the coordinator's timers all run on the loop's clock, so the outcome
does not depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, eventually
from virtual_time import LatencyTransport, loop_ms, loop_s, run_with_coordinator

from client import GroupCoordError, GroupMember, NotOwnedError, RebalanceListener, Resource
from client.member_state import MemberState

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 6_000
#: each on_revoked: shorter than the session, two of them in a row longer.
REVOKE_S = 4.0
SETTINGS: dict[str, Any] = dict(session_timeout_ms=SESSION_MS, rebalance_timeout_ms=30_000,
                                retry_backoff_ms=50, retry_backoff_max_ms=500)


class SlowRevoke(RebalanceListener):
    """Stops its work in ``on_revoked`` (``REVOKE_S`` of it), then commits the
    final position of every revoked resource; keeps each commit's outcome."""

    def __init__(self) -> None:
        self.member: GroupMember | None = None
        self.revoking = asyncio.Event()
        self.outcomes: list[tuple[frozenset[Resource], BaseException | None]] = []
        self.partition_at_start: Any = None

    async def on_revoked(self, resources: set[Resource]) -> None:
        assert self.member is not None
        self.revoking.set()
        if self.partition_at_start is not None:
            self.partition_at_start.partitioned = True
        await asyncio.sleep(REVOKE_S)
        try:
            await self.member.commit({r: f"final-{r[1]}" for r in resources})
        except GroupCoordError as exc:
            self.outcomes.append((frozenset(resources), exc))
        else:
            self.outcomes.append((frozenset(resources), None))


def test_close_during_a_slow_revocation_keeps_every_final_commit() -> None:
    run_with_coordinator(_close_during_a_slow_revocation)


async def _close_during_a_slow_revocation(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("shards", 9)
    listener = SlowRevoke()
    a = GroupMember(coordinator.transport(), "g", ["shards"], listener=listener,
                    client_id="a", clock=loop_ms, **SETTINGS)
    listener.member = a
    ledger = Ledger(clock=loop_s)
    b = GroupMember(coordinator.transport(), "g", ["shards"], listener=ledger.listener("b"),
                    client_id="b", clock=loop_ms, **SETTINGS)
    await a.__aenter__()
    assert len(a.assignment) == 9
    b.start()  # a new member: a revokes what moves to it, slowly
    try:
        await _close_a(a, b, listener)
    finally:
        await b.close()


async def _close_a(a: GroupMember, b: GroupMember, listener: SlowRevoke) -> None:
    await asyncio.wait_for(listener.revoking.wait(), 10)
    await asyncio.sleep(1)
    started = loop_ms()
    await a.close()  # Ctrl-C while on_revoked runs
    # The rebalance's revocation and the close's, back to back: longer than a
    # session without a heartbeat, had the callbacks blocked them.
    assert loop_ms() - started >= 2 * REVOKE_S * 1000 - 1000 > SESSION_MS
    assert a.failure is None
    # The rebalance's revocation, then the close's (everything left).
    assert [exc for _, exc in listener.outcomes] == [None, None]
    assert frozenset().union(*(r for r, _ in listener.outcomes)) == {
        ("shards", i) for i in range(9)}
    # Every final commit is stored, and b takes everything over once a left.
    await eventually(lambda: len(b.assignment) == 9, 30)
    assert await b.fetch() == {("shards", i): f"final-{i}" for i in range(9)}


def test_a_final_commit_that_cannot_be_stored_is_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="groupcoord.client")
    run_with_coordinator(_final_commit_after_the_lease)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "final commit" in r.getMessage()]
    assert len(warnings) == 1, warnings
    line = warnings[0]
    assert "shards[0], shards[1], shards[2]" in line
    assert "safety deadline" in line and "not stored" in line


async def _final_commit_after_the_lease(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("shards", 3)
    listener = SlowRevoke()
    transport = coordinator.transport()
    a = GroupMember(transport, "g", ["shards"], listener=listener, client_id="a",
                    clock=loop_ms, session_timeout_ms=3_000, rebalance_timeout_ms=30_000)
    listener.member = a
    await a.__aenter__()
    # Cut off from the coordinator as the close's on_revoked starts: nothing
    # renews the lease while the callback runs longer than the session, and
    # the coordinator may give the resources away from the deadline on.
    listener.partition_at_start = transport
    await a.close()
    assert len(listener.outcomes) == 1
    resources, exc = listener.outcomes[0]
    assert resources == {("shards", i) for i in range(3)}
    assert isinstance(exc, NotOwnedError)
    assert exc.resources == sorted(resources)
    assert "safety deadline" in str(exc)


# ---------------------------------------------------------------- close racing a rebalance


class QuickRevoke(RebalanceListener):
    """Commits each revoked resource's final position after half a second."""

    def __init__(self) -> None:
        self.member: GroupMember | None = None
        self.outcomes: list[tuple[frozenset[Resource], BaseException | None]] = []

    async def on_revoked(self, resources: set[Resource]) -> None:
        assert self.member is not None
        await asyncio.sleep(0.5)
        try:
            await self.member.commit({r: f"final-{r[1]}" for r in resources})
        except GroupCoordError as exc:
            self.outcomes.append((frozenset(resources), exc))
        else:
            self.outcomes.append((frozenset(resources), None))


async def _close_during_a_rebalance(coordinator: InProcessCoordinator, offset_ms: int | None,
                                    ) -> tuple[str, QuickRevoke, dict[Resource, Any]]:
    """a owns 6 resources; b joins over a network with 100 ms round trips;
    a is closed ``offset_ms`` after it left STABLE (None: once it is SYNCING).
    Returns a's state when closed, its listener, and the checkpoints then."""
    await coordinator.put_resource("shards", 6)
    listener = QuickRevoke()
    a = GroupMember(LatencyTransport(coordinator, 100), "g", ["shards"], listener=listener,
                    client_id="a", clock=loop_ms, **SETTINGS)
    listener.member = a
    await a.__aenter__()
    b = GroupMember(LatencyTransport(coordinator, 100), "g", ["shards"], client_id="b",
                    clock=loop_ms, **SETTINGS)
    b.start()
    try:
        if offset_ms is None:
            await eventually(lambda: a.state is MemberState.SYNCING, 10, 0.001)
        else:
            await eventually(lambda: a.state is not MemberState.STABLE, 10, 0.001)
            await asyncio.sleep(offset_ms / 1000)
        state = a.state.value
        await a.close()
        await eventually(lambda: len(b.assignment) == 6, 30)
        return state, listener, await b.fetch()
    finally:
        await b.close()


def test_close_while_syncing_finishes_the_sync_and_keeps_every_final_commit() -> None:
    # Abandoned, the sync left the group waiting for the leader's sync, and
    # then in a generation the member's commits no longer carried: every
    # final commit was refused (REBALANCE_IN_PROGRESS or ILLEGAL_GENERATION).
    result: list[Any] = []

    async def scenario(coordinator: InProcessCoordinator) -> None:
        result.append(await _close_during_a_rebalance(coordinator, None))

    run_with_coordinator(scenario)
    state, listener, stored = result[0]
    assert state == "syncing"
    assert [exc for _, exc in listener.outcomes] == [None] * len(listener.outcomes)
    assert stored == {("shards", i): f"final-{i}" for i in range(6)}


def test_close_at_any_moment_of_a_rebalance_stores_every_final_commit(
        caplog: pytest.LogCaptureFixture) -> None:
    # Closed while its join's answer was on the way (the group's join phase
    # completed with it), the member used to abandon the join and lose the
    # generation its commits needed: every final commit was refused. Now the
    # join goes on until the side channel shows it parked or not arrived.
    caplog.set_level(logging.WARNING, logger="groupcoord.client")
    for offset_ms in range(0, 400, 20):
        result: list[Any] = []

        async def scenario(coordinator: InProcessCoordinator) -> None:
            result.append(await _close_during_a_rebalance(coordinator, offset_ms))  # noqa: B023

        run_with_coordinator(scenario)
        state, listener, stored = result[0]
        assert [exc for _, exc in listener.outcomes] == [None] * len(listener.outcomes), (
            offset_ms, state, listener.outcomes)
        assert stored == {("shards", i): f"final-{i}" for i in range(6)}, (offset_ms, state)
    assert not [r for r in caplog.records if "final commit" in r.getMessage()]


class Holdable(LatencyTransport):
    """Every call waits while ``hold`` is set (a member stalled on its network)."""

    def __init__(self, coordinator: InProcessCoordinator, rtt_ms: int) -> None:
        super().__init__(coordinator, rtt_ms)
        self.hold = False

    async def call(self, api: str, request: Any) -> Any:
        while self.hold:
            await asyncio.sleep(0.05)
        return await super().call(api, request)


def test_close_with_a_parked_join_abandons_it_and_commits_in_its_generation() -> None:
    # The group waits for another member to rejoin (it is stalled): a's join is
    # parked. The close does not wait for the join phase (up to the rebalance
    # timeout): a side-channel answer shows the join phase still running, the
    # join is abandoned, and the final commits go in a's generation.
    run_with_coordinator(_close_with_a_parked_join)


async def _close_with_a_parked_join(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("shards", 6)
    listener = QuickRevoke()
    a = GroupMember(LatencyTransport(coordinator, 100), "g", ["shards"], listener=listener,
                    client_id="a", clock=loop_ms, **SETTINGS)
    listener.member = a
    c_net = Holdable(coordinator, 100)
    c = GroupMember(c_net, "g", ["shards"], client_id="c", clock=loop_ms, **SETTINGS)
    b = GroupMember(LatencyTransport(coordinator, 100), "g", ["shards"], client_id="b",
                    clock=loop_ms, **SETTINGS)
    await a.__aenter__()
    c.start()
    try:
        await eventually(lambda: len(a.assignment) == 3 and len(c.assignment) == 3, 30)
        c_net.hold = True  # c will not rejoin for a while
        b.start()
        await eventually(lambda: a.state is MemberState.JOINING, 10, 0.001)
        await asyncio.sleep(1)  # a's join is parked: the group waits for c
        mine = a.assignment
        listener.outcomes.clear()  # the hand-over to c's
        started = loop_ms()
        await a.close()
        took = loop_ms() - started
        assert took < 0.5 * 1000 + 2 * SETTINGS["session_timeout_ms"] // 3, took
        assert listener.outcomes == [(mine, None)]
        c_net.hold = False
        await eventually(lambda: len(b.assignment) + len(c.assignment) == 6, 60)
        stored = await b.fetch()
        assert all(stored[r] == f"final-{r[1]}" for r in mine)
    finally:
        await b.close()
        await c.close()


def test_a_close_that_times_out_during_on_revoked_names_what_it_cuts_short(
        caplog: pytest.LogCaptureFixture) -> None:
    # close(timeout_s) bounds the whole close, user code included: when it
    # runs out while on_revoked runs, the final commits it had yet to make
    # are not stored, and the WARNING says which resources.
    caplog.set_level(logging.WARNING, logger="groupcoord.client")
    run_with_coordinator(_close_times_out)
    lines = [r.getMessage() for r in caplog.records if "close timed out" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "on_revoked(shards[0], shards[1])" in lines[0]
    assert "not stored" in lines[0]


async def _close_times_out(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("shards", 2)
    listener = SlowRevoke()
    a = GroupMember(coordinator.transport(), "g", ["shards"], listener=listener,
                    client_id="a", clock=loop_ms, **SETTINGS)
    listener.member = a
    await a.__aenter__()
    await a.close(timeout_s=REVOKE_S / 2)
    assert listener.outcomes == []  # cut short before its commit
