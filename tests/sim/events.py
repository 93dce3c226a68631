"""The simulation's one thread: a seeded event heap, one global clock, the trace.

Time is integer milliseconds of *global* (real) time. The coordinator reads
it directly; every member reads its own monotonic clock
(:class:`DriftClock`): an offset plus the global time scaled by a bounded
drift. Events are ``(time, sequence, function, argument)``; equal times run
in the order they were scheduled, so a run depends on nothing but the seed.

The trace is every event worth replaying (messages, actions, faults), one
line each: always hashed (the determinism check compares hashes), kept as
text only when asked (``--trace``, or a failed seed's report).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["DriftClock", "Sim", "SimTimer"]

_push = heapq.heappush
_pop = heapq.heappop


class Sim:
    def __init__(self, *, keep_trace: bool = False) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()
        self._hash = hashlib.blake2b(digest_size=16)
        self.keep_trace = keep_trace
        self.trace: list[str] = []
        self.events = 0
        #: what ends with the run: each simulated process's event loop is shut
        #: down (World.run calls these once the last event ran).
        self.at_end: list[Callable[[], None]] = []

    def at(self, when: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``fn(arg)`` at global time ``when`` (never in the past)."""
        now = self.now
        _push(self._heap, (when if when > now else now, next(self._seq), fn, arg))

    def after(self, delay: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        now = self.now
        when = now + delay
        _push(self._heap, (when if when > now else now, next(self._seq), fn, arg))

    def run_until(self, end: int, after_step: Callable[[], None] | None = None) -> None:
        heap = self._heap
        pop = _pop
        events = self.events
        try:
            if after_step is None:
                while heap and heap[0][0] <= end:
                    when, _, fn, arg = pop(heap)
                    self.now = when
                    events += 1
                    fn(arg)
            else:
                while heap and heap[0][0] <= end:
                    when, _, fn, arg = pop(heap)
                    self.now = when
                    events += 1
                    fn(arg)
                    after_step()
        finally:
            self.events = events
        self.now = max(self.now, end)

    def log(self, line: str) -> None:
        """A line of the trace. Lines of every message are logged only when
        the trace is kept (``verbose``; the callers check it); the hash is
        then over all of them, else over the rest (faults, crashes, group
        states, callbacks, violations), so equal seeds give equal hashes in
        either mode."""
        text = f"{self.now} {line}"
        self._hash.update(text.encode())
        self._hash.update(b"\n")
        if self.keep_trace:
            self.trace.append(text)

    @property
    def verbose(self) -> bool:
        return self.keep_trace

    def trace_hash(self) -> str:
        return self._hash.hexdigest()


class DriftClock:
    """A member's monotonic clock: ``offset + g + g * ppm / 10**6`` (floored).

    ``ppm`` is the drift in parts per million (negative: the member's clock
    runs slow, so it believes in its lease a little longer than the
    coordinator keeps its session; the simulator bounds it, see scenario.py).
    """

    __slots__ = ("offset", "ppm")

    def __init__(self, offset: int, ppm: int) -> None:
        self.offset = offset
        self.ppm = ppm

    def local(self, g: int) -> int:
        return self.offset + g + (g * self.ppm) // 1_000_000

    def global_at(self, local_ms: int) -> int:
        """The first global instant at which this clock reads ``local_ms``."""
        g = ((local_ms - self.offset) * 1_000_000) // (1_000_000 + self.ppm)
        g = max(g, 0)
        while self.local(g) < local_ms:
            g += 1
        while g > 0 and self.local(g - 1) >= local_ms:
            g -= 1
        return g


class SimTimer:
    """A timer a simulated process armed on its clock (the handle its clock's
    ``call_at`` returns): the event at its deadline runs ``callback`` unless
    it was cancelled first."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
