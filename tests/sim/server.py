"""The coordinator under simulation: the real core behind the runtime's rules.

:class:`SimCoordinator` does what ``coordinator/runtime/runtime.py`` does,
with the simulation's clock, network and disk instead of asyncio and SQLite:

- every request and timer firing is one ``core.handle(now, command)``;
- ``Persist`` records collect in an open batch; one batch commits at a time
  (group commit), taking a drawn disk latency (slower while a *slow disk*
  fault lasts);
- a reply waits for the latest uncommitted batch holding a write it depends
  on (its own command's earlier writes, its group's writes, catalog writes):
  the batches and that rule are the runtime's own
  :class:`coordinator.runtime.commits.Commits`, not a copy;
- timers are data: key -> deadline, re-arming replaces, a firing whose key
  was re-armed or cancelled since is dropped;
- a closed connection of a request still parked in the core becomes
  ``Cancelled(request_id)``;
- a crash loses the open and the in-flight batch (what was not committed),
  every timer and every waiting reply (their connections reset); a restart
  folds the committed records (``coordinator.core.replay.fold``, the
  reference for what storage keeps) and calls ``GroupCoordinator.restore``.

The catalog read (``GET /v1/resources``) is answered from memory at once,
as the HTTP layer does.

With several coordinators (:mod:`sim.cluster`) one of these is the runtime
of one partition a coordinator owns: its clock is the coordinator's drifting
clock, its batches are fenced writes to the simulated database (``write``),
its events wait while the coordinator is paused (``gate``), and it can be
abandoned (a lease run out, a fenced or failed write) or stopped for a
hand-off (writes finished, parked calls answered ``NOT_COORDINATOR``), as
``Runtime.abandon`` and ``Runtime.stop`` do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from client.transport import CATALOG_API, CatalogResponse
from coordinator.core.commands import (
    Cancelled,
    Command,
    Commit,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
    TimerFired,
)
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import (
    CancelTimer,
    Effect,
    GroupStateChanged,
    Persist,
    Reply,
    ScheduleTimer,
)
from coordinator.core.records import Record
from coordinator.core.replay import fold
from coordinator.runtime.commits import Batch, Commits
from coordinator.runtime.runtime import error_answer
from protocol.errors import ErrorCode
from protocol.messages import CommitRequest, HeartbeatRequest, JoinRequest, LeaveRequest

if TYPE_CHECKING:
    from sim.events import DriftClock, Sim
    from sim.network import Conn, Network

__all__ = ["SimCoordinator"]

_COMMANDS: dict[type, Callable[[int, Any], Command]] = {
    HeartbeatRequest: Heartbeat, LeaveRequest: Leave, CommitRequest: Commit,
}


class _Waiter:
    # A plain class, not a dataclass: mypyc (benchmarks/build_sim_mypyc.py)
    # evaluates a compiled dataclass's annotations at import, and ``Conn``
    # exists only for the type checker here (sim.network imports this module).
    __slots__ = ("command", "conn", "in_core")

    def __init__(self, conn: Conn, command: Command, in_core: bool = True) -> None:
        self.conn = conn
        self.command = command
        self.in_core = in_core


class SimCoordinator:
    def __init__(self, sim: Sim, net: Network, rng: random.Random, config: CoreConfig, *,
                 disk_ms: tuple[int, int], clock: DriftClock | None = None) -> None:
        self.sim = sim
        #: the process's monotonic clock (None: the global one, a single coordinator).
        self.clock = clock
        self.net = net
        self.rng = rng
        self.config = config
        #: (min, max) commit latency of one batch.
        self.disk_ms = disk_ms
        self.slow_disk_until = -1
        self.slow_disk_factor = 1
        #: when the batch being written commits (a slow write outlasts its fault).
        self.inflight_done_at = 0
        self.up = False
        #: bumped by every crash: events of an older incarnation are dropped.
        self.epoch = 0
        self.core: GroupCoordinator | None = None
        self.durable: list[Record] = []
        self._rid = 0
        self._member_ids = 0
        self._waiters: dict[int, _Waiter] = {}
        self._timers: dict[str, int] = {}
        self.commits = Commits()
        #: hooks of the invariant checker.
        self.on_effects: Callable[[Command, list[Effect], Conn | None], None] | None = None
        self.on_restored: Callable[[], None] | None = None
        #: a reply sent (several coordinators: a commit's checks wait for this).
        self.on_resolved: Callable[[Reply], None] | None = None
        self.crashes = 0
        self.core_errors: list[str] = []
        #: several coordinators: a batch goes to the database through this (the
        #: owner calls :meth:`write_done`); None: the simulated disk.
        self.write: Callable[[Batch], None] | None = None
        #: several coordinators: True when the event must wait (the process is
        #: paused; it is kept and replayed) or must not run (it is gone).
        self.gate: Callable[[Callable[[Any], None], Any], bool] | None = None
        #: a member id for a first join (several coordinators: unique across them).
        self.new_member_id: Callable[[str], str] | None = None
        #: a hand-off in progress: called once the writes are done and the
        #: parked calls answered.
        self._stopped: Callable[[], None] | None = None
        self._stop_code = ErrorCode.NOT_COORDINATOR
        #: a hand-off abandoned while a write was in flight: ends with that write.
        self._stop_waits_for: Batch | None = None
        self._stopped_late: Callable[[], None] | None = None

    def now(self) -> int:
        """The time the core is given: the process's own clock."""
        clock = self.clock
        return self.sim.now if clock is None else clock.local(self.sim.now)

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self.core = GroupCoordinator(self.config)
        effects = self.core.restore(fold(self.durable), self.now())
        self.up = True
        self.sim.log(f"coord up epoch={self.epoch} records={len(self.durable)}")
        self._execute(effects)
        if self.on_restored is not None:
            self.on_restored()

    def crash(self) -> None:
        if not self.up:
            return
        self.crashes += 1
        lost = self.commits.pending_writes
        self.sim.log(f"coord CRASH epoch={self.epoch} uncommitted={lost}")
        self.up = False
        self.epoch += 1
        self.core = None
        self._timers.clear()
        self.commits.clear()
        waiters, self._waiters = self._waiters, {}
        for rid in sorted(waiters):
            conn = waiters[rid].conn
            if not conn.closed:
                self.net.reset(conn, "connection reset (coordinator crashed)")

    def admin(self, command_of: Callable[[int], Command]) -> bool:
        """An admin call (catalog change) applied here; its answer is not awaited."""
        if not self.up:
            return False
        self._rid += 1
        self._apply(command_of(self._rid))
        return True

    # ------------------------------------------------------------ the network side

    def on_request(self, conn: Conn) -> None:
        if not self.up:
            self.net.reset(conn, "connection refused (coordinator down)")
            return
        core = self.core
        assert core is not None
        if conn.api == CATALOG_API:
            self.net.answer(conn, CatalogResponse(core.resources_epoch, dict(core.catalog())))
            return
        self._rid += 1
        rid = self._rid
        conn.rid = rid
        request = conn.request
        command: Command
        if isinstance(request, JoinRequest):
            if self.new_member_id is not None:
                new_id = self.new_member_id(conn.member.name)
            else:
                self._member_ids += 1
                new_id = f"{conn.member.name}-m{self._member_ids}"
            command = Join(rid, request, conn.member.name, new_id)
        elif conn.api == "sync":
            command = Sync(rid, request)
        else:
            command = _COMMANDS[type(request)](rid, request)
        self._waiters[rid] = _Waiter(conn, command)
        self._apply(command)

    def on_close(self, conn: Conn) -> None:
        rid = conn.rid
        if rid is None or not self.up or self._stopped is not None:
            return
        waiter = self._waiters.get(rid)
        if waiter is None or waiter.conn is not conn:
            return
        del self._waiters[rid]
        if waiter.in_core:
            self._apply(Cancelled(rid))

    # ------------------------------------------------------------ apply step

    def _apply(self, command: Command) -> None:
        core = self.core
        assert core is not None
        try:
            effects = core.handle(self.now(), command)
        except Exception as exc:  # the runtime answers UNKNOWN_SERVER_ERROR; here it is a finding
            self.core_errors.append(f"core raised {exc!r} on {command!r}")
            self.sim.log(f"coord CORE ERROR {exc!r}")
            rid = getattr(command, "request_id", None)
            waiter = self._waiters.pop(rid, None) if isinstance(rid, int) else None
            if waiter is not None:
                self.net.answer(waiter.conn, error_answer(command, ErrorCode.UNKNOWN_SERVER_ERROR))
            return
        if self.on_effects is not None:
            rid = getattr(command, "request_id", None)
            waiter = self._waiters.get(rid) if isinstance(rid, int) else None
            self.on_effects(command, effects, waiter.conn if waiter is not None else None)
        self._execute(effects)

    def _execute(self, effects: list[Effect]) -> None:
        wrote = False
        commits = self.commits
        for effect in effects:
            if isinstance(effect, ScheduleTimer):
                self._arm(effect.key, effect.deadline_ms)
            elif isinstance(effect, Reply):
                self._route_reply(effect, wrote)
            elif isinstance(effect, Persist):
                commits.write(effect.record)
                wrote = True
            elif isinstance(effect, CancelTimer):
                self._timers.pop(effect.key, None)
            elif isinstance(effect, GroupStateChanged):
                self.sim.log(f"coord group {effect.old_state}->{effect.new_state} "
                             f"gen={effect.generation_id} {effect.reason}")
        if commits.open.records and commits.inflight is None:
            self._start_commit()

    def _route_reply(self, reply: Reply, wrote: bool) -> None:
        # As Runtime._route_reply, through the same Commits.
        waiter = self._waiters.get(reply.request_id)
        if waiter is None:
            return
        waiter.in_core = False
        batch = self.commits.wait_for(waiter.command, wrote)
        if batch is None:
            self._resolve(reply)
        else:
            batch.replies.append(reply)

    def _resolve(self, reply: Reply) -> None:
        waiter = self._waiters.pop(reply.request_id, None)
        if waiter is None:
            return
        # Sent even if the member gave up meanwhile (its close is still on the
        # way): the member drops an answer on a connection it closed.
        self.net.answer(waiter.conn, reply.response)
        if self.on_resolved is not None:
            self.on_resolved(reply)

    # ------------------------------------------------------------ timers

    def _arm(self, key: str, deadline_ms: int) -> None:
        self._timers[key] = deadline_ms
        when = deadline_ms if self.clock is None else self.clock.global_at(deadline_ms)
        self.sim.at(when, self._fire, (self.epoch, key, deadline_ms))

    def _fire(self, arg: tuple[int, str, int]) -> None:
        if self.gate is not None and self.gate(self._fire, arg):
            return
        epoch, key, deadline = arg
        if epoch != self.epoch or self._timers.get(key) != deadline:
            return  # re-armed, cancelled, or from before a crash
        del self._timers[key]
        self._apply(TimerFired(key))

    # ------------------------------------------------------------ group commit

    def _start_commit(self) -> None:
        batch = self.commits.start_commit()
        if self.write is not None:
            self.write(batch)
            return
        lo, hi = self.disk_ms
        ms = self.rng.randint(lo, hi)
        if self.sim.now < self.slow_disk_until:
            ms *= self.slow_disk_factor
        self.inflight_done_at = self.sim.now + ms
        self.sim.after(ms, self._committed, (self.epoch, batch))

    def _committed(self, arg: tuple[int, Batch]) -> None:
        epoch, batch = arg
        if epoch != self.epoch:
            return  # the crash lost it
        self.durable.extend(batch.records)
        self.commits.committed(batch)
        for reply in batch.replies:
            self._resolve(reply)
        if self.commits.open.records:
            self._start_commit()
        elif self._stopped is not None and self.commits.inflight is None:
            self._finish_stop()

    # ------------------------------------------------------------ several coordinators

    def write_result(self, batch: Batch, ok: bool) -> None:
        """The database answered the write of ``batch``: committed (``ok``) or not
        (the owner drops the partition). A hand-off abandoned meanwhile goes on
        now: ``Runtime.stop`` waits for the write in flight, whatever happened."""
        if ok and self.up and self.commits.inflight is batch:
            self._committed((self.epoch, batch))
            return
        if self._stop_waits_for is batch:
            done, self._stopped_late = self._stopped_late, None
            self._stop_waits_for = None
            if done is not None:
                done()

    def abandon(self, code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> None:
        """``Runtime.abandon``/``_halt``: serve nothing more from memory at once --
        timers and uncommitted writes dropped, every waiting call answered
        ``code`` (its outcome unknown: a write in flight may still commit)."""
        if not self.up:
            return
        self.up = False
        self.epoch += 1
        self.core = None
        self._timers.clear()
        inflight = self.commits.inflight
        self.commits.clear()
        stopping, self._stopped = self._stopped, None
        if stopping is not None:
            # Abandoned in the middle of a hand-off: it ends when the write in
            # flight returns (at once if none is).
            if inflight is None:
                self.sim.after(0, lambda _: stopping())
            else:
                self._stop_waits_for, self._stopped_late = inflight, stopping
        waiters, self._waiters = self._waiters, {}
        for rid in sorted(waiters):
            waiter = waiters[rid]
            if not waiter.conn.closed:
                self.net.answer(waiter.conn, error_answer(waiter.command, code))

    def stop(self, done: Callable[[], None]) -> None:
        """``Runtime.stop(NOT_COORDINATOR)``, a hand-off: timers cancelled, the
        pending writes committed, then every call still waiting answered
        ``NOT_COORDINATOR`` (nothing was done for it); then ``done()``."""
        if not self.up:
            done()
            return
        self._timers.clear()
        self._stopped = done
        if self.commits.inflight is None and not self.commits.open.records:
            self._finish_stop()

    def _finish_stop(self) -> None:
        done, self._stopped = self._stopped, None
        assert done is not None
        self.abandon(self._stop_code)
        done()

    # ------------------------------------------------------------ admin helpers

    def put_resource(self, name: str, partitions: int) -> bool:
        return self.admin(lambda rid: PutResource(rid, name, partitions))
