"""The coordinator under simulation: the production runtime, on simulated I/O.

:class:`SimCoordinator` runs the same :class:`coordinator.runtime.runtime.Runtime`
that ``groupcoord serve`` runs -- its machine
(:class:`coordinator.runtime.machine.RuntimeMachine`: admission and the
parked-request limits, every request and timer firing as one
``core.handle(now, command)``, group commit and reply after commit, lazy
timers, one group's failure evicting and reloading it, stop and abandon) and
its asyncio shell (futures of parked calls, the write and load tasks, the
timer handles, the failure flag) -- on an event loop of its own
(:class:`sim.loop.SimLoop`) that the simulation steps. What is left here is I/O:

- a request gets a request id mapped to its connection; ``Runtime.request``
  answers it or gives a future, whose answer is sent on that connection; a
  closed connection cancels the future (the runtime cancels the parked call);
- the store (:class:`SimStore`): a write takes a drawn disk latency (slower
  while a *slow disk* fault lasts) and then returns, fails or is refused; a
  group's load reads its committed records
  (``coordinator.core.replay.fold``) after a disk latency;
- the clock (:class:`SimClock`): ``call_at`` is an event of the simulation at
  the deadline, run on the loop unless the handle was cancelled;
- a crash loses the process: its loop with every task, future and timer of
  it (what was not committed), and every waiting reply (their connections
  reset); a restart folds the committed records (the reference for what
  storage keeps) into a new core and a new runtime (``Runtime.start``).

Each entry (a request, a closed connection, a timer, a write's outcome) is
one step of the loop: the callback, then everything it made ready, until
the loop would wait. Calls out of the process that could come back into it
(a partition's fenced write, a hand-off's end) are made after the step.

The catalog read (``GET /v1/resources``) is answered from memory at once,
as the HTTP layer does. Anything the core raises is recorded as a finding
(``core_errors``), after the runtime handled it; so is an exception the
loop catches (a bug in the shell).

What only the real runtime meets is drawn too (:class:`RuntimeFaults`, armed
by the world's faults): the core failing over one group (:class:`SimCore`
raises ``CoreFailure`` for the group's next call, before or after changing
its state), the store refusing one group's record (``RecordError``, saying
whose it was or not), a write or the idle storage check failing (serving
stops: the server exits and is started again), and the parked-request limits
(``max_parked_requests``, ``max_parked_per_token`` with each worker's token
as the principal), cut down for a while as when other groups' calls fill
them. A failure the world injected is expected, not a finding; any other is.

With several coordinators (:mod:`sim.cluster`) each partition's runtime is
made by the production partition host; what it shares with this one is
:class:`SimServing`: the connections and futures of its calls, and what the
checker is shown of what it does.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from mypy_extensions import mypyc_attr

from client.transport import CatalogResponse
from coordinator.config import ServerConfig
from coordinator.core.commands import (
    CallCommand,
    Command,
    Commit,
    Fetch,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
)
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import CoreFailure, GroupCoordinator
from coordinator.core.effects import Effect, GroupStateChanged
from coordinator.core.records import JournalEntry, Record, Snapshot
from coordinator.core.replay import fold
from coordinator.metrics import Metrics
from coordinator.runtime import effects as fx
from coordinator.runtime import machine as rm
from coordinator.runtime.clock import Clock
from coordinator.runtime.commits import command_group, record_group
from coordinator.runtime.runtime import Core, Runtime, Store
from coordinator.storage.sqlite import RecordError, StorageError
from protocol.catalog import Weights, Zones
from protocol.errors import ErrorCode
from protocol.messages import (
    Api,
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
)
from sim.events import SimTimer
from sim.loop import SimLoop

if TYPE_CHECKING:
    from sim.events import Sim
    from sim.network import Conn, Network

__all__ = ["InjectedFault", "RuntimeFaults", "SimClock", "SimCoordinator", "SimCore",
           "SimRuntime", "SimServing", "SimStore"]

_COMMANDS: dict[type, Callable[[int, Any], Command]] = {
    HeartbeatRequest: Heartbeat, LeaveRequest: Leave, CommitRequest: Commit,
    FetchRequest: Fetch,
}
#: the limits ``groupcoord serve`` runs with by default.
_DEFAULTS = ServerConfig()
#: what a refused record's ``RecordError`` names as the database.
SIM_DISK = "<simulated disk>"


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


# ---------------------------------------------------------------- the runtime's I/O


class SimClock:
    """The runtime's clock: the process's own time; a timer is an event of the
    simulation at its deadline (``SimCoordinator.fire``)."""

    def __init__(self, coordinator: SimCoordinator) -> None:
        self.coordinator = coordinator

    def now_ms(self) -> int:
        return self.coordinator.now()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> SimTimer:
        coordinator = self.coordinator
        timer = SimTimer(callback)
        coordinator.sim.at(deadline_ms, coordinator.fire, (coordinator.epoch, timer))
        return timer


class SimStore:
    """The runtime's store: the simulated disk (or, with several coordinators, the
    simulated database through the owner's fenced write)."""

    def __init__(self, coordinator: SimCoordinator) -> None:
        self.coordinator = coordinator

    async def load(self) -> Snapshot:
        return fold(self.coordinator.durable)

    async def load_group(self, group_id: str) -> Snapshot:
        coordinator = self.coordinator
        future: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        ms = coordinator.disk_latency()
        # A read on the slow disk ends when it ends, as a write does.
        coordinator.inflight_done_at = max(coordinator.inflight_done_at,
                                           coordinator.sim.now + ms)
        coordinator.sim.after(ms, coordinator.loaded, (coordinator.epoch, group_id, future))
        return await future

    async def write(self, records: Sequence[Record]) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.coordinator.start_write(tuple(records), future)
        return await future

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        """The group's ``limit`` newest journal entries on the simulated disk, newest
        first (their fields as the records hold them)."""
        entries = [r for r in self.coordinator.durable
                   if isinstance(r, JournalEntry) and r.group_id == group_id]
        return [{"group_id": e.group_id, "generation_id": e.generation_id,
                 "protocol_type": e.protocol_type, "protocol_name": e.protocol_name,
                 "leader": e.leader, "member_count": len(e.members),
                 "members": list(e.members), "joined": list(e.joined), "left": list(e.left),
                 "reason": e.reason, "started_ms": e.started_ms, "ended_ms": e.ended_ms,
                 "assignments": dict(e.assignments)} for e in reversed(entries[-limit:])]

    def check(self) -> None:
        coordinator = self.coordinator
        if coordinator.faults.fail_check:
            coordinator.faults.fail_check = False
            coordinator.expect_stop = True
            coordinator.sim.log("coord storage check FAILED")
            raise StorageError("injected: the database is read-only")


