"""The runtime: one serial apply step, group commit, reply after commit.

docs/architecture.md practices 4 and 5, after Kafka's group coordinator runtime:

- Every request and every timer firing becomes a command applied with
  ``core.handle(now_ms, command)`` synchronously on the event loop, one at a
  time, so no locks are needed and each transition is atomic.
- ``Persist`` effects are collected into a batch. While one storage
  transaction is in flight, the next batch collects (group commit), so many
  requests share one fsync.
- A ``Reply`` is released only after every write it depends on is committed:
  every write of its own group (group records, checkpoints, journal entries,
  whichever command emitted them), every catalog write (heartbeat and sync
  answers carry ``resources_epoch``; any record not tied to one group counts
  as catalog), and every write emitted earlier by the same command. A reply
  that depends on no uncommitted write goes out at once, so a slow commit of
  group A's records does not hold group B's heartbeats (docs/architecture.md,
  practice 5). The batches and the rule are :class:`~coordinator.runtime.commits.Commits`,
  pure bookkeeping the simulator (tests/sim/server.py) drives too.
- Limits: ``max_parked_requests`` (``--max-parked-requests``) bounds the
  joins, syncs and long-poll heartbeats parked in the core. At the limit a
  long-poll is answered at once (as with ``wait_ms`` 0), and a join or sync
  first takes the place of the oldest parked long-poll (``ReleaseHeartbeat``),
  being refused only when joins and syncs alone fill the limit; the core keeps
  at most one parked heartbeat per member. ``max_groups`` and
  ``max_groups_per_token`` are enforced by the core. Refusals are counted and
  logged at most once a minute per limit.
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
- A failure confined to one group stays in that group, as Kafka reverts one
  group's state when its write fails: an exception in the core while it handles
  a command of one group (``CoreFailure`` names the group; the core may have
  changed part of that group's state before it raised), or a record of one
  group the store will not take (``RecordError``: the others of the batch are
  written, apart if the database did not say whose record it was). That call is
  answered ``UNKNOWN_SERVER_ERROR`` (and the calls whose writes went with the
  refused records); the group is evicted from the core, its parked calls and
  every call for it until it is back are answered
  ``COORDINATOR_LOAD_IN_PROGRESS``, and once none of its writes is uncommitted
  it is reloaded from what is durable (``Store.load_group``). One ERROR line
  names the group; ``groupcoord_reloaded_groups_total`` counts it. Every other
  group keeps serving.
- Any other storage failure (the database gone, full, fenced) leaves memory
  ahead of disk for every group. Rather than serve from a state that a restart
  would not reproduce, the runtime fails every waiting reply with
  ``COORDINATOR_NOT_AVAILABLE``, stops serving (``/readyz`` 503) and sets
  :attr:`Runtime.failed`, on which ``groupcoord serve`` exits so a supervisor
  restarts it from what is on disk. A database file deleted or replaced under
  the server is such a failure: the storage checks the file after every commit
  (before the replies go out), and the runtime asks it every
  ``storage_check_interval_ms`` while no write is in flight, so an idle server
  notices too (``/readyz`` 503 within that interval). An exception in the core
  over state of no one group (the catalog) is handled the same way. A
  partition's runtime among several coordinators (``partition`` set) does the
  same, and its host drops the partition.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from coordinator import history, offload
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
    ReleaseHeartbeat,
    RemoveMember,
    ResetCheckpoints,
    Sync,
    TimerFired,
    command_group,
)
from coordinator.core.coordinator import CoreFailure
from coordinator.core.effects import (
    AdminResult,
    CancelTimer,
    Effect,
    GroupStateChanged,
    MemberExpired,
    Persist,
    RebalanceCompleted,
    Reply,
    RequestRefused,
    ScheduleTimer,
)
from coordinator.core.health import Health
from coordinator.core.records import (
    REBALANCE_REASONS,
    CheckpointMeta,
    JournalEntry,
    Record,
    Snapshot,
)
from coordinator.core.views import GroupSummary, GroupView
from coordinator.metrics import Metrics
from coordinator.runtime.clock import Clock, TimerHandle
from coordinator.runtime.commits import Batch, Commits, record_group
from coordinator.storage.sqlite import RecordError
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitResponse,
    FetchResponse,
    FindCoordinatorResponse,
    HeartbeatResponse,
    JoinResponse,
    LeaveResponse,
    Response,
    SyncResponse,
)
from protocol.validate import Scalar

log = logging.getLogger("groupcoord.runtime")

Answer = Response | AdminResult

#: A refused request is logged at most this often per limit (the metric counts every one).
REFUSAL_LOG_INTERVAL_MS = 60_000
#: how often an idle runtime checks that its database file is still the one open
#: (``Store.check``: three stat calls, a few microseconds).
STORAGE_CHECK_INTERVAL_MS = 1_000
_LIMIT_FLAGS = {"max_groups": "--max-groups", "max_groups_per_token": "--max-groups-per-token",
                "max_parked_requests": "--max-parked-requests",
                "max_parked_per_token": "--max-parked-per-token"}


class CoreView(Protocol):
    """The read-only views of the groups held in memory (the admin API, the console,
    metrics): one core's, or every partition's of a coordinator among several."""

    def state_counts(self) -> Mapping[str, int]: ...

    def member_count(self) -> int: ...

    def list_groups(self) -> Sequence[GroupSummary]: ...

    def group_ids(self) -> Sequence[str]:
        """Every group's id, sorted (cheaper than :meth:`list_groups`: no summaries)."""

    def group_summary(self, group_id: str) -> GroupSummary | None: ...

    def describe_group(self, group_id: str) -> GroupView | None: ...

    def health(self, group_id: str, now_ms: int) -> Health: ...

    def catalog(self) -> Mapping[str, int]: ...

    def checkpoints(self, group_id: str) -> Mapping[tuple[str, int], Scalar]: ...

    def checkpoint_meta(self, group_id: str) -> Mapping[tuple[str, int], CheckpointMeta]: ...

    @property
    def resources_epoch(self) -> int: ...

    def parked_request_count(self) -> int: ...

    def parked_by(self, principal: str) -> int: ...


