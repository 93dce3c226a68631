"""Virtual time for whole-member tests: the real driver, machine, runtime and core.

:class:`VirtualTimeLoop` is an asyncio event loop whose clock only moves when
the loop has nothing to run: instead of sleeping until its next timer, it
jumps there. Everything that keeps time through the loop (``asyncio.sleep``,
``asyncio.wait`` timeouts, ``call_at``) then runs in virtual time, so a
minute of heartbeats takes milliseconds of CPU and the outcome does not
depend on how loaded the machine is. The loop refuses to wait for I/O (there
is none: members talk to the in-process coordinator) and raises if it would
block forever.

:class:`LoopClock` gives the coordinator's runtime the same time, and
:class:`LatencyTransport` adds a network round trip (half each way) to the
in-process transport, the "healthy network" of the timing tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from client_harness import InProcessCoordinator, InProcessTransport, MemoryStore

from coordinator.core import CoreConfig, GroupCoordinator
from coordinator.runtime.clock import Clock, TimerHandle
from coordinator.runtime.runtime import Runtime

__all__ = ["LatencyTransport", "LoopClock", "VirtualTimeLoop", "in_process_coordinator",
           "loop_ms", "loop_s", "run_virtual", "run_with_coordinator"]


class _VirtualSelector(selectors.DefaultSelector):
    """Polls the real selector without blocking; a wait becomes a time jump."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("the virtual-time loop would wait forever: nothing is scheduled")
        assert self.loop is not None
        self.loop.now_s += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start_s: float = 1_000.0) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now_s = start_s

    def time(self) -> float:
        return self.now_s


def loop_ms() -> int:
    """The running loop's time in milliseconds (the member's ``clock``)."""
    return round(asyncio.get_running_loop().time() * 1000)


def loop_s() -> float:
    """The running loop's time in seconds (a ``Ledger``'s clock)."""
    return asyncio.get_running_loop().time()


class LoopClock:
    """The runtime's clock on the running loop's (virtual) time."""

    def now_ms(self) -> int:
        return loop_ms()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_at(deadline_ms / 1000, callback)


class LatencyTransport:
    """The in-process transport behind a network with a fixed round trip.
    ``lose_heartbeats``: that many of the next heartbeats are lost on the way
    (never reach the coordinator, never answered; the caller's timeout ends
    them)."""

    def __init__(self, coordinator: InProcessCoordinator, rtt_ms: int) -> None:
        self.inner = InProcessTransport(coordinator)
        self.one_way_s = rtt_ms / 2000
        self.calls: dict[str, int] = {}
        self.lose_heartbeats = 0
        self.lost = 0

    async def call(self, api: str, request: Any) -> Any:
        self.calls[api] = self.calls.get(api, 0) + 1
        if api == "heartbeat" and self.lose_heartbeats > 0:
            self.lose_heartbeats -= 1
            self.lost += 1
            await asyncio.get_running_loop().create_future()  # never answered
        await asyncio.sleep(self.one_way_s)
        response = await self.inner.call(api, request)
        await asyncio.sleep(self.one_way_s)
        return response


@contextlib.asynccontextmanager
async def in_process_coordinator(clock: Clock | None = None,
                                 **settings: int) -> AsyncIterator[InProcessCoordinator]:
    """The real core and runtime on the loop's clock (or ``clock``: a
    ``FakeClock`` the test moves), in memory, stopped on exit: the
    ``coordinator`` fixture of conftest.py for a test in virtual time (the
    same defaults: 100 ms minimum session, no initial delay)."""
    config = CoreConfig(**{"min_session_timeout_ms": 100, "initial_rebalance_delay_ms": 0,
                           **settings})
    runtime = Runtime(GroupCoordinator(config), MemoryStore(), clock or LoopClock())
    await runtime.start()
    try:
        yield InProcessCoordinator(runtime)
    finally:
        await runtime.stop()


def run_virtual(main: Callable[[], Any], *, start_s: float = 1_000.0) -> Any:
    """Run the coroutine function ``main`` on a fresh virtual-time loop."""
    loop = VirtualTimeLoop(start_s)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def run_with_coordinator(scenario: Callable[[InProcessCoordinator], Awaitable[None]],
                         **settings: int) -> None:
    """``scenario(coordinator)`` on a fresh virtual-time loop, with an
    :func:`in_process_coordinator` made with ``settings``."""

    async def main() -> None:
        async with in_process_coordinator(**settings) as coordinator:
            await scenario(coordinator)

    run_virtual(main)


def settings_id(settings: Mapping[str, int]) -> str:
    return ",".join(f"{k.removesuffix('_ms')}={v}" for k, v in settings.items())
