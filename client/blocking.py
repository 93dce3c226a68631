"""``BlockingGroupMember``: the member for workers that are not asyncio.

It runs a :class:`~client.member.GroupMember` on its own thread with its own
event loop. Every method blocks the caller until the member thread did the
work.

Listener callbacks run **on the member thread**, in the member's driver task,
with exactly the async member's semantics (KIP-429 order, one at a time, the
next protocol step waits for them). A callback therefore runs concurrently
with the caller's own thread: hand the resources over through something
thread-safe (a ``queue.Queue``, a lock-protected set, ``threading.Event`` per
resource). A callback must not call this object's blocking methods (they
would wait on the thread the callback is running on); ``close()`` is the
exception: from a callback it only starts the close. A ``load_callback``
runs on the member thread too, each heartbeat interval: keep it quick.

::

    with BlockingGroupMember("http://127.0.0.1:9080", "indexers", ["shards"],
                             listener=MyListener()) as member:
        while running:
            for resource in member.assignment:
                process(resource)
            member.commit({("shards", 3): 42})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from client.member import GroupMember
from client.member_state import Resource
from protocol.messages import Scalar

__all__ = ["BlockingGroupMember"]

log = logging.getLogger("groupcoord.client")

T = TypeVar("T")


class BlockingGroupMember:
    """Takes the same arguments as :class:`~client.member.GroupMember`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="groupcoord-member",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        # GroupMember creates its asyncio primitives; build it on its loop.
        self._member: GroupMember = self._run(self._build(args, kwargs), None)

    async def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GroupMember:
        return GroupMember(*args, **kwargs)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking member methods cannot be called from a listener "
                               "callback (it runs on the member thread)")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s}s") from None

    # ------------------------------------------------------------ the member's API

    @property
    def member(self) -> GroupMember:
        """The asyncio member (read its properties; call its coroutines only
        through this wrapper)."""
        return self._member

    @property
    def assignment(self) -> frozenset[Resource]:
        """What the member owns now, read on the caller's thread: empty from
        the safety deadline on, even while the member thread is busy (a long
        callback) and has not run ``on_lost`` yet."""
        return self._member.assignment

    @property
    def failure(self) -> BaseException | None:
        return self._member.failure

    def start(self, wait_assigned: bool = True, timeout_s: float | None = None) -> None:
        async def go() -> None:
            self._member.start()
            if wait_assigned:
                await self._member.wait_assigned(timeout_s)

        self._run(go(), None)

    def commit(self, checkpoints: Mapping[Resource, Scalar],
               timeout_s: float | None = None) -> None:
        self._run(self._member.commit(checkpoints), timeout_s)

    def fetch(self, resources: Iterable[Resource] | None = None,
              timeout_s: float | None = None) -> dict[Resource, Scalar]:
        return self._run(self._member.fetch(resources), timeout_s)

    def subscribe(self, sets: Iterable[str]) -> None:
        self._run(self._member.subscribe(list(sets)), None)

    def report_load(self, loads: Mapping[Resource, float]) -> bool:
        """:meth:`GroupMember.report_load`, from any thread."""
        async def report() -> bool:
            return self._member.report_load(dict(loads))
        return self._run(report(), None)

    def drain(self, *, timeout_s: float | None = None, leave: bool = True) -> bool:
        """:meth:`GroupMember.drain`: hand everything over, then leave (and
        stop; call ``close()`` to end the member thread) or stay idle. Returns
        False when it timed out and closed."""
        return self._run(self._member.drain(timeout_s=timeout_s, leave=leave), None)

    @property
    def standby(self) -> frozenset[Resource]:
        """:attr:`GroupMember.standby` (safe from any thread)."""
        return self._member.standby

    def wait_closed(self, timeout_s: float | None = None) -> None:
        self._run(self._member.wait_closed(), timeout_s)

    def close(self, *, leave: bool | None = None, timeout_s: float | None = None) -> None:
        """Revoke, leave (dynamic members), stop the member and its thread.

        A Ctrl-C (``KeyboardInterrupt``) while it waits does not cut the close
        short: ``on_revoked`` finishes (its final commits included) and the
        member leaves, within the close's own bound (``timeout_s``, by default
        the request timeout + 5 s); then the ``KeyboardInterrupt`` is raised. A
        second one gives up waiting: the member thread is stopped where it is,
        and a WARNING says what may be lost."""
        if threading.current_thread() is self._thread:
            self._loop.create_task(self._member.close(leave=leave))
            return
        if not self._thread.is_alive():
            return
        interrupted: KeyboardInterrupt | None = None
        future: concurrent.futures.Future[None] | None = None
        try:
            while True:
                try:
                    # Scheduled inside the try: the close's on_revoked may run (and a
                    # Ctrl-C come) before run_coroutine_threadsafe has returned here.
                    # An interrupt that lands after the scheduling but before the
                    # assignment makes the next pass close again: a second close of
                    # the member only waits for the first.
                    if future is None:
                        future = asyncio.run_coroutine_threadsafe(
                            self._member.close(leave=leave, timeout_s=timeout_s), self._loop)
                    future.result()
                    break
                except KeyboardInterrupt as exc:
                    if interrupted is not None:
                        log.warning("member %s: close interrupted twice; stopped without "
                                    "waiting: final commits of on_revoked and the leave may "
                                    "not have been sent", self._member.client_id)
                        raise
                    interrupted = exc
                    log.warning("member %s: interrupted while closing; waiting for on_revoked "
                                "(final commits) and the leave to finish (interrupt again to "
                                "stop at once)", self._member.client_id)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
        if exc is None and self._member.failure is not None:
            raise self._member.failure
