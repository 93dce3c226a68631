"""What the application's other tasks see of ``assignment`` at a callback's edges.

A worker reads ``member.assignment`` and commits from tasks of its own, beside
the member's driver. The listener callbacks are where ownership changes hands,
so those tasks must never see it change anywhere else:

- a resource ``on_revoked`` gave up is out of ``assignment`` (and refused by
  ``commit``) from the moment the callback returns, as Kafka's consumer no
  longer owns a partition once ``onPartitionsRevoked`` returned; the member
  rejoins only after that, so a commit slipping into the gap would still be
  stored, after the application's final one;
- a resource is in ``assignment`` only once ``on_assigned`` has started for it
  (the subscription state changes right before the listener runs).

What holds the edges (``client/member.py``, ``client/member_state/driver.py``):
the runtime reports ``on_revoked``'s return before it stops the side-channel
task that ran beside the callback (an await), and a step that gives a call up
(its cancellation is awaited) decides nothing more, so no await falls between
the step that owns new resources and the ``on_assigned`` it ends with.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport
from virtual_time import in_process_coordinator, loop_ms, run_with_coordinator

from client import GroupMember, NotOwnedError, RebalanceListener, Resource
from coordinator.runtime.clock import FakeClock
from protocol.messages import Api

pytestmark = pytest.mark.timeout(30)


class Revoker(RebalanceListener):
    """Its ``on_revoked`` awaits (so the driver runs its side channel meanwhile),
    then, as its last act, starts a commit of what it revokes in a task of its
    own and schedules a look at ``assignment``: both run only after it returned."""

    def __init__(self) -> None:
        self.member: GroupMember | None = None
        self.revoked: list[set[Resource]] = []
        self.late_commits: list[asyncio.Future[None]] = []
        self.seen_after: list[frozenset[Resource]] = []

    async def on_revoked(self, resources: set[Resource]) -> None:
        member = self.member
        assert member is not None
        await asyncio.sleep(0)
        self.revoked.append(resources)
        self.late_commits.append(asyncio.ensure_future(
            member.commit(dict.fromkeys(resources, "late"))))
        asyncio.get_running_loop().call_soon(
            lambda: self.seen_after.append(member.assignment & frozenset(resources)))


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_what_on_revoked_gave_up_is_not_owned_once_it_returned(assignor: str) -> None:
    async def scenario(coordinator: InProcessCoordinator) -> None:
        await coordinator.put_resource("s", 6)
        listener = Revoker()
        settings: dict[str, Any] = dict(assignors=[assignor], session_timeout_ms=6_000,
                                        heartbeat_interval_ms=300, clock=loop_ms)
        a = GroupMember(coordinator.transport(), "g", ["s"], client_id="a",
                        listener=listener, **settings)
        listener.member = a
        async with a:
            assert len(a.assignment) == 6
            b = GroupMember(coordinator.transport(), "g", ["s"], client_id="b", **settings)
            async with b:
                while len(a.assignment) + len(b.assignment) != 6 or not b.assignment:
                    await asyncio.sleep(0.05)
        assert listener.revoked and listener.revoked[0]
        assert listener.seen_after == [frozenset()] * len(listener.revoked)
        for late in listener.late_commits:
            with pytest.raises(NotOwnedError):
                await late
        # The close revoked the rest the same way.
        assert listener.revoked[-1] and len(listener.late_commits) >= 2

    run_with_coordinator(scenario)


class Watcher(RebalanceListener):
    """What ``on_assigned`` has handed the application so far."""

    def __init__(self) -> None:
        self.handed: set[Resource] = set()

    def on_assigned(self, resources: set[Resource]) -> None:
        self.handed |= resources


class HeldSync(InProcessTransport):
    """Heartbeats are never answered; when one is cancelled, it records what
    ``assignment`` and the listener say at that moment (``probes``). The sync's
    answer is fetched at once but handed to the member only on ``release``."""

    def __init__(self, coordinator: InProcessCoordinator, watcher: Watcher) -> None:
        super().__init__(coordinator)
        self.watcher = watcher
        self.member: GroupMember | None = None
        self.release = asyncio.Event()
        self.sync_answered = asyncio.Event()
        self.heartbeats = 0
        self.probes: list[tuple[frozenset[Resource], frozenset[Resource]]] = []

    async def call(self, api: str, request: Any) -> Any:
        if api == Api.HEARTBEAT:
            self.heartbeats += 1
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                assert self.member is not None
                self.probes.append((self.member.assignment, frozenset(self.watcher.handed)))
                raise
        response = await super().call(api, request)
        if api == Api.SYNC:
            self.sync_answered.set()
            await self.release.wait()
        return response


async def test_an_assignment_is_not_visible_before_on_assigned_starts() -> None:
    clock = FakeClock()
    async with in_process_coordinator(clock) as coordinator:
        await coordinator.put_resource("s", 4)
        watcher = Watcher()
        net = HeldSync(coordinator, watcher)
        a = GroupMember(net, "g", ["s"], client_id="a", listener=watcher, clock=clock,
                        session_timeout_ms=6_000, heartbeat_interval_ms=300,
                        rebalance_timeout_ms=10_000)
        net.member = a
        a.start()
        try:
            # The join phase ends on the coordinator's timer; the sync's answer
            # is then held while the side channel heartbeats.
            while not net.sync_answered.is_set() or net.heartbeats == 0:
                clock.advance(50)
                for _ in range(20):
                    await asyncio.sleep(0)
            # Past the heartbeat's timeout (about half the session here), well
            # within the session, and the answer handed over at the same
            # instant: the driver wakes to both, gives the heartbeat up
            # (awaiting its cancellation, which runs the probe) and then
            # delivers the assignment.
            clock.advance(3_500)
            net.release.set()
            await asyncio.wait_for(a.wait_assigned(), 5)
            assert len(a.assignment) == 4
            # The heartbeat was given up (the scenario happened) and saw no
            # resource that on_assigned had not been called with.
            assert len(net.probes) == 1
            assert all(seen <= handed for seen, handed in net.probes), net.probes
        finally:
            closing = asyncio.ensure_future(a.close(timeout_s=30))
            while not closing.done():
                clock.advance(100)
                await asyncio.sleep(0.001)
            await closing
