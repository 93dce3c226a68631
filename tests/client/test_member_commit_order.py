"""One member's commits reach the coordinator in call order (docs/client.md, ``commit``),
and ``GroupMember.safety_deadline_ms()`` says until when the member may work.

Against the real core and runtime in this process; the transport holds the
first commit back, as a slow connection would. The deadline's test runs in
virtual time (``virtual_time.py``): it waits for a session to run out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport, eventually
from virtual_time import loop_ms, run_with_coordinator

from client import GroupMember, RebalanceListener, Resource
from client.errors import CoordinatorUnavailableError
from protocol.messages import CommitRequest

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = dict(session_timeout_ms=600, heartbeat_interval_ms=150,
                            rebalance_timeout_ms=3_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100)


class HoldFirstCommit(InProcessTransport):
    """Holds the first commit until ``release`` is set; records commits as they arrive."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator)
        self.release = asyncio.Event()
        self.arrived: list[Any] = []
        self.held = asyncio.Event()

    async def call(self, api: str, request: Any) -> Any:
        if api == "commit":
            assert isinstance(request, CommitRequest)
            if not self.held.is_set():
                self.held.set()
                await self.release.wait()
            self.arrived.append(request.checkpoints[0][2])
        return await super().call(api, request)


async def test_two_concurrent_commits_of_one_resource_apply_in_call_order(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 1)
    transport = HoldFirstCommit(coordinator)
    async with GroupMember(transport, "g", ["s"], **FAST) as member:
        first = asyncio.ensure_future(member.commit({("s", 0): "first"}))
        await asyncio.wait_for(transport.held.wait(), 5)
        second = asyncio.ensure_future(member.commit({("s", 0): "second"}))
        await asyncio.sleep(0.05)
        # The second commit did not overtake the first: it has not been sent.
        assert transport.arrived == [] and not second.done()
        transport.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert transport.arrived == ["first", "second"]
        assert await member.fetch() == {("s", 0): "second"}


class FailFirstCommit(InProcessTransport):
    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator)
        self.commits = 0

    async def call(self, api: str, request: Any) -> Any:
        if api == "commit":
            self.commits += 1
            if self.commits == 1:
                await asyncio.sleep(0.05)
                raise CoordinatorUnavailableError("commit: cut (test)")
        return await super().call(api, request)


async def test_a_failed_commit_does_not_block_the_next(
        coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 1)
    transport = FailFirstCommit(coordinator)
    async with GroupMember(transport, "g", ["s"], **FAST) as member:
        first = asyncio.ensure_future(member.commit({("s", 0): 1}))
        second = asyncio.ensure_future(member.commit({("s", 0): 2}))
        results = await asyncio.wait_for(asyncio.gather(first, second,
                                                        return_exceptions=True), 5)
        assert isinstance(results[0], CoordinatorUnavailableError)
        assert results[1] is None
        assert await member.fetch() == {("s", 0): 2}


def test_safety_deadline_is_renewed_by_the_coordinator_and_ends_ownership() -> None:
    run_with_coordinator(_safety_deadline)


async def _safety_deadline(coordinator: InProcessCoordinator) -> None:
    await coordinator.put_resource("s", 2)
    lost_at: list[int] = []

    class Listener(RebalanceListener):
        def on_lost(self, resources: set[Resource]) -> None:
            lost_at.append(loop_ms())

    transport = coordinator.transport()
    member = GroupMember(transport, "g", ["s"], listener=Listener(), clock=loop_ms, **FAST)
    assert member.safety_deadline_ms() is None  # owns nothing yet
    async with member:
        now = loop_ms()
        first = member.safety_deadline_ms()
        assert first is not None
        # At most one session timeout ahead: the coordinator may expire the member then.
        assert now < first <= now + FAST["session_timeout_ms"]
        # Heartbeats answered push it later.
        await eventually(lambda: (member.safety_deadline_ms() or 0) > first, 5)
        # Cut off from the coordinator: the deadline stops moving, and the member
        # stops owning (on_lost) once it passes, not before.
        transport.partitioned = True
        await asyncio.sleep(0.2)  # any heartbeat in flight is answered or cut by now
        frozen = member.safety_deadline_ms()
        assert frozen is not None
        await eventually(lambda: bool(lost_at), 5)
        assert lost_at[0] >= frozen
        assert member.assignment == frozenset()
        assert member.safety_deadline_ms() is None
        transport.partitioned = False
        await member.wait_assigned(5)
        await eventually(lambda: bool(member.assignment), 5)