# Not a native class when mypyc compiles the simulator: it extends the runtime.
@mypyc_attr(native_class=False)
class SimRuntime(Runtime):
    """The production runtime, its effects also shown to the simulation (the
    checker's ``Applied``, the findings and the trace) before it carries them out."""

    def __init__(self, observer: SimServing, core: Core, store: Store, clock: Clock,
                 metrics: Metrics | None = None, **limits: Any) -> None:
        super().__init__(core, store, clock, metrics, **limits)
        self.machine.trace = True
        self.observer = observer

    def _carry_out(self, effect: fx.MachineEffect) -> None:
        self.observer.observe(effect)
        super()._carry_out(effect)


class SimServing:
    """What a runtime serving calls has of the simulation: its calls' connections
    and futures, and what the checker is shown of what it does (one server's
    :class:`SimCoordinator`, or a partition's runtime, :class:`sim.cluster.SimPartition`).

    A request becomes the command the HTTP layer would build (its request id,
    a new member id for a first join, the caller's token as its principal);
    ``Runtime.request`` answers it or gives a future, whose answer is sent on
    its connection; a connection closed first cancels the future (the runtime
    then tells its core that the caller went).
    """

    def __init__(self, sim: Sim, net: Network, tokens: dict[str, str] | None = None) -> None:
        self.sim, self.net = sim, net
        #: worker name -> its token (authentication on: the principal of its calls).
        self.tokens = tokens or {}
        self.core: SimCore | None = None
        self.runtime: SimRuntime | None = None
        #: a serving stop the world caused (a failed write or check) is expected.
        self.expect_stop = False
        self.core_errors: list[str] = []
        #: request id -> the connection waiting for its answer.
        self._conns: dict[int, Conn] = {}
        #: request id -> the future of a call the runtime answers later.
        self._futures: dict[int, asyncio.Future[fx.Answer]] = {}
        #: request id -> who waits for the answer of a call made in-process
        #: (:meth:`SimCoordinator.call`: the world's own client of another group).
        self._calls: dict[int, Callable[[fx.Answer], None]] = {}
        #: hooks of the invariant checker.
        self.on_effects: Callable[[Command, list[Effect], Conn | None], None] | None = None
        self.on_restored: Callable[[], None] | None = None
        #: an answer sent on a connection (the world's reply-after-commit check).
        self.on_sent: Callable[[Conn, fx.Answer], None] | None = None
        #: an answer sent (several coordinators: a commit's checks wait for this).
        self.on_resolved: Callable[[int, fx.Answer], None] | None = None

    # ------------------------------------------------------------ what subclasses say

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the process's loop, as one step (or within the step
        running)."""
        raise NotImplementedError

    def new_request_id(self) -> int:
        """``Runtime.new_request_id``: the next request id of the process."""
        raise NotImplementedError

    def new_member_id(self, name: str) -> str:
        """The member id a first join of worker ``name`` is given."""
        raise NotImplementedError

    def accepting(self) -> bool:
        """Whether the process is there to read a connection's close."""
        raise NotImplementedError

    # ------------------------------------------------------------ the network side

    def serve(self, conn: Conn) -> None:
        """A protocol call on ``conn``, as the HTTP layer makes it a command."""
        rid = conn.rid = self.new_request_id()
        request = conn.request
        command: CallCommand
        principal = self.tokens.get(conn.member.name)
        if isinstance(request, JoinRequest):
            command = Join(rid, request, conn.member.name, self.new_member_id(conn.member.name),
                           principal)
        elif conn.api == "sync":
            command = Sync(rid, request, principal)
        else:
            command = cast(CallCommand, _COMMANDS[type(request)](rid, request))
        self._conns[rid] = conn
        self._run(self._request, command)

    def _request(self, command: CallCommand) -> None:
        runtime = self.runtime
        assert runtime is not None
        rid = command.request_id
        answer = runtime.request(command)
        if isinstance(answer, asyncio.Future):
            self._futures[rid] = answer
            answer.add_done_callback(partial(self._resolved, rid))
        else:
            self._answer(rid, answer)

    def _resolved(self, rid: int, future: asyncio.Future[fx.Answer]) -> None:
        if self._futures.pop(rid, None) is future and not future.cancelled():
            self._answer(rid, future.result())

    def awaited(self, rid: int) -> bool:
        """Whether a caller still waits for the answer of request ``rid``."""
        return rid in self._conns or rid in self._calls

    def on_close(self, conn: Conn) -> None:
        rid = conn.rid
        if rid is None or not self.accepting() or self._conns.get(rid) is not conn:
            return
        del self._conns[rid]
        future = self._futures.pop(rid, None)
        if future is not None:
            # The runtime's own callback on the future tells the core the caller went.
            self._run(future.cancel)

    def reset_calls(self) -> None:
        """The process died: the calls waiting here lose their connections."""
        conns, self._conns = self._conns, {}
        self._futures.clear()
        for rid in sorted(conns):
            conn = conns[rid]
            if not conn.closed:
                self.net.reset(conn, "connection reset (coordinator crashed)")

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

    # ------------------------------------------------------------ what the runtime did

    def observe(self, effect: fx.MachineEffect) -> None:
        """An effect of the runtime's machine, before the runtime carries it out:
        the checker's view, the findings and the trace."""
        match effect:
            case fx.Applied(command=command, effects=effects):
                if self.on_effects is not None:
                    of = getattr(command, "request_id", None)
                    conn = self._conns.get(of) if isinstance(of, int) else None
                    self.on_effects(command, list(effects), conn)
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
                if self.expect_stop:
                    self.expect_stop = False
                else:
                    self.core_errors.append(f"stopped serving: {why}")
                self.sim.log(f"coord STOPPED SERVING {why}")
            case GroupStateChanged():
                self.sim.log(f"coord group {effect.old_state}->{effect.new_state} "
                             f"gen={effect.generation_id} {effect.reason}")
            case _:
                pass


