"""The driver's waits go through its clock (client/clock.py).

A member given a clock with timers (``FakeClock``: time stands still until
the test advances it) does everything on that clock: its heartbeats, a
call's timeout, the side channel's heartbeat timeout, the safety deadline,
``wait_assigned``'s bound. Here two members and the coordinator's runtime
share one ``FakeClock`` on an ordinary event loop; minutes of the group's
time pass in well under a second of real time, and nothing happens until
the clock is moved. Before, the driver accepted only a function for a clock
and slept on the event loop's clock, so these waits took real time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from client_harness import InProcessCoordinator, InProcessTransport, Ledger
from virtual_time import in_process_coordinator

from client import GroupMember
from client.errors import CoordinatorUnavailableError
from client.member_state import MemberState
from coordinator.runtime.clock import FakeClock

pytestmark = pytest.mark.timeout(30)

SETTINGS: dict[str, Any] = dict(session_timeout_ms=6_000, rebalance_timeout_ms=10_000,
                                request_timeout_ms=20_000)


class Hangable(InProcessTransport):
    """``hang``: every call from now on is never answered (a network that
    swallows requests without resetting the connection)."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator)
        self.hang = False
        self.hung = 0

    async def call(self, api: str, request: Any) -> Any:
        if self.hang:
            self.hung += 1
            await asyncio.get_running_loop().create_future()
        return await super().call(api, request)


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def _advance(clock: FakeClock, ms: int, step_ms: int = 50) -> None:
    """Move the shared clock by ``ms``, letting the loop run every step."""
    for _ in range(ms // step_ms):
        clock.advance(step_ms)
        await _settle()


async def _group(coordinator: InProcessCoordinator, clock: FakeClock) -> tuple[
        dict[str, GroupMember], dict[str, Hangable], Ledger]:
    await coordinator.put_resource("shards", 8)
    ledger = Ledger()
    nets = {name: Hangable(coordinator) for name in "ab"}
    members = {name: GroupMember(nets[name], "g", ["shards"], listener=ledger.listener(name),
                                 client_id=name, clock=clock, **SETTINGS) for name in "ab"}
    return members, nets, ledger


async def test_a_group_on_a_fake_clock_moves_only_with_it() -> None:
    clock = FakeClock()
    started = time.monotonic()
    async with in_process_coordinator(clock) as coordinator:
        members, nets, ledger = await _group(coordinator, clock)
        try:
            for m in members.values():
                m.start()
            await _settle()
            # Nothing is due until the clock moves: the join phase completes as
            # the coordinator's rebalance timer (on the same clock) fires.
            await _advance(clock, 3_000)
            assert all(m.state is MemberState.STABLE for m in members.values())
            owned = {n: m.assignment for n, m in members.items()}
            assert len(owned["a"]) + len(owned["b"]) == 8 and owned["a"] and owned["b"]
            # A minute of heartbeats: nothing changes, nothing is lost.
            await _advance(clock, 60_000, step_ms=500)
            assert {n: m.assignment for n, m in members.items()} == owned
            assert ledger.count("a", "lost") == 0 and ledger.count("b", "lost") == 0

            # a's network swallows everything: its parked heartbeat times out on
            # the fake clock, its retries too; its safety deadline passes and it
            # calls on_lost; the coordinator expires its session and b gets all.
            # (Its heartbeat parked before the cut may still be answered: the last
            # proof is at most the cut's time, the deadline a session later.)
            nets["a"].hang = True
            cut = clock.now_ms()
            await _advance(clock, SETTINGS["session_timeout_ms"] + 100)
            assert clock.now_ms() > cut + SETTINGS["session_timeout_ms"]
            assert members["a"].assignment == frozenset()
            assert ledger.count("a", "lost") == 1
            assert nets["a"].hung >= 2  # the heartbeat that hung, and a retry after its timeout
            await _advance(clock, 2 * SETTINGS["session_timeout_ms"])
            assert len(members["b"].assignment) == 8

            # A user call is bounded on the same clock: fetch times out after
            # request_timeout_ms of fake time, not of real time.
            fetch = asyncio.ensure_future(members["a"].fetch())
            await _advance(clock, SETTINGS["request_timeout_ms"] - 100)
            assert not fetch.done()
            await _advance(clock, 200)
            assert fetch.done()
            with pytest.raises(CoordinatorUnavailableError, match="fetch: timed out"):
                fetch.result()

            # wait_assigned's bound is on the clock too: a new member whose joins
            # are never answered.
            net = Hangable(nets["a"].coordinator)
            net.hang = True
            members["c"] = GroupMember(net, "g", ["shards"], client_id="c", clock=clock, **SETTINGS)
            members["c"].start()
            waiting = asyncio.ensure_future(members["c"].wait_assigned(timeout_s=5))
            await _advance(clock, 4_900)
            assert not waiting.done()
            await _advance(clock, 200)
            with pytest.raises(TimeoutError):
                waiting.result()
            assert net.hung == 1  # its join, still awaited
        finally:
            nets["a"].hang = False
            closing = [asyncio.ensure_future(m.close(timeout_s=30)) for m in members.values()]
            while not all(c.done() for c in closing):
                await _advance(clock, 500)
            await asyncio.gather(*closing)
    # Well over two minutes of the group's time in a fraction of that in real time.
    assert time.monotonic() - started < 15


def test_a_clock_that_is_neither_a_function_nor_a_clock_is_refused() -> None:
    transport = InProcessTransport(InProcessCoordinator(None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clock must be a function returning milliseconds"):
        GroupMember(transport, "g", ["shards"], clock=5)  # type: ignore[arg-type]
