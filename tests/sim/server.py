"""The coordinator under simulation: the runtime's own machine, on simulated I/O.

:class:`SimCoordinator` drives the same
:class:`coordinator.runtime.machine.RuntimeMachine` that
``coordinator/runtime/runtime.py`` drives with asyncio, with the simulation's
clock, network and disk instead: admission and the parked-request limits,
every request and timer firing as one ``core.handle(now, command)``, group
commit and reply after commit, lazy timers, one group's failure evicting and
reloading it, stop and abandon are the machine's. What is left here is I/O:

- a request gets a request id mapped to its connection; an ``Answered``
  effect is sent on that connection, and a closed connection is
  ``caller_gone`` (the machine cancels a request still parked in the core);
- a ``WriteRecords`` takes a drawn disk latency (slower while a *slow disk*
  fault lasts) and then ``write_done``; one batch is written at a time;
- an ``ArmTimer`` is an event at its deadline (re-arming a key replaces it:
  the older event is dropped when it comes), delivered as ``timer_due``;
- a ``LoadGroup`` reads the group's committed records
  (``coordinator.core.replay.fold``) and delivers ``group_loaded``;
- a crash loses the machine: the open and the in-flight batch (what was not
  committed), every timer and every waiting reply (their connections reset);
  a restart folds the committed records (the reference for what storage
  keeps) into a new core and a new machine (``RuntimeMachine.start``).

The catalog read (``GET /v1/resources``) is answered from memory at once,
as the HTTP layer does. Anything the core raises is recorded as a finding
(``core_errors``), after the machine handled it as the runtime does.

What only the real runtime meets is drawn too (:class:`RuntimeFaults`, armed
by the world's faults): the core failing over one group (:class:`SimCore`
raises ``CoreFailure`` for the group's next call, before or after changing
its state), the store refusing one group's record (``write_refused``, saying
whose it was or not), a write or the idle storage check failing (serving
stops: the server exits and is started again), and the parked-request limits
(``max_parked_requests``, ``max_parked_per_token`` with each worker's token
as the principal), cut down for a while as when other groups' calls fill
them. A failure the world injected is expected, not a finding; any other is.

With several coordinators (:mod:`sim.cluster`) one of these is the runtime
of one partition a coordinator owns: its clock is the coordinator's drifting
clock, its writes are fenced writes to the simulated database (``write``, the
owner reporting with :meth:`write_result`), its timers wait while the
coordinator is paused (``gate``), and it can be abandoned (a lease run out, a
fenced or failed write) or stopped for a hand-off (writes finished, parked
calls answered ``NOT_COORDINATOR``), as ``Runtime.abandon`` and
``Runtime.stop`` do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from client.transport import CatalogResponse
from coordinator.config import ServerConfig
from coordinator.core.commands import (
    CallCommand,
    Command,
    Commit,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
)
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import CoreFailure, GroupCoordinator
from coordinator.core.effects import Effect, GroupStateChanged
from coordinator.core.records import Record
from coordinator.core.replay import fold
from coordinator.runtime import effects as fx
from coordinator.runtime import machine as rm
from coordinator.runtime.commits import command_group, record_group
from protocol.catalog import Weights, Zones
from protocol.errors import ErrorCode
from protocol.messages import Api, CommitRequest, HeartbeatRequest, JoinRequest, LeaveRequest

if TYPE_CHECKING:
    from sim.events import DriftClock, Sim
    from sim.network import Conn, Network

__all__ = ["InjectedFault", "RuntimeFaults", "SimCoordinator", "SimCore", "StoreRefusal"]

_COMMANDS: dict[type, Callable[[int, Any], Command]] = {
    HeartbeatRequest: Heartbeat, LeaveRequest: Leave, CommitRequest: Commit,
}
#: the limits ``groupcoord serve`` runs with by default.
_DEFAULTS = ServerConfig()


# Not a native class when mypyc compiles the simulator (benchmarks/build_sim_mypyc.py):
# mypyc's native classes cannot inherit from RuntimeError.
@mypyc_attr(native_class=False)
class InjectedFault(RuntimeError):
    """What the simulated core raises when the world made it fail (a bug in a handler)."""


class SimCore(GroupCoordinator):
    """The real core, made to fail once over one group when the world says so:
    its next call of that group (join, sync, heartbeat, leave, commit) raises
    ``CoreFailure`` as a handler that raised does -- before the handler ran, or
    after it (its state changed, its effects lost: what the runtime must not
    serve from)."""

    def __init__(self, config: CoreConfig) -> None:
        super().__init__(config)
        #: (group, after the handler ran) of the next failure; None: none armed.
        self.fail_next: tuple[str, bool] | None = None

    def handle(self, now_ms: int, command: Command) -> list[Effect]:
        armed = self.fail_next
        if armed is None or not hasattr(command, "request") or command_group(command) != armed[0]:
            return super().handle(now_ms, command)
        self.fail_next = None
        group_id, after = armed
        if after:
            super().handle(now_ms, command)
        raise CoreFailure(group_id, command, InjectedFault(
            f"injected {'after' if after else 'before'} {type(command).__name__}"))


@dataclass(frozen=True)
class StoreRefusal:
    """The store's ``RecordError`` (coordinator/storage/sqlite.py): a record it cannot
    store; ``group_id`` None when it could not say whose."""

    group_id: str | None
    problem: str


@dataclass
class RuntimeFaults:
    """What the world armed, each striking once (see the module docs)."""

    #: the next write holding a record of this group is refused: (group, says whose).
    refuse: tuple[str, bool] | None = None
    #: the next write fails (the database gone): whether it committed all the same
    #: (its answer lost: the outcome is unknown to the server); None: not armed.
    fail_write: bool | None = None
    #: the next idle storage check fails.
    fail_check: bool = False


class SimCoordinator:
    def __init__(self, sim: Sim, net: Network, rng: random.Random, config: CoreConfig, *,
                 disk_ms: tuple[int, int], clock: DriftClock | None = None,
                 max_parked_requests: int = _DEFAULTS.max_parked_requests,
                 max_parked_per_token: int = _DEFAULTS.max_parked_per_token,
                 storage_check_ms: int = 0, tokens: dict[str, str] | None = None) -> None:
        self.sim, self.net, self.rng, self.config = sim, net, rng, config
        #: the limits and the idle storage check each machine runs with.
        self.max_parked_requests = max_parked_requests
        self.max_parked_per_token = max_parked_per_token
        self.storage_check_ms = storage_check_ms
        #: worker name -> its token (authentication on: the principal of its calls).
        self.tokens = tokens or {}
        self.faults = RuntimeFaults()
        #: the record a refused write held (refused again in every write holding it).
        self._refused_record: Record | None = None
        #: a serving stop the world caused (a failed write or check) is expected.
        self._expect_stop = False
        #: when the idle storage check is due (None: not armed).
        self._check_at: int | None = None
        #: the server exited on a failure (the world starts it again).
        self.on_exit: Callable[[], None] | None = None
        #: request id -> who waits for the answer of a call made in-process
        #: (:meth:`call`: the world's own client of another group).
        self._calls: dict[int, Callable[[fx.Answer], None]] = {}
        #: after every step: the world's checks of the machine's bookkeeping.
        self.on_step: Callable[[], None] | None = None
        #: an answer sent on a connection (the world's reply-after-commit check).
        self.on_sent: Callable[[Conn, fx.Answer], None] | None = None
        #: the process's monotonic clock (None: the global one, a single coordinator).
        self.clock = clock
        #: (min, max) commit latency of one batch.
        self.disk_ms = disk_ms
        self.slow_disk_until = -1
        self.slow_disk_factor = 1
        #: when the batch being written commits, or a group being reloaded is read
        #: (a slow write or read outlasts its fault).
        self.inflight_done_at = 0
        self.up = False
        #: bumped by every crash, abandon and stop: events of an older incarnation
        #: are dropped.
        self.epoch = 0
        self.core: SimCore | None = None
        #: the runtime's machine; kept after an abandon until its write returns.
        self.machine: rm.RuntimeMachine | None = None
        self.durable: list[Record] = []
        self._rid = 0
        self._member_ids = 0
        #: request id -> the connection waiting for its answer.
        self._conns: dict[int, Conn] = {}
        #: key -> the deadline of the latest ArmTimer (an older event is dropped).
        self._timers: dict[str, int] = {}
        #: the records of the outstanding WriteRecords.
        self._writing: tuple[Record, ...] | None = None
        #: hooks of the invariant checker.
        self.on_effects: Callable[[Command, list[Effect], Conn | None], None] | None = None
        self.on_restored: Callable[[], None] | None = None
        #: an answer sent (several coordinators: a commit's checks wait for this).
        self.on_resolved: Callable[[int, fx.Answer], None] | None = None
        self.crashes = 0
        self.core_errors: list[str] = []
        #: several coordinators: records go to the database through this (the
        #: owner calls :meth:`write_result`); None: the simulated disk.
        self.write: Callable[[tuple[Record, ...]], None] | None = None
        #: several coordinators: True when the event must wait (the process is
        #: paused; it is kept and replayed) or must not run (it is gone).
        self.gate: Callable[[Callable[[Any], None], Any], bool] | None = None
        #: a member id for a first join (several coordinators: unique across them).
        self.new_member_id: Callable[[str], str] | None = None
        #: a hand-off in progress: called once the writes are done and the
        #: parked calls answered.
        self._stopped: Callable[[], None] | None = None
        #: inside abandon(): a hand-off it ends is told after it (as a later event).
        self._abandoning = False

    def now(self) -> int:
        """The time the machine is given: the process's own clock."""
        clock = self.clock
        return self.sim.now if clock is None else clock.local(self.sim.now)

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self.core = SimCore(self.config)
        machine = self.machine = rm.RuntimeMachine(
            self.core, max_parked_requests=self.max_parked_requests,
            max_parked_per_token=self.max_parked_per_token,
            storage_check_interval_ms=self.storage_check_ms)
        machine.trace = True
        self._writing = None
        self._check_at = None
        self._expect_stop = False
        self.up = True
        self.sim.log(f"coord up epoch={self.epoch} records={len(self.durable)}")
        machine.start(self.now(), fold(self.durable))
        self._perform(machine)
        if self.on_restored is not None:
            self.on_restored()

    def crash(self) -> None:
        if not self.up:
            return
        self.crashes += 1
        machine = self.machine
        lost = machine.commits.pending_writes if machine is not None else 0
        self.sim.log(f"coord CRASH epoch={self.epoch} uncommitted={lost}")
        self._gone()
        conns, self._conns = self._conns, {}
        for rid in sorted(conns):
            conn = conns[rid]
            if not conn.closed:
                self.net.reset(conn, "connection reset (coordinator crashed)")

    def _gone(self) -> None:
        """This incarnation is over: nothing it armed or started counts any more."""
        self.up = False
        self.epoch += 1
        self.core = None
        self.machine = None
        self._timers.clear()
        self._writing = None
        self._check_at = None
        self._calls.clear()

    def new_request_id(self) -> int:
        """``Runtime.new_request_id``: the next request id of this server."""
        self._rid += 1
        return self._rid

    def call(self, command: CallCommand, answered: Callable[[fx.Answer], None]) -> bool:
        """A call made in-process (the world's own client of another group), its
        ``request_id`` from :meth:`new_request_id`: its answer goes to
        ``answered``, unless the server goes down first."""
        machine = self.machine
        if not self.up or machine is None:
            return False
        rid = command.request_id
        self._calls[rid] = answered
        answer = machine.request(self.now(), rid, command)
        self._perform(machine)
        if answer is not None:
            self._answer(rid, answer)
        return True

    def submit(self, command: Command) -> None:
        """``Runtime.submit``: a command whose answer nobody waits for."""
        machine = self.machine
        if self.up and machine is not None and machine.ready:
            machine.apply(self.now(), command)
            self._perform(machine)

    # ------------------------------------------------------------ the network side

    def on_request(self, conn: Conn) -> None:
        machine = self.machine
        if not self.up or machine is None:
            self.net.reset(conn, "connection refused (coordinator down)")
            return
        core = self.core
        assert core is not None
        if conn.api == Api.RESOURCES:
            self.net.answer(conn, CatalogResponse(core.resources_epoch, dict(core.catalog()),
                                                  dict(core.catalog_placement())))
            return
        rid = conn.rid = self.new_request_id()
        request = conn.request
        command: Command
        principal = self.tokens.get(conn.member.name)
        if isinstance(request, JoinRequest):
            if self.new_member_id is not None:
                new_id = self.new_member_id(conn.member.name)
            else:
                self._member_ids += 1
                new_id = f"{conn.member.name}-m{self._member_ids}"
            command = Join(rid, request, conn.member.name, new_id, principal)
        elif conn.api == "sync":
            command = Sync(rid, request, principal)
        else:
            command = _COMMANDS[type(request)](rid, request)
        self._conns[rid] = conn
        answer = machine.request(self.now(), rid, command)
        self._perform(machine)
        if answer is not None:
            self._answer(rid, answer)

    def awaited(self, rid: int) -> bool:
        """Whether a caller still waits for the answer of request ``rid``."""
        return rid in self._conns or rid in self._calls

    def on_close(self, conn: Conn) -> None:
        rid = conn.rid
        machine = self.machine
        if rid is None or not self.up or machine is None or self._conns.get(rid) is not conn:
            return
        del self._conns[rid]
        machine.caller_gone(self.now(), rid)
        self._perform(machine)

    def _answer(self, rid: int, answer: fx.Answer) -> None:
        conn = self._conns.pop(rid, None)
        if conn is None:
            answered = self._calls.pop(rid, None)
            if answered is not None:
                answered(answer)
            return
        # Sent even if the member gave up meanwhile (its close is still on the
        # way): the member drops an answer on a connection it closed.
        self.net.answer(conn, answer)
        if self.on_sent is not None:
            self.on_sent(conn, answer)
        if self.on_resolved is not None:
            self.on_resolved(rid, answer)

    # ------------------------------------------------------------ the machine's effects

    def _perform(self, machine: rm.RuntimeMachine) -> None:
        while machine.pending:
            for effect in machine.take():
                self._carry_out(machine, effect)
        if self.on_step is not None and self.machine is machine:
            self.on_step()
        if machine.failed and self.machine is machine:
            # The server exits on a failure (a supervisor restarts it).
            self.sim.log(f"coord exits epoch={self.epoch}")
            self._gone()
            if self.on_exit is not None:
                self.on_exit()

    def _carry_out(self, machine: rm.RuntimeMachine, effect: fx.MachineEffect) -> None:
        match effect:
            case fx.Answered(request_id=rid, answer=answer):
                self._answer(rid, answer)
            case fx.Applied(command=command, effects=effects):
                if self.on_effects is not None:
                    of = getattr(command, "request_id", None)
                    conn = self._conns.get(of) if isinstance(of, int) else None
                    self.on_effects(command, list(effects), conn)
            case fx.ArmTimer(key=key, deadline_ms=deadline_ms):
                self._timers[key] = deadline_ms
                when = deadline_ms if self.clock is None else self.clock.global_at(deadline_ms)
                self.sim.at(when, self._fire, (self.epoch, key, deadline_ms))
            case fx.DisarmTimer(key=key):
                self._timers.pop(key, None)
            case fx.DisarmTimers():
                self._timers.clear()
            case fx.WriteDue():
                # At once: the simulated process has no loop iteration to wait for.
                machine.begin_write(self.now())
            case fx.WriteRecords(records=records):
                self._start_write(records)
            case fx.LoadGroup(group_id=group_id):
                ms = self._disk_latency()
                # A read on the slow disk ends when it ends, as a write does.
                self.inflight_done_at = max(self.inflight_done_at, self.sim.now + ms)
                self.sim.after(ms, self._loaded, (self.epoch, group_id))
            case fx.ArmStorageCheck(deadline_ms=deadline_ms):
                self._check_at = deadline_ms
                when = deadline_ms if self.clock is None else self.clock.global_at(deadline_ms)
                self.sim.at(when, self._check_due, (self.epoch, deadline_ms))
            case fx.DisarmStorageCheck():
                self._check_at = None
            case fx.CheckStorage():
                self.sim.after(self._disk_latency(), self._checked, self.epoch)
            case fx.CoreRaised(command=name, error=error):
                if not (isinstance(error, CoreFailure)
                        and isinstance(error.cause, InjectedFault)):
                    self.core_errors.append(f"core raised {error!r} on {name}")
                self.sim.log(f"coord CORE ERROR {error!r}")
            case fx.GroupEvicted(group_id=group_id, why=why):
                self.sim.log(f"coord evicted {group_id}: {why}")
            case fx.GroupReloaded(group_id=group_id, found=found):
                self.sim.log(f"coord reloaded {group_id}: {found}")
                if self.on_restored is not None:
                    self.on_restored()
            case fx.ServingStopped(why=why):
                if self._expect_stop:
                    self._expect_stop = False
                else:
                    self.core_errors.append(f"stopped serving: {why}")
                self.sim.log(f"coord STOPPED SERVING {why}")
            case fx.Stopped():
                self._stop_done()
            case GroupStateChanged():
                self.sim.log(f"coord group {effect.old_state}->{effect.new_state} "
                             f"gen={effect.generation_id} {effect.reason}")
            case _:
                pass  # metrics and log lines of the real runtime

    def _fire(self, arg: tuple[int, str, int]) -> None:
        if self.gate is not None and self.gate(self._fire, arg):
            return
        epoch, key, deadline = arg
        machine = self.machine
        if epoch != self.epoch or machine is None or self._timers.get(key) != deadline:
            return  # re-armed, cancelled, or from before a crash
        del self._timers[key]
        machine.timer_due(self.now(), key)
        self._perform(machine)

    # ------------------------------------------------------------ storage

    def _disk_latency(self) -> int:
        lo, hi = self.disk_ms
        ms = self.rng.randint(lo, hi)
        if self.sim.now < self.slow_disk_until:
            ms *= self.slow_disk_factor
        return ms

    def _start_write(self, records: tuple[Record, ...]) -> None:
        self._writing = records
        if self.write is not None:
            self.write(records)
            return
        refuse = self.faults.refuse
        if refuse is not None:
            poisoned = next((r for r in records if record_group(r) == refuse[0]), None)
            if poisoned is not None:
                self._refused_record = poisoned
        ms = self._disk_latency()
        self.inflight_done_at = self.sim.now + ms
        self.sim.after(ms, self._written, (self.epoch, records, ms))

    def _written(self, arg: tuple[int, tuple[Record, ...], int]) -> None:
        epoch, records, ms = arg
        machine = self.machine
        if epoch != self.epoch or machine is None or self._writing is not records:
            return  # the crash lost it
        self._writing = None
        now = self.now()
        poisoned = self._refused_record
        if poisoned is not None and any(r is poisoned for r in records):
            # The store cannot hold this record: nothing of the transaction is written.
            refuse = self.faults.refuse
            says = refuse is None or refuse[1]
            self.faults.refuse = None
            group_id = record_group(poisoned) if says else None
            self.sim.log(f"coord write REFUSED ({group_id or 'whose not said'})")
            machine.write_refused(now, StoreRefusal(group_id, "injected: a value it cannot hold"))
        elif self.faults.fail_write is not None:
            committed = self.faults.fail_write
            self.faults.fail_write = None
            if committed:
                self.durable.extend(records)  # the COMMIT went through, its answer was lost
            self.sim.log(f"coord write FAILED (committed={committed})")
            self._expect_stop = True
            machine.write_failed(now, "injected: the database went away")
        else:
            self.durable.extend(records)
            machine.write_done(now, ms / 1000)
        self._perform(machine)

    def _check_due(self, arg: tuple[int, int]) -> None:
        epoch, deadline = arg
        machine = self.machine
        if epoch != self.epoch or machine is None or self._check_at != deadline:
            return
        self._check_at = None
        machine.storage_check_due(self.now())
        self._perform(machine)

    def _checked(self, epoch: int) -> None:
        machine = self.machine
        if epoch != self.epoch or machine is None:
            return
        if self.faults.fail_check:
            self.faults.fail_check = False
            self._expect_stop = True
            self.sim.log("coord storage check FAILED")
            machine.storage_failed(self.now(), "injected: the database is read-only")
        else:
            machine.storage_checked(self.now())
        self._perform(machine)

    def _loaded(self, arg: tuple[int, str]) -> None:
        epoch, group_id = arg
        machine = self.machine
        if epoch != self.epoch or machine is None:
            return
        machine.group_loaded(self.now(), group_id,
                             fold([r for r in self.durable if record_group(r) == group_id]))
        self._perform(machine)

    # ------------------------------------------------------------ several coordinators

    def write_result(self, records: tuple[Record, ...], ok: bool) -> None:
        """The database answered the write of ``records``: committed (``ok``) or not
        (the owner drops the partition first). A hand-off abandoned meanwhile goes
        on now: ``Runtime.stop`` waits for the write in flight, whatever happened."""
        machine = self.machine
        if machine is None or self._writing is not records:
            return
        self._writing = None
        if ok:
            if self.up:
                self.durable.extend(records)
            machine.write_done(self.now(), 0.0)
        else:
            machine.write_failed(self.now(), "the database did not take the write")
        self._perform(machine)

    def abandon(self) -> None:
        """``Runtime.abandon``: serve nothing more from memory at once -- timers and
        uncommitted writes dropped, every waiting call answered
        ``COORDINATOR_NOT_AVAILABLE`` (its outcome unknown: a write in flight may
        still commit). A hand-off in progress ends when that write returns."""
        machine = self.machine
        if not self.up or machine is None:
            return
        self._abandoning = True
        machine.abandon(self.now())
        self._perform(machine)
        self._abandoning = False
        self.up = False
        self.epoch += 1
        self.core = None
        self._timers.clear()
        if not machine.writing:
            self.machine = None

    def stop(self, done: Callable[[], None],
             code: ErrorCode = ErrorCode.NOT_COORDINATOR) -> None:
        """``Runtime.stop(code)``: timers cancelled, the pending writes committed,
        then every call still waiting answered ``code`` (nothing was done for it);
        then ``done()``. ``NOT_COORDINATOR``: a hand-off; ``COORDINATOR_NOT_AVAILABLE``:
        the server shutting down."""
        machine = self.machine
        if not self.up or machine is None:
            done()
            return
        self._stopped = done
        machine.stop(self.now(), code)
        self._perform(machine)

    def _stop_done(self) -> None:
        done, self._stopped = self._stopped, None
        if self.up:
            self._gone()
        else:
            self.machine = None
        if done is None:
            return
        if self._abandoning:
            self.sim.after(0, lambda _: done())
        else:
            done()

    # ------------------------------------------------------------ admin helpers

    def put_resource(self, name: str, partitions: int, weights: Weights | None = None,
                     zones: Zones | None = None) -> bool:
        """An admin call (catalog change) applied here; its answer is not awaited."""
        if not self.up:
            return False
        self.submit(PutResource(self.new_request_id(), name, partitions, weights, zones))
        return True
