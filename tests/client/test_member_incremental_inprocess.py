"""incremental-cooperative (KIP-415) through the real client, against the real
coordinator core and runtime in this process: the assignor's state travels in
``user_data`` (echoed by the members), the leader hands it the time, and a
departed member's resources wait for it for the scheduled delay. In virtual
time (``virtual_time.py``): these ran for ~2 s of real time each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, eventually, owners
from virtual_time import in_process_coordinator, loop_ms, loop_s, run_virtual

from client import GroupMember, Resource
from client.member_state import MemberState

pytestmark = pytest.mark.timeout(60)

IC = "incremental-cooperative"
FAST: dict[str, Any] = dict(session_timeout_ms=600, heartbeat_interval_ms=150,
                            rebalance_timeout_ms=3_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100, clock=loop_ms)


def member(coord: InProcessCoordinator, name: str, ledger: Ledger,
           delay_ms: int) -> GroupMember:
    return GroupMember(coord.transport(), "g", ["s"], client_id=name,
                       group_instance_id=f"i-{name}", assignors=[IC],
                       listener=ledger.listener(name),
                       assignor_settings={IC: {"scheduled_rebalance_max_delay_ms": delay_ms,
                                               "revocation_backoff_ms": 50}},
                       **FAST)


def settled(members: list[GroupMember], total: int) -> bool:
    c = owners(members)
    return (len(c) == total and all(v == 1 for v in c.values())
            and all(len(m.assignment) == total // len(members) for m in members))


async def _three_then_c_departs(coord: InProcessCoordinator, ledger: Ledger,
                                delay_ms: int) -> tuple[GroupMember, GroupMember,
                                                        frozenset[Resource], float]:
    """a, b, c share 6 resources; c (static) closes without leaving; return
    once the coordinator removed it (session timeout) and a and b completed
    the rebalance without it: (a, b, what c held, when c closed)."""
    await coord.put_resource("s", 6)
    a, b, c = (member(coord, n, ledger, delay_ms) for n in "abc")
    for m in (a, b, c):
        m.start()
    await eventually(lambda: settled([a, b, c], 6), timeout_s=15)
    held = c.assignment
    generation = a.generation_id
    closed_at = loop_s()
    await c.close()
    assert ledger.revoked_or_lost("c", closed_at) == held
    # Removed after its session timeout; the next generation forms without it.
    await eventually(lambda: a.generation_id > generation and b.generation_id == a.generation_id
                     and a.state is MemberState.STABLE and b.state is MemberState.STABLE,
                     timeout_s=10)
    return a, b, held, closed_at


def test_a_static_member_back_within_the_delay_gets_its_resources_back() -> None:
    async def main() -> None:
        async with in_process_coordinator() as coordinator:
            await _back_within_the_delay(coordinator)

    run_virtual(main)


async def _back_within_the_delay(coordinator: InProcessCoordinator) -> None:
    ledger = Ledger(clock=loop_s)
    a, b, held, _ = await _three_then_c_departs(coordinator, ledger, delay_ms=20_000)
    try:
        a_had, b_had = a.assignment, b.assignment
        # Deferred: nobody takes c's resources while it may come back.
        await asyncio.sleep(1.0)
        assert a.assignment == a_had and b.assignment == b_had
        assert held.isdisjoint(a.assignment | b.assignment)
        assert len(owners([a, b])) == 4
        since = loop_s()
        c2 = member(coordinator, "c", ledger, delay_ms=20_000)
        async with c2:
            await eventually(lambda: c2.assignment == held, timeout_s=10)
            await asyncio.sleep(0.5)
            assert c2.assignment == held
            assert a.assignment == a_had and b.assignment == b_had
            # Nothing moved away from the others for the return.
            assert ledger.count("a", "revoked", since) == 0
            assert ledger.count("b", "revoked", since) == 0
            await c2.close()
    finally:
        await a.close()
        await b.close()
    ledger.check()


def test_after_the_delay_the_departed_members_resources_are_spread() -> None:
    async def main() -> None:
        async with in_process_coordinator() as coordinator:
            await _spread_after_the_delay(coordinator)

    run_virtual(main)


async def _spread_after_the_delay(coordinator: InProcessCoordinator) -> None:
    ledger = Ledger(clock=loop_s)
    delay_ms = 1_500
    a, b, held, closed_at = await _three_then_c_departs(coordinator, ledger, delay_ms)
    try:
        removed_at = loop_s()
        assert len(owners([a, b])) == 4
        assert held.isdisjoint(a.assignment | b.assignment)
        await eventually(lambda: len(owners([a, b])) == 6, timeout_s=10)
        spread_at = loop_s()
        # Not before the delay, counted from when the leader saw c gone
        # (after its session timeout, so later than closed_at).
        assert spread_at - removed_at >= delay_ms / 1000 - 0.5
        assert spread_at - closed_at >= delay_ms / 1000
        assert len(a.assignment) == 3 and len(b.assignment) == 3
        assert (a.assignment | b.assignment) >= held
    finally:
        await a.close()
        await b.close()
    ledger.check()
