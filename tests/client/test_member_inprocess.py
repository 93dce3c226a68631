"""GroupMember (the asyncio driver) against the real coordinator core and
runtime in this process, through the in-memory transport: whole flows on the
wall clock with small timeouts; in virtual time (``virtual_time.py``, members
on the loop's clock) those that wait for sessions to run out, and those that
assert exactly what a rebalance revokes: on the wall clock, a stall of the
test process longer than the session timeout turns a revocation into a loss."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, eventually, owners
from prometheus_client import CollectorRegistry
from virtual_time import loop_ms, loop_s, run_with_coordinator

from client import (
    FencedInstanceIdError,
    GroupMaxSizeReachedError,
    GroupMember,
    InconsistentGroupProtocolError,
    NotOwnedError,
    RebalanceListener,
    Resource,
)

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = dict(session_timeout_ms=600, heartbeat_interval_ms=150,
                            rebalance_timeout_ms=3_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100)


def member(coord: InProcessCoordinator, name: str, ledger: Ledger | None = None,
           sets: tuple[str, ...] = ("s",), group: str = "g", **kw: Any) -> GroupMember:
    settings = {**FAST, **kw}
    return GroupMember(coord.transport(), group, list(sets), client_id=name,
                       listener=ledger.listener(name) if ledger else None, **settings)


def settled(members: list[GroupMember], total: int) -> bool:
    c = owners(members)
    return len(c) == total and all(v == 1 for v in c.values()) and all(
        m.assignment for m in members)


async def test_single_member_gets_everything_commits_and_fetches(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 4)
    ledger = Ledger()
    async with member(coordinator, "a", ledger) as m:
        assert m.assignment == {("s", i) for i in range(4)}
        assert m.is_leader
        assert m.protocol == "cooperative"
        await m.commit({("s", 1): b"offset-42", ("s", 2): 7})
        assert await m.fetch() == {("s", 1): b"offset-42", ("s", 2): 7}
        assert await m.fetch([("s", 2)]) == {("s", 2): 7}
        with pytest.raises(NotOwnedError):
            await m.commit({("s", 9): 1})
    assert ledger.events[-1][2] == "revoked"  # close revokes
    assert ledger.check() == {}


async def test_final_commit_from_on_revoked_during_close_is_stored(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    holder: list[GroupMember] = []

    class CommitOnRevoke(RebalanceListener):
        async def on_revoked(self, resources: set[Resource]) -> None:
            await holder[0].commit(dict.fromkeys(resources, b"final"))

    m = GroupMember(coordinator.transport(), "g", ["s"], listener=CommitOnRevoke(), **FAST)
    holder.append(m)
    async with m:
        pass
    assert m.failure is None
    reader = member(coordinator, "reader", group="g")
    async with reader:
        assert await reader.fetch() == {("s", 0): b"final", ("s", 1): b"final"}


def test_cooperative_newcomer_takes_a_share_without_double_ownership() -> None:
    run_with_coordinator(_cooperative_newcomer)


async def _cooperative_newcomer(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 12)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, clock=loop_ms)
    async with a:
        assert len(a.assignment) == 12
        before = a.assignment
        b = member(coordinator, "b", ledger, clock=loop_ms)
        async with b:
            await eventually(lambda: settled([a, b], 12))
            assert len(a.assignment) == 6 and len(b.assignment) == 6
            # a revoked exactly what moved, never what it kept
            assert ledger.revoked_or_lost("a") == before - a.assignment
            assert ledger.check() == {**dict.fromkeys(a.assignment, "a"),
                                      **dict.fromkeys(b.assignment, "b")}
            assert a.metrics.rebalances >= 2  # the first, and the one with its revocation


async def test_eager_revokes_everything_on_each_rebalance(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 6)
    ledger = Ledger()
    a = member(coordinator, "a", ledger, assignors=["range"])
    async with a:
        assert a.protocol == "eager"
        b = member(coordinator, "b", ledger, assignors=["range"])
        async with b:
            await eventually(lambda: settled([a, b], 6))
            assert ledger.revoked_or_lost("a") == {("s", i) for i in range(6)}
            ledger.check()


async def test_listener_exceptions_are_logged_and_counted_never_fatal(
        coordinator: InProcessCoordinator, caplog: pytest.LogCaptureFixture) -> None:
    await coordinator.put_resource("s", 2)

    class Broken(RebalanceListener):
        def on_assigned(self, resources: set[Resource]) -> None:  # a plain function works too
            raise ValueError("bug in the worker")

    m = GroupMember(coordinator.transport(), "g", ["s"], listener=Broken(), **FAST)
    with caplog.at_level(logging.ERROR, logger="groupcoord.client"):
        async with m:
            assert m.assignment == {("s", 0), ("s", 1)}
            assert m.metrics.callback_errors == 1
            value = m.registry.get_sample_value(
                "groupcoord_client_callback_errors_total",
                {"group_id": "g", "client_id": m.client_id, "callback": "assigned"})
            assert value == 1.0
            await asyncio.sleep(0.4)  # keeps heartbeating
            assert m.failure is None
    assert "on_assigned raised" in caplog.text


async def test_inconsistent_protocol_surfaces_as_an_exception(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    async with member(coordinator, "a", assignors=["cooperative-sticky"]):
        other = member(coordinator, "b", assignors=["range"])
        with pytest.raises(InconsistentGroupProtocolError):
            async with other:
                pass
        assert isinstance(other.failure, InconsistentGroupProtocolError)


async def test_group_max_size_surfaces_as_an_exception(make_coordinator: Any) -> None:
    coord = await make_coordinator(group_max_size=1)
    await coord.put_resource("s", 2)
    async with member(coord, "a"):
        with pytest.raises(GroupMaxSizeReachedError):
            async with member(coord, "b"):
                pass


async def test_fenced_static_member_loses_everything_and_stops(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 3)
    ledger = Ledger()
    old = member(coordinator, "old", ledger, group_instance_id="worker-1")
    await old.__aenter__()
    assert len(old.assignment) == 3
    # A second process starts with the same instance id (the first is a zombie).
    new = member(coordinator, "new", ledger, group_instance_id="worker-1")
    new.start()
    with pytest.raises(FencedInstanceIdError):
        await asyncio.wait_for(old.wait_closed(), 5)
    assert ledger.count("old", "lost") == 1
    await new.wait_assigned(5)
    assert len(new.assignment) == 3
    ledger.check()
    await new.close()
    with pytest.raises(FencedInstanceIdError):
        await old.__aexit__(None, None, None)


def test_a_partitioned_member_stops_on_its_own_before_the_move() -> None:
    run_with_coordinator(_partitioned)


async def _partitioned(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 8)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, clock=loop_ms)
    b = member(coordinator, "b", ledger, clock=loop_ms)
    async with a, b:
        await eventually(lambda: settled([a, b], 8))
        transport = a._transport
        assert hasattr(transport, "partitioned")
        cut_at = loop_s()
        transport.partitioned = True
        await eventually(lambda: len(b.assignment) == 8, timeout_s=10)
        lost_at = [t for t, m, k, _ in ledger.events if m == "a" and k == "lost"]
        assert lost_at, "the partitioned member never called on_lost"
        assert lost_at[0] - cut_at < 0.6 + 0.3  # within about a session timeout
        ledger.check()  # b got a's resources only after a called on_lost
        transport.partitioned = False
        await eventually(lambda: settled([a, b], 8), timeout_s=10)
        ledger.check()


def test_static_member_restart_gets_its_resources_back_without_rebalance() -> None:
    run_with_coordinator(_static_restart)


async def _static_restart(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 8)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, group_instance_id="i-a", session_timeout_ms=3_000,
               heartbeat_interval_ms=300, clock=loop_ms)
    b = member(coordinator, "b", ledger, group_instance_id="i-b", session_timeout_ms=3_000,
               heartbeat_interval_ms=300, clock=loop_ms)
    async with a:
        async with b:
            await eventually(lambda: settled([a, b], 8))
        held = {r for r in ledger.revoked_or_lost("b")}
        generation = a.generation_id
        since = loop_s()
        b2 = member(coordinator, "b2", ledger, group_instance_id="i-b",
                    session_timeout_ms=3_000, heartbeat_interval_ms=300, clock=loop_ms)
        async with b2:
            assert b2.assignment == held
            await asyncio.sleep(0.5)
            assert a.generation_id == generation  # no rebalance
            assert ledger.count("a", "assigned", since) == 0
            assert ledger.count("a", "revoked", since) == 0
        ledger.check()


async def test_catalog_change_is_assigned_after_the_leader_rejoins(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    a = member(coordinator, "a", sets=("s", "t"))
    b = member(coordinator, "b", sets=("s", "t"))
    async with a, b:
        await eventually(lambda: settled([a, b], 2))
        await coordinator.put_resource("t", 4)
        await eventually(lambda: settled([a, b], 6), timeout_s=10)


def test_subscription_change_revokes_and_rejoins() -> None:
    run_with_coordinator(_subscription_change)


async def _subscription_change(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    await coordinator.put_resource("t", 2)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, sets=("s", "t"), clock=loop_ms)
    async with a:
        assert len(a.assignment) == 4
        await a.subscribe(["s"])
        await eventually(lambda: a.assignment == {("s", 0), ("s", 1)})
        assert ledger.revoked_or_lost("a") == {("t", 0), ("t", 1)}


async def test_metrics_go_to_a_private_registry_per_member(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    a, b = member(coordinator, "a"), member(coordinator, "b")
    async with a, b:
        await eventually(lambda: settled([a, b], 2))
        assert a.registry is not b.registry
        labels = {"group_id": "g", "client_id": "a"}
        assert (a.registry.get_sample_value("groupcoord_client_rebalances_total", labels)
                or 0) >= 1
        ago = a.registry.get_sample_value("groupcoord_client_last_rebalance_seconds_ago", labels)
        assert ago is not None and 0 <= ago < 10
        assert (a.registry.get_sample_value("groupcoord_client_rebalance_rate_per_hour",
                                            labels) or 0) >= 1
        assert (a.registry.get_sample_value(
            "groupcoord_client_rebalance_latency_seconds_count", labels) or 0) >= 1


async def test_members_may_share_one_registry(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    shared = CollectorRegistry()
    a = member(coordinator, "a", registry=shared)
    b = member(coordinator, "b", registry=shared)
    async with a, b:
        await eventually(lambda: settled([a, b], 2))
        for name in ("a", "b"):
            assert shared.get_sample_value("groupcoord_client_owned_resources",
                                           {"group_id": "g", "client_id": name}) == 1


async def test_close_from_inside_a_callback_does_not_deadlock(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 1)
    holder: list[GroupMember] = []

    class CloseOnAssign(RebalanceListener):
        async def on_assigned(self, resources: set[Resource]) -> None:
            await holder[0].close()

    m = GroupMember(coordinator.transport(), "g", ["s"], listener=CloseOnAssign(), **FAST)
    holder.append(m)
    m.start()
    await asyncio.wait_for(m.wait_closed(), 5)
    assert m.assignment == frozenset()


def test_two_rolling_bounces_from_range_to_cooperative_sticky() -> None:
    """KIP-429's upgrade path: bounce 1 to ["range", "cooperative-sticky"]
    (still eager, range chosen), bounce 2 to ["cooperative-sticky"] (members
    turn cooperative one by one while the rest are eager); never two owners."""
    run_with_coordinator(_two_rolling_bounces)


async def _two_rolling_bounces(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 12)
    ledger = Ledger(clock=loop_s)
    names = ["a", "b", "c"]
    members = {n: member(coordinator, n, ledger, assignors=["range"], clock=loop_ms) for n in names}
    for m in members.values():
        m.start()
    await eventually(lambda: settled(list(members.values()), 12))
    bounce = 0
    for config, protocol in ((["range", "cooperative-sticky"], "eager"),
                             (["cooperative-sticky"], "cooperative")):
        for n in names:
            await members[n].close()
            ledger.check()
            bounce += 1
            fresh = member(coordinator, f"{n}{bounce}", ledger, assignors=config,
                           clock=loop_ms)
            assert fresh.protocol == protocol
            members[n] = fresh
            fresh.start()
            await eventually(lambda: settled(list(members.values()), 12), timeout_s=15)
            ledger.check()
        chosen = {m._machine.protocol_name for m in members.values()}
        assert chosen == {config[0]}
    # Fully cooperative now: a newcomer takes a share; the others keep the rest.
    since = loop_s()
    before = {n: m.assignment for n, m in members.items()}
    newcomer = member(coordinator, "d", ledger, clock=loop_ms)
    newcomer.start()
    everyone = [*members.values(), newcomer]
    await eventually(lambda: settled(everyone, 12), timeout_s=15)
    for n, m in members.items():
        assert ledger.revoked_or_lost(m.client_id, since) == before[n] - m.assignment
    ledger.check()
    for m in everyone:
        await m.close()
    assert ledger.check() == {}
