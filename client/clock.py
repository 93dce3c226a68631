"""The member driver's time: where ``now_ms`` comes from and how it waits.

Every wait of :class:`~client.member.GroupMember` (until the machine's next
deadline, a call's or a heartbeat's timeout, ``wait_assigned`` and
``close`` bounds) is a deadline on one clock, armed with
:meth:`MemberClock.call_at`, never a delay on the event loop's own clock. So
the same driver runs on real time, on a test's fake clock
(``coordinator.runtime.clock.FakeClock`` has this shape: time stands still
until the test advances it) or on a simulated one, and what it does depends
only on that clock.

``GroupMember(clock=...)`` takes a :class:`MemberClock`, or a plain function
returning milliseconds (the default, ``time.monotonic``); a function is
wrapped in :class:`LoopTimers`, which arms its deadlines on the running
loop and re-arms one that fires before the function has reached it (a clock
slower than the loop's, a fake one moved by hand).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["LoopTimers", "MemberClock", "TimerHandle", "as_member_clock"]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


@runtime_checkable
class MemberClock(Protocol):
    """Milliseconds (monotonic for a member), and timers on them."""

    def now_ms(self) -> int: ...

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle: ...


class _LoopTimer:
    __slots__ = ("_callback", "_clock", "_deadline_ms", "_handle")

    def __init__(self, clock: Callable[[], int], deadline_ms: int,
                 callback: Callable[[], None]) -> None:
        self._clock = clock
        self._deadline_ms = deadline_ms
        self._callback = callback
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        delay_ms = self._deadline_ms - self._clock()
        self._handle = (loop.call_soon(self._fire) if delay_ms <= 0
                        else loop.call_later(delay_ms / 1000, self._fire))

    def _fire(self) -> None:
        if self._clock() < self._deadline_ms:
            self._arm()  # the loop's clock ran ahead of ours
            return
        self._handle = None
        self._callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class LoopTimers:
    """A millisecond function as a :class:`MemberClock`: timers on the
    running loop, each firing once the function reads its deadline."""

    __slots__ = ("_clock",)

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock

    def now_ms(self) -> int:
        return self._clock()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return _LoopTimer(self._clock, deadline_ms, callback)


def as_member_clock(clock: Callable[[], int] | MemberClock) -> MemberClock:
    """``clock`` as a :class:`MemberClock` (``ValueError`` for anything else)."""
    if isinstance(clock, MemberClock):
        return clock
    if callable(clock):
        return LoopTimers(clock)
    raise ValueError(f"clock must be a function returning milliseconds or an object with "
                     f"now_ms() and call_at(deadline_ms, callback), got "
                     f"{type(clock).__name__}")
