"""Hand-overs that must end before the resources move, with exact timing.

The seeded chaos runs (tests/chaos, benchmarks/chaos.py) and the simulator
(tests/sim) find problems by chance; these pin down the interleavings that
matter most for exclusive ownership, each deterministically. The real
member (driver, machine) and the real runtime and core in virtual time
(these once ran against the real server for ~5 s of real time each);
the lost calls never reach the coordinator, so the HTTP layer has no part
in them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport
from virtual_time import in_process_coordinator, loop_ms, loop_s, run_virtual

from client.errors import CoordinatorUnavailableError, GroupCoordError
from client.listener import RebalanceListener, Resource
from client.member import GroupMember

pytestmark = pytest.mark.timeout(60)


class Recorder(RebalanceListener):
    """Times of every callback, per resource: when ownership started and ended."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, frozenset[Resource]]] = []

    def on_assigned(self, resources: set[Resource]) -> None:
        self.events.append((loop_s(), "assigned", frozenset(resources)))

    def on_revoked(self, resources: set[Resource]) -> None:
        self.events.append((loop_s(), "revoked", frozenset(resources)))

    def on_lost(self, resources: set[Resource]) -> None:
        self.events.append((loop_s(), "lost", frozenset(resources)))

    def first_assigned(self) -> tuple[float, frozenset[Resource]] | None:
        for t, kind, res in self.events:
            if kind == "assigned" and res:
                return t, res
        return None

    def released_at(self, r: Resource, after: float) -> float | None:
        for t, kind, res in self.events:
            if t >= after and kind in ("revoked", "lost") and r in res:
                return t
        return None


async def first_assignment(rec: Recorder, timeout_s: float = 15.0
                           ) -> tuple[float, frozenset[Resource]]:
    """When ``rec``'s member first got resources, and which (waits up to ``timeout_s``)."""
    deadline = loop_s() + timeout_s
    while rec.first_assigned() is None and loop_s() < deadline:
        await asyncio.sleep(0.02)
    first = rec.first_assigned()
    assert first is not None, "B never got anything"
    return first


def assert_released_first(rec_a: Recorder, first: tuple[float, frozenset[Resource]],
                          why: str) -> None:
    """Every resource B got first had been released by A by then (one owner at a time)."""
    t_b, moved = first
    for r in sorted(moved):
        released = rec_a.released_at(r, 0)
        assert released is not None and released <= t_b, (
            f"{r} given to B at {t_b:.3f} {why} (A released it at {released})")


class HangsCalls(InProcessTransport):
    """Calls of one API hang until healed, then fail (the network ate them):
    ``hang`` turns it on."""

    def __init__(self, coordinator: InProcessCoordinator, api: str) -> None:
        super().__init__(coordinator)
        self.api = api
        self.hang = False
        self.heal = asyncio.Event()

    async def call(self, api: str, request: Any) -> Any:
        if api == self.api and self.hang:
            await self.heal.wait()
            raise CoordinatorUnavailableError(f"{api}: connection reset (the test healed it)")
        return await super().call(api, request)


async def _join_lost() -> None:
    async with in_process_coordinator() as coordinator:
        await coordinator.put_resource("s", 4)
        settings: dict[str, Any] = dict(assignors=["cooperative-sticky"],
                                        session_timeout_ms=1_000, heartbeat_interval_ms=200,
                                        rebalance_timeout_ms=1_500, request_timeout_ms=3_000,
                                        clock=loop_ms)
        lossy = HangsCalls(coordinator, "join")
        rec_a, rec_b = Recorder(), Recorder()
        a = GroupMember(lossy, "g", ["s"], listener=rec_a, **settings)
        b = GroupMember(coordinator.transport(), "g", ["s"], listener=rec_b, **settings)
        a.start()
        try:
            assert len(await a.wait_assigned(10)) == 4
            lossy.hang = True
            b.start()
            first = await first_assignment(rec_b)
            assert_released_first(rec_a, first, "while A still owned it")
        finally:
            lossy.hang = False
            lossy.heal.set()
            await asyncio.gather(a.close(timeout_s=5), b.close(timeout_s=5),
                                 return_exceptions=True)


def test_a_member_whose_join_is_lost_gives_up_before_its_resources_move() -> None:
    """Cooperative member A owns everything; B joins; A learns of the
    rebalance from its heartbeat, but its join never reaches the coordinator.
    The coordinator removes A when the rebalance timeout runs out and gives
    its resources to B. A must have stopped owning them by then: its own
    rule (a session timeout after its last successful heartbeat was sent)
    says the coordinator may have expired it."""
    run_virtual(_join_lost)


class CommitsOnRevoke(Recorder):
    """The documented pattern: final checkpoints in on_revoked."""

    member: GroupMember | None = None

    async def on_revoked(self, resources: set[Resource]) -> None:  # type: ignore[override]
        assert self.member is not None
        with contextlib.suppress(GroupCoordError):  # refused or unanswered: hand over anyway
            await self.member.commit(dict.fromkeys(resources, 1))
        self.events.append((loop_s(), "revoked", frozenset(resources)))


async def _final_commit_stuck() -> None:
    async with in_process_coordinator() as coordinator:
        await coordinator.put_resource("s", 4)
        settings: dict[str, Any] = dict(assignors=["range"], session_timeout_ms=1_000,
                                        heartbeat_interval_ms=200, rebalance_timeout_ms=1_500,
                                        request_timeout_ms=10_000, clock=loop_ms)
        slow = HangsCalls(coordinator, "commit")
        rec_a, rec_b = CommitsOnRevoke(), Recorder()
        a = GroupMember(slow, "g", ["s"], listener=rec_a, **settings)
        rec_a.member = a
        b = GroupMember(coordinator.transport(), "g", ["s"], listener=rec_b, **settings)
        a.start()
        try:
            assert len(await a.wait_assigned(10)) == 4
            slow.hang = True
            b.start()
            first = await first_assignment(rec_b)
            await asyncio.sleep(0.5)
            slow.heal.set()
            await asyncio.sleep(0.2)
            assert_released_first(rec_a, first, "while A's on_revoked still ran")
        finally:
            slow.hang = False
            slow.heal.set()
            await asyncio.gather(a.close(timeout_s=5), b.close(timeout_s=5),
                                 return_exceptions=True)


def test_a_revocation_stuck_in_its_final_commit_ends_before_the_resources_move() -> None:
    """Chaos seed 45 (third run): eager member A is told to rebalance and runs
    on_revoked, whose final commit hangs behind a partition. The coordinator
    removes A when the rebalance timeout runs out and gives everything to B
    while A's on_revoked is still running: the hand-over ends after the new
    owner started. The member's own deadline had passed in the meantime; a
    commit after it can only be refused, so the library should not wait for
    one past it."""
    run_virtual(_final_commit_stuck)
