"""The runtime's decisions and bookkeeping, without I/O: :class:`RuntimeMachine`.

docs/architecture.md practices 4, 5 and 11. The machine is what the runtime
decides; it never awaits, reads a clock or touches storage. Every input is a
method call carrying ``now_ms`` (a request arrives, its caller went away, a
timer is due, a write finished or was refused or failed, a group's snapshot
loaded, the storage check passed or failed, stop); every output is a frozen
value (``coordinator/runtime/effects.py``) appended to an outbox the caller
takes with :meth:`RuntimeMachine.take`
and carries out in order (answer request N, write these records, arm the loop
timer of a key, load a group, log or count something). Two drivers run the
same machine: :class:`~coordinator.runtime.runtime.Runtime` (asyncio, SQLite or
PostgreSQL), which the simulator's coordinator (``tests/sim/server.py``) runs
too, on a simulated clock, disk and network.

The rules (the module docs of ``runtime.py`` say what each costs a user):

- Admission: nothing is served before :meth:`start` or after :meth:`stop`,
  :meth:`abandon` or a failure; a group being reloaded answers
  ``COORDINATOR_LOAD_IN_PROGRESS``; ``max_parked_per_token`` and
  ``max_parked_requests`` bound the joins, syncs and long-poll heartbeats
  parked in the core (a long-poll at the limit is answered at once, a join or
  sync first releases the oldest parked long-poll, ``ReleaseHeartbeat``).
- Every request and timer firing is one ``core.handle(now_ms, command)``; its
  ``Persist`` effects collect into the open batch of
  :class:`~coordinator.runtime.commits.Commits` and one batch is written at a
  time (group commit); a reply waits for the latest uncommitted batch holding a
  write it depends on.
- A request answered within its own step is returned by :meth:`request` (the
  heartbeat of a Stable group with nothing uncommitted: no outbox entry at all);
  any later answer is an :class:`Answered` effect.
- Timers are lazy: re-arming a key for a deadline no earlier than its loop
  timer's only records it; a loop timer due before the recorded deadline
  re-arms itself (:class:`ArmTimer` again) instead of reaching the core.
- A record the store refuses (:meth:`write_refused`) leaves its group out of
  the batch, which is written again without it (or group by group when the
  store could not say whose record it was); that group is evicted and
  reloaded (:class:`LoadGroup`) once none of its writes is uncommitted, as is a
  group whose command made the core raise a ``CoreFailure``.
- Any other storage failure, or the core failing over no one group, stops
  serving (:class:`ServingStopped`): every waiting call is answered
  ``COORDINATOR_NOT_AVAILABLE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from coordinator.core.commands import (
    Cancelled,
    Command,
    Commit,
    DeleteGroup,
    DeleteResource,
    DrainMember,
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
    DrainRequested,
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
from coordinator.core.records import CheckpointMeta, JournalEntry, Record, Snapshot
from coordinator.core.views import DrainCounts, GroupSummary, GroupView
from coordinator.runtime.commits import Batch, Commits, record_group
from coordinator.runtime.effects import (
    Answer,
    Answered,
    Applied,
    ArmStorageCheck,
    ArmTimer,
    BatchCommitted,
    CheckStorage,
    CoreRaised,
    DisarmStorageCheck,
    DisarmTimer,
    DisarmTimers,
    GroupEvicted,
    GroupReloaded,
    JournalRecorded,
    LimitRefused,
    Loaded,
    LoadGroup,
    MachineEffect,
    ServingStopped,
    Stopped,
    WriteDue,
    WriteRecords,
)
from protocol.catalog import Placement
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitResponse,
    FetchResponse,
    HeartbeatResponse,
    JoinResponse,
    LeaveResponse,
    SyncResponse,
)
from protocol.validate import Scalar

#: A refused request is logged at most this often per limit (the metric counts every one).
REFUSAL_LOG_INTERVAL_MS = 60_000


class CoreView(Protocol):
    """The read-only views of the groups held in memory (the admin API, the console,
    metrics): one core's, or every partition's of a coordinator among several."""

    def state_counts(self) -> Mapping[str, int]: ...

    def member_count(self) -> int: ...

    def drain_counts(self) -> DrainCounts: ...

    def list_groups(self) -> Sequence[GroupSummary]: ...

    def group_ids(self) -> Sequence[str]:
        """Every group's id, sorted (cheaper than :meth:`list_groups`: no summaries)."""

    def group_summary(self, group_id: str) -> GroupSummary | None: ...

    def describe_group(self, group_id: str) -> GroupView | None: ...

    def health(self, group_id: str, now_ms: int) -> Health: ...

    def catalog(self) -> Mapping[str, int]: ...

    def catalog_placement(self) -> Mapping[str, Placement]:
        """The weights and zones of the catalog's sets that are not the default."""

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
                | DrainMember() | ResetCheckpoints():
            return AdminResult(code)
    raise TypeError(f"{type(command).__name__} has no answer")