class Core(CoreView, Protocol):
    """What the runtime needs of ``coordinator.core.GroupCoordinator``."""

    def handle(self, now_ms: int, command: Command) -> list[Effect]: ...

    def restore(self, snapshot: Snapshot, now_ms: int) -> list[Effect]: ...

    def evict_group(self, group_id: str, now_ms: int) -> list[Effect]: ...

    def restore_group(self, snapshot: Snapshot, now_ms: int) -> list[Effect]: ...


class Store(Protocol):
    """What the runtime needs of :class:`coordinator.storage.sqlite.Storage`."""

    async def load(self) -> Snapshot: ...

    async def load_group(self, group_id: str) -> Snapshot:
        """One group's durable state (its rows only), checked as :meth:`load` checks it."""

    async def write(self, records: Sequence[Record]) -> float: ...

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]: ...

    def check(self) -> None:
        """Raise if what is open is no longer what the next start would load
        (the database file deleted or replaced); no I/O, called on the loop."""


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
        case DeleteGroup() | PutResource() | DeleteResource() | RemoveMember() \
                | ResetCheckpoints():
            return AdminResult(code)
    raise TypeError(f"{type(command).__name__} has no answer")


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
    command: Command
    #: made only for a call that waits (parked, or its reply held for a commit).
    future: asyncio.Future[Answer] | None = None
    #: the answer of a call resolved within its own apply step (no future needed).
    answer: Answer | None = None
    #: True until the core emitted the Reply (it may still wait for a commit).
    in_core: bool = True


