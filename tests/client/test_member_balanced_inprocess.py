"""The ``balanced`` assignor through the real client, against the real
coordinator core and runtime in this process: members share the resources by
load, a join hands over cooperatively (nobody owns a resource twice, checked
by the ledger), and a settled static member that restarts gets its resources
back without a rebalance (the assignor echoes no state once the group has
settled, so the restarted member's subscription is unchanged). In virtual
time (``virtual_time.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, eventually, owners
from virtual_time import loop_ms, loop_s, run_with_coordinator

from client import GroupMember

pytestmark = pytest.mark.timeout(60)

SLOW_SESSION: dict[str, Any] = dict(session_timeout_ms=3_000, heartbeat_interval_ms=300,
                                    rebalance_timeout_ms=3_000, retry_backoff_ms=20,
                                    retry_backoff_max_ms=100, clock=loop_ms)


def member(coord: InProcessCoordinator, name: str, ledger: Ledger, instance: str) -> GroupMember:
    return GroupMember(coord.transport(), "g", ["s"], client_id=name, group_instance_id=instance,
                       assignors=["balanced"], listener=ledger.listener(name), **SLOW_SESSION)


def shared_evenly(members: list[GroupMember], total: int) -> bool:
    c = owners(members)
    return (len(c) == total and all(v == 1 for v in c.values())
            and all(len(m.assignment) == total // len(members) for m in members))


def test_balanced_join_then_static_restart_without_rebalance() -> None:
    run_with_coordinator(_join_then_restart)


async def _join_then_restart(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 12)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, "i-a")
    b = member(coordinator, "b", ledger, "i-b")
    async with a, b:
        await eventually(lambda: shared_evenly([a, b], 12))
        assert a.protocol == "cooperative"
        c = member(coordinator, "c", ledger, "i-c")
        async with c:
            await eventually(lambda: shared_evenly([a, b, c], 12), timeout_s=10)
            ledger.check()  # the join was handed over: never two owners
            # The group settles (the follow-up round echoes nothing).
            await asyncio.sleep(1.0)
            generation = a.generation_id
        held = set(ledger.revoked_or_lost("c"))
        since = loop_s()
        c2 = member(coordinator, "c2", ledger, "i-c")
        async with c2:
            assert c2.assignment == held
            await asyncio.sleep(0.5)
            assert a.generation_id == generation  # no rebalance
            assert ledger.count("a", "assigned", since) == 0
            assert ledger.count("a", "revoked", since) == 0
        ledger.check()