class _RecordRefused(Protocol):
    """What :meth:`RuntimeMachine.write_refused` needs of the store's ``RecordError``."""

    @property
    def group_id(self) -> str | None: ...

    @property
    def problem(self) -> str: ...


# ---------------------------------------------------------------- bookkeeping


class _Timer:
    """One armed key: the deadline the core asked for and the loop timer serving it.

    ``loop_ms`` (when the loop timer goes off) is never later than
    ``deadline_ms``: an earlier deadline replaces the loop timer, a later one is
    only recorded.
    """

    __slots__ = ("deadline_ms", "loop_ms")

    def __init__(self, deadline_ms: int) -> None:
        self.deadline_ms = deadline_ms
        self.loop_ms = deadline_ms


class _Waiter:
    __slots__ = ("answer", "command", "in_core", "waiting")

    def __init__(self, command: Command) -> None:
        self.command = command
        #: the answer of a call resolved within its own step (no Answered effect).
        self.answer: Answer | None = None
        #: True until the core emitted the Reply (it may still wait for a commit).
        self.in_core = True
        #: its caller waits for an Answered effect (the step that admitted it is over).
        self.waiting = False


class _Write:
    """The write outstanding: the batch, what is being written of it, and the
    groups whose records the store refused so far."""

    __slots__ = ("batch", "refused", "seconds", "unit_group", "units", "void")

    def __init__(self) -> None:
        #: None until :meth:`RuntimeMachine.begin_write` took the open batch.
        self.batch: Batch | None = None
        self.refused: dict[str, str] = {}
        #: None: the batch (less the refused groups) as one transaction; else the
        #: groups' records still to write apart, one transaction each.
        self.units: list[tuple[str | None, list[Record]]] | None = None
        self.unit_group: str | None = None
        self.seconds = 0.0
        #: serving stopped since it began: its outcome changes nothing.
        self.void = False


