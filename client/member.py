"""``GroupMember``: the asyncio driver of the member state machine.

One driver task per member (docs/architecture.md practice 7), the asyncio
runtime of the sans-IO :class:`~client.member_state.driver.MemberDriver`
(which decides around the :class:`~client.member_state.MemberStateMachine`:
what to send on which channel, when to give a call up, which callback to
run, when to look again): it performs the driver's effects through the
one-method transport, and reports the outcomes. There is no
lock: the machine is only touched from the event loop, and no lock is ever
held across a listener callback. Callbacks run *in the driver task*, so the
next protocol step (a join after an eager ``on_revoked``, the follow-up
rebalance after a cooperative one) waits for them; see
:mod:`client.listener` for the order and the rules.

Time comes from an injected ``clock`` (monotonic milliseconds), and so does
every wait (:mod:`client.clock`): the driver sleeps until the deadlines the
machine names, or until it is poked by ``subscribe``, ``commit`` or
``close``; a call's timeout, the side channel's heartbeat timeout and the
bounds of ``wait_assigned`` and ``close`` are deadlines on that clock too,
never delays on the event loop's. On a clock that only moves when a test (or
a simulator) moves it, the driver does exactly what it would do in real time.
The leader's assignor gets its own time, ``wall_clock`` (wall-clock
milliseconds by default): an assignor that keeps deadlines in ``user_data``
(incremental-cooperative) needs a time base every member shares, since the
next leader may be another process or host.

While the machine is rebalancing (a join or sync in flight, or waiting to
send one), the driver also runs the machine's side channel: heartbeats with
the generation the member still has (KIP-62's heartbeat thread, here a
second request future watched by the same task), and it wakes at the safety
deadline to abandon a join or sync that outlasts it. While an ``async``
listener callback runs (in the driver task), a second task services the side
channel in every state, closing included, so a slow ``on_revoked`` keeps the
member's session and can still commit at its end; a plain-function callback
blocks the event loop, and the heartbeats with it.

Fatal outcomes (FENCED_INSTANCE_ID, INCONSISTENT_GROUP_PROTOCOL,
GROUP_MAX_SIZE_REACHED, ...) stop the member after ``on_lost``; they surface
as the exception from ``wait_assigned()``, ``wait_closed()``, ``commit()``,
``subscribe()``, and ``async with``'s exit.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry

from client.clock import MemberClock, TimerHandle, as_member_clock
from client.errors import (
    CoordinatorUnavailableError,
    FatalMemberError,
    GroupCoordError,
)
from client.listener import RebalanceListener
from client.member_state import (
    ERROR_ACTIONS,
    CallbackKind,
    ErrorAction,
    InvokeListener,
    MemberConfig,
    MemberState,
    MemberStateMachine,
    RebalanceCompleted,
    RebalanceFailed,
    RebalanceStarted,
    Resource,
    UnknownSets,
)
from client.member_state.driver import (
    Cancel,
    Channel,
    DriverEffect,
    MeasureLoad,
    MemberDriver,
    Send,
    StartWarmup,
)
from client.metrics import MemberMetrics
from client.retry_log import RetryLog
from client.transport import (
    AiohttpTransport,
    CoordinatorRouter,
    Transport,
    check_coordinator_url,
    redact_url,
)
from protocol.errors import ErrorCode
from protocol.limits import MAX_FETCH_CHECKPOINTS
from protocol.messages import Api, FetchRequest, FetchResponse, Scalar

__all__ = ["GroupMember", "LoadCallback", "monotonic_ms", "wall_ms"]

log = logging.getLogger("groupcoord.client")

#: ``load_callback``: given what the member owns, the load measured on each
#: (a plain function or a coroutine function).
LoadCallback = Callable[[frozenset[Resource]],
                        Mapping[Resource, float] | Awaitable[Mapping[Resource, float]]]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    return int(time.time() * 1000)


class GroupMember:
    """A worker's membership in one group. Use ``async with`` (joins, and
    waits for the first assignment; closes on exit) or ``start()`` /
    ``close()``.

    ``coordinator``: the coordinator's URL, or a list of bootstrap URLs of
    several coordinators sharing the groups (docs/protocol.md, "Several
    coordinators sharing groups"): the member
    finds its group's coordinator and follows it when it changes
    (:class:`~client.transport.CoordinatorRouter`; docs/client.md, "Several
    coordinators"). Or a :class:`~client.transport.Transport` (tests)."""

    def __init__(
        self,
        coordinator: str | Sequence[str] | Transport,
        group_id: str,
        sets: Sequence[str],
        *,
        assignors: Sequence[str] = ("cooperative-sticky",),
        listener: RebalanceListener | None = None,
        group_instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 60_000,
        heartbeat_interval_ms: int | None = None,
        client_id: str | None = None,
        rack: str | None = None,
        user_data: bytes | None = None,
        token: str | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], int] | MemberClock = monotonic_ms,
        rng: Callable[[], float] | None = None,
        leave_on_close: bool | None = None,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        request_timeout_ms: int = 30_000,
        assignor_settings: Mapping[str, Mapping[str, object]] | None = None,
        capacity: float | None = None,
        load_rejoin_interval_ms: int = 30_000,
        load_callback: LoadCallback | None = None,
        wall_clock: Callable[[], int] | None = None,
        ca_file: str | Path | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        urls = _coordinator_urls(coordinator, tls_settings=ca_file is not None
                                 or ssl_context is not None)
        if urls is None and (ca_file is not None or ssl_context is not None):
            raise ValueError("ca_file/ssl_context apply to a coordinator URL; configure the "
                             "transport passed as coordinator instead")
        self.client_id = client_id or f"member-{uuid.uuid4().hex[:12]}"
        self.config = MemberConfig(
            group_id=group_id, sets=tuple(sets), assignors=tuple(assignors),
            group_instance_id=group_instance_id, session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, client_id=self.client_id, rack=rack,
            user_data=user_data, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms, request_timeout_ms=request_timeout_ms,
            leave_on_close=leave_on_close, assignor_settings=dict(assignor_settings or {}),
            capacity=capacity, load_rejoin_interval_ms=load_rejoin_interval_ms,
        )
        time_source = as_member_clock(clock)
        if wall_clock is None:
            # An injected (test) clock drives the assignor too, so one fake
            # clock moves everything; the real default is the wall clock.
            wall_clock = wall_ms if clock is monotonic_ms else time_source.now_ms
        self._machine = MemberStateMachine(self.config, rng=rng, assignor_clock=wall_clock)
        self._router: CoordinatorRouter | None = None
        if urls is not None:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            http = AiohttpTransport(urls[0], headers=headers, ca_file=ca_file,
                                    ssl_context=ssl_context)
            # One HTTP session for every coordinator; a find_coordinator answer
            # is awaited as long as a heartbeat's (the timing rule's reply_ms).
            self._router = CoordinatorRouter(urls, group_id, http.at,
                                             find_timeout_ms=self.config.timing.reply_ms,
                                             name=self.client_id)
            self._transport: Transport = self._router
            self._owns_transport = True
        else:
            assert not isinstance(coordinator, (str, Sequence))
            self._transport = coordinator
            self._owns_transport = False
            if isinstance(coordinator, CoordinatorRouter):
                self._router = coordinator
        description = (_describe(self._transport) if self._router is None else
                       ", ".join(redact_url(u) for u in self._router.bootstrap_urls))
        #: reports an unreachable coordinator with log lines that back off.
        self._retry_log = RetryLog(self.client_id, description)
        #: the last rebalance failed and is being retried (logged quietly).
        self._retrying = False
        self._listener = listener or RebalanceListener()
        #: the clock every wait is armed on; ``_clock`` reads it.
        self._time = time_source
        self._clock: Callable[[], int] = time_source.now_ms
        self.metrics = MemberMetrics(registry, group_id, self.client_id, self._clock)
        self._wakeup = asyncio.Event()
        self._assigned_once = asyncio.Event()
        self._stopped = asyncio.Event()
        #: set once a drain is done (the member owns nothing; see drain()).
        self._drained = asyncio.Event()
        #: the warm-ups (on_standby) running beside the driver's steps.
        self._warmups: set[asyncio.Future[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        #: asked for the owned resources' loads each heartbeat interval while
        #: stable (MeasureLoad); what it returns goes where report_load's goes.
        self._load_callback = load_callback
        #: a coroutine load_callback's measurement under way.
        self._measuring: asyncio.Future[Mapping[Resource, float]] | None = None
        #: the driver's decisions (sans-IO); this class performs them.
        self._driver = MemberDriver(self._machine, measures_load=load_callback is not None)
        #: the call in flight on each channel of the driver.
        self._calls: dict[Channel, asyncio.Future[Any]] = {}
        #: one commit at a time, in call order (asyncio.Lock wakes waiters FIFO).
        self._commit_lock = asyncio.Lock()

    # ------------------------------------------------------------ what a worker reads

    @property
    def assignment(self) -> frozenset[Resource]:
        """What the member owns now: empty from its safety deadline on, even
        if the driver has not run since (a paused process, a busy loop), so
        a resource the group may have given to another member is never
        reported. Safe to read from any thread."""
        return self._machine.owned_at(self._clock())

    @property
    def standby(self) -> frozenset[Resource]:
        """The standbys the last assignment gave: resources to warm up
        (``on_standby``), never to act on. Never in ``assignment``, never
        committable."""
        return self._machine.standby

    @property
    def draining(self) -> bool:
        """The member drains (``drain()``, or the coordinator asked it to)."""
        return self._machine.draining

    @property
    def member_id(self) -> str:
        return self._machine.member_id

    @property
    def coordinator_url(self) -> str | None:
        """The URL of the group's coordinator as the member last learned it
        (credentials left out); ``None`` while it is looking for it, or when
        the member was given a transport."""
        url = self._router.current_url if self._router is not None else None
        return None if url is None else redact_url(url)

    @property
    def generation_id(self) -> int:
        return self._machine.generation_id

    @property
    def is_leader(self) -> bool:
        return self._machine.is_leader

    @property
    def protocol(self) -> str:
        """``"eager"`` or ``"cooperative"`` (KIP-429: cooperative when every
        configured assignor supports it)."""
        return self._machine.protocol.value

    @property
    def state(self) -> MemberState:
        return self._machine.state

    @property
    def failure(self) -> BaseException | None:
        """The fatal error that stopped the member, if any."""
        return self._failure

    @property
    def last_error(self) -> str | None:
        return self._machine.last_error

    def safety_deadline_ms(self) -> int | None:
        """When this member must have stopped working on its resources, on the
        member's ``clock`` (monotonic milliseconds by default), or ``None``
        while it owns nothing.

        The coordinator may give the resources to another member from that
        moment on if it has not heard from this one (a session timeout after
        the last answered heartbeat, or a rebalance timeout after a rebalance
        began; the rule is in :mod:`client.member_state.lease`). Every answer from
        the coordinator that proves the member is still known pushes it
        later; the member calls ``on_lost`` when it passes. A worker doing
        long steps should check it between steps (and not start a step that
        would end after it), because ``on_lost`` cannot interrupt a step in
        progress. ``commit()`` is already bounded by it.
        """
        return self._machine.safety_deadline_ms()

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Start the driver task (joins in the background)."""
        if self._task is not None:
            raise RuntimeError("the member was already started")
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"groupcoord-member-{self.client_id}")

    async def wait_assigned(self, timeout_s: float | None = None) -> frozenset[Resource]:
        """Wait for the first completed rebalance; raises the member's fatal
        error, or ``TimeoutError``."""
        first = asyncio.ensure_future(self._assigned_once.wait())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            done = await self._first_of({first, stopped}, self._after_s(timeout_s))
        finally:
            first.cancel()
            stopped.cancel()
        if self._failure is not None:
            raise self._failure
        if not done:
            raise TimeoutError("no assignment yet")
        return self.assignment

    async def wait_closed(self) -> None:
        """Wait until the member stops; raises its fatal error if it failed."""
        await self._stopped.wait()
        if self._failure is not None:
            raise self._failure

    async def close(self, *, leave: bool | None = None, timeout_s: float | None = None) -> None:
        """Revoke everything (``on_revoked``), leave the group (dynamic members;
        static ones stay so that a restart gets the same resources back) and
        stop. A member that owns something and is rebalancing first finishes
        its sync, or its join if the coordinator answered it, so the final
        commits of ``on_revoked`` carry a generation the coordinator takes
        (docs/client.md, "Final commits"). From inside a listener callback it
        only starts the close."""
        if self._task is None:
            await self._close_transport()
            return
        self._machine.close(leave)
        self._wakeup.set()
        if asyncio.current_task() is self._task:
            return
        timeout = timeout_s if timeout_s is not None else (
            self.config.request_timeout_ms / 1000 + 5)
        # Not cancelled if this caller is: the close goes on.
        done = await self._first_of({self._task}, self._after_s(timeout))
        if self._task not in done:
            running = self._machine.callback_running
            if running is not None and running.kind is CallbackKind.REVOKED:
                log.warning("member %s: close timed out after %.1fs while on_revoked(%s) "
                            "ran; stopping: its final commits not made yet are not stored, "
                            "and the member does not leave", self.client_id, timeout,
                            _fmt(running.resources))
            else:
                log.warning("member %s: close timed out after %.1fs; stopping",
                            self.client_id, timeout)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # A failure is kept in self._failure; the task itself raises nothing.

    async def drain(self, *, timeout_s: float | None = None, leave: bool = True) -> bool:
        """Hand everything over before going (docs/client.md, "Drain"): the
        member rejoins saying it drains, keeps serving what it owns until each
        resource is revoked (``on_revoked``, final commits as usual), and is
        given nothing new; an assignor that warms up (``balanced`` with
        ``warmup``) has the new owners warm each resource first. Once it owns
        nothing it leaves and stops (``leave=True``), or stays in the group as
        an idle member (``leave=False``). Returns True then.

        ``timeout_s``: after that long (None: no bound) the rest is given up
        the way a plain leave does (``close(leave=True)``: ``on_revoked`` on
        what is left, leave, stop), and it returns False. Raises the member's
        fatal error if it failed, ``MemberClosedError`` if it is closing.
        From inside a listener callback it only starts the drain."""
        if self._task is None:
            raise RuntimeError("the member was not started")
        self._raise_failure()
        self._machine.drain(self._clock(), leave=leave)
        self._wakeup.set()
        if asyncio.current_task() is self._task:
            return False
        done = asyncio.ensure_future((self._stopped if leave else self._drained).wait())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            finished = await self._first_of({done, stopped}, self._after_s(timeout_s))
        finally:
            done.cancel()
            stopped.cancel()
        self._raise_failure()
        if finished:
            return leave or self._machine.drained
        log.warning("member %s: drain timed out after %.1fs owning %s; closing", self.client_id,
                    timeout_s or 0.0, _fmt(self._machine.owned) or "nothing")
        await self.close(leave=True)
        self._raise_failure()
        return False

    async def __aenter__(self) -> Self:
        self.start()
        try:
            await self.wait_assigned()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
        if exc is None and self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------ worker calls

    async def subscribe(self, sets: Iterable[str]) -> None:
        """Change the subscription: what is no longer subscribed is revoked and
        the member rejoins (KIP-429 step 1.1)."""
        self._raise_failure()
        if self._machine.subscribe(self._clock(), list(sets)):
            self._wakeup.set()

    def report_load(self, loads: Mapping[Resource, float]) -> bool:
        """The load the application measured on resources it owns (requests/s,
        bytes/s, a CPU share: one unit per group), for a load-aware assignor
        (``balanced``); sent with the next join. When every owned resource has a
        load and their sum has left the band the leader gave this member, the
        member rejoins (cooperatively: nothing stops), at most once per
        ``load_rejoin_interval_ms`` (30 s). Returns whether it rejoins now.
        Call it as often as you measure; a resource not owned is ignored."""
        self._raise_failure()
        rejoin = self._machine.report_load(self._clock(), loads)
        if rejoin:
            self._wakeup.set()
        return rejoin

    async def commit(self, checkpoints: Mapping[Resource, Scalar]) -> None:
        """Store ``checkpoints`` (resource -> value) for owned resources; fenced
        by generation on the coordinator (docs/protocol.md, "POST /v1/commit and POST /v1/fetch").

        Concurrent commits of one member are sent one at a time, in the order
        they were called, so the coordinator applies them in that order (as
        Kafka's consumer keeps its commits in order on one connection); the
        later waits for the earlier's answer (or its timeout) first.
        """
        self._raise_failure()
        async with self._commit_lock:
            await self._commit_locked(checkpoints)

    async def _commit_locked(self, checkpoints: Mapping[Resource, Scalar]) -> None:
        # A final commit (from on_revoked, for what it revokes) is the last word
        # on those resources: when it cannot be stored, the member says so.
        final = self._machine.revoking(checkpoints)
        try:
            await self._send_commit(checkpoints)
        except GroupCoordError as exc:
            if final:
                stored = ("may not be stored" if isinstance(exc, CoordinatorUnavailableError)
                          else "not stored")
                log.warning("member %s: final commit of %s %s: %s", self.client_id,
                            _fmt(checkpoints), stored, exc)
            raise

    async def _send_commit(self, checkpoints: Mapping[Resource, Scalar]) -> None:
        # Built now, not at call time: ownership and generation are checked
        # as of sending, after any commit queued ahead of this one.
        self._raise_failure()
        request, timeout_ms = self._driver.commit_call(self._clock(), checkpoints,
                                                       self.config.request_timeout_ms)
        response = await self._user_call(Api.COMMIT, request, timeout_ms)
        error = self._driver.commit_answered(self._clock(), request, response.error)
        self._wakeup.set()
        if error is not None:
            raise error

    async def fetch(self, resources: Iterable[Resource] | None = None) -> dict[Resource, Scalar]:
        """The group's checkpoints (all, or those of ``resources``).

        The coordinator answers at most ``MAX_FETCH_CHECKPOINTS`` per call
        (docs/protocol.md, "Additions of this release"): all of them are read
        page by page (``after`` /
        ``next``), and a long list of resources is asked for in slices.
        """
        self._raise_failure()
        group_id = self.config.group_id
        requests: list[FetchRequest]
        if resources is None:
            requests = [FetchRequest(group_id, paged=True)]
        else:
            keys = tuple(sorted(resources))
            requests = [FetchRequest(group_id, keys[i:i + MAX_FETCH_CHECKPOINTS])
                        for i in range(0, len(keys), MAX_FETCH_CHECKPOINTS)] \
                or [FetchRequest(group_id, ())]
        found: dict[Resource, Scalar] = {}
        while requests:
            request = requests.pop()
            response = await self._user_call(Api.FETCH, request)
            assert isinstance(response, FetchResponse)
            if response.error is not None:
                raise CoordinatorUnavailableError(f"fetch: {response.error.value}")
            found.update(((s, i), v) for s, i, v in response.checkpoints)
            if request.paged and response.next is not None:
                requests.append(FetchRequest(group_id, paged=True, after=response.next))
        return found

    async def _user_call(self, api: Api, request: Any, timeout_ms: int | None = None) -> Any:
        limit_ms = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        call = asyncio.ensure_future(self._transport.call(api, request))
        try:
            done = await self._first_of({call}, self._clock() + limit_ms)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if call not in done:
            await _cancel(call)
            self._timed_out(api)
            raise CoordinatorUnavailableError(f"{api}: timed out")
        return call.result()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------ the driver task

    async def _run(self) -> None:
        """The asyncio runtime of :class:`~client.member_state.driver.MemberDriver`:
        report what finished, step it, perform its effects, wait for the
        next thing (an answer, a poke, its ``wake_at``)."""
        driver = self._driver
        try:
            while True:
                # Cleared before the driver is stepped: whatever poked us
                # changed the machine first, so no wake-up is lost.
                self._wakeup.clear()
                if self._calls:
                    self._report_calls((Channel.SIDE, Channel.MAIN))
                if self._measuring is not None and self._measuring.done():
                    self._measured(self._measuring)
                effects = driver.step(self._clock())
                callback = await self._apply(effects) if effects else None
                self._drain_events()
                if self._machine.drained:
                    self._drained.set()
                if callback is not None:
                    await self._invoke(callback)
                    self._drain_events()
                elif driver.stopped:
                    break
                elif driver.wake_at is not None and driver.wake_at <= self._clock():
                    continue  # due at once: the step gave a call up and decided nothing more
                else:
                    poke = asyncio.ensure_future(self._wakeup.wait())
                    try:
                        await self._first_of({poke, *self._calls.values()}, driver.wake_at)
                    finally:
                        poke.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the library: stop loudly, never silently
            log.exception("member %s: driver crashed", self.client_id)
            self._failure = FatalMemberError(f"internal error in the member driver: {exc!r}",
                                             ErrorCode.UNKNOWN_SERVER_ERROR)
        finally:
            if self._measuring is not None:
                await _cancel(self._measuring)
            for warmup in list(self._warmups):
                await _cancel(warmup)
            await self._apply(driver.abandon(self._clock()))
            self._drain_events()
            self.metrics.owned(len(self._machine.owned))
            self._stopped.set()
            await self._close_transport()

    async def _apply(self, effects: list[DriverEffect]) -> InvokeListener | None:
        """Perform the driver's effects; returns the callback to run, if any."""
        callback: InvokeListener | None = None
        for effect in effects:
            if isinstance(effect, Send):
                call = effect.call
                self._calls[effect.channel] = asyncio.ensure_future(
                    self._transport.call(call.api, call.request))
            elif isinstance(effect, Cancel):
                future = self._calls.pop(effect.channel, None)
                if future is not None:
                    await _cancel(future)
                if effect.timed_out:
                    self._timed_out(effect.api)
                    if effect.channel is Channel.SIDE:
                        self._unreachable("heartbeat: no answer in time", self._given_up_url())
            elif isinstance(effect, InvokeListener):
                callback = effect
            elif isinstance(effect, MeasureLoad):
                self._measure(effect.resources)
            elif isinstance(effect, StartWarmup):
                task = asyncio.ensure_future(self._warm_up(effect))
                self._warmups.add(task)
                task.add_done_callback(self._warmups.discard)
            else:
                self._failure = effect.error
                if effect.error is not None:
                    log.error("member %s stopped: %s", self.client_id, effect.error)
        return callback

    def _measure(self, owned: frozenset[Resource]) -> None:
        """Run the load callback: a plain function at once, a coroutine as a
        task of its own (the driver goes on; the answer pokes it)."""
        assert self._load_callback is not None
        try:
            result = self._load_callback(owned)
            if inspect.isawaitable(result):
                self._measuring = asyncio.ensure_future(result)
                self._measuring.add_done_callback(lambda _: self._wakeup.set())
                return
        except Exception:
            log.exception("member %s: load_callback raised; no load reported this interval",
                          self.client_id)
            self._driver.load_measured(self._clock(), None)
            return
        self._report_measured(result)

    def _measured(self, future: asyncio.Future[Mapping[Resource, float]]) -> None:
        """A coroutine load callback finished."""
        self._measuring = None
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            log.error("member %s: load_callback failed (%r); no load reported this interval",
                      self.client_id, error)
            self._driver.load_measured(self._clock(), None)
            return
        self._report_measured(future.result())

    def _report_measured(self, loads: object) -> None:
        if not isinstance(loads, Mapping):
            log.error("member %s: load_callback returned %s, not a mapping of resource to "
                      "load; no load reported this interval", self.client_id,
                      type(loads).__name__)
            self._driver.load_measured(self._clock(), None)
            return
        try:
            rejoin = self._driver.load_measured(self._clock(), loads)
        except ValueError as exc:  # the driver took the answer; the loads were refused
            log.error("member %s: load_callback returned a bad load: %s; no load reported "
                      "this interval", self.client_id, exc)
            return
        if rejoin:
            self._wakeup.set()

    def _report_calls(self, channels: Iterable[Channel]) -> None:
        """Tell the driver about each call on ``channels`` that finished."""
        for channel in channels:
            future = self._calls.get(channel)
            if future is None or not future.done():
                continue
            del self._calls[channel]
            call = self._driver.in_flight(channel)
            api = "call" if call is None else call.api
            error: BaseException | None = (asyncio.CancelledError() if future.cancelled()
                                           else future.exception())
            now = self._clock()
            if error is None:
                self._answered(api, future.result())
                self._driver.answered(channel, now, future.result())
            elif isinstance(error, GroupCoordError):
                log.debug("member %s: %s failed: %s", self.client_id, api, error)
                if isinstance(error, CoordinatorUnavailableError):
                    self._unreachable(str(error), error.url)
                self._driver.failed(channel, now, error)
            else:  # a transport that broke its contract: retry, loudly
                log.warning("member %s: %s raised %r", self.client_id, api, error)
                self._driver.failed(channel, now, CoordinatorUnavailableError(repr(error)))

    async def _invoke(self, action: InvokeListener) -> None:
        name = action.kind.value
        # A listener written before standbys may lack their callbacks: nothing to do.
        method = getattr(self._listener, f"on_{name}", _nothing)
        started = time.perf_counter()
        failed = False
        keeper: asyncio.Future[None] | None = None
        done: asyncio.Future[None] | None = None
        try:
            result = method(set(action.resources))
            if inspect.isawaitable(result):
                # The callback runs in this task; a second one runs the side
                # channel meanwhile (a plain function blocks the loop, and
                # heartbeats with it).
                done = asyncio.get_running_loop().create_future()
                keeper = asyncio.ensure_future(self._side_during_callback(done))
                await result
        except Exception:
            failed = True
            log.exception("member %s: on_%s raised; the member carries on", self.client_id,
                          name)
        except BaseException:  # cancelled (the member stops: the driver is abandoned), ...
            if keeper is not None:
                await _cancel(keeper)
            raise
        # Reported before anything else runs: what on_revoked gave up is no
        # longer owned (nor committable) once it returned, for every task.
        # Only then is the side-channel task told to stop: whatever it is
        # waiting for, it steps the driver no more.
        self._driver.callback_returned(self._clock())
        self.metrics.callback(name, time.perf_counter() - started, failed)
        if keeper is not None and done is not None:
            # Told to stop, not cancelled: it ends between two steps, never
            # with a step's effects half performed.
            done.set_result(None)
            await keeper  # an error in it is a bug in the library: the driver stops loudly
        self.metrics.owned(len(self._machine.owned))
        if action.kind is CallbackKind.ASSIGNED:
            self._assigned_once.set()

    async def _warm_up(self, warmup: StartWarmup) -> None:
        """``on_standby(resources)``, beside the driver's steps; its end is
        reported to the driver (a rejoin reports them warm)."""
        resources = warmup.resources
        started = time.perf_counter()
        failed = False
        try:
            result = getattr(self._listener, "on_standby", _nothing)(set(resources))
            if inspect.isawaitable(result):
                await result
        except Exception:
            failed = True
            log.exception("member %s: on_standby raised; %s not reported warm", self.client_id,
                          _fmt(resources))
        self.metrics.callback("standby", time.perf_counter() - started, failed)
        if not self._driver.stopped:
            self._driver.warmup_done(self._clock(), warmup, failed=failed)
            self._wakeup.set()

    async def _side_during_callback(self, done: asyncio.Future[None]) -> None:
        """Step the driver while a listener callback awaits (until ``done``):
        with a callback running it only runs the side channel (KIP-62). Not
        once ``done``: the callback's return is reported already (it may
        return before this task first runs)."""
        driver = self._driver
        while not done.done():
            await self._apply(driver.step(self._clock()))
            side = self._calls.get(Channel.SIDE)
            await self._first_of({done} if side is None else {done, side}, driver.wake_at)
            if done.done():
                return  # a side-channel answer is reported by the main loop
            self._report_calls((Channel.SIDE,))

    async def _first_of(self, waiters: set[asyncio.Future[Any]],
                        until_ms: int | None) -> set[asyncio.Future[Any]]:
        """Wait until one of ``waiters`` is done or the member's clock reads
        ``until_ms`` (None: no bound); returns those done. Cancels none of
        them."""
        timer: asyncio.Future[None] | None = None
        handle: TimerHandle | None = None
        if until_ms is not None:
            timer = asyncio.get_running_loop().create_future()
            handle = self._time.call_at(until_ms, _resolver(timer))
        try:
            await asyncio.wait(waiters if timer is None else waiters | {timer},
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if handle is not None:
                handle.cancel()
            if timer is not None:
                timer.cancel()
        return {w for w in waiters if w.done()}

    def _after_s(self, timeout_s: float | None) -> int | None:
        """The member's clock ``timeout_s`` seconds from now (None: never)."""
        return None if timeout_s is None else self._clock() + round(timeout_s * 1000)

    def _timed_out(self, api: Api) -> None:
        """A call got no answer within its timeout: tell a transport that
        cares (a router looks for the coordinator again)."""
        timed_out = getattr(self._transport, "timed_out", None)
        if timed_out is not None:
            timed_out(api)

    def _unreachable(self, error: str, url: str | None) -> None:
        """A call failed for want of a coordinator: at ``url`` when one failed
        (else the log names every URL the member was given)."""
        line = self._retry_log.failed(self._clock(), error, url)
        if line is not None:
            log.warning("%s", line)

    def _given_up_url(self) -> str | None:
        """The coordinator a call just failed at, for an answer or a time-out that
        carries no URL: the current one, else the one the router just gave up
        (credentials left out)."""
        router = self._router
        url = None if router is None else (router.current_url or router.failed_url)
        return None if url is None else redact_url(url)

    def _answered(self, api: str, response: Any) -> None:
        code = getattr(response, "error", None)
        if isinstance(code, ErrorCode) and ERROR_ACTIONS.get(code) is ErrorAction.RETRY:
            # COORDINATOR_NOT_AVAILABLE, LOAD_IN_PROGRESS, ...: retried like a
            # network failure, reported like one.
            self._unreachable(f"{api}: {code.value}", self._given_up_url())
            return
        line = self._retry_log.succeeded(self._clock(), self.coordinator_url)
        if line is not None:
            log.info("%s", line)

    def _drain_events(self) -> None:
        for event in self._machine.drain_events():
            if isinstance(event, RebalanceStarted):
                # The same join again after a retriable failure is no news.
                level = logging.DEBUG if self._retrying else logging.INFO
                self._retrying = False
                log.log(level, "member %s: rebalance started (%s)", self.client_id,
                        event.reason)
            elif isinstance(event, RebalanceCompleted):
                self.metrics.rebalance_completed(event.at_ms, event.latency_ms)
                log.info("member %s: generation %d, %d resources, rebalance took %d ms",
                         self.client_id, event.generation_id, len(self._machine.owned),
                         event.latency_ms)
            elif isinstance(event, RebalanceFailed):
                self.metrics.rebalance_failed(event.at_ms)
                self._retrying = event.retriable
                # Another rebalance starting meanwhile is routine (Kafka logs it at INFO);
                # a step retried for want of a coordinator is reported by _retry_log.
                level = (logging.DEBUG if event.retriable
                         else logging.INFO if ErrorCode.REBALANCE_IN_PROGRESS.value in event.reason
                         else logging.WARNING)
                log.log(level, "member %s: rebalance failed: %s", self.client_id, event.reason)
            elif isinstance(event, UnknownSets):
                who = "; ".join(f"{'this member' if m == self.member_id else m} "
                                f"subscribes to {', '.join(map(repr, sets))}"
                                for m, sets in event.members)
                log.warning("member %s (leader): the resource catalog has no such set: %s; "
                            "nothing of it is assigned (the catalog has: %s)", self.client_id,
                            who, ", ".join(map(repr, event.known)) or "no sets")

    async def _close_transport(self) -> None:
        if self._owns_transport:
            aclose = getattr(self._transport, "aclose", None)
            if aclose is not None:
                await aclose()


def _coordinator_urls(coordinator: object, *, tls_settings: bool) -> list[str] | None:
    """The URL(s) ``GroupMember`` was given, each checked (``ValueError``
    naming the bad one), or ``None`` for a transport."""
    if isinstance(coordinator, str):
        return [check_coordinator_url(coordinator, tls_settings=tls_settings)]
    if hasattr(coordinator, "call"):
        return None
    if not isinstance(coordinator, Sequence):
        raise ValueError(f"coordinator must be a URL, a list of URLs or a transport, "
                         f"got {type(coordinator).__name__}")
    if not coordinator:
        raise ValueError("coordinator: the list of URLs is empty; give at least one")
    urls = []
    for i, url in enumerate(coordinator):
        try:
            urls.append(check_coordinator_url(url, tls_settings=tls_settings))
        except ValueError as exc:
            raise ValueError(f"coordinator[{i}]: {exc}") from None
    return urls


def _describe(transport: Transport) -> str:
    """A transport as log lines name it: its URL when known."""
    url = getattr(transport, "base_url", None)
    if not isinstance(url, str):
        return type(transport).__name__
    return redact_url(url)  # never log credentials a URL may carry


def _fmt(resources: Iterable[Resource]) -> str:
    """Resources as log lines name them: ``shards[0], shards[3]``."""
    return ", ".join(f"{s}[{i}]" for s, i in sorted(resources))


def _nothing(resources: set[Resource]) -> None:
    return None


def _resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    def resolve() -> None:
        if not future.done():
            future.set_result(None)
    return resolve


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
