"""Drain and warm-up standbys through the real client, against the real
coordinator core and runtime in this process, in virtual time
(``virtual_time.py``): a draining member hands its resources over (through
standbys first when the assignor warms up), owns nothing, and leaves; a
standby is never owned (the ledger fails on it); every assignor drains.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport, Ledger, eventually, owners
from virtual_time import loop_ms, loop_s, run_with_coordinator

from client import GroupMember
from client.member_state import MemberState
from protocol.messages import HeartbeatResponse

pytestmark = pytest.mark.timeout(60)

SETTINGS: dict[str, Any] = dict(session_timeout_ms=3_000, heartbeat_interval_ms=300,
                                rebalance_timeout_ms=5_000, retry_backoff_ms=20,
                                retry_backoff_max_ms=100, clock=loop_ms)
WARMUP = {"balanced": {"warmup": True, "warmup_timeout_ms": 20_000, "round_delay_ms": 100}}


def member(coord: InProcessCoordinator, name: str, ledger: Ledger, assignor: str,
           warmup_s: float = 0.0, **settings: Any) -> GroupMember:
    listener = ledger.listener(name)
    listener.warmup_s = warmup_s
    return GroupMember(coord.transport(), "g", ["s"], client_id=name, assignors=[assignor],
                       listener=listener, assignor_settings=WARMUP, **{**SETTINGS, **settings})


def members_of(coordinator: InProcessCoordinator) -> list[str]:
    view = coordinator.runtime.core.describe_group("g")
    assert view is not None
    return [m.member_id for m in view.members]


def first(ledger: Ledger, member: str, kind: str, resource: tuple[str, int],
          since: float) -> float:
    return min(t for t, m, k, rs in ledger.events
               if t >= since and m == member and k == kind and resource in rs)


def test_drain_hands_over_through_warm_standbys_then_leaves() -> None:
    run_with_coordinator(_drain_with_warmup)


async def _drain_with_warmup(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 12)
    ledger = Ledger(clock=loop_s)
    a, b, c = (member(coordinator, n, ledger, "balanced", warmup_s=0.2) for n in "abc")
    async with a, b, c:
        await eventually(lambda: all(len(m.assignment) == 4 for m in (a, b, c)), 20)
        held = set(c.assignment)
        since = loop_s()
        assert await c.drain(timeout_s=30) is True
        assert c.state is MemberState.CLOSED and c.assignment == frozenset()
        await eventually(lambda: len(owners([a, b])) == 12, 10)
        assert set(owners([a, b]).values()) == {1}
        # Each resource c held was warmed by its new owner before it was assigned.
        for r in held:
            new = "a" if r in a.assignment else "b"
            assert first(ledger, new, "standby", r, since) < first(ledger, new, "assigned", r,
                                                                   since)
        # Nothing c held moved while c was warming nothing up: c kept serving
        # until each new owner was warm (0.2 s per resource), then revoked.
        revoked = [t for t, m, k, _ in ledger.events if m == "c" and k == "revoked"]
        assert revoked and min(revoked) >= since + 0.2
        assert not a.standby and not b.standby
        ledger.check()
        assert c.member_id not in members_of(coordinator)


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range", "roundrobin", "sticky",
                                      "balanced"])
def test_every_assignor_drains(assignor: str) -> None:
    """A draining member is given nothing new by every assignor (the leader shows
    one that ignores ``draining`` a member subscribed to nothing another member
    takes), so its drain ends: it owns nothing and leaves."""

    async def scenario(coordinator: InProcessCoordinator) -> None:
        await coordinator.put_resource("s", 9)
        ledger = Ledger(clock=loop_s)
        a, b, c = (member(coordinator, n, ledger, assignor) for n in "abc")
        async with a, b, c:
            await eventually(lambda: all(len(m.assignment) == 3 for m in (a, b, c)), 20)
            assert await c.drain(timeout_s=30) is True
            assert c.assignment == frozenset() and c.state is MemberState.CLOSED
            await eventually(lambda: len(owners([a, b])) == 9, 10)
            ledger.check()

    run_with_coordinator(scenario)


def test_drain_staying_idle_gets_nothing_new() -> None:
    run_with_coordinator(_drain_and_stay)


async def _drain_and_stay(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 6)
    ledger = Ledger(clock=loop_s)
    a, b = (member(coordinator, n, ledger, "cooperative-sticky") for n in "ab")
    async with a, b:
        await eventually(lambda: len(a.assignment) == 3 == len(b.assignment), 20)
        assert await b.drain(leave=False, timeout_s=30) is True
        # It owns nothing and stays (the rebalance that hands its last
        # resources on may still be completing).
        assert b.assignment == frozenset() and b.state is not MemberState.CLOSED
        await eventually(lambda: len(a.assignment) == 6, 10)
        await eventually(lambda: b.state is MemberState.STABLE, 10)
        assert b.assignment == frozenset()
        # A later rebalance (a new member) gives the idle member nothing either.
        c = member(coordinator, "c", ledger, "cooperative-sticky")
        async with c:
            await eventually(lambda: len(c.assignment) == 3 == len(a.assignment), 20)
            assert b.assignment == frozenset() and b.draining
        ledger.check()


def test_a_drain_that_times_out_closes() -> None:
    """The only member drains: nobody can take its resources, so the drain
    times out and gives them up the way a plain close does."""
    run_with_coordinator(_drain_times_out)


async def _drain_times_out(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 3)
    ledger = Ledger(clock=loop_s)
    a = member(coordinator, "a", ledger, "cooperative-sticky")
    async with a:
        await eventually(lambda: len(a.assignment) == 3, 20)
        started = loop_s()
        assert await a.drain(timeout_s=2) is False
        assert loop_s() - started == pytest.approx(2, abs=0.5)
        assert a.state is MemberState.CLOSED
        assert ledger.revoked_or_lost("a") == {("s", i) for i in range(3)}


def test_a_long_warm_up_holds_up_no_rebalance() -> None:
    """``on_standby`` runs beside the member's steps: a warm-up far longer than
    the rebalance timeout neither delays the group's rebalances meanwhile nor
    gets the warming member expelled."""
    run_with_coordinator(_long_warmup)


async def _long_warmup(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 6)
    ledger = Ledger(clock=loop_s)
    a, b = (member(coordinator, n, ledger, "balanced", warmup_s=10.0) for n in "ab")
    async with a:
        await eventually(lambda: len(a.assignment) == 6, 20)
        async with b:  # b joins: its share goes to it as standbys, 30 s of warm-up
            await eventually(lambda: len(b.standby) == 3, 10)
            generation = b.generation_id
            started = loop_s()
            c = member(coordinator, "c", ledger, "balanced")
            async with c:  # a rebalance while b warms up: not held up by it
                assert loop_s() - started < 3
                assert b.generation_id > generation and c.generation_id == b.generation_id
                assert ledger.count("b", "lost") == 0 and b.standby
            await eventually(lambda: len(b.assignment) == 3 == len(a.assignment), 60)
        ledger.check()


class AskToDrain(InProcessTransport):
    """The coordinator's side of an operator's drain, as the member sees it:
    once ``ask`` is set, heartbeat answers carry ``drain: true``."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator)
        self.ask = False

    async def call(self, api: str, request: Any) -> Any:
        response = await super().call(api, request)
        if self.ask and isinstance(response, HeartbeatResponse):
            return dataclasses.replace(response, drain=True)
        return response


def test_a_heartbeat_answer_asking_to_drain_drains_the_member_and_it_leaves() -> None:
    run_with_coordinator(_asked_to_drain)


async def _asked_to_drain(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 6)
    ledger = Ledger(clock=loop_s)
    transport = AskToDrain(coordinator)
    a = member(coordinator, "a", ledger, "cooperative-sticky")
    b = GroupMember(transport, "g", ["s"], client_id="b", assignors=["cooperative-sticky"],
                    listener=ledger.listener("b"), **SETTINGS)
    async with a, b:
        await eventually(lambda: len(a.assignment) == 3 == len(b.assignment), 20)
        transport.ask = True
        await asyncio.wait_for(b.wait_closed(), 30)  # drained, left, stopped on its own
        assert b.draining and b.assignment == frozenset() and b.failure is None
        await eventually(lambda: len(a.assignment) == 6, 10)
        assert b.member_id not in members_of(coordinator)
        ledger.check()