class Runtime:
    def __init__(self, core: Core, storage: Store, clock: Clock,
                 metrics: Metrics | None = None, *, max_parked_requests: int = 0,
                 max_parked_per_token: int = 0,
                 storage_check_interval_ms: int = STORAGE_CHECK_INTERVAL_MS,
                 partition: int | None = None) -> None:
        if max_parked_requests < 0:
            raise ValueError(f"max_parked_requests: must be >= 0, got {max_parked_requests}")
        if max_parked_per_token < 0:
            raise ValueError(f"max_parked_per_token: must be >= 0, got {max_parked_per_token}")
        if storage_check_interval_ms < 0:
            raise ValueError(f"storage_check_interval_ms: must be >= 0, "
                             f"got {storage_check_interval_ms}")
        self.core = core
        self.storage = storage
        #: the protocol URL ``find_coordinator`` gives out for this one-process server
        #: (set by ``groupcoord serve`` once it listens).
        self.advertised_url = ""
        #: the partition this runtime serves among several coordinators
        #: (coordinator.cluster); ``None``: a one-process server's only runtime. A
        #: partition's runtime leaves the ``groupcoord_ready`` gauge to its host, and a
        #: failed write of it drops the partition instead of stopping the server.
        self.partition = partition
        self._owns_readiness = partition is None
        self.clock = clock
        self.metrics = metrics
        #: True once state is loaded and until stop or a storage failure.
        self.ready = False
        #: set when a storage write or check failed; the server should exit.
        self.failed = asyncio.Event()
        #: 0: only the check after each commit.
        self.storage_check_interval_ms = storage_check_interval_ms
        self._storage_check: TimerHandle | None = None
        self._stopping = False
        #: the loop serving this runtime, kept at the first call: asyncio.get_running_loop()
        #: costs a getpid() system call per call in CPython (its fork check).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._timers: dict[str, _Timer] = {}
        #: 0: unlimited.
        self.max_parked_requests = max_parked_requests
        #: parked joins and syncs of one token (authentication on); 0: unlimited.
        self.max_parked_per_token = max_parked_per_token
        #: the open batch, the one in flight, and which one each reply waits for.
        self._commits = Commits()
        self._flusher: asyncio.Task[None] | None = None
        #: per limit: when a refusal was last logged, and refusals since then.
        self._refusal_logged_ms: dict[str, int] = {}
        self._refusals_unlogged: dict[str, int] = {}
        #: groups evicted after a failure confined to them, until reloaded from
        #: storage: their reload task, ``None`` while a write of theirs is uncommitted.
        self._reloading: dict[str, asyncio.Task[None] | None] = {}

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load the snapshot, rebuild the core, then serve."""
        snapshot = await self.storage.load()
        self._execute(self.core.restore(snapshot, self.clock.now_ms()))
        self.ready = True
        if self.metrics is not None and self._owns_readiness:
            self.metrics.ready.set(1)
        self._arm_storage_check()
        # A partition's runtime: its host says it once for all its partitions.
        log.log(logging.INFO if self.partition is None else logging.DEBUG,
                "loaded %d group(s), %d checkpoint group(s), %d resource set(s)",
                len(snapshot.groups), len(snapshot.checkpoints), len(snapshot.catalog))

    async def stop(self, code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> None:
        """Stop serving: cancel timers, let pending writes commit, answer the rest.

        Parked requests get ``code`` (``COORDINATOR_NOT_AVAILABLE``; a partition
        handed to another coordinator: ``NOT_COORDINATOR``) so their callers retry
        against the next instance; nothing is written on their behalf.
        """
        self._stopping = True
        self.ready = False
        if self.metrics is not None and self._owns_readiness:
            self.metrics.ready.set(0)
        self._cancel_timers()
        self._cancel_storage_check()
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        self._fail_waiters(code)

    def abandon(self) -> None:
        """Stop serving at once, without waiting for anything (a partition whose lease
        may have run out): timers cancelled, uncommitted writes dropped (a fenced
        write would fail anyway), every waiting call answered
        ``COORDINATOR_NOT_AVAILABLE`` (not ``NOT_COORDINATOR``, which says nothing
        changed: a write in flight may still commit). That write finishes on its own;
        its replies are already answered."""
        self._stopping = True
        self._halt()

    def submit(self, command: Command) -> None:
        """Apply a command that answers nothing (``AdoptCatalog``), if serving."""
        if self.ready:
            self._apply(command)

    # ------------------------------------------------------------ routing (v1.1)

    def route(self, group_id: str) -> Runtime:
        """The runtime serving ``group_id``: a one-process server serves every group
        (``coordinator.cluster`` routes by partition)."""
        return self

    def find_coordinator(self, group_id: str) -> FindCoordinatorResponse:
        """``POST /v1/find_coordinator``: a one-process server answers its own URL."""
        return FindCoordinatorResponse(None, self.advertised_url, 0)

    async def refresh_groups(self) -> None:
        """Before a listing of every group: nothing to read for a one-process server
        (every group is in its core)."""

    def owner_admin_url(self, group_id: str) -> str | None:
        """A one-process server serves every group itself."""
        return None

    def coordinators(self) -> list[dict[str, Any]]:
        """``GET /v1/coordinators``: this one process, owning the one partition."""
        return [{"id": "local", "url": self.advertised_url, "admin_url": "",
                 "started_at": None, "partitions": [{"partition": 0, "epoch": 0,
                                                     "since": None}]}]

    @property
    def pending_writes(self) -> int:
        """Records collected or in flight (for tests and diagnostics)."""
        return self._commits.pending_writes

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
        if self._reloading and command_group(command) in self._reloading:
            # Being reloaded after a failure of its own: as Kafka answers while it
            # loads a group, the caller retries.
            return error_answer(command, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if self.max_parked_per_token and isinstance(command, (Join, Sync)) \
                and command.principal is not None \
                and self.core.parked_by(command.principal) >= self.max_parked_per_token:
            # The token's share of the parked requests is full: refused before the
            # core, like the global limit below, so one token's parked joins and
            # syncs leave the rest of the limit to the others. Its own parked calls
            # drain within their rebalance timeouts (--max-rebalance-timeout-ms).
            self._refused("max_parked_per_token", command_group(command) or "")
            return error_answer(command, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if self.max_parked_requests and isinstance(command, (Join, Sync, Heartbeat)) \
                and self.core.parked_request_count() >= self.max_parked_requests:
            if isinstance(command, Heartbeat):
                # At the limit a long-poll heartbeat is answered at once, as if
                # wait_ms were 0: it still renews the session (docs/protocol.md,
                # "POST /v1/heartbeat").
                if command.request.wait_ms > 0:
                    command = Heartbeat(command.request_id, replace(command.request, wait_ms=0))
            else:
                # A parked long-poll heartbeat is only a wait: answer the oldest one
                # now to make room, so heartbeats (one parked per member at most)
                # can never starve joins and syncs of other groups.
                self._apply(ReleaseHeartbeat())
            if not isinstance(command, Heartbeat) \
                    and self.core.parked_request_count() >= self.max_parked_requests:
                # Whether a join or sync would park depends on the group's state and
                # changing that state is what parking does; deciding it without
                # applying would duplicate the core. So when joins and syncs alone
                # fill the limit every join and sync is refused before it reaches
                # the core (it changes nothing); the client retries
                # COORDINATOR_NOT_AVAILABLE with backoff, and the parked requests
                # drain within their rebalance timeouts.
                self._refused("max_parked_requests", command_group(command) or "")
                return error_answer(command, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        waiter = _Waiter(command)
        self._waiters[request_id] = waiter
        self._apply(command)
        if waiter.answer is not None:
            # Answered within the apply step (a heartbeat of a Stable group with no
            # write of its group or the catalog pending, most fetches): no future.
            return waiter.answer
        future: asyncio.Future[Answer] = self._running_loop().create_future()
        waiter.future = future
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(request_id)
            raise

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _abandon(self, request_id: int) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and waiter.in_core and self.ready:
            self._apply(Cancelled(request_id))

    # ------------------------------------------------------------ apply step

    def _apply(self, command: Command) -> None:
        try:
            effects = self.core.handle(self.clock.now_ms(), command)
        except Exception as exc:
            # A bug in the core. It may have changed part of the state it was
            # changing before it raised, and serving from a half-changed state is
            # what a storage failure is also kept from. This request is answered
            # UNKNOWN_SERVER_ERROR. The core names whose state that was: one group's
            # is evicted and reloaded from what is durable while every other group
            # keeps serving (Kafka reverts one group when its write fails); state of
            # no one group (the catalog) stops serving as a storage failure does.
            request_id = getattr(command, "request_id", None)
            if isinstance(request_id, int) and request_id in self._waiters:
                self._resolve(request_id, error_answer(self._waiters[request_id].command,
                                                       ErrorCode.UNKNOWN_SERVER_ERROR))
            group_id = exc.group_id if isinstance(exc, CoreFailure) else None
            if group_id is None:
                log.error("core failed", exc_info=exc)
                self._stop_serving(f"the core failed on {type(command).__name__}: {exc!r}")
                return
            # The traceback is for whoever debugs the core; the operator's line is
            # the one below.
            log.debug("core failed on %s", type(command).__name__, exc_info=exc)
            cause = exc.cause if isinstance(exc, CoreFailure) else exc
            self._isolate(group_id, "core",
                          f"the core failed on {type(command).__name__}: {cause!r}")
            return
        self._execute(effects)

    def _execute(self, effects: list[Effect]) -> None:
        #: this command emitted a write (into the open batch) before the current effect.
        wrote = False
        commits = self._commits
        for effect in effects:
            # The effects of a heartbeat (a session re-arm and a reply) are matched first.
            match effect:
                case ScheduleTimer(key=key, deadline_ms=deadline_ms):
                    self._arm(key, deadline_ms)
                case Reply():
                    self._route_reply(effect, wrote)
                case Persist(record=record):
                    commits.write(record)
                    wrote = True
                    if type(record) is JournalEntry and self.metrics is not None:
                        self._count_moves(record, self.metrics)
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
                    log.info("group %r: member %r expired (session timeout)",
                             effect.group_id, effect.member_id)
                    if self.metrics is not None:
                        self.metrics.session_expiries.inc()
                case RequestRefused(group_id=group_id, reason=reason):
                    self._refused(reason, group_id)
        if commits.open.records and self._flusher is None:
            self._flusher = self._running_loop().create_task(self._flush())

    @staticmethod
    def _count_moves(entry: JournalEntry, metrics: Metrics) -> None:
        """``groupcoord_resource_moves_total``: what this generation's assignments
        gave their members, by the cause of their ``why`` entries. Large
        assignments are decoded on the offload worker, not on the loop that
        answers every group's calls."""
        def count() -> None:
            metrics.count_moves(history.gained_by_cause(entry.protocol_type,
                                                        entry.assignments))
        size = sum(len(blob) for blob in entry.assignments.values())
        if size >= offload.LARGE_BODY_BYTES:
            offload.submit(count)
        else:
            count()

    def _route_reply(self, reply: Reply, wrote: bool) -> None:
        waiter = self._waiters.get(reply.request_id)
        if waiter is None:
            return  # the caller went away: nothing to release
        waiter.in_core = False
        # Reply after commit, per group: wait for the latest uncommitted batch
        # holding a write this reply depends on (Commits.wait_for). With nothing
        # uncommitted, the steady state of heartbeats, the tracker says so in
        # one attribute and the reply goes now without a call.
        commits = self._commits
        if not wrote and commits.idle:
            self._resolve(reply.request_id, reply.response)
            return
        batch = commits.wait_for(waiter.command, wrote)
        if batch is None:
            self._resolve(reply.request_id, reply.response)
        else:
            batch.replies.append(reply)

    def _refused(self, reason: str, group_id: str) -> None:
        """Count a request refused by a limit; log it at most once per interval per limit."""
        if self.metrics is not None:
            self.metrics.requests_refused.labels(reason).inc()
        now = self.clock.now_ms()
        last = self._refusal_logged_ms.get(reason)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL_MS:
            self._refusals_unlogged[reason] = self._refusals_unlogged.get(reason, 0) + 1
            return
        earlier = self._refusals_unlogged.pop(reason, 0)
        self._refusal_logged_ms[reason] = now
        log.warning("%s reached: refused a request for group %r with COORDINATOR_NOT_AVAILABLE "
                    "(%d more refused since the last such warning; "
                    "groupcoord_requests_refused_total counts them all)",
                    _LIMIT_FLAGS.get(reason, reason), group_id, earlier)

    def _resolve(self, request_id: int, answer: Answer) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            _settle(waiter, answer)

    def _state_changed(self, change: GroupStateChanged) -> None:
        log.info("group %r: %s -> %s (generation %d): %s", change.group_id,
                 change.old_state or "(new)", change.new_state, change.generation_id,
                 change.reason)
        if (self.metrics is not None and change.new_state == "PreparingRebalance"
                and change.old_state != "PreparingRebalance"):
            reason = change.reason if change.reason in REBALANCE_REASONS else "other"
            self.metrics.rebalances_started.labels(reason).inc()

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
        commits = self._commits
        try:
            while commits.open.records:
                batch = commits.start_commit()
                written = await self._write(batch)
                if written is None:
                    return  # storage failed: stopped serving
                seconds, refused = written
                commits.committed(batch)
                if self.metrics is not None:
                    self.metrics.observe_commit(seconds, len(batch.records))
                for reply in batch.replies:
                    if refused and self._request_group(reply.request_id) in refused:
                        # Its group's writes were not made durable.
                        self._resolve(reply.request_id, error_answer(
                            self._waiters[reply.request_id].command,
                            ErrorCode.UNKNOWN_SERVER_ERROR))
                    else:
                        self._resolve(reply.request_id, reply.response)
                for group_id, problem in refused.items():
                    self._isolate(group_id, "storage", f"the store refused its records: {problem}")
                self._reload_committed()
        finally:
            self._flusher = None
            # Cancelled mid-write (the loop shutting down): nothing is in flight.
            commits.inflight = None

    async def _write(self, batch: Batch) -> tuple[float, dict[str, str]] | None:
        """Make ``batch`` durable; returns the seconds it took and the groups whose
        records the store refused (:class:`RecordError`), with why. Those records
        are left out and everything else is written. ``None``: the storage failed
        (the database gone, full, fenced): serving has stopped.

        A store that names the group of the record it refused has that group's
        records left out and the rest written again; one that does not (the
        database refused a value) has each group's records written apart, so the
        refused ones fail alone. The catalog's records refused stop serving."""
        records = batch.records
        refused: dict[str, str] = {}
        while True:
            try:
                return await self.storage.write(records), refused
            except RecordError as exc:
                if exc.group_id is None or exc.group_id in refused:
                    break
                refused[exc.group_id] = exc.problem
                records = [r for r in records if record_group(r) not in refused]
                if not records:
                    return 0.0, refused
            except Exception as exc:
                self._storage_failed(exc)
                return None
        units: dict[str | None, list[Record]] = {}
        for record in records:
            units.setdefault(record_group(record), []).append(record)
        seconds = 0.0
        for group_id, unit in units.items():
            try:
                seconds += await self.storage.write(unit)
            except RecordError as exc:
                if group_id is None:
                    self._storage_failed(exc)
                    return None
                refused[group_id] = exc.problem
            except Exception as exc:
                self._storage_failed(exc)
                return None
        return seconds, refused

    def _request_group(self, request_id: int) -> str | None:
        waiter = self._waiters.get(request_id)
        return None if waiter is None else command_group(waiter.command)

    # ------------------------------------------------------------ one group's failure

    def _isolate(self, group_id: str, cause: str, why: str) -> None:
        """A failure confined to one group: memory may be ahead of what is durable
        for it, or half-changed. Evict it from the core, answer its parked calls
        ``COORDINATOR_LOAD_IN_PROGRESS``, and reload it from storage once no write
        of it is uncommitted; until then its calls get the same answer. Every
        other group keeps serving."""
        if not self.ready:
            return
        first = group_id not in self._reloading
        if first:
            self._reloading[group_id] = None
            log.error("group %r: %s; it is reloaded from storage (its calls are answered "
                      "COORDINATOR_LOAD_IN_PROGRESS meanwhile; other groups are not "
                      "affected)", group_id, why)
            if self.metrics is not None:
                self.metrics.group_reloads.labels(cause).inc()
        self._execute(self.core.evict_group(group_id, self.clock.now_ms()))
        # Its parked calls are no longer in the core.
        for request_id, waiter in list(self._waiters.items()):
            if waiter.in_core and command_group(waiter.command) == group_id:
                self._resolve(request_id, error_answer(
                    waiter.command, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
        if cause == "storage":
            # What it wrote since the refused batch was built on what is not durable.
            self._drop_open_writes(group_id)
        self._reload_committed()

    def _drop_open_writes(self, group_id: str) -> None:
        opened = self._commits.open
        self._commits.drop_group(group_id)
        kept = []
        for reply in opened.replies:
            if self._request_group(reply.request_id) == group_id:
                self._resolve(reply.request_id, error_answer(
                    self._waiters[reply.request_id].command, ErrorCode.UNKNOWN_SERVER_ERROR))
            else:
                kept.append(reply)
        opened.replies = kept

    def _reload_committed(self) -> None:
        """Start the reload of every evicted group none of whose writes is uncommitted
        (what is durable is then all it wrote)."""
        if not self._reloading:
            return
        for group_id, task in self._reloading.items():
            if task is None and not self._commits.holds(group_id):
                self._reloading[group_id] = self._running_loop().create_task(
                    self._reload(group_id))

    async def _reload(self, group_id: str) -> None:
        started = time.perf_counter()
        try:
            snapshot = await self.storage.load_group(group_id)
        except Exception as exc:
            self._storage_failed(exc)
            return
        if not self.ready or group_id not in self._reloading:
            return
        del self._reloading[group_id]
        try:
            effects = self.core.restore_group(snapshot, self.clock.now_ms())
        except Exception as exc:
            self._stop_serving(f"group {group_id!r}: reloading it from storage failed: {exc!r}")
            return
        self._execute(effects)
        record = next((r for r in snapshot.groups if r.group_id == group_id), None)
        log.warning("group %r: reloaded from storage in %.0f ms (%s)", group_id,
                    (time.perf_counter() - started) * 1000,
                    "nothing durable: it starts anew" if record is None and group_id
                    not in snapshot.checkpoints else
                    f"generation {record.generation_id}, {len(record.members)} member(s)"
                    if record is not None else "checkpoints only")

    def _arm_storage_check(self) -> None:
        if self.storage_check_interval_ms and self.ready:
            self._storage_check = self.clock.call_at(
                self.clock.now_ms() + self.storage_check_interval_ms, self._check_storage)

    def _cancel_storage_check(self) -> None:
        if self._storage_check is not None:
            self._storage_check.cancel()
            self._storage_check = None

    def _check_storage(self) -> None:
        """The idle check: with no write in flight (a write checks after its commit)."""
        self._storage_check = None
        if not self.ready:
            return
        if self._flusher is None:
            try:
                self.storage.check()
            except Exception as exc:
                self._storage_failed(exc)
                return
        self._arm_storage_check()

    def _storage_failed(self, exc: Exception) -> None:
        if self.failed.is_set():
            return
        if self.metrics is not None:
            self.metrics.storage_failures.inc()
        self._stop_serving(f"storage failed: {exc}")

    def _stop_serving(self, why: str) -> None:
        """Memory may be ahead of what is durable, or half-changed: stop serving it
        (module docs) and set :attr:`failed`."""
        if self.failed.is_set():
            return
        if self.partition is None:
            log.critical("%s; memory is now ahead of disk: stopping service (restart to "
                         "reload from disk)", why)
        else:
            log.warning("partition %d: %s; memory may be ahead of the database: the "
                        "partition is dropped (reloaded from the database by its next "
                        "owner)", self.partition, why)
        self._halt()
        self.failed.set()

    def _halt(self) -> None:
        """Serve nothing more from memory: not ready, timers and the storage check
        cancelled, uncommitted writes dropped, every waiting call answered
        ``COORDINATOR_NOT_AVAILABLE`` (its outcome unknown)."""
        self.ready = False
        if self.metrics is not None and self._owns_readiness:
            self.metrics.ready.set(0)
        self._cancel_timers()
        self._cancel_storage_check()
        self._commits.clear()
        for task in self._reloading.values():
            if task is not None:
                task.cancel()
        self._reloading.clear()
        self._fail_waiters(ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def _fail_waiters(self, code: ErrorCode) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            _settle(waiter, error_answer(waiter.command, code))


def _settle(waiter: _Waiter, answer: Answer) -> None:
    """Give a waiter its answer: to its future if it is awaiting one, else to
    :meth:`Runtime.call` still in its apply step."""
    future = waiter.future
    if future is None:
        waiter.answer = answer
    elif not future.done():
        future.set_result(answer)
