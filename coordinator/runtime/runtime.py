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
  pure bookkeeping the simulator (tests/sim/server.py) runs too.
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

Every rule above is decided by :class:`~coordinator.runtime.machine.RuntimeMachine`,
which does no I/O; :class:`Runtime` is its asyncio shell: it gives the machine
the clock's time and mints the request ids, turns the machine's effects into
futures answered, storage writes and loads run as tasks (their outcome fed back),
loop timers on the :class:`~coordinator.runtime.clock.Clock`, log lines and
metrics. The simulator (tests/sim/server.py) runs this shell and its machine
on an event loop it steps, with a simulated store and clock.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from coordinator import history, offload
from coordinator.core.commands import CallCommand, Command
from coordinator.core.effects import (
    DrainRequested,
    GroupStateChanged,
    MemberExpired,
    RebalanceCompleted,
)
from coordinator.core.records import REBALANCE_REASONS, JournalEntry, Record, Snapshot
from coordinator.metrics import Metrics
from coordinator.runtime import effects as fx
from coordinator.runtime.clock import Clock, TimerHandle
from coordinator.runtime.effects import Answer
from coordinator.runtime.machine import (
    REFUSAL_LOG_INTERVAL_MS,
    Core,
    CoreView,
    RuntimeMachine,
    error_answer,
)
from coordinator.storage.sqlite import RecordError
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse

__all__ = ["REFUSAL_LOG_INTERVAL_MS", "STORAGE_CHECK_INTERVAL_MS", "Answer", "Core", "CoreView",
           "Runtime", "Store", "error_answer"]

log = logging.getLogger("groupcoord.runtime")

#: how often an idle runtime checks that its database file is still the one open
#: (``Store.check``: three stat calls, a few microseconds).
STORAGE_CHECK_INTERVAL_MS = 1_000
_LIMIT_FLAGS = {"max_groups": "--max-groups", "max_groups_per_token": "--max-groups-per-token",
                "max_parked_requests": "--max-parked-requests",
                "max_parked_per_token": "--max-parked-per-token"}


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


