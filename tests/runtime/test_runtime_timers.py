"""The runtime's lazy timers: re-arming later only records the deadline.

What a user relies on: a member's session expires exactly one session timeout
after its last heartbeat, never earlier and never lost, however many
heartbeats pushed the deadline before; a timer re-armed for an earlier
deadline fires at that deadline; a cancelled timer never reaches the core;
stopping leaves no loop timer behind. And the point of laziness: heartbeats
do not create a loop timer each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from coordinator.core.commands import Command, Heartbeat, Join, Sync, TimerFired
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import CancelTimer, Effect, ScheduleTimer
from coordinator.core.records import Record, Snapshot
from coordinator.core.views import GroupSummary, GroupView
from coordinator.metrics import Metrics
from coordinator.runtime.clock import FakeClock, TimerHandle
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatRequest,
    JoinRequest,
    JoinResponse,
    SyncAssignment,
    SyncRequest,
)

T0 = 1_700_000_000_000
POKE = "poke"  # a command key that only makes the scripted core emit its next effects


class ScriptedCore:
    """A core whose effects the test dictates; records the timer firings it gets."""

    def __init__(self) -> None:
        self.next_effects: list[Effect] = []
        self.fired: list[tuple[int, str]] = []

    def handle(self, now_ms: int, command: Command) -> list[Effect]:
        if isinstance(command, TimerFired) and command.key != POKE:
            self.fired.append((now_ms, command.key))
            return []
        effects, self.next_effects = self.next_effects, []
        return effects

    def restore(self, snapshot: Snapshot, now_ms: int) -> list[Effect]:
        return []

    def state_counts(self) -> Mapping[str, int]:
        return {}

    def member_count(self) -> int:
        return 0

    def list_groups(self) -> Sequence[GroupSummary]:
        return []

    def describe_group(self, group_id: str) -> GroupView | None:
        return None

    def parked_request_count(self) -> int:
        return 0

    def parked_by(self, principal: str) -> int:
        return 0

    def catalog(self) -> Mapping[str, int]:
        return {}

    @property
    def resources_epoch(self) -> int:
        return 0


class CountingClock(FakeClock):
    """A fake clock that counts the loop timers created."""

    def __init__(self, now_ms: int) -> None:
        super().__init__(now_ms)
        self.created = 0

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        self.created += 1
        return super().call_at(deadline_ms, callback)


class NoStorage:
    async def load(self) -> Snapshot:
        return Snapshot()

    async def write(self, records: Sequence[Record]) -> float:
        raise AssertionError("nothing is persisted in these tests")

    def check(self) -> None:
        """No file, nothing to find replaced."""


async def scripted() -> tuple[Runtime, ScriptedCore, CountingClock]:
    core, clock = ScriptedCore(), CountingClock(T0)
    # No idle storage check: these tests count the loop timers the core's keys create.
    runtime = Runtime(core, NoStorage(), clock, storage_check_interval_ms=0)
    await runtime.start()
    return runtime, core, clock


def emit(runtime: Runtime, core: ScriptedCore, *effects: Effect) -> None:
    """Run ``effects`` through the runtime as if the core had emitted them."""
    core.next_effects = list(effects)
    runtime._apply(TimerFired(POKE))


async def test_rearming_later_keeps_one_loop_timer_and_fires_once_at_the_last_deadline(
) -> None:
    runtime, core, clock = await scripted()
    emit(runtime, core, ScheduleTimer("session:g:m", T0 + 1000))
    for step in range(1, 101):  # 100 heartbeats, 10 ms apart
        clock.advance(10)
        emit(runtime, core, ScheduleTimer("session:g:m", T0 + step * 10 + 1000))
    last_deadline = T0 + 100 * 10 + 1000
    # One loop timer, plus one re-schedule when it fired early (at T0 + 1000).
    assert clock.created == 2, "a re-arm for a later deadline must not create a loop timer"
    assert len(clock.pending()) == 1
    clock.advance(last_deadline - clock.now_ms() - 1)
    assert core.fired == []  # the first loop timer fired, was early, re-scheduled itself
    clock.advance(1)
    assert core.fired == [(last_deadline, "session:g:m")]
    assert runtime.timer_keys() == []
    clock.advance(10_000)
    assert core.fired == [(last_deadline, "session:g:m")], "fired once only"


async def test_rearming_earlier_fires_at_the_earlier_deadline() -> None:
    runtime, core, clock = await scripted()
    emit(runtime, core, ScheduleTimer("join:g", T0 + 5000))
    emit(runtime, core, ScheduleTimer("join:g", T0 + 200))
    clock.advance(199)
    assert core.fired == []
    clock.advance(1)
    assert core.fired == [(T0 + 200, "join:g")]
    clock.advance(10_000)
    assert core.fired == [(T0 + 200, "join:g")], "the replaced loop timer is stale"


async def test_cancelled_timers_never_fire_and_rearming_after_cancel_uses_the_new_deadline(
) -> None:
    runtime, core, clock = await scripted()
    emit(runtime, core, ScheduleTimer("sync:g", T0 + 100), ScheduleTimer("sync:h", T0 + 100))
    emit(runtime, core, CancelTimer("sync:g"))
    emit(runtime, core, CancelTimer("sync:h"), ScheduleTimer("sync:h", T0 + 300))
    clock.advance(299)
    assert core.fired == []
    clock.advance(1)
    assert core.fired == [(T0 + 300, "sync:h")]
    assert clock.pending() == []


async def test_stop_leaves_no_loop_timer() -> None:
    runtime, core, clock = await scripted()
    emit(runtime, core, ScheduleTimer("a", T0 + 100), ScheduleTimer("b", T0 + 50))
    emit(runtime, core, ScheduleTimer("a", T0 + 900))  # lazily recorded
    await runtime.stop()
    assert clock.pending() == []
    clock.advance(10_000)
    assert core.fired == []


# ---------------------------------------------------------------- with the real core

CONFIG = CoreConfig(min_session_timeout_ms=100, max_session_timeout_ms=60_000,
                    initial_rebalance_delay_ms=0)
SESSION_MS = 1_000


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_session_expires_one_timeout_after_the_last_of_many_heartbeats(
        tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path / "g.db")
    clock, metrics = CountingClock(T0), Metrics()
    runtime = Runtime(GroupCoordinator(CONFIG), storage, clock, metrics,
                      storage_check_interval_ms=0)  # counted: only the core's timers
    await runtime.start()
    try:
        join = JoinRequest(group_id="g", member_id="", protocol_type="resources",
                           protocols=(("range", b"m"),), session_timeout_ms=SESSION_MS,
                           rebalance_timeout_ms=SESSION_MS, client_id="t")
        first = await runtime.call(Join(runtime.new_request_id(), join, "127.0.0.1", "t-1"))
        assert isinstance(first, JoinResponse) and first.member_id == "t-1"
        rejoin = JoinRequest(group_id="g", member_id="t-1", protocol_type="resources",
                             protocols=(("range", b"m"),), session_timeout_ms=SESSION_MS,
                             rebalance_timeout_ms=SESSION_MS, client_id="t")
        joining = asyncio.ensure_future(
            runtime.call(Join(runtime.new_request_id(), rejoin, "127.0.0.1", "unused")))
        await settle()
        clock.advance(0)
        joined = await asyncio.wait_for(joining, 5)
        assert isinstance(joined, JoinResponse) and joined.error is None
        generation = joined.generation_id
        sync = SyncRequest(group_id="g", member_id="t-1", generation_id=generation,
                           assignments=(SyncAssignment("t-1", b"A"),))
        assert (await asyncio.wait_for(runtime.call(Sync(runtime.new_request_id(), sync)), 5)
                ).error is None
        created = clock.created
        beat = HeartbeatRequest(group_id="g", member_id="t-1", generation_id=generation)
        for _ in range(50):  # 50 heartbeats, 300 ms apart: 15 s > 15 sessions
            clock.advance(300)
            await settle()
            assert (await runtime.call(Heartbeat(runtime.new_request_id(), beat))).error is None
        # The session's loop timer re-schedules itself when it fires early, about
        # once a session (15 here), instead of once per heartbeat (50).
        assert clock.created - created <= 16, "heartbeats must not each create a loop timer"
        clock.advance(SESSION_MS - 1)
        await settle()
        assert metrics.session_expiries._value.get() == 0, "expired early"
        clock.advance(1)
        await settle()
        assert metrics.session_expiries._value.get() == 1, "expiry lost or late"
        gone = await runtime.call(Heartbeat(runtime.new_request_id(), beat))
        assert gone.error is ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        await runtime.stop()
        await storage.close()
