"""``member.assignment`` after the safety deadline.

A worker paused past its session (SIGSTOP) and continued reads
``member.assignment`` before its event loop ran ``on_lost``: it must not see
the resources the group may already have given to another member. The
member's clock is moved past the deadline while the driver cannot run (no
``await`` in between; for ``BlockingGroupMember`` the member thread is held
in a callback), and the assignment read then is empty.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, admin_put_resource, eventually

from client import BlockingGroupMember, GroupMember, RebalanceListener, Resource
from client.member import monotonic_ms
from client.member_state import MemberConfig, MemberStateMachine
from client.transport import CatalogResponse
from protocol.messages import JoinResponse, SyncResponse
from protocol.resources import ResourceAssignment

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = dict(session_timeout_ms=600, heartbeat_interval_ms=150,
                            rebalance_timeout_ms=3_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100)


class SkewedClock:
    """The member's monotonic clock, plus a jump the test makes (a pause)."""

    def __init__(self) -> None:
        self.jump_ms = 0

    def __call__(self) -> int:
        return monotonic_ms() + self.jump_ms


async def test_assignment_is_empty_past_the_deadline_before_the_driver_runs(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 4)
    ledger = Ledger()
    clock = SkewedClock()
    member = GroupMember(coordinator.transport(), "g", ["s"], listener=ledger.listener("a"),
                         clock=clock, **FAST)
    member.start()
    try:
        await member.wait_assigned(10)
        assert len(member.assignment) == 4
        deadline = member.safety_deadline_ms()
        assert deadline is not None
        # The process "was paused" until just past its deadline; nothing ran since.
        clock.jump_ms = deadline - monotonic_ms()
        assert member.assignment == frozenset()
        assert ledger.count("a", "lost") == 0  # on_lost has not run: the read alone decides
        await eventually(lambda: ledger.count("a", "lost") == 1, 5)
    finally:
        await member.close()


async def test_assignment_is_kept_just_before_the_deadline(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    clock = SkewedClock()
    member = GroupMember(coordinator.transport(), "g", ["s"], clock=clock, **FAST)
    member.start()
    try:
        await member.wait_assigned(10)
        deadline = member.safety_deadline_ms()
        assert deadline is not None
        clock.jump_ms = deadline - 1 - monotonic_ms()
        assert len(member.assignment) == 2
    finally:
        await member.close()


def test_the_machine_answers_by_the_clock_it_is_given() -> None:
    m = MemberStateMachine(MemberConfig("g", ["s"], session_timeout_ms=1_000,
                                        rebalance_timeout_ms=5_000), rng=lambda: 0.5)
    m.next_action(0)
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "m1", "m1"))
    m.next_action(0)  # the catalog read (the leader)
    m.receive(0, CatalogResponse(1, {"s": 2}))
    m.next_action(0)
    m.receive(0, SyncResponse(None, "resources", "cooperative-sticky",
                              ResourceAssignment(assigned={"s": [0, 1]}).encode()))
    m.next_action(0)  # on_assigned
    m.listener_done(0)
    assert m.owned_at(999) == {("s", 0), ("s", 1)}
    assert m.owned_at(1_000) == frozenset()  # the session bound
    assert m.owned == {("s", 0), ("s", 1)}  # on_lost has not been emitted yet


def test_blocking_member_assignment_is_empty_past_the_deadline(start_server: Any,
                                                               tmp_path: Path) -> None:
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 3)
    in_callback = threading.Event()
    release = threading.Event()

    class Stuck(RebalanceListener):
        """Holds the member thread (and its event loop) in on_assigned."""

        def on_assigned(self, resources: set[Resource]) -> None:
            if resources:
                in_callback.set()
                release.wait(30)

    clock = SkewedClock()
    member = BlockingGroupMember(server.url, "g", ["s"], listener=Stuck(), clock=clock,
                                 **FAST)
    try:
        member.start(wait_assigned=False)
        assert in_callback.wait(20)
        assert len(member.assignment) == 3  # owned while on_assigned runs
        deadline = member.member.safety_deadline_ms()
        assert deadline is not None
        clock.jump_ms = deadline - monotonic_ms()
        # The member thread is still in the callback: its loop cannot have run.
        assert member.assignment == frozenset()
    finally:
        release.set()
        time.sleep(0.05)
        member.close(timeout_s=10)
    assert server.terminate() == 0