class Runtime:
    """The asyncio shell of a :class:`RuntimeMachine` (module docs)."""

    def __init__(self, core: Core, storage: Store, clock: Clock,
                 metrics: Metrics | None = None, *, max_parked_requests: int = 0,
                 max_parked_per_token: int = 0,
                 storage_check_interval_ms: int = STORAGE_CHECK_INTERVAL_MS,
                 partition: int | None = None,
                 request_ids: Iterator[int] | None = None) -> None:
        self.machine = RuntimeMachine(core, max_parked_requests=max_parked_requests,
                                      max_parked_per_token=max_parked_per_token,
                                      storage_check_interval_ms=storage_check_interval_ms)
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
        #: set when a storage write or check failed; the server should exit.
        self.failed = asyncio.Event()
        #: set when a stop is over (its writes done, its calls answered).
        self._stopped = asyncio.Event()
        #: the loop serving this runtime, kept at the first call: asyncio.get_running_loop()
        #: costs a getpid() system call per call in CPython (its fork check).
        self._loop: asyncio.AbstractEventLoop | None = None
        #: where :meth:`new_request_id` draws from: the runtimes of several
        #: coordinators' partitions share their host's (coordinator.cluster).
        self._ids = itertools.count(1) if request_ids is None else request_ids
        #: the calls waiting for an Answered effect.
        self._futures: dict[int, asyncio.Future[Answer]] = {}
        self._loop_timers: dict[str, TimerHandle] = {}
        self._storage_check: TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._loads: set[asyncio.Task[None]] = set()

    @property
    def ready(self) -> bool:
        """True once state is loaded and until stop or a storage failure."""
        return self.machine.ready

    @property
    def max_parked_requests(self) -> int:
        """``--max-parked-requests`` (0: unlimited)."""
        return self.machine.max_parked_requests

    @property
    def max_parked_per_token(self) -> int:
        """``--max-parked-per-token`` (0: unlimited)."""
        return self.machine.max_parked_per_token

    @property
    def storage_check_interval_ms(self) -> int:
        """How often an idle runtime checks its database (0: only after commits)."""
        return self.machine.storage_check_interval_ms

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load the snapshot, rebuild the core, then serve."""
        snapshot = await self.storage.load()
        self.machine.start(self.clock.now_ms(), snapshot)
        if self.metrics is not None and self._owns_readiness:
            self.metrics.ready.set(1)
        self._perform()

    async def stop(self, code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> None:
        """Stop serving: cancel timers, let pending writes commit, answer the rest.

        Parked requests get ``code`` (``COORDINATOR_NOT_AVAILABLE``; a partition
        handed to another coordinator: ``NOT_COORDINATOR``) so their callers retry
        against the next instance; nothing is written on their behalf.
        """
        self._not_ready()
        self._stopped.clear()
        self.machine.stop(self.clock.now_ms(), code)
        self._perform()
        await asyncio.shield(self._stopped.wait())

    def abandon(self) -> None:
        """Stop serving at once, without waiting for anything (a partition whose lease
        may have run out): timers cancelled, uncommitted writes dropped (a fenced
        write would fail anyway), every waiting call answered
        ``COORDINATOR_NOT_AVAILABLE`` (not ``NOT_COORDINATOR``, which says nothing
        changed: a write in flight may still commit). That write finishes on its own;
        its replies are already answered."""
        self._not_ready()
        self.machine.abandon(self.clock.now_ms())
        self._perform()

    def submit(self, command: Command) -> None:
        """Apply a command that answers nothing (``AdoptCatalog``), if serving."""
        if self.machine.ready:
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
        return self.machine.commits.pending_writes

    def timer_keys(self) -> list[str]:
        """Keys of the armed timers (for tests and diagnostics)."""
        return self.machine.timer_keys()

    # ------------------------------------------------------------ requests

    def new_request_id(self) -> int:
        """A request id for a command of :meth:`request` or :meth:`call`, unique
        within this runtime."""
        return next(self._ids)

    def request(self, command: CallCommand) -> Answer | asyncio.Future[Answer]:
        """Apply ``command`` (its ``request_id`` from :meth:`new_request_id`): its
        answer, or a future of it when the command waits (a parked join, sync or
        long-poll heartbeat, a reply held until its writes commit).

        Most calls (a heartbeat of a Stable group with no write of its group or the
        catalog pending, most fetches) are answered within the apply step, with no
        future. Cancelling the future (the caller went away) tells the core:
        ``Cancelled(request_id)``.
        """
        request_id = command.request_id
        machine = self.machine
        answer = machine.request(self.clock.now_ms(), request_id, command)
        if machine.pending:
            self._perform()
        if answer is not None:
            return answer
        future: asyncio.Future[Answer] = self._running_loop().create_future()
        self._futures[request_id] = future
        future.add_done_callback(functools.partial(self._caller_gone, request_id))
        return future

    async def call(self, command: CallCommand) -> Answer:
        """Apply ``command`` (its ``request_id`` from :meth:`new_request_id`) and wait
        for its answer (the admin calls; :meth:`request` with the wait)."""
        answer = self.request(command)
        return await answer if isinstance(answer, asyncio.Future) else answer

    def _caller_gone(self, request_id: int, future: asyncio.Future[Answer]) -> None:
        """A request's future is done: if it was cancelled before its answer, the
        caller went away (its connection closed) while the request was parked."""
        if future.cancelled() and self._futures.pop(request_id, None) is not None:
            self.machine.caller_gone(self.clock.now_ms(), request_id)
            self._perform()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _apply(self, command: Command) -> None:
        """Apply ``command`` whose answer no caller waits for."""
        self.machine.apply(self.clock.now_ms(), command)
        self._perform()

    # ------------------------------------------------------------ effects

    def _perform(self) -> None:
        """Carry out the machine's effects, in order, until it has none (carrying one
        out may feed the machine an outcome, which emits more)."""
        machine = self.machine
        while machine.pending:
            for effect in machine.take():
                self._carry_out(effect)

    def _carry_out(self, effect: fx.MachineEffect) -> None:
        match effect:
            case fx.Answered(request_id=request_id, answer=answer):
                future = self._futures.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(answer)
            case fx.ArmTimer(key=key, deadline_ms=deadline_ms):
                handle = self._loop_timers.get(key)
                if handle is not None:
                    handle.cancel()
                self._loop_timers[key] = self.clock.call_at(
                    deadline_ms, functools.partial(self._timer_due, key))
            case fx.DisarmTimer(key=key):
                handle = self._loop_timers.pop(key, None)
                if handle is not None:
                    handle.cancel()
            case fx.DisarmTimers():
                for handle in self._loop_timers.values():
                    handle.cancel()
                self._loop_timers.clear()
            case fx.WriteDue():
                # As late as the loop allows: whatever else is applied meanwhile
                # shares the transaction (group commit).
                self._running_loop().call_soon(self._begin_write)
            case fx.WriteRecords(records=records):
                self._writer = self._running_loop().create_task(self._write(records))
            case fx.BatchCommitted(seconds=seconds, records=count):
                if self.metrics is not None:
                    self.metrics.observe_commit(seconds, count)
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
            case DrainRequested():
                log.info("group %r: member %r asked to drain", effect.group_id,
                         effect.member_id)
                if self.metrics is not None:
                    self.metrics.drain_requests.inc()
            case fx.JournalRecorded(entry=entry):
                if self.metrics is not None:
                    _count_moves(entry, self.metrics)
            case fx.ArmStorageCheck(deadline_ms=deadline_ms):
                self._cancel_storage_check()
                self._storage_check = self.clock.call_at(deadline_ms, self._storage_check_due)
            case fx.DisarmStorageCheck():
                self._cancel_storage_check()
            case fx.CheckStorage():
                try:
                    self.storage.check()
                except Exception as exc:
                    self.machine.storage_failed(self.clock.now_ms(), str(exc))
                else:
                    self.machine.storage_checked(self.clock.now_ms())
            case fx.LoadGroup(group_id=group_id):
                task = self._running_loop().create_task(self._load_group(group_id))
                self._loads.add(task)
                task.add_done_callback(self._loads.discard)
            case fx.LimitRefused():
                self._refused(effect)
            case fx.CoreRaised(command=name, error=error, group_id=group_id):
                if group_id is None:
                    log.error("core failed", exc_info=error)
                else:
                    # The traceback is for whoever debugs the core; the operator's
                    # line is GroupEvicted's.
                    log.debug("core failed on %s", name, exc_info=error)
            case fx.GroupEvicted(group_id=group_id, cause=cause, why=why):
                log.error("group %r: %s; it is reloaded from storage (its calls are answered "
                          "COORDINATOR_LOAD_IN_PROGRESS meanwhile; other groups are not "
                          "affected)", group_id, why)
                if self.metrics is not None:
                    self.metrics.group_reloads.labels(cause).inc()
            case fx.GroupReloaded(group_id=group_id, took_ms=took_ms, found=found):
                log.warning("group %r: reloaded from storage in %d ms (%s)", group_id,
                            took_ms, found)
            case fx.ServingStopped(why=why, storage=storage):
                self._serving_stopped(why, storage)
            case fx.Stopped():
                self._stopped.set()
            case fx.Loaded(groups=groups, checkpoint_groups=checkpoints,
                        resource_sets=resource_sets):
                # A partition's runtime: its host says it once for all its partitions.
                log.log(logging.INFO if self.partition is None else logging.DEBUG,
                        "loaded %d group(s), %d checkpoint group(s), %d resource set(s)",
                        groups, checkpoints, resource_sets)
            case fx.Applied():
                pass  # only asked for by the simulator

    def _begin_write(self) -> None:
        self.machine.begin_write(self.clock.now_ms())
        self._perform()

    def _timer_due(self, key: str) -> None:
        self._loop_timers.pop(key, None)
        self.machine.timer_due(self.clock.now_ms(), key)
        self._perform()

    def _storage_check_due(self) -> None:
        self._storage_check = None
        self.machine.storage_check_due(self.clock.now_ms())
        self._perform()

    def _cancel_storage_check(self) -> None:
        if self._storage_check is not None:
            self._storage_check.cancel()
            self._storage_check = None

    async def _write(self, records: Sequence[Record]) -> None:
        """One :class:`WriteRecords`: its outcome goes back to the machine."""
        machine = self.machine
        try:
            seconds = await self.storage.write(records)
        except RecordError as exc:
            self._writer = None
            machine.write_refused(self.clock.now_ms(), exc)
        except asyncio.CancelledError:
            # The loop shutting down: nothing is in flight any more.
            self._writer = None
            machine.write_cancelled(self.clock.now_ms())
            self._perform()
            raise
        except Exception as exc:
            self._writer = None
            machine.write_failed(self.clock.now_ms(), str(exc))
        else:
            self._writer = None
            machine.write_done(self.clock.now_ms(), seconds)
        self._perform()

    async def _load_group(self, group_id: str) -> None:
        try:
            snapshot = await self.storage.load_group(group_id)
        except Exception as exc:
            self.machine.group_load_failed(self.clock.now_ms(), group_id, str(exc))
        else:
            self.machine.group_loaded(self.clock.now_ms(), group_id, snapshot)
        self._perform()

    # ------------------------------------------------------------ logs and metrics

    def _refused(self, refusal: fx.LimitRefused) -> None:
        """Count a request refused by a limit; log it when the machine says so."""
        if self.metrics is not None:
            self.metrics.requests_refused.labels(refusal.reason).inc()
        if refusal.logged:
            log.warning("%s reached: refused a request for group %r with "
                        "COORDINATOR_NOT_AVAILABLE (%d more refused since the last such "
                        "warning; groupcoord_requests_refused_total counts them all)",
                        _LIMIT_FLAGS.get(refusal.reason, refusal.reason), refusal.group_id,
                        refusal.earlier)

    def _state_changed(self, change: GroupStateChanged) -> None:
        log.info("group %r: %s -> %s (generation %d): %s", change.group_id,
                 change.old_state or "(new)", change.new_state, change.generation_id,
                 change.reason)
        if self.metrics is not None and change.new_state == "Dead":
            self.metrics.forget_group(change.group_id)
        if (self.metrics is not None and change.new_state == "PreparingRebalance"
                and change.old_state != "PreparingRebalance"):
            reason = change.reason if change.reason in REBALANCE_REASONS else "other"
            self.metrics.rebalances_started.labels(reason).inc()

    def _serving_stopped(self, why: str, storage: bool) -> None:
        """Memory may be ahead of what is durable, or half-changed: the machine stopped
        serving it (module docs); set :attr:`failed`."""
        if storage and self.metrics is not None:
            self.metrics.storage_failures.inc()
        if self.partition is None:
            log.critical("%s; memory is now ahead of disk: stopping service (restart to "
                         "reload from disk)", why)
        else:
            log.warning("partition %d: %s; memory may be ahead of the database: the "
                        "partition is dropped (reloaded from the database by its next "
                        "owner)", self.partition, why)
        self._not_ready()
        for task in self._loads:
            task.cancel()
        self.failed.set()

    def _not_ready(self) -> None:
        if self.metrics is not None and self._owns_readiness:
            self.metrics.ready.set(0)


def _count_moves(entry: JournalEntry, metrics: Metrics) -> None:
    """``groupcoord_resource_moves_total``: what a generation's assignments gave their
    members, by the cause of their ``why`` entries; and the warm-ups they start and
    end (``groupcoord_warmups_*``). Large assignments are decoded on
    the offload worker, not on the loop that answers every group's calls."""
    def count() -> None:
        metrics.count_moves(history.gained_by_cause(entry.protocol_type, entry.assignments))
        metrics.count_warmups(entry)
    size = sum(len(blob) for blob in entry.assignments.values())
    if size >= offload.LARGE_BODY_BYTES:
        offload.submit(count)
    else:
        count()