class RuntimeMachine:
    """The runtime's state and decisions; see the module docs."""

    def __init__(self, core: Core, *, max_parked_requests: int = 0,
                 max_parked_per_token: int = 0, storage_check_interval_ms: int = 0) -> None:
        if max_parked_requests < 0:
            raise ValueError(f"max_parked_requests: must be >= 0, got {max_parked_requests}")
        if max_parked_per_token < 0:
            raise ValueError(f"max_parked_per_token: must be >= 0, got {max_parked_per_token}")
        if storage_check_interval_ms < 0:
            raise ValueError(f"storage_check_interval_ms: must be >= 0, "
                             f"got {storage_check_interval_ms}")
        self.core = core
        #: 0: unlimited.
        self.max_parked_requests = max_parked_requests
        #: parked joins and syncs of one token (authentication on); 0: unlimited.
        self.max_parked_per_token = max_parked_per_token
        #: 0: only the check after each commit (the store's own).
        self.storage_check_interval_ms = storage_check_interval_ms
        #: True once state is loaded and until stop or a failure.
        self.ready = False
        #: serving stopped on a failure (:class:`ServingStopped` was emitted).
        self.failed = False
        #: emit :class:`Applied` for every command applied (the simulator's checks).
        self.trace = False
        self._stopping = False
        #: the code every waiting call gets once a stop's writes are done; None: no stop.
        self._stop_code: ErrorCode | None = None
        self._out: list[MachineEffect] = []
        self._waiters: dict[int, _Waiter] = {}
        self._timers: dict[str, _Timer] = {}
        #: the open batch, the one in flight, and which one each reply waits for.
        self.commits = Commits()
        self._write: _Write | None = None
        #: per limit: when a refusal was last logged, and refusals since then.
        self._refusal_logged_ms: dict[str, int] = {}
        self._refusals_unlogged: dict[str, int] = {}
        #: groups evicted after a failure confined to them, until reloaded: when
        #: their load began, ``None`` while a write of theirs is uncommitted.
        self._reloading: dict[str, int | None] = {}

    # ------------------------------------------------------------ outputs

    @property
    def pending(self) -> bool:
        """Effects wait in the outbox."""
        return bool(self._out)

    def take(self) -> list[MachineEffect]:
        """The effects emitted since the last call, in order (the outbox is emptied)."""
        out, self._out = self._out, []
        return out

    def timer_keys(self) -> list[str]:
        """Keys of the armed timers."""
        return sorted(self._timers)

    @property
    def writing(self) -> bool:
        """A :class:`WriteRecords` is outstanding."""
        return self._write is not None

    # ------------------------------------------------------------ lifecycle

    def start(self, now_ms: int, snapshot: Snapshot) -> None:
        """Rebuild the core from ``snapshot``, then serve."""
        self._execute(now_ms, self.core.restore(snapshot, now_ms))
        self.ready = True
        self._arm_storage_check(now_ms)
        self._out.append(Loaded(len(snapshot.groups), len(snapshot.checkpoints),
                                len(snapshot.catalog)))

    def stop(self, now_ms: int, code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> None:
        """Stop serving: timers cancelled, the pending writes written, then every
        waiting call answered ``code`` and :class:`Stopped` emitted."""
        self._stopping = True
        self.ready = False
        self._cancel_timers()
        self._stop_code = code
        if self._write is None:
            self._finish_stop()

    def abandon(self, now_ms: int) -> None:
        """Stop serving at once: uncommitted writes dropped, every waiting call
        answered ``COORDINATOR_NOT_AVAILABLE``. A write outstanding is void (a
        stop in progress ends when it returns)."""
        self._stopping = True
        self._halt()

    # ------------------------------------------------------------ requests

    def request(self, now_ms: int, request_id: int, command: Command) -> Answer | None:
        """A call: admit and apply ``command``. Returns its answer if it is given
        within this step; otherwise an :class:`Answered` follows."""
        if not self.ready:
            code = (ErrorCode.COORDINATOR_NOT_AVAILABLE if self._stopping or self.failed
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
            self._refused(now_ms, "max_parked_per_token", command_group(command) or "")
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
                self._apply(now_ms, ReleaseHeartbeat())
            if not isinstance(command, Heartbeat) \
                    and self.core.parked_request_count() >= self.max_parked_requests:
                # Whether a join or sync would park depends on the group's state and
                # changing that state is what parking does; deciding it without
                # applying would duplicate the core. So when joins and syncs alone
                # fill the limit every join and sync is refused before it reaches
                # the core (it changes nothing); the client retries
                # COORDINATOR_NOT_AVAILABLE with backoff, and the parked requests
                # drain within their rebalance timeouts.
                self._refused(now_ms, "max_parked_requests", command_group(command) or "")
                return error_answer(command, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        waiter = _Waiter(command)
        self._waiters[request_id] = waiter
        self._apply(now_ms, command)
        answer = waiter.answer
        if answer is None:
            waiter.waiting = True
        return answer

    def caller_gone(self, now_ms: int, request_id: int) -> None:
        """The caller of ``request_id`` went away: no answer is wanted, and a request
        still parked in the core is cancelled there (``Cancelled``)."""
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and waiter.in_core and self.ready:
            self._apply(now_ms, Cancelled(request_id))

    def apply(self, now_ms: int, command: Command) -> None:
        """Apply a command whose answer no caller waits for (``AdoptCatalog``, an
        admin call of the simulator)."""
        self._apply(now_ms, command)

    # ------------------------------------------------------------ timers

    def timer_due(self, now_ms: int, key: str) -> None:
        """The loop timer of ``key`` (the latest :class:`ArmTimer` of it) went off."""
        timer = self._timers.get(key)
        if timer is None or not self.ready:
            return  # cancelled or stopped since
        if now_ms < timer.deadline_ms:
            # Re-armed for later since this loop timer was set: wait for that.
            timer.loop_ms = timer.deadline_ms
            self._out.append(ArmTimer(key, timer.deadline_ms))
            return
        del self._timers[key]
        self._apply(now_ms, TimerFired(key))

    def _arm(self, key: str, deadline_ms: int) -> None:
        timer = self._timers.get(key)
        if timer is not None:
            if timer.loop_ms <= deadline_ms:
                # Lazy re-arm (a heartbeat pushing its session deadline later): the
                # loop timer goes off first and re-arms itself for this deadline.
                timer.deadline_ms = deadline_ms
                return
            timer.deadline_ms = timer.loop_ms = deadline_ms
        else:
            self._timers[key] = _Timer(deadline_ms)
        self._out.append(ArmTimer(key, deadline_ms))

    def _cancel_timers(self) -> None:
        if self._timers:
            self._timers.clear()
            self._out.append(DisarmTimers())
        self._out.append(DisarmStorageCheck())

    # ------------------------------------------------------------ storage check

    def _arm_storage_check(self, now_ms: int) -> None:
        if self.storage_check_interval_ms and self.ready:
            self._out.append(ArmStorageCheck(now_ms + self.storage_check_interval_ms))

    def storage_check_due(self, now_ms: int) -> None:
        """The idle check's time: check unless a write is outstanding (a write
        checks after its commit), else wait another interval."""
        if not self.ready:
            return
        if self._write is None:
            self._out.append(CheckStorage())
        else:
            self._arm_storage_check(now_ms)

    def storage_checked(self, now_ms: int) -> None:
        """The :class:`CheckStorage` found nothing wrong."""
        self._arm_storage_check(now_ms)

    def storage_failed(self, now_ms: int, error: str) -> None:
        """Storage failed outside a write (the check): stop serving."""
        self._stop_serving(f"storage failed: {error}", storage=True)

    # ------------------------------------------------------------ apply step

    def _apply(self, now_ms: int, command: Command) -> None:
        try:
            effects = self.core.handle(now_ms, command)
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
            name = type(command).__name__
            group_id = exc.group_id if isinstance(exc, CoreFailure) else None
            self._out.append(CoreRaised(name, exc, group_id))
            if group_id is None:
                self._stop_serving(f"the core failed on {name}: {exc!r}", storage=False)
                return
            cause = exc.cause if isinstance(exc, CoreFailure) else exc
            self._isolate(now_ms, group_id, "core", f"the core failed on {name}: {cause!r}")
            return
        if self.trace:
            self._out.append(Applied(command, tuple(effects)))
        self._execute(now_ms, effects)

    def _execute(self, now_ms: int, effects: list[Effect]) -> None:
        #: this command emitted a write (into the open batch) before the current effect.
        wrote = False
        commits = self.commits
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
                    if type(record) is JournalEntry:
                        self._out.append(JournalRecorded(record))
                case CancelTimer(key=key):
                    if self._timers.pop(key, None) is not None:
                        self._out.append(DisarmTimer(key))
                case GroupStateChanged() | RebalanceCompleted() | MemberExpired() \
                        | DrainRequested():
                    self._out.append(effect)
                case RequestRefused(group_id=group_id, reason=reason):
                    self._refused(now_ms, reason, group_id)
        if commits.open.records and self._write is None:
            self._start_write()

    def _route_reply(self, reply: Reply, wrote: bool) -> None:
        waiter = self._waiters.get(reply.request_id)
        if waiter is None:
            return  # the caller went away: nothing to release
        waiter.in_core = False
        # Reply after commit, per group: wait for the latest uncommitted batch
        # holding a write this reply depends on (Commits.wait_for). With nothing
        # uncommitted, the steady state of heartbeats, the tracker says so in
        # one attribute and the reply goes now without a call.
        commits = self.commits
        if not wrote and commits.idle:
            self._resolve(reply.request_id, reply.response)
            return
        batch = commits.wait_for(waiter.command, wrote)
        if batch is None:
            self._resolve(reply.request_id, reply.response)
        else:
            batch.replies.append(reply)

    def _resolve(self, request_id: int, answer: Answer) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is None:
            return
        if waiter.waiting:
            self._out.append(Answered(request_id, answer))
        else:
            waiter.answer = answer

    def _refused(self, now_ms: int, reason: str, group_id: str) -> None:
        """A request refused by a limit: counted always, logged at most once per
        interval per limit."""
        last = self._refusal_logged_ms.get(reason)
        if last is not None and now_ms - last < REFUSAL_LOG_INTERVAL_MS:
            self._refusals_unlogged[reason] = self._refusals_unlogged.get(reason, 0) + 1
            self._out.append(LimitRefused(reason, group_id, False, 0))
            return
        earlier = self._refusals_unlogged.pop(reason, 0)
        self._refusal_logged_ms[reason] = now_ms
        self._out.append(LimitRefused(reason, group_id, True, earlier))

    def _request_group(self, request_id: int) -> str | None:
        waiter = self._waiters.get(request_id)
        return None if waiter is None else command_group(waiter.command)

    # ------------------------------------------------------------ group commit

    def _start_write(self) -> None:
        self._write = _Write()
        self._out.append(WriteDue())

    def begin_write(self, now_ms: int) -> None:
        """The :class:`WriteDue`: the open batch is now the one in flight
        (:class:`WriteRecords`)."""
        write = self._write
        if write is None or write.batch is not None:
            return
        if write.void or not self.commits.open.records:
            self._write_over()
            return
        batch = write.batch = self.commits.start_commit()
        self._out.append(WriteRecords(tuple(batch.records)))

    def _reported(self) -> _Write | None:
        """The outstanding write an outcome is about; None when there is nothing to
        act on (none outstanding, or a void one, which is over now)."""
        write = self._write
        if write is None or write.batch is None:
            return None
        if write.void:
            self._write_over()
            return None
        return write

    def write_done(self, now_ms: int, seconds: float) -> None:
        """The outstanding :class:`WriteRecords` committed in ``seconds``."""
        write = self._reported()
        if write is None:
            return
        if write.units is None:
            self._committed(now_ms, write, seconds)
        else:
            write.seconds += seconds
            self._next_unit(now_ms, write)

    def write_refused(self, now_ms: int, error: _RecordRefused) -> None:
        """The store refused a record of the outstanding write (nothing of that
        transaction was written). ``error.group_id``: whose record, if the store
        could say. That group's records are left out and the rest written again;
        when the store could not say, each group's records are written apart so
        the refused ones fail alone. The catalog's records refused stop serving."""
        write = self._reported()
        if write is None:
            return
        group_id = error.group_id
        if write.units is None:
            if group_id is None or group_id in write.refused:
                units: dict[str | None, list[Record]] = {}
                for record in self._unrefused(write):
                    units.setdefault(record_group(record), []).append(record)
                write.units = list(units.items())
                self._next_unit(now_ms, write)
                return
            write.refused[group_id] = error.problem
            records = self._unrefused(write)
            if not records:
                self._committed(now_ms, write, 0.0)
            else:
                self._out.append(WriteRecords(tuple(records)))
            return
        if write.unit_group is None:
            self._write = None
            self._stop_serving(f"storage failed: {error}", storage=True)
            return
        write.refused[write.unit_group] = error.problem
        self._next_unit(now_ms, write)

    def write_failed(self, now_ms: int, error: str) -> None:
        """The outstanding write failed otherwise (the database gone, full, fenced):
        memory is ahead of disk for every group; serving stops."""
        write = self._reported()
        if write is None:
            return
        self._write = None
        self._stop_serving(f"storage failed: {error}", storage=True)

    def write_cancelled(self, now_ms: int) -> None:
        """The outstanding write will not report (its task was cancelled: the loop is
        closing): nothing is in flight."""
        if self._write is not None:
            self.commits.inflight = None
            self._write_over()

    def _unrefused(self, write: _Write) -> list[Record]:
        refused = write.refused
        assert write.batch is not None
        return [r for r in write.batch.records if record_group(r) not in refused]

    def _next_unit(self, now_ms: int, write: _Write) -> None:
        units = write.units
        assert units is not None
        if not units:
            self._committed(now_ms, write, write.seconds)
            return
        write.unit_group, records = units.pop(0)
        self._out.append(WriteRecords(tuple(records)))

    def _committed(self, now_ms: int, write: _Write, seconds: float) -> None:
        batch = write.batch
        assert batch is not None
        commits = self.commits
        commits.committed(batch)
        self._out.append(BatchCommitted(seconds, len(batch.records)))
        refused = write.refused
        for reply in batch.replies:
            if refused and self._request_group(reply.request_id) in refused:
                # Its group's writes were not made durable.
                self._resolve(reply.request_id, error_answer(
                    self._waiters[reply.request_id].command, ErrorCode.UNKNOWN_SERVER_ERROR))
            else:
                self._resolve(reply.request_id, reply.response)
        for group_id, problem in refused.items():
            self._isolate(now_ms, group_id, "storage",
                          f"the store refused its records: {problem}")
        self._reload_committed(now_ms)
        # Only now: what the isolations above dropped must not go out first.
        self._write = None
        if commits.open.records:
            self._start_write()
        else:
            self._write_over()

    def _write_over(self) -> None:
        """No write is outstanding any more: a stop waiting for it ends."""
        self._write = None
        if self._stop_code is not None:
            self._finish_stop()

    # ------------------------------------------------------------ one group's failure

    def _isolate(self, now_ms: int, group_id: str, cause: str, why: str) -> None:
        """A failure confined to one group: evict it from the core, answer its parked
        calls ``COORDINATOR_LOAD_IN_PROGRESS``, and reload it from storage once no
        write of it is uncommitted; until then its calls get the same answer."""
        if not self.ready:
            return
        if group_id not in self._reloading:
            self._reloading[group_id] = None
            self._out.append(GroupEvicted(group_id, cause, why))
        self._execute(now_ms, self.core.evict_group(group_id, now_ms))
        # Its parked calls are no longer in the core.
        for request_id, waiter in list(self._waiters.items()):
            if waiter.in_core and command_group(waiter.command) == group_id:
                self._resolve(request_id, error_answer(
                    waiter.command, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
        if cause == "storage":
            # What it wrote since the refused batch was built on what is not durable.
            self._drop_open_writes(group_id)
        self._reload_committed(now_ms)

    def _drop_open_writes(self, group_id: str) -> None:
        opened = self.commits.open
        self.commits.drop_group(group_id)
        kept = []
        for reply in opened.replies:
            if self._request_group(reply.request_id) == group_id:
                self._resolve(reply.request_id, error_answer(
                    self._waiters[reply.request_id].command, ErrorCode.UNKNOWN_SERVER_ERROR))
            else:
                kept.append(reply)
        opened.replies = kept

    def _reload_committed(self, now_ms: int) -> None:
        """Load every evicted group none of whose writes is uncommitted (what is
        durable is then all it wrote)."""
        if not self._reloading:
            return
        for group_id, began in self._reloading.items():
            if began is None and not self.commits.holds(group_id):
                self._reloading[group_id] = now_ms
                self._out.append(LoadGroup(group_id))

    def group_loaded(self, now_ms: int, group_id: str, snapshot: Snapshot) -> None:
        """The :class:`LoadGroup` of ``group_id`` read ``snapshot``: restore it."""
        if not self.ready or self._reloading.get(group_id) is None:
            return
        began = self._reloading.pop(group_id)
        assert began is not None
        try:
            effects = self.core.restore_group(snapshot, now_ms)
        except Exception as exc:
            self._stop_serving(f"group {group_id!r}: reloading it from storage failed: "
                               f"{exc!r}", storage=False)
            return
        self._execute(now_ms, effects)
        record = next((r for r in snapshot.groups if r.group_id == group_id), None)
        found = ("nothing durable: it starts anew" if record is None
                 and group_id not in snapshot.checkpoints else
                 f"generation {record.generation_id}, {len(record.members)} member(s)"
                 if record is not None else "checkpoints only")
        self._out.append(GroupReloaded(group_id, now_ms - began, found))

    def group_load_failed(self, now_ms: int, group_id: str, error: str) -> None:
        """The :class:`LoadGroup` of ``group_id`` failed: a storage failure."""
        if self._reloading.get(group_id) is not None:
            self._stop_serving(f"storage failed: {error}", storage=True)

    # ------------------------------------------------------------ stopping

    def _stop_serving(self, why: str, *, storage: bool) -> None:
        """Stop serving on a failure, once (:class:`ServingStopped`)."""
        if self.failed:
            return
        self.failed = True
        self._out.append(ServingStopped(why, storage))
        self._halt()

    def _halt(self) -> None:
        """Serve nothing more from memory: not ready, timers and the storage check
        cancelled, uncommitted writes dropped, every waiting call answered
        ``COORDINATOR_NOT_AVAILABLE`` (its outcome unknown)."""
        self.ready = False
        self._cancel_timers()
        self.commits.clear()
        if self._write is not None:
            self._write.void = True
        self._reloading.clear()
        self._fail_waiters(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if self._stop_code is not None and self._write is None:
            self._finish_stop()

    def _finish_stop(self) -> None:
        code = self._stop_code
        assert code is not None
        self._stop_code = None
        self._fail_waiters(code)
        self._out.append(Stopped())

    def _fail_waiters(self, code: ErrorCode) -> None:
        waiters, self._waiters = self._waiters, {}
        for request_id, waiter in waiters.items():
            answer = error_answer(waiter.command, code)
            if waiter.waiting:
                self._out.append(Answered(request_id, answer))
            else:
                waiter.answer = answer
