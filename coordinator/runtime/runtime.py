"""The runtime: one serial apply step, group commit, reply after commit.

DESIGN.md practices 4 and 5, after Kafka's group coordinator runtime:

- Every request and every timer firing becomes a command applied with
  ``core.handle(now_ms, command)`` synchronously on the event loop, one at a
  time, so no locks are needed and each transition is atomic.
- ``Persist`` effects are collected into a batch. While one storage
  transaction is in flight, the next batch collects (group commit), so many
  requests share one fsync.
- A ``Reply`` is released only after every write emitted before it — by this
  command or any earlier one — is committed. A reply that follows no pending
  write goes out at once.
- Timers are keyed by strings; arming a key again replaces its deadline,
  cancelling an unknown key is a no-op, and a firing whose key was re-armed or
  cancelled since is dropped before it reaches the core.
- Timers are lazy: every heartbeat pushes its member's session deadline
  later, and cancelling plus re-creating a loop timer for each one was a
  visible share of a heartbeat's cost. Re-arming a key for a deadline no
  earlier than its loop timer's only records the new deadline; when the loop
  timer fires before the recorded deadline it re-schedules itself for it. So
  the core sees ``TimerFired(key)`` once, at or after the latest deadline
  armed for the key, exactly as if every re-arm had replaced the loop timer.
- A storage failure leaves memory ahead of disk. Rather than serve from a
  state that a restart would not reproduce, the runtime fails every waiting
  reply with ``COORDINATOR_NOT_AVAILABLE``, stops serving (``/readyz`` 503)
  and sets :attr:`Runtime.failed`, on which ``groupcoord serve`` exits so a
  supervisor restarts it from what is on disk.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.core.commands import (
    Cancelled,
    Command,
    Commit,
    DeleteGroup,
    DeleteResource,
    Fetch,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
    TimerFired,
)
from coordinator.core.effects import (
    AdminResult,
    CancelTimer,
    Effect,
    GroupStateChanged,
    MemberExpired,
    Persist,
    RebalanceCompleted,
    Reply,
    ScheduleTimer,
)
from coordinator.core.records import Record, Snapshot
from coordinator.core.views import GroupSummary, GroupView
from coordinator.metrics import Metrics
from coordinator.runtime.clock import Clock, TimerHandle
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitResponse,
    FetchResponse,
    HeartbeatResponse,
    JoinResponse,
    LeaveResponse,
    Response,
    SyncResponse,
)

log = logging.getLogger("groupcoord.runtime")

Answer = Response | AdminResult


class Core(Protocol):
    """What the runtime needs of ``coordinator.core.GroupCoordinator``."""

    def handle(self, now_ms: int, command: Command) -> list[Effect]: ...

    def restore(self, snapshot: Snapshot, now_ms: int) -> list[Effect]: ...

    def state_counts(self) -> Mapping[str, int]: ...

    def member_count(self) -> int: ...

    def list_groups(self) -> Sequence[GroupSummary]: ...

    def describe_group(self, group_id: str) -> GroupView | None: ...

    def catalog(self) -> Mapping[str, int]: ...

    @property
    def resources_epoch(self) -> int: ...


class Store(Protocol):
    """What the runtime needs of :class:`coordinator.storage.sqlite.Storage`."""

    async def load(self) -> Snapshot: ...

    async def write(self, records: Sequence[Record]) -> float: ...


def error_answer(command: Command, code: ErrorCode) -> Answer:
    """The answer to ``command`` carrying only an error code."""
    match command:
        case Join():
            return JoinResponse(code, member_id=command.request.member_id)
        case Sync():
            return SyncResponse(code)
        case Heartbeat():
            return HeartbeatResponse(code)
        case Leave():
            return LeaveResponse(code)
        case Commit():
            return CommitResponse(code)
        case Fetch():
            return FetchResponse(code)
        case DeleteGroup() | PutResource() | DeleteResource():
            return AdminResult(code)
    raise TypeError(f"{type(command).__name__} has no answer")


@dataclass(slots=True)
class _Batch:
    records: list[Record] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Timer:
    """One armed key: the deadline the core asked for and the loop timer serving it.

    ``handle_deadline_ms`` (when the loop timer fires) is never later than
    ``deadline_ms``: an earlier deadline replaces the loop timer, a later one
    is only recorded (see the module docs).
    """

    deadline_ms: int
    handle_deadline_ms: int
    handle: TimerHandle | None = None


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Answer]
    command: Command
    #: True until the core emitted the Reply (it may still wait for a commit).
    in_core: bool = True


class Runtime:
    def __init__(self, core: Core, storage: Store, clock: Clock,
                 metrics: Metrics | None = None) -> None:
        self.core = core
        self.storage = storage
        self.clock = clock
        self.metrics = metrics
        #: True once state is loaded and until stop or a storage failure.
        self.ready = False
        #: set when a storage write failed; the server should exit.
        self.failed = asyncio.Event()
        self._stopping = False
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._timers: dict[str, _Timer] = {}
        self._open = _Batch()
        self._inflight: _Batch | None = None
        self._flusher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load the snapshot, rebuild the core, then serve."""
        snapshot = await self.storage.load()
        self._execute(self.core.restore(snapshot, self.clock.now_ms()))
        self.ready = True
        if self.metrics is not None:
            self.metrics.ready.set(1)
        log.info("loaded %d group(s), %d checkpoint group(s), %d resource set(s)",
                 len(snapshot.groups), len(snapshot.checkpoints), len(snapshot.catalog))

    async def stop(self) -> None:
        """Stop serving: cancel timers, let pending writes commit, answer the rest.

        Parked requests get ``COORDINATOR_NOT_AVAILABLE`` so their callers retry
        against the next instance; nothing is written on their behalf.
        """
        self._stopping = True
        self.ready = False
        if self.metrics is not None:
            self.metrics.ready.set(0)
        self._cancel_timers()
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        self._fail_waiters(ErrorCode.COORDINATOR_NOT_AVAILABLE)

    @property
    def pending_writes(self) -> int:
        """Records collected or in flight (for tests and diagnostics)."""
        inflight = len(self._inflight.records) if self._inflight else 0
        return len(self._open.records) + inflight

    # ------------------------------------------------------------ requests

    async def call(self, make: Callable[[int], Command]) -> Answer:
        """Apply the command ``make(request_id)`` and wait for its answer.

        If the caller goes away (the awaiting task is cancelled, as aiohttp
        does when a client disconnects) while the request is parked in the
        core, the core is told with ``Cancelled(request_id)``.
        """
        request_id = next(self._ids)
        command = make(request_id)
        if not self.ready:
            code = (ErrorCode.COORDINATOR_NOT_AVAILABLE if self._stopping or self.failed.is_set()
                    else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            return error_answer(command, code)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, command)
        self._waiters[request_id] = waiter
        self._apply(command)
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(request_id)
            raise

    def _abandon(self, request_id: int) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and waiter.in_core and self.ready:
            self._apply(Cancelled(request_id))

    # ------------------------------------------------------------ apply step

    def _apply(self, command: Command) -> None:
        try:
            effects = self.core.handle(self.clock.now_ms(), command)
        except Exception:
            # A bug in the core: answer this request, keep serving the others.
            log.exception("core failed on %s", type(command).__name__)
            request_id = getattr(command, "request_id", None)
            if isinstance(request_id, int) and request_id in self._waiters:
                self._resolve(request_id, error_answer(self._waiters[request_id].command,
                                                       ErrorCode.UNKNOWN_SERVER_ERROR))
            return
        self._execute(effects)

    def _execute(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Persist(record=record):
                    self._open.records.append(record)
                case Reply():
                    self._route_reply(effect)
                case ScheduleTimer(key=key, deadline_ms=deadline_ms):
                    self._arm(key, deadline_ms)
                case CancelTimer(key=key):
                    timer = self._timers.pop(key, None)
                    if timer is not None and timer.handle is not None:
                        timer.handle.cancel()
                case GroupStateChanged():
                    self._state_changed(effect)
                case RebalanceCompleted():
                    if self.metrics is not None:
                        self.metrics.rebalances_completed.inc()
                        self.metrics.rebalance_seconds.observe(effect.duration_ms / 1000)
                case MemberExpired():
                    log.info("group %s: member %s expired (session timeout)",
                             effect.group_id, effect.member_id)
                    if self.metrics is not None:
                        self.metrics.session_expiries.inc()
        if self._open.records and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    def _route_reply(self, reply: Reply) -> None:
        waiter = self._waiters.get(reply.request_id)
        if waiter is not None:
            waiter.in_core = False
        # Reply after commit: wait for the batch holding the latest write
        # emitted before this reply, if any is still uncommitted.
        if self._open.records:
            self._open.replies.append(reply)
        elif self._inflight is not None:
            self._inflight.replies.append(reply)
        else:
            self._resolve(reply.request_id, reply.response)

    def _resolve(self, request_id: int, answer: Answer) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(answer)

    def _state_changed(self, change: GroupStateChanged) -> None:
        log.info("group %s: %s -> %s (generation %d): %s", change.group_id,
                 change.old_state or "(new)", change.new_state, change.generation_id,
                 change.reason)
        if (self.metrics is not None and change.new_state == "PreparingRebalance"
                and change.old_state != "PreparingRebalance"):
            self.metrics.rebalances_started.inc()

    # ------------------------------------------------------------ timers

    def _arm(self, key: str, deadline_ms: int) -> None:
        timer = self._timers.get(key)
        if timer is not None and timer.handle_deadline_ms <= deadline_ms:
            # Lazy re-arm (a heartbeat pushing its session deadline later): the
            # loop timer fires first and re-schedules itself for this deadline.
            timer.deadline_ms = deadline_ms
            return
        if timer is not None and timer.handle is not None:
            timer.handle.cancel()
        timer = _Timer(deadline_ms, deadline_ms)
        timer.handle = self.clock.call_at(deadline_ms, functools.partial(self._fire, key, timer))
        self._timers[key] = timer

    def _fire(self, key: str, timer: _Timer) -> None:
        if self._timers.get(key) is not timer or not self.ready:
            return  # cancelled, replaced or stopped since: a stale firing
        if self.clock.now_ms() < timer.deadline_ms:
            # Re-armed for later since this loop timer was set: wait for that.
            timer.handle_deadline_ms = timer.deadline_ms
            timer.handle = self.clock.call_at(timer.deadline_ms,
                                              functools.partial(self._fire, key, timer))
            return
        del self._timers[key]
        self._apply(TimerFired(key))

    def _cancel_timers(self) -> None:
        for timer in self._timers.values():
            if timer.handle is not None:
                timer.handle.cancel()
        self._timers.clear()

    def timer_keys(self) -> list[str]:
        """Keys of the armed timers (for tests and diagnostics)."""
        return sorted(self._timers)

    # ------------------------------------------------------------ group commit

    async def _flush(self) -> None:
        try:
            while self._open.records:
                batch, self._open = self._open, _Batch()
                self._inflight = batch
                try:
                    seconds = await self.storage.write(batch.records)
                except Exception as exc:
                    self._storage_failed(exc)
                    return
                self._inflight = None
                if self.metrics is not None:
                    self.metrics.observe_commit(seconds, len(batch.records))
                for reply in batch.replies:
                    self._resolve(reply.request_id, reply.response)
        finally:
            self._flusher = None
            self._inflight = None

    def _storage_failed(self, exc: Exception) -> None:
        log.critical("storage write failed, memory is now ahead of disk; stopping service "
                     "(restart to reload from disk): %s", exc)
        self.ready = False
        if self.metrics is not None:
            self.metrics.storage_failures.inc()
            self.metrics.ready.set(0)
        self._cancel_timers()
        self._open = _Batch()
        self._fail_waiters(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        self.failed.set()

    def _fail_waiters(self, code: ErrorCode) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            if not waiter.future.done():
                waiter.future.set_result(error_answer(waiter.command, code))
