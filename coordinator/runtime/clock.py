"""Clocks: where the runtime gets ``now_ms`` and arms timers (docs/architecture.md practice 3).

The core never reads a clock; the runtime passes ``now_ms`` into every
``handle`` call and maps ``ScheduleTimer`` deadlines (in the same milliseconds)
onto a clock's ``call_at``. :class:`WallClock` uses the event loop;
:class:`FakeClock` only moves when a test calls :meth:`FakeClock.advance`, and
fires exactly the timers that became due, in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle: ...


class WallClock:
    """Unix milliseconds; timers on the running loop.

    A deadline is turned into a delay when armed, and the loop counts delays on
    its monotonic clock, so a wall-clock step does not fire timers early.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        loop = self._loop or asyncio.get_running_loop()
        delay = max(0, deadline_ms - self.now_ms()) / 1000
        return loop.call_later(delay, callback)


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "deadline_ms")

    def __init__(self, deadline_ms: int, callback: Callable[[], None]) -> None:
        self.deadline_ms = deadline_ms
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock for tests: time stands still until :meth:`advance`."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now = now_ms
        self._heap: list[tuple[int, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        timer = _FakeTimer(deadline_ms, callback)
        heapq.heappush(self._heap, (deadline_ms, next(self._seq), timer))
        return timer

    def pending(self) -> list[int]:
        """Deadlines of the timers still armed, soonest first."""
        return sorted(t.deadline_ms for _, _, t in self._heap if not t.cancelled)

    def advance(self, ms: int) -> int:
        """Move time forward by ``ms``, firing due timers in order; returns how many fired.

        A timer armed by a callback fires in the same call if it is already due.
        """
        target = self._now + ms
        fired = 0
        while self._heap and self._heap[0][0] <= target:
            deadline, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now = max(self._now, deadline)
            timer.callback()
            fired += 1
        self._now = target
        return fired
