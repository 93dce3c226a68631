"""The partition host's decisions, without I/O: :class:`HostMachine`.

docs/architecture.md practices 4, 5 and 11; docs/protocol.md, "Several
coordinators sharing groups". The machine is what one coordinator among several
on PostgreSQL decides about its partitions; it never awaits, reads a clock or
touches the database. Every input is a method call carrying ``now``
(monotonic seconds, the clock :class:`~coordinator.storage.leases.LocalLease`
counts on): start, a round is due, a statement answered or failed, a
partition loaded or its load failed, a serving runtime failed, the expiry timer
went off, a call to route, a newer catalog, stop. Every output is a frozen
value (``coordinator/cluster/host_effects.py``) appended to an outbox the
driver takes with :meth:`HostMachine.take` and carries out in order. Two
drivers run the same machine:
:class:`~coordinator.cluster.host.PartitionHost` (asyncio, PostgreSQL) and the
simulator's coordinator (``tests/sim/cluster.py``: a simulated clock, network
and database).

The sequence, one statement (a :class:`~coordinator.cluster.host_effects.Step`)
outstanding at a time:

- start: register, read the catalog whole, then a first round (a failure of
  any of these: :class:`StartFailed`);
- a round, every ``lease_ms / 5`` and at the moment a lease it waits for runs
  out (:class:`NextRound`):

  1. renew every owned lease in one statement (``sent_at``: the round's start,
     the owner's own rule); a partition not renewed was lost: dropped at once;
  2. refresh this coordinator's row, read the live coordinators (seen within
     ``lease_ms / 2``) and every lease;
  3. :func:`~coordinator.storage.leases.balance`: hand off what others are
     short of (the runtime finishes its writes, then the lease is released),
     then acquire free partitions up to this coordinator's share (each then
     loads: ``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile); an acquire that fails
     is tried again next round;
  4. adopt a catalog changed through another coordinator.

  A renew or read that fails ends the round (:class:`RoundFailed`): leases not
  renewed run out by the clock;
- stop: every partition handed off, then deregister.

Besides the sequence: a partition is dropped (:class:`Drop`, then its lease
freed in the background unless stopping) the moment its lease may have run
out (:class:`ArmExpiry`, and :meth:`route` on every call), when its load
fails, and when its runtime fails (a write fenced or refused, the store's
lease check).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, cast

from coordinator.cluster.host_effects import (
    Acquire,
    Adopt,
    ArmExpiry,
    Deregister,
    DisarmExpiry,
    Discard,
    Drop,
    FreeDropped,
    HandOff,
    HostEffect,
    Load,
    NextRound,
    NotAcquired,
    R,
    ReadCatalog,
    ReadCluster,
    Register,
    Release,
    Renew,
    RoundAcquired,
    RoundFailed,
    Serve,
    SharedOut,
    Started,
    StartFailed,
    Step,
    Stopped,
)
from coordinator.core.commands import AdoptCatalog
from coordinator.storage.leases import CoordinatorRow, LeaseRow, LocalLease, balance
from coordinator.storage.postgres import CatalogState
from protocol.catalog import Placement
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse, NotCoordinatorAnswer

#: a round runs at least this many times per lease (renewals: lease / 5).
TICKS_PER_LEASE = 5
#: seconds after a dead owner's lease runs out at which a survivor looks.
EXPIRY_MARGIN_S = 0.02

_START, _ROUND, _STOP = "start", "round", "stop"


@dataclass(slots=True, eq=False)
class Partition(Generic[R]):
    """A partition this coordinator owns: its lease, and its runtime once loaded."""

    number: int
    lease: LocalLease
    #: ``None`` while loading (calls answered ``COORDINATOR_LOAD_IN_PROGRESS``).
    runtime: R | None = None
    #: True from the start of a hand-off or drop: no call is routed to it any more.
    leaving: bool = False


class HostMachine(Generic[R]):
    """One coordinator's partitions: leases, loads, hand-offs and routing (module docs)."""

    def __init__(self, coordinator_id: str, url: str, partitions: int, lease_ms: int) -> None:
        self.coordinator_id = coordinator_id
        #: the advertised URL (the answer of find_coordinator for an owned partition).
        self.url = url
        self.partition_count = partitions
        self.lease_ms = lease_ms
        #: a coordinator is live while seen within this (it is seen every round, a
        #: fifth of a lease): half a lease, so a dead one stops counting before its
        #: leases run out, and the survivors' shares already include its partitions
        #: when they become free (a failover costs the lease, not a lease and a round).
        self.live_window_ms = lease_ms // 2
        #: owned partitions (loading, serving or leaving).
        self.partitions: dict[int, Partition[R]] = {}
        #: every lease as last read, and the live coordinators.
        self.lease_rows: dict[int, LeaseRow] = {}
        self.coordinators: list[CoordinatorRow] = []
        self.catalog: dict[str, int] = {}
        #: the weights and zones of the catalog's sets that have them.
        self.placement: dict[str, Placement] = {}
        self.resources_epoch = 0
        #: True from :meth:`stop` on.
        self.stopping = False
        self._outbox: list[HostEffect[R]] = []
        #: the outstanding step, and the sequence it belongs to.
        self._step: Step | None = None
        self._phase: str | None = None
        #: the start's first round is under way.
        self._starting = False
        #: when the outstanding renew or acquire was sent (LocalLease's ``sent_at``).
        self._sent_at = 0.0
        #: the round's (or the stop's) moves still to make, and what it did so far.
        self._releases: list[int] = []
        self._acquires: list[int] = []
        self._handed: list[int] = []
        self._acquired: list[int] = []
        self._round_started = 0.0

    @property
    def tick_s(self) -> float:
        """Seconds between rounds at the most."""
        return self.lease_ms / TICKS_PER_LEASE / 1000

    @property
    def step(self) -> Step | None:
        """The step waiting for its outcome, if any."""
        return self._step

    def take(self) -> list[HostEffect[R]]:
        """The effects produced since the last call, in order."""
        effects, self._outbox = self._outbox, []
        return effects

    # ------------------------------------------------------------ the sequence

    def start(self, now: float) -> None:
        """Register, read the catalog, then the first round (:class:`Started`)."""
        self._phase, self._starting = _START, True
        self._begin(Register())

    def begin_round(self, now: float) -> None:
        """A round is due; a round still waiting on a statement is given up."""
        if self.stopping:
            return
        self._phase = _ROUND
        held = tuple(sorted((n, p.lease.epoch) for n, p in self.partitions.items()
                            if not p.leaving))
        self._sent_at = now
        self._begin(Renew(held) if held else ReadCluster(self.live_window_ms))

    def stop(self, now: float) -> None:
        """SIGTERM: hand every partition off (writes finished, then the lease
        released), then deregister (:class:`Stopped`). A round under way is given
        up; a partition it was handing off is handed off again."""
        if self.stopping:
            return
        self.stopping = True
        self._phase = _STOP
        self._step = None
        self._outbox.append(DisarmExpiry())
        self._releases = sorted(self.partitions)
        self._handed = []
        self._next_hand_off()

    def done(self, now: float, step: Step, answer: object = None) -> None:
        """``step`` answered ``answer`` (see each step for what it answers)."""
        if step is not self._step:
            return  # given up meanwhile (a new round, a stop)
        self._step = None
        if isinstance(step, Register):
            self._begin(ReadCatalog(None))
        elif isinstance(step, ReadCatalog):
            state = cast("CatalogState | None", answer)
            if self._phase == _START:
                assert state is not None
                self.catalog, self.placement = dict(state.catalog), dict(state.placement)
                self.resources_epoch = state.epoch
                self.begin_round(now)
                return
            if state is not None:
                self.adopt_catalog(state)
            self._end_round(now)
        elif isinstance(step, Renew):
            self._renewed(step, cast("set[int]", answer))
            self._begin(ReadCluster(self.live_window_ms))
        elif isinstance(step, ReadCluster):
            coordinators, rows = cast(
                "tuple[Sequence[CoordinatorRow], Iterable[LeaseRow]]", answer)
            self._plan(now, coordinators, rows)
        elif isinstance(step, Acquire):
            self._acquired_one(step, cast("int | None", answer))
            self._next_move(now)
        elif isinstance(step, HandOff):
            partition = self.partitions.get(step.partition)
            if partition is not None and partition.lease.epoch == step.epoch:
                del self.partitions[step.partition]
            self._begin(Release(step.partition, step.epoch))
        elif isinstance(step, Release):
            self._handed.append(step.partition)
            self._next_move(now)
        elif isinstance(step, Deregister):
            self._phase = None
            self._outbox.append(Stopped(tuple(self._handed)))

    def failed(self, now: float, step: Step, why: str) -> None:
        """``step`` got no answer in time, or the database refused it."""
        if step is not self._step:
            return
        if isinstance(step, Acquire):
            # Held up (a lock of a paused coordinator's write) or failed: the next
            # round tries again; the others are still worth trying now.
            self._step = None
            self._outbox.append(NotAcquired(step.partition, why))
            self._next_move(now)
        elif isinstance(step, HandOff | Release | Deregister):
            self.done(now, step)  # a release that failed: the lease runs out instead
        elif self._phase == _START or self._starting:
            self._step = None
            self._phase, self._starting = None, False
            self._outbox.append(StartFailed(why))
        else:
            self._step = None
            self._outbox.append(RoundFailed(why))
            self._end_round(now)

    def _begin(self, step: Step) -> None:
        self._step = step
        self._outbox.append(step)

    def _renewed(self, step: Renew, renewed: set[int]) -> None:
        for number, _epoch in step.held:
            partition = self.partitions.get(number)
            if partition is None or partition.leaving:
                continue
            if number in renewed:
                partition.lease = partition.lease.renewed(self._sent_at)
            else:
                self.drop(number, "its lease was not renewed (another coordinator took it "
                                   "over, or it ran out)")
        self._arm_expiry()

    def _plan(self, now: float, coordinators: Sequence[CoordinatorRow],
              rows: Iterable[LeaseRow]) -> None:
        self.coordinators = list(coordinators)
        self.lease_rows = {row.partition: row for row in rows}
        # A lease the database still gives this coordinator for a partition it dropped
        # is not its share: it is being released (or runs out) and then acquired again.
        owners = {row.partition: str(row.owner_id) for row in self.lease_rows.values()
                  if row.held and row.owner_id is not None
                  and (row.owner_id != self.coordinator_id or row.partition in self.partitions)}
        plan = balance(self.coordinator_id, [c.id for c in self.coordinators], owners,
                       self.partition_count)
        self._releases, self._acquires = list(plan.release), list(plan.acquire)
        self._handed, self._acquired = [], []
        self._round_started = now
        self._next_move(now)

    def _next_move(self, now: float) -> None:
        """The round's next hand-off, else its next acquire, else the catalog."""
        if self._phase == _STOP:
            self._next_hand_off()
            return
        while self._releases:
            number = self._releases.pop(0)
            partition = self.partitions.get(number)
            if partition is not None and partition.runtime is not None \
                    and not partition.leaving:
                self._hand_off(partition)
                return
        if self._handed:
            self._outbox.append(SharedOut(tuple(self._handed)))
            self._handed = []
        while self._acquires:
            number = self._acquires.pop(0)
            if number not in self.partitions:
                self._sent_at = now
                self._begin(Acquire(number, self.lease_ms))
                return
        if self._acquired:
            self._outbox.append(RoundAcquired(tuple(self._acquired), self._round_started))
            self._acquired = []
        self._begin(ReadCatalog(self.resources_epoch))

    def _next_hand_off(self) -> None:
        while self._releases:
            partition = self.partitions.get(self._releases.pop(0))
            if partition is not None:
                self._hand_off(partition)
                return
        self._begin(Deregister())

    def _hand_off(self, partition: Partition[R]) -> None:
        """Stop routing calls to it; the runtime finishes its writes (parked calls
        answered ``NOT_COORDINATOR``); the lease is released once it is done."""
        partition.leaving = True
        self._begin(HandOff(partition.number, partition.lease.epoch, partition.runtime))

    def _acquired_one(self, step: Acquire, epoch: int | None) -> None:
        number = step.partition
        if epoch is None or number in self.partitions or self.stopping:
            return  # taken by another coordinator meanwhile
        lease = LocalLease.granted(number, epoch, self.lease_ms, self._sent_at)
        self.partitions[number] = Partition(number, lease)
        self._acquired.append(number)
        self._arm_expiry()
        self._outbox.append(Load(number, epoch))

    def _end_round(self, now: float) -> None:
        self._phase = None
        self.expire(now)
        self._outbox.append(NextRound(now + min(self.tick_s, self._next_expiry_wait())))
        if self._starting:
            self._starting = False
            self._outbox.append(Started())

    def _next_expiry_wait(self) -> float:
        """Seconds until a lease this coordinator waits for may be taken: one held by a
        coordinator that is no longer live (its owner died), a little after it runs
        out, so a failover is not late by up to a tick."""
        live = {c.id for c in self.coordinators} | {self.coordinator_id}
        waits = [row.expires_in_ms / 1000 + EXPIRY_MARGIN_S for row in self.lease_rows.values()
                 if row.held and row.owner_id not in live]
        return max(0.0, min(waits)) if waits else float("inf")

    # ------------------------------------------------------------ partitions

    def loaded(self, now: float, number: int, epoch: int, runtime: R) -> None:
        """Partition ``number``'s runtime, acquired at ``epoch``, loaded and serves."""
        partition = self.partitions.get(number)
        if partition is None or partition.leaving or partition.lease.epoch != epoch \
                or partition.runtime is not None:
            self._outbox.append(Discard(number, runtime))
            return
        partition.runtime = runtime
        self._outbox.append(Serve(number, epoch, runtime, self.adoption()))

    def load_failed(self, now: float, number: int, epoch: int) -> None:
        """Partition ``number``'s load failed: it is dropped and released (even while
        stopping: the stop's hand-off of it may be over)."""
        partition = self.partitions.get(number)
        if partition is not None and partition.lease.epoch == epoch \
                and partition.runtime is None:
            self.drop(number, "its load failed", release=True)

    def runtime_failed(self, now: float, number: int, runtime: R, why: str) -> None:
        """A write or check of ``runtime`` failed: memory may be ahead of the
        database, so its partition is dropped (and loaded again by its next owner)."""
        partition = self.partitions.get(number)
        if partition is not None and partition.runtime is runtime:
            self.drop(number, why)

    def expire(self, now: float) -> None:
        """Drop every partition whose lease may have run out by ``now``."""
        for number, partition in sorted(self.partitions.items()):
            if not partition.lease.valid(now):
                self.drop(number, "its lease ran out by this coordinator's clock")
        self._arm_expiry()

    def _arm_expiry(self) -> None:
        """The expiry timer at the earliest ``valid_until`` of the owned leases, so a
        partition is dropped (its parked calls answered, its timers stopped) the
        moment its lease may have run out, even while a statement is outstanding."""
        if self.partitions and not self.stopping:
            earliest = min(p.lease.valid_until for p in self.partitions.values())
            self._outbox.append(ArmExpiry(earliest))
        else:
            self._outbox.append(DisarmExpiry())

    def drop(self, number: int, why: str, release: bool | None = None) -> None:
        """Stop serving a partition at once (lost, expired, failed); nothing waits.
        If the database still has the lease (a write failed while it was reachable,
        or came back), it is freed, so that it is acquired again (and reloaded) at
        the next round rather than after it runs out."""
        partition = self.partitions.pop(number, None)
        if partition is None:
            return
        partition.leaving = True
        epoch = partition.lease.epoch
        self._outbox.append(Drop(number, epoch, partition.runtime, why))
        if release if release is not None else not self.stopping:
            self._outbox.append(FreeDropped(number, epoch))

    # ------------------------------------------------------------ catalog

    def adopt_catalog(self, state: CatalogState) -> None:
        """Take the shared catalog if newer and give it to every loaded partition."""
        if state.epoch <= self.resources_epoch:
            return
        self.catalog, self.placement = dict(state.catalog), dict(state.placement)
        self.resources_epoch = state.epoch
        runtimes = tuple(p.runtime for p in self.partitions.values() if p.runtime is not None)
        if runtimes:
            self._outbox.append(Adopt(runtimes, self.adoption()))

    def adoption(self) -> AdoptCatalog:
        """The catalog held here, as the command a partition's core takes it by."""
        return AdoptCatalog(tuple(sorted(self.catalog.items())), self.resources_epoch,
                            tuple(sorted(self.placement.items())))

    # ------------------------------------------------------------ routing

    def route(self, now: float, number: int) -> R | NotCoordinatorAnswer:
        """The runtime serving partition ``number`` here, or the answer that sends the
        caller on. The lease is checked by the clock on every call: an owner stops
        answering as soon as its lease may have run out (the partition is dropped).
        The driver answers ``COORDINATOR_LOAD_IN_PROGRESS`` for a runtime that does
        not serve (yet, or any more)."""
        partition = self.partitions.get(number)
        if partition is None or partition.leaving:
            return NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, self.owner_url(number))
        if not partition.lease.valid(now):
            self.drop(number, "its lease ran out by this coordinator's clock")
            return NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, "")
        if partition.runtime is None:
            return NotCoordinatorAnswer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "")
        return partition.runtime

    def serving(self) -> list[R]:
        """The runtimes of the partitions loaded and not leaving."""
        return [p.runtime for p in self.partitions.values()
                if p.runtime is not None and not p.leaving]

    def other_owner(self, number: int) -> LeaseRow | None:
        """The partition's lease as last read, if another coordinator holds it.

        Both the protocol URL (find_coordinator, ``NOT_COORDINATOR``) and the admin
        URL (forwarded admin calls) of the owner come from this one row: whether the
        owner is live (seen within ``live_window_ms``) does not matter, its lease
        does (an owner whose round runs late still holds it)."""
        row = self.lease_rows.get(number)
        if row is None or not row.held or row.owner_id == self.coordinator_id:
            return None
        return row

    def owner_url(self, number: int) -> str:
        row = self.other_owner(number)
        return (row.owner_url or "") if row is not None else ""

    def find_coordinator(self, number: int) -> FindCoordinatorResponse:
        partition = self.partitions.get(number)
        if partition is not None and not partition.leaving:
            return FindCoordinatorResponse(None, self.url, number)
        url = self.owner_url(number)
        if not url:
            return FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, "", number)
        return FindCoordinatorResponse(None, url, number)
