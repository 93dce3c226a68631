"""The driver's side channel against the real core in process: heartbeats
while a join is parked, on_lost at the rebalance bound when the join is
lost, nothing lost when a slow but healthy barrier stays inside the bound.
In virtual time (``virtual_time.py``): the same scenarios ran for ~2 s of
real time each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport, Ledger, eventually
from virtual_time import in_process_coordinator, loop_ms, loop_s, run_virtual

from client import GroupMember
from client.errors import CoordinatorUnavailableError
from protocol.messages import JoinRequest

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = dict(session_timeout_ms=600, heartbeat_interval_ms=150,
                            rebalance_timeout_ms=2_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100, clock=loop_ms)


class JoinControl(InProcessTransport):
    """Joins with a known member id can be lost (held until healed, then a
    connection reset) or delayed before they reach the coordinator; every
    call is logged with its time."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator)
        self.lose_joins = False
        self.delay_joins_s = 0.0
        self.heal = asyncio.Event()
        self.log: list[tuple[float, str]] = []

    async def call(self, api: str, request: Any) -> Any:
        self.log.append((loop_s(), api))
        if isinstance(request, JoinRequest) and request.member_id:
            if self.lose_joins:
                await self.heal.wait()
                raise CoordinatorUnavailableError("join: connection reset (test)")
            if self.delay_joins_s:
                await asyncio.sleep(self.delay_joins_s)
        return await super().call(api, request)

    def count(self, api: str, start: float, end: float) -> int:
        return sum(1 for t, a in self.log if a == api and start <= t <= end)


def test_a_member_whose_join_is_lost_gives_up_at_the_bound_before_the_move() -> None:
    async def main() -> None:
        async with in_process_coordinator() as coordinator:
            await _join_lost(coordinator)

    run_virtual(main)


async def _join_lost(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 4)
    ledger = Ledger(clock=loop_s)
    lossy = JoinControl(coordinator)
    a = GroupMember(lossy, "g", ["s"], client_id="a", listener=ledger.listener("a"), **FAST)
    b = GroupMember(coordinator.transport(), "g", ["s"], client_id="b",
                    listener=ledger.listener("b"), **FAST)
    a.start()
    try:
        assert len(await a.wait_assigned(10)) == 4
        lossy.lose_joins = True
        lost_from = loop_s()
        b.start()
        await eventually(lambda: len(b.assignment) == 4, timeout_s=15)
        lost_at = [t for t, m, k, _ in ledger.events if m == "a" and k == "lost"]
        assert lost_at, "a never gave up what it owned"
        # a kept heartbeating while its join was lost (REBALANCE_IN_PROGRESS
        # answers), so it was the rebalance bound, not the session, that fired
        assert lossy.count("heartbeat", lost_from, lost_from + 1.0) >= 3
        ledger.check()  # never two owners: a's on_lost came before b's on_assigned
    finally:
        lossy.lose_joins = False
        lossy.heal.set()
        await asyncio.gather(a.close(timeout_s=5), b.close(timeout_s=5),
                             return_exceptions=True)


def test_a_slow_healthy_barrier_inside_the_bound_loses_nothing() -> None:
    async def main() -> None:
        async with in_process_coordinator() as coordinator:
            await _slow_barrier(coordinator)

    run_virtual(main)


async def _slow_barrier(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 6)
    ledger = Ledger(clock=loop_s)
    ta, tc = JoinControl(coordinator), JoinControl(coordinator)
    a = GroupMember(ta, "g", ["s"], client_id="a", listener=ledger.listener("a"), **FAST)
    c = GroupMember(tc, "g", ["s"], client_id="c", listener=ledger.listener("c"), **FAST)
    b = GroupMember(coordinator.transport(), "g", ["s"], client_id="b",
                    listener=ledger.listener("b"), **FAST)
    a.start()
    c.start()
    try:
        await eventually(lambda: len(a.assignment) + len(c.assignment) == 6
                         and bool(a.assignment) and bool(c.assignment), timeout_s=15)
        kept_a, kept_c = set(a.assignment), set(c.assignment)
        # c rejoins slowly: the join barrier lasts about twice the session
        # timeout, well inside the rebalance timeout
        tc.delay_joins_s = 1.2
        started = loop_s()
        b.start()
        await eventually(lambda: len(b.assignment) == 2, timeout_s=15)
        assert loop_s() - started > 1.2
        assert not [e for e in ledger.events if e[1] in ("a", "c") and e[2] == "lost"]
        # what moved to b was revoked; everything else was kept throughout
        moved = {r for _, m, k, rs in ledger.events if k == "revoked" for r in rs}
        assert set(a.assignment) | moved >= kept_a
        assert set(c.assignment) | moved >= kept_c
        assert len(moved) == 2
        # a heartbeated while its join was parked behind c's
        assert ta.count("heartbeat", started + 0.3, started + 1.1) >= 3
        ledger.check()
    finally:
        await asyncio.gather(a.close(timeout_s=5), b.close(timeout_s=5), c.close(timeout_s=5),
                             return_exceptions=True)