class SimCoordinator(SimServing):
    """The one-process server (``groupcoord serve`` on SQLite): the runtime on
    the simulated disk and clock, crashed, restarted and stopped by the world."""

    def __init__(self, sim: Sim, net: Network, rng: random.Random, config: CoreConfig, *,
                 disk_ms: tuple[int, int],
                 max_parked_requests: int = _DEFAULTS.max_parked_requests,
                 max_parked_per_token: int = _DEFAULTS.max_parked_per_token,
                 storage_check_ms: int = 0, tokens: dict[str, str] | None = None) -> None:
        super().__init__(sim, net, tokens)
        self.rng, self.config = rng, config
        #: the limits and the idle storage check each runtime runs with.
        self.max_parked_requests = max_parked_requests
        self.max_parked_per_token = max_parked_per_token
        self.storage_check_ms = storage_check_ms
        self.faults = RuntimeFaults()
        #: the record a refused write held (refused again in every write holding it).
        self._refused_record: Record | None = None
        #: the server exited on a failure (the world starts it again).
        self.on_exit: Callable[[], None] | None = None
        #: after every step: the world's checks of the machine's bookkeeping.
        self.on_step: Callable[[], None] | None = None
        #: (min, max) commit latency of one batch.
        self.disk_ms = disk_ms
        self.slow_disk_until = -1
        self.slow_disk_factor = 1
        #: when the batch being written commits, or a group being reloaded is read
        #: (a slow write or read outlasts its fault).
        self.inflight_done_at = 0
        self.up = False
        #: bumped by every crash and stop: events of an older incarnation are dropped.
        self.epoch = 0
        #: the runtime's machine and loop.
        self.machine: rm.RuntimeMachine | None = None
        self.loop: SimLoop | None = None
        self.durable: list[Record] = []
        #: this server's request ids (``Runtime.new_request_id``), across restarts.
        self.request_ids = itertools.count(1)
        self._member_ids = 0
        #: the outstanding write: its records and the future the store awaits.
        self._writing: tuple[tuple[Record, ...], asyncio.Future[float]] | None = None
        #: calls out of the process, made once the loop's step is over.
        self._after_step: list[Callable[[], None]] = []
        self.crashes = 0
        #: a stop in progress: called once the writes are done and the parked
        #: calls answered.
        self._stopped: Callable[[], None] | None = None
        sim.at_end.append(self._shut_down)

    def now(self) -> int:
        """The time the runtime is given (one server: the global clock)."""
        return self.sim.now

    def new_member_id(self, name: str) -> str:
        self._member_ids += 1
        return f"{name}-m{self._member_ids}"

    def accepting(self) -> bool:
        return self.up

    # ------------------------------------------------------------ steps of the loop

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the process's loop, as one step (``SimLoop.run``)."""
        loop = self.loop
        assert loop is not None
        runtime = self.runtime
        if loop.run(fn, *args):
            self._stepped(loop, runtime)

    def _step(self, loop: SimLoop) -> None:
        runtime = self.runtime
        loop.step()
        self._stepped(loop, runtime)

    def _stepped(self, loop: SimLoop, runtime: SimRuntime | None) -> None:
        """After a step: the calls out of the process, then the checks, then an
        exit if the runtime failed."""
        while self._after_step:
            calls, self._after_step = self._after_step, []
            for call in calls:
                call()
        if loop.dead:
            loop.close()
            return
        if runtime is None or self.runtime is not runtime:
            return
        if self.on_step is not None:
            self.on_step()
        if runtime.failed.is_set() and self.up:
            # The server exits on a failure (a supervisor restarts it).
            self.sim.log(f"coord exits epoch={self.epoch}")
            self._gone()
            loop.close()
            if self.on_exit is not None:
                self.on_exit()

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        core = self.core = SimCore(self.config)
        loop = self.loop = SimLoop(self.core_errors)
        runtime = self.runtime = SimRuntime(
            self, core, SimStore(self), SimClock(self),
            max_parked_requests=self.max_parked_requests,
            max_parked_per_token=self.max_parked_per_token,
            storage_check_interval_ms=self.storage_check_ms, request_ids=self.request_ids)
        self.machine = runtime.machine
        self._writing = None
        self.expect_stop = False
        self.up = True
        self.sim.log(f"coord up epoch={self.epoch} records={len(self.durable)}")
        loop.create_task(runtime.start())
        self._step(loop)
        if self.on_restored is not None and self.up:
            self.on_restored()

    def _shut_down(self) -> None:
        """The run is over: the serving loop is closed, what it left pending dropped."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.dead = True
            loop.close()

    def crash(self) -> None:
        if not self.up:
            return
        self.crashes += 1
        machine = self.machine
        lost = machine.commits.pending_writes if machine is not None else 0
        self.sim.log(f"coord CRASH epoch={self.epoch} uncommitted={lost}")
        loop = self.loop
        self._gone()
        if loop is not None and not loop.is_running():
            loop.close()
        self.reset_calls()

    def _gone(self) -> None:
        """This incarnation is over: nothing it armed or started counts any more
        (its loop is closed once its step is over)."""
        self.up = False
        self.epoch += 1
        self.core = None
        self.machine = None
        self.runtime = None
        if self.loop is not None:
            self.loop.dead = True
        self.loop = None
        self._writing = None
        self._calls.clear()
        self._futures.clear()

    def new_request_id(self) -> int:
        """``Runtime.new_request_id``: the next request id of this server."""
        return next(self.request_ids)

    def call(self, command: CallCommand, answered: Callable[[fx.Answer], None]) -> bool:
        """A call made in-process (the world's own client of another group), its
        ``request_id`` from :meth:`new_request_id`: its answer goes to
        ``answered``, unless the server goes down first."""
        if not self.up or self.runtime is None:
            return False
        self._calls[command.request_id] = answered
        self._run(self._request, command)
        return True

    def submit(self, command: Command) -> None:
        """``Runtime.submit``: a command whose answer nobody waits for."""
        runtime = self.runtime
        if self.up and runtime is not None and runtime.ready:
            self._run(runtime.submit, command)

    # ------------------------------------------------------------ the network side

    def on_request(self, conn: Conn) -> None:
        core = self.core
        if not self.up or core is None:
            self.net.reset(conn, "connection refused (coordinator down)")
            return
        if conn.api == Api.RESOURCES:
            self.net.answer(conn, CatalogResponse(core.resources_epoch, dict(core.catalog()),
                                                  dict(core.catalog_placement())))
            return
        self.serve(conn)

    # ------------------------------------------------------------ the runtime's timers

    def fire(self, arg: tuple[int, SimTimer]) -> None:
        """A timer of the runtime's clock is due."""
        epoch, timer = arg
        if epoch != self.epoch or timer.cancelled or self.loop is None:
            return  # cancelled, or from before a crash
        self._run(timer.callback)

    # ------------------------------------------------------------ storage

    def disk_latency(self) -> int:
        lo, hi = self.disk_ms
        ms = self.rng.randint(lo, hi)
        if self.sim.now < self.slow_disk_until:
            ms *= self.slow_disk_factor
        return ms

    def start_write(self, records: tuple[Record, ...], future: asyncio.Future[float]) -> None:
        """``SimStore.write``: the write of ``records``, whose outcome ``future`` gets."""
        self._writing = (records, future)
        refuse = self.faults.refuse
        if refuse is not None:
            poisoned = next((r for r in records if record_group(r) == refuse[0]), None)
            if poisoned is not None:
                self._refused_record = poisoned
        ms = self.disk_latency()
        self.inflight_done_at = self.sim.now + ms
        self.sim.after(ms, self._written, (self.epoch, records, ms))

    def _written(self, arg: tuple[int, tuple[Record, ...], int]) -> None:
        epoch, records, ms = arg
        writing = self._writing
        if epoch != self.epoch or writing is None or writing[0] is not records:
            return  # the crash lost it
        self._writing = None
        future = writing[1]
        poisoned = self._refused_record
        error: Exception | None = None
        if poisoned is not None and any(r is poisoned for r in records):
            # The store cannot hold this record: nothing of the transaction is written.
            refuse = self.faults.refuse
            says = refuse is None or refuse[1]
            self.faults.refuse = None
            group_id = record_group(poisoned) if says else None
            self.sim.log(f"coord write REFUSED ({group_id or 'whose not said'})")
            error = RecordError(SIM_DISK, group_id, "injected: a value it cannot hold")
        elif self.faults.fail_write is not None:
            committed = self.faults.fail_write
            self.faults.fail_write = None
            if committed:
                self.durable.extend(records)  # the COMMIT went through, its answer was lost
            self.sim.log(f"coord write FAILED (committed={committed})")
            self.expect_stop = True
            error = StorageError("injected: the database went away")
        else:
            self.durable.extend(records)
        if error is None:
            self._run(future.set_result, ms / 1000)
        else:
            self._run(future.set_exception, error)

    def loaded(self, arg: tuple[int, str, asyncio.Future[Snapshot]]) -> None:
        """``SimStore.load_group``: the group's committed records are read."""
        epoch, group_id, future = arg
        if epoch != self.epoch or future.done() or self.loop is None:
            return
        self._run(future.set_result,
                  fold([r for r in self.durable if record_group(r) == group_id]))

    def stop(self, done: Callable[[], None],
             code: ErrorCode = ErrorCode.NOT_COORDINATOR) -> None:
        """``Runtime.stop(code)``: timers cancelled, the pending writes committed,
        then every call still waiting answered ``code`` (nothing was done for it);
        then ``done()``. ``NOT_COORDINATOR``: a hand-off; ``COORDINATOR_NOT_AVAILABLE``:
        the server shutting down."""
        runtime = self.runtime
        if not self.up or runtime is None:
            done()
            return
        self._stopped = done
        self._run(self._begin_stop, runtime, code)

    def _begin_stop(self, runtime: SimRuntime, code: ErrorCode) -> None:
        loop = self.loop
        assert loop is not None
        loop.create_task(runtime.stop(code)).add_done_callback(self._stop_done)

    def _stop_done(self, _: asyncio.Task[None]) -> None:
        done, self._stopped = self._stopped, None
        if self.up:
            self._gone()
        else:
            self.machine = None
        if done is not None:
            self._after_step.append(done)

    # ------------------------------------------------------------ admin helpers

    def put_resource(self, name: str, partitions: int, weights: Weights | None = None,
                     zones: Zones | None = None) -> bool:
        """An admin call (catalog change) applied here; its answer is not awaited."""
        if not self.up:
            return False
        self.submit(PutResource(self.new_request_id(), name, partitions, weights, zones))
        return True
