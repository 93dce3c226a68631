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
from protocol.catalog import Weights, Zones

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


def test_the_catalogs_weights_and_home_zones_reach_the_balanced_assignor() -> None:
    """Weights and zones set in the catalog (as ``PUT /v1/resources`` sets them) are
    what the leader's ``balanced`` assignor places by: the heavy resource is alone
    on one member, and each resource homed in a zone goes to that zone's member."""
    run_with_coordinator(_weights_and_zones)


async def _weights_and_zones(coordinator: InProcessCoordinator) -> None:
    # 0 weighs as much as 1..5 together; 1 and 2 live in zone z-b.
    await coordinator.put_resource(
        "s", 6, Weights(1.0, ((0, 5.0),)), Zones(None, ((1, ("z-b",)), (2, ("z-b",)))))
    ledger = Ledger(clock=loop_s)
    a = GroupMember(coordinator.transport(), "g", ["s"], client_id="a", rack="z-a",
                    assignors=["balanced"], listener=ledger.listener("a"), **SLOW_SESSION)
    b = GroupMember(coordinator.transport(), "g", ["s"], client_id="b", rack="z-b",
                    assignors=["balanced"], listener=ledger.listener("b"), **SLOW_SESSION)
    async with a, b:
        await eventually(lambda: len(owners([a, b])) == 6, timeout_s=10)
        await asyncio.sleep(1.0)  # settled
        heavy_owner, other = (a, b) if ("s", 0) in a.assignment else (b, a)
        assert heavy_owner.assignment == {("s", 0)}
        assert {("s", 1), ("s", 2)} <= b.assignment
        assert other.assignment == {("s", i) for i in range(1, 6)}
    ledger.check()


def test_a_member_whose_measured_load_leaves_its_band_rejoins_and_is_rebalanced() -> None:
    """``report_load``: the loads go to the leader with the next join; a member whose
    measured total leaves the band the leader gave it rejoins (cooperatively), at
    most once per ``load_rejoin_interval_ms``, and ``balanced`` moves by the loads."""
    run_with_coordinator(_load_report)


async def _load_report(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 4)
    ledger = Ledger(clock=loop_s)
    a = GroupMember(coordinator.transport(), "g", ["s"], client_id="a", capacity=1.0,
                    assignors=["balanced"], listener=ledger.listener("a"), **SLOW_SESSION)
    b = GroupMember(coordinator.transport(), "g", ["s"], client_id="b", capacity=1.0,
                    assignors=["balanced"], listener=ledger.listener("b"), **SLOW_SESSION)
    async with a, b:
        await eventually(lambda: len(a.assignment) == 2 and len(b.assignment) == 2,
                         timeout_s=10)
        await asyncio.sleep(1.0)  # settled
        generation = a.generation_id
        with pytest.raises(ValueError, match="finite number"):
            a.report_load({next(iter(a.assignment)): float("nan")})
        hot, cold = sorted(a.assignment)
        # Within its band (2 resources of weight 1): nothing happens.
        assert a.report_load({hot: 1.0, cold: 1.1}) is False
        assert a.generation_id == generation
        # One of its resources is now ten times as busy: out of the band, it rejoins.
        assert a.report_load({hot: 10.0, cold: 1.0}) is True
        # A second report at once does not make it rejoin again (rate-limited).
        assert a.report_load({hot: 12.0, cold: 1.0}) is False
        # balanced places by the measured load: the hot resource ends up alone.
        await eventually(lambda: any(m.assignment == {hot} for m in (a, b)), timeout_s=10)
        other = b if a.assignment == {hot} else a
        assert other.assignment == {("s", i) for i in range(4)} - {hot}
        assert a.generation_id > generation
    ledger.check()


def test_a_static_member_that_restarts_with_a_new_capacity_gets_its_share() -> None:
    """A static member restarted with another ``capacity`` is a changed
    subscription (KIP-345's rule, on what ``balanced`` places by): the group
    rebalances and the member gets the share its capacity says."""
    run_with_coordinator(_restart_with_capacity)


async def _restart_with_capacity(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 12)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, "i-a")
    b = member(coordinator, "b", ledger, "i-b")
    async with a:
        async with b:
            await eventually(lambda: shared_evenly([a, b], 12))
            await asyncio.sleep(1.0)  # settled
            generation = a.generation_id
        # b stopped without leaving (static); a still holds its half.
        b2 = GroupMember(coordinator.transport(), "g", ["s"], client_id="b2",
                         group_instance_id="i-b", capacity=3.0, assignors=["balanced"],
                         listener=ledger.listener("b2"), **SLOW_SESSION)
        async with b2:
            await eventually(lambda: len(b2.assignment) == 9 and len(a.assignment) == 3,
                             timeout_s=10)
            assert a.generation_id > generation
    ledger.check()
