"""A simulated process's asyncio event loop, stepped by the simulation.

The production code the simulator runs on asyncio (the coordinator's
runtime, :mod:`sim.server`) gets a loop of its own per process: a real
``asyncio.SelectorEventLoop`` whose selector has nothing to wait for. Each
:meth:`SimLoop.step` runs every callback ready and everything they make
ready, and stops where the loop would wait: the simulation, not the loop,
decides when the process runs next (an answer, a timer of its clock, a
write that returns). Nothing here reads real time.

A loop made with a ``clock`` (a coordinator of several, :mod:`sim.cluster`,
whose partition host arms timers on the loop itself: ``call_at``,
``asyncio.wait_for``) keeps the process's time: :meth:`SimLoop.time` is its
drifting clock, and a step that ends waiting for the earliest timer asks
``wake`` for an event of the simulation then. Kept apart from the
modules mypyc compiles (benchmarks/sim_compiled.py): it extends asyncio's
loop.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SimLoop"]


class _Idle(selectors.BaseSelector):
    """A selector with nothing to wait for: asked to wait, it ends the loop's step.

    The simulated process does no socket I/O (the simulated network calls it),
    so a loop that would wait has run everything ready. A wait with a deadline
    is a timer on the loop itself: a loop with a clock asks for a wake-up
    then; on any other it would never fire, and is recorded as a finding
    (the timers of the code simulated are on its simulated clock, e.g.
    :class:`sim.server.SimClock`).
    """

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.loop: SimLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fileobj] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout != 0:
            loop = self.loop
            assert loop is not None
            if timeout is not None:
                if loop.wake is not None:
                    loop.wake(timeout)
                else:
                    loop.report(f"a timer on the event loop itself ({timeout:.3f} s): the "
                                f"simulation does not fire it")
            loop.stop()
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """One simulated process's event loop, stepped by the simulation (:meth:`step`).

    An exception the loop catches (a callback or task of the runtime that
    raised) goes to ``errors``, unless the process is gone (:attr:`dead`):
    what a crashed process left pending is dropped with it.
    """

    def __init__(self, errors: list[str], clock: Callable[[], float] | None = None,
                 wake: Callable[[float], None] | None = None) -> None:
        #: the process's clock in seconds, and what arms a step ``timeout`` seconds
        #: on (None: the loop has no timers of its own).
        self.clock = clock
        self.wake = wake
        selector = _Idle()
        super().__init__(selector)
        selector.loop = self
        self.errors = errors
        self.dead = False
        self.set_exception_handler(_loop_exception)

    def time(self) -> float:
        clock = self.clock
        return super().time() if clock is None else clock()

    def step(self) -> None:
        """Run every callback ready, and all they make ready, until the loop would wait."""
        self.run_forever()

    def run(self, fn: Callable[..., Any], *args: Any) -> bool:
        """``fn(*args)`` as one step; at once when called from inside a step (a
        call back in from the step's own hooks). True when it stepped the loop
        (the caller's own work after a step follows)."""
        if self.is_running():
            fn(*args)
            return False
        self.call_soon(fn, *args)
        self.step()
        return True

    def report(self, problem: str) -> None:
        if not self.dead:
            self.errors.append(f"event loop: {problem}")


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    assert isinstance(loop, SimLoop)
    loop.report(f"{context.get('message')} {context.get('exception')!r}")
