"""Several coordinators under simulation: a shared database with partition
leases and epochs, the lease loop of each coordinator, routing by partition,
and the members' router (several coordinators: docs/operations.md,
"Running several coordinators").

:class:`SimDatabase`
    the PostgreSQL of ``coordinator/storage/{postgres,leases}.py``: the lease
    rows (owner, epoch, expiry), the coordinators' rows (last seen), every
    partition's committed records and the shared catalog. A statement runs at
    the database after a drawn latency and is judged by the database's clock
    (the global one); its answer comes back after another latency. A
    coordinator cut off from the database (the *db_cut* fault) exchanges
    nothing with it meanwhile; what was on its way goes on when the cut heals
    (TCP's retransmissions), unless the statement's timeout ended it first. A
    write is a transaction in two steps, as the real one: the fence (the
    writer must hold the partition's lease at the write's epoch), which locks
    the lease row (``FOR SHARE``: an acquire of the row fails meanwhile, as at
    the real ``lock_timeout``), then the records and ``COMMIT``, sent by the
    coordinator once the fence answered -- a coordinator paused in between
    (the zombie) holds the lock until the server ends its transaction after a
    lease
    (``idle_in_transaction_session_timeout``), and its ``COMMIT`` then fails.

:class:`SimNode`
    ``coordinator/cluster/host.py``'s ``PartitionHost``, as events: every
    ``lease_ms / 5`` of its own drifting clock (and when a lease of a dead
    owner runs out) a round renews its leases (noting ``sent_at`` first; the
    owner's rule is the real :class:`~coordinator.storage.leases.LocalLease`),
    refreshes its row, reads the live coordinators and the leases, and moves
    towards its share with the real :func:`~coordinator.storage.leases.balance`
    (acquire, then load: ``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile; hand off:
    the runtime finishes its writes, then the lease is released). A partition
    is one :class:`~sim.server.SimCoordinator` (the real core behind the
    runtime's rules), restored from the database's records at every load, as
    the real ``Runtime`` is from ``load_partition``. Every call checks the
    partition's lease by the coordinator's clock (``route``); an expiry timer
    drops a partition the moment its lease may have run out; a write refused
    (fenced, timed out) drops it.

:class:`SimRouter`
    a member's ``CoordinatorRouter``: its choices are the real
    :class:`~client.transport.CoordinatorChoice`; the calls travel as legs on
    one connection: ``find_coordinator`` to the bootstrap URLs in the choice's
    order (each bounded by ``find_timeout_ms``, the member's ``reply_ms`` as
    ``GroupMember`` sets it), the call to the coordinator
    found, ``NOT_COORDINATOR`` followed (at most ``MAX_REDIRECTS`` times),
    ``COORDINATOR_LOAD_IN_PROGRESS`` and failures handed to the member; a
    call that timed out gives its coordinator up, and finding another fails
    the calls still waiting on the old one.

Simplifications (docs/reliability.md): one statement per round reads
everything the real round reads with three (renew first, at one instant);
each partition writes on its own (no group commit across partitions); the
catalog is changed at the database and adopted by each coordinator at its
next round (by the one it went through at once).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from client.errors import CoordinatorUnavailableError, NotCoordinatorError
from client.transport import CatalogResponse, CoordinatorChoice, CoordinatorRouter
from coordinator.cluster.host import TICKS_PER_LEASE
from coordinator.core.commands import AdoptCatalog
from coordinator.core.config import CoreConfig
from coordinator.core.records import Record
from coordinator.storage.leases import LocalLease, balance
from coordinator.storage.postgres import partition_of
from protocol.catalog import Placement
from protocol.errors import ErrorCode
from protocol.messages import Api, FindCoordinatorResponse, NotCoordinatorAnswer
from sim.events import DriftClock, Sim
from sim.server import SimCoordinator

if TYPE_CHECKING:
    from sim.member import SimMember
    from sim.network import Conn, Network

__all__ = ["NODE_DOWN", "NODE_PAUSED", "NODE_UP", "Cluster", "SimDatabase", "SimNode",
           "SimRouter"]

NODE_UP, NODE_PAUSED, NODE_DOWN = "up", "paused", "down"
#: ms after a dead owner's lease runs out at which a survivor looks (host.py: 0.02 s).
EXPIRY_MARGIN_MS = 20
#: a read (a partition's load) is given up after this (host.READ_TIMEOUT_S).
READ_TIMEOUT_MS = 30_000
#: how far apart the coordinators' wall clocks are at most (docs/operations.md,
#: "Clocks"): a minute, hundreds of leases.
WALL_SKEW_MS = 60_000


class StatementFailed(Exception):
    """A statement got no answer in time, or the database refused it."""


class Fenced(StatementFailed):
    """A write whose partition's lease is no longer this coordinator's at its epoch."""


@dataclass(slots=True)
class LeaseRow:
    owner: str | None = None
    url: str = ""
    epoch: int = 0
    #: global ms; -1: never held.
    expires_at: int = -1


@dataclass(slots=True, eq=False)
class Statement:
    node: SimNode
    life: int
    run: Callable[[], Any]
    done: Callable[[Any], None]
    timeout_ms: int
    finished: bool = False
    timeout_armed: bool = False
    #: a write's epoch (its fence).
    epoch: int = 0


class SimDatabase:
    def __init__(self, sim: Sim, rng: random.Random, partitions: int,
                 latency_ms: tuple[int, int], catalog: dict[str, int]) -> None:
        self.sim = sim
        self.rng = rng
        self.partitions = partitions
        self.latency_ms = latency_ms
        self.leases = {p: LeaseRow() for p in range(partitions)}
        #: coordinator id -> (url, last seen, global ms).
        self.seen: dict[str, tuple[str, int]] = {}
        self.records: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        self.catalog = dict(catalog)
        self.catalog_epoch = 1
        #: the sets' weights and zones (those not the default).
        self.placement: dict[str, Placement] = {}
        #: coordinators cut off from the database, and what their cut holds.
        self.cut: set[str] = set()
        self.held: dict[str, list[tuple[Callable[[Any], None], Any]]] = {}
        self.slow_until = -1
        self.slow_factor = 1
        self.inflight: dict[str, list[Statement]] = {}
        #: the checker's own log of every acquisition: partition -> [(epoch, owner)].
        self.acquired: dict[int, list[tuple[int, str]]] = {}
        #: partition -> the largest epoch a committed write carried.
        self.written_epoch: dict[int, int] = {}
        self.on_violation: Callable[[str], None] | None = None
        #: the coordinators (for a cut's heal).
        self.nodes: list[SimNode] = []
        self.writes = 0
        #: writes refused by the fence, and writes whose transaction the server ended.
        self.fenced = 0
        self.ended = 0
        #: partition -> the write whose transaction holds its lease row.
        self.locks: dict[int, Statement] = {}
        #: a transaction left open is ended after this (the writer's session setting).
        self.idle_timeout_ms = 0

    def _latency(self, slow: bool = False) -> int:
        hi = self.latency_ms[1]
        ms = 1 + int(self.rng.random() * (hi // 2 + 1))
        if slow and self.sim.now < self.slow_until:
            ms *= self.slow_factor
        return ms

    def submit(self, node: SimNode, run: Callable[[], Any], done: Callable[[Any], None],
               timeout_ms: int) -> None:
        """``run()`` at the database after a latency, ``done(result)`` at ``node``
        after another (``done`` gets a :class:`StatementFailed` when ``run``
        raised it, or when no answer came within ``timeout_ms``)."""
        st = Statement(node, node.life, run, done, timeout_ms)
        self.inflight.setdefault(node.id, []).append(st)
        if node.id in self.cut:
            self._arm_timeout(st)
        self._on_link(node, self._exec, st)

    def _on_link(self, node: SimNode, fn: Callable[[Any], None], arg: Any,
                 at_node: bool = False) -> None:
        """A message between ``node`` and the database: after a latency, or held
        by a cut until it heals."""
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((fn, arg))
        elif at_node:
            node.at(self.sim.now + self._latency(), fn, arg)
        else:
            self.sim.after(self._latency(), fn, arg)

    def _arm_timeout(self, st: Statement) -> None:
        if not st.timeout_armed:
            st.timeout_armed = True
            node = st.node
            node.at(node.clock.global_at(node.local() + st.timeout_ms), self._timeout, st)

    def _exec(self, st: Statement) -> None:
        node = st.node
        if st.life != node.life:
            return  # the process died: its transaction rolled back
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((self._exec, st))
            return
        try:
            result = st.run()
        except StatementFailed as exc:
            result = exc
        self._on_link(node, self._reply, (st, result), at_node=True)

    def _reply(self, arg: tuple[Statement, Any]) -> None:
        st, result = arg
        if st.finished:
            return
        if st.node.id in self.cut:
            self.held.setdefault(st.node.id, []).append((self._reply, arg))
            return
        self._finish(st, result)

    def _timeout(self, st: Statement) -> None:
        if not st.finished:
            self._finish(st, StatementFailed(f"no answer within {st.timeout_ms} ms"))

    def _finish(self, st: Statement, result: Any) -> None:
        st.finished = True
        pending = self.inflight.get(st.node.id)
        if pending is not None and st in pending:
            pending.remove(st)
        st.done(result)

    def cut_off(self, node: SimNode, duration: int) -> None:
        self.cut.add(node.id)
        for st in self.inflight.get(node.id, []):
            self._arm_timeout(st)
        self.sim.after(duration, self._heal, node.id)

    def _heal(self, node_id: str) -> None:
        if node_id not in self.cut:
            return
        self.cut.discard(node_id)
        node = next(n for n in self.nodes if n.id == node_id)
        for fn, arg in self.held.pop(node_id, []):
            self._on_link(node, fn, arg,
                          at_node=fn in (self._reply, self._write_send_commit))

    def heal_all(self) -> None:
        for node_id in sorted(self.cut):
            self._heal(node_id)

    # ------------------------------------------------------------ the statements (run at the db)

    def renew_and_read(self, node: SimNode, held: dict[int, int], lease_ms: int,
                       live_window_ms: int) -> tuple[set[int], list[str], dict[int, tuple[
                           str | None, str, int, int]], tuple[dict[str, int], int]]:
        now = self.sim.now
        renewed: set[int] = set()
        for p, epoch in held.items():
            row = self.leases[p]
            if row.epoch == epoch and row.owner == node.id:
                row.expires_at = now + lease_ms
                renewed.add(p)
        self.seen[node.id] = (node.url, now)
        live = sorted(cid for cid, (_, seen) in self.seen.items() if seen > now - live_window_ms)
        rows = {p: (r.owner, r.url, r.epoch, r.expires_at - now if r.expires_at >= 0 else -1)
                for p, r in self.leases.items()}
        return renewed, live, rows, (dict(self.catalog), self.catalog_epoch,
                                     dict(self.placement))

    def acquire(self, node: SimNode, partition: int, lease_ms: int) -> int | None:
        if partition in self.locks:
            raise StatementFailed(f"partition {partition}: lease row locked by a write")
        now = self.sim.now
        row = self.leases[partition]
        if row.owner is not None and row.expires_at > now:
            return None
        row.owner, row.url = node.id, node.url
        row.epoch += 1
        row.expires_at = now + lease_ms
        self.acquired.setdefault(partition, []).append((row.epoch, node.id))
        return row.epoch

    def release(self, node: SimNode, partition: int, epoch: int) -> bool:
        if partition in self.locks:
            raise StatementFailed(f"partition {partition}: lease row locked by a write")
        row = self.leases[partition]
        if row.owner != node.id or row.epoch != epoch:
            return False
        row.owner, row.url, row.expires_at = None, "", self.sim.now
        return True

    def deregister(self, node: SimNode) -> None:
        self.seen.pop(node.id, None)

    def load(self, partition: int) -> list[Record]:
        return list(self.records[partition])

    def write(self, node: SimNode, partition: int, epoch: int, records: list[Record],
              done: Callable[[Any], None], timeout_ms: int) -> None:
        """A fenced write (see the class docs); ``done(None)`` once committed."""
        st = Statement(node, node.life, lambda: None, done, timeout_ms, epoch=epoch)
        self.inflight.setdefault(node.id, []).append(st)
        arg = (st, partition, epoch, records)
        if node.id in self.cut:
            self._arm_timeout(st)
            self.held.setdefault(node.id, []).append((self._write_fence, arg))
            return
        self.sim.after(self._latency(slow=True), self._write_fence, arg)

    def _write_fence(self, arg: tuple[Statement, int, int, list[Record]]) -> None:
        st, partition, epoch, records = arg
        node = st.node
        if st.life != node.life:
            return
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((self._write_fence, arg))
            return
        row = self.leases[partition]
        result: StatementFailed | None = None
        if row.owner != node.id or row.epoch != epoch:
            self.fenced += 1
            result = Fenced(f"partition {partition}: lease at epoch {row.epoch} of {row.owner}, "
                            f"not epoch {epoch} of {node.id}")
        elif partition in self.locks:
            result = StatementFailed(f"partition {partition}: lease row locked")
        if result is not None:
            self._on_link(node, self._reply, (st, result), at_node=True)
            return
        self.locks[partition] = st
        self.sim.after(self.idle_timeout_ms, self._idle_end, (st, partition))
        self._on_link(node, self._write_send_commit, (st, partition, records), at_node=True)

    def _write_send_commit(self, arg: tuple[Statement, int, list[Record]]) -> None:
        """At the coordinator: the fence answered; the records and COMMIT go."""
        st = arg[0]
        node = st.node
        if node.pause_mid_write:
            # The zombie: paused between its fence and its COMMIT; the COMMIT
            # goes when it resumes.
            duration, node.pause_mid_write = node.pause_mid_write, 0
            node.pause()
            self.sim.after(duration, node.resume)
            node.deferred.append((self._write_send_commit, arg))
            return
        if not st.finished:
            self._on_link(node, self._write_commit, arg)

    def _write_commit(self, arg: tuple[Statement, int, list[Record]]) -> None:
        st, partition, records = arg
        node = st.node
        if st.life != node.life:
            return
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((self._write_commit, arg))
            return
        result: StatementFailed | None = None
        if self.locks.get(partition) is not st:
            self.ended += 1
            result = StatementFailed("the server ended the transaction (idle in transaction)")
        else:
            del self.locks[partition]
            self._check_write(node, partition, st)
            self.writes += 1
            self.records[partition].extend(records)
        self._on_link(node, self._reply, (st, result), at_node=True)

    def _idle_end(self, arg: tuple[Statement, int]) -> None:
        st, partition = arg
        if self.locks.get(partition) is st:
            del self.locks[partition]

    def process_gone(self, node: SimNode) -> None:
        """Its connections closed: its open transactions end (their locks go)."""
        for partition, st in sorted(self.locks.items()):
            if st.node is node:
                del self.locks[partition]
        self.inflight.pop(node.id, None)
        self.held.pop(node.id, None)

    def _check_write(self, node: SimNode, partition: int, st: Statement) -> None:
        """The invariant, from the checker's own log of acquisitions: a write
        commits only for the latest acquisition of its partition, and never
        after a write of a newer epoch (two owners' writes never both commit)."""
        epoch = st.epoch
        log = self.acquired.get(partition, [])
        latest = log[-1] if log else None
        if latest != (epoch, node.id) and self.on_violation is not None:
            self.on_violation(f"fenced-db: {node.id}'s write of partition {partition} at epoch "
                              f"{epoch} committed; the latest acquisition is {latest}")
        if self.written_epoch.get(partition, 0) > epoch and self.on_violation is not None:
            self.on_violation(f"fenced-db: {node.id}'s write of partition {partition} at epoch "
                              f"{epoch} committed after one of epoch "
                              f"{self.written_epoch[partition]}")
        self.written_epoch[partition] = max(self.written_epoch.get(partition, 0), epoch)

    def change_catalog(self, name: str, partitions: int,
                       placement: Placement | None = None) -> None:
        self.catalog[name] = partitions
        if placement is not None:
            if placement.is_default:
                self.placement.pop(name, None)
            else:
                self.placement[name] = placement
        self.catalog_epoch += 1


@dataclass(slots=True, eq=False)
class Part:
    """A partition a coordinator owns (host.Partition)."""

    number: int
    lease: LocalLease
    runtime: SimCoordinator | None = None
    leaving: bool = False
    #: the load in progress belongs to this (a drop and a new acquire start anew).
    loads: int = 0


class SimNode:
    def __init__(self, cluster: Cluster, index: int, clock: DriftClock) -> None:
        self.cluster = cluster
        self.sim = cluster.sim
        self.db = cluster.db
        self.index = index
        self.id = f"c{index}"
        self.url = f"http://c{index}"
        self.clock = clock
        self.lease_ms = cluster.lease_ms
        self.live_window_ms = self.lease_ms // 2
        self.state = NODE_DOWN
        #: bumped by every crash and start: events of an older life are dropped.
        self.life = 0
        self.deferred: list[tuple[Callable[[Any], None], Any]] = []
        self.partitions: dict[int, Part] = {}
        self.lease_rows: dict[int, tuple[str | None, str, int, int]] = {}
        self.live: list[str] = []
        self.catalog: dict[str, int] = {}
        self.resources_epoch = 0
        self.stopping = False
        self._round_token = 0
        #: the global time of the armed expiry event (None: none armed).
        self._expiry_at: int | None = None
        self._pending_catalog: tuple[dict[str, int], int, dict[str, Placement]] = ({}, 0, {})
        self.placement: dict[str, Placement] = {}
        #: a pause armed for the next write's COMMIT (its duration; 0: none).
        self.pause_mid_write = 0

    # ------------------------------------------------------------ events and clock

    def local(self) -> int:
        return self.clock.local(self.sim.now)

    def at(self, when: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """An event of this process at global ``when``: dropped if the process
        died meanwhile, kept for its resume while it is paused."""
        self.sim.at(when, self._event, (self.life, fn, arg))

    def after_local(self, delay_ms: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self.at(self.clock.global_at(self.local() + delay_ms), fn, arg)

    def _event(self, arg: tuple[int, Callable[[Any], None], Any]) -> None:
        life, fn, inner = arg
        if life != self.life or self.state == NODE_DOWN:
            return
        if self.state == NODE_PAUSED:
            self.deferred.append((fn, inner))
            return
        fn(inner)

    def gate(self, fn: Callable[[Any], None], arg: Any) -> bool:
        if self.state == NODE_PAUSED:
            self.deferred.append((fn, arg))
            return True
        return self.state != NODE_UP

    def log(self, line: str) -> None:
        self.sim.log(f"{self.id} {line}")

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self.state != NODE_DOWN:
            return
        self.state = NODE_UP
        self.life += 1
        self.stopping = False
        self.log(f"up (life {self.life})")
        self._round()

    def crash(self) -> None:
        if self.state == NODE_DOWN:
            return
        self.log("CRASH " + " ".join(f"p{n}@{p.lease.epoch}" for n, p in
                                     sorted(self.partitions.items())))
        self._exit()

    def _exit(self) -> None:
        self._expiry_at = None
        self.state = NODE_DOWN
        self.life += 1
        self.deferred.clear()
        for part in self.partitions.values():
            if part.runtime is not None:
                part.runtime.crash()
        self.partitions.clear()
        self.db.process_gone(self)

    def pause(self) -> None:
        if self.state == NODE_UP:
            self.log("PAUSE")
            self.state = NODE_PAUSED

    def disarm_pause(self, _: Any = None) -> None:
        """The armed pause did not strike in its time: it is off."""
        self.pause_mid_write = 0

    def resume(self, _: Any = None) -> None:
        if self.state != NODE_PAUSED:
            return
        self.log("RESUME")
        self.state = NODE_UP
        deferred, self.deferred = self.deferred, []
        for fn, arg in deferred:
            if self.state != NODE_UP:
                break
            fn(arg)

    def stop(self, then: Callable[[], None]) -> None:
        """SIGTERM (host.stop): hand every partition off, then deregister."""
        if self.state != NODE_UP or self.stopping:
            return
        self.log("STOP")
        self.stopping = True
        self._round_token += 1  # the round in progress ends here
        numbers = sorted(self.partitions)

        def next_one(_: Any = None) -> None:
            if self.state == NODE_DOWN:
                return
            while numbers:
                number = numbers.pop(0)
                if number in self.partitions:
                    self._hand_off(number, next_one)
                    return
            self.db.submit(self, lambda: self.db.deregister(self), finished,
                           self._statement_timeout())

        def finished(_: Any) -> None:
            self.log("stopped")
            self._exit()  # the process exits: nothing of it remains
            then()

        next_one()

    def _statement_timeout(self) -> int:
        return max(500, self.lease_ms // 2)

    # ------------------------------------------------------------ the round

    def _round(self, _: Any = None) -> None:
        if self.stopping:
            return
        self._round_token += 1
        token = self._round_token
        held = {n: p.lease.epoch for n, p in self.partitions.items() if not p.leaving}
        sent_at = self.local() / 1000
        self.db.submit(self, lambda: self.db.renew_and_read(self, held, self.lease_ms,
                                                            self.live_window_ms),
                       lambda result: self._renewed(token, held, sent_at, result),
                       self._statement_timeout())

    def _renewed(self, token: int, held: dict[int, int], sent_at: float, result: Any) -> None:
        if token != self._round_token:
            return
        if isinstance(result, StatementFailed):
            # The database is unreachable: the leases run out by this clock.
            if self.cluster.verbose:
                self.log(f"round failed: {result}")
            self._end_round()
            return
        renewed, live, rows, (catalog, catalog_epoch, placement) = result
        for number in held:
            part = self.partitions.get(number)
            if part is None or part.leaving:
                continue
            if number in renewed:
                part.lease = part.lease.renewed(sent_at)
            else:
                self._drop(number, "not renewed")
        self._arm_expiry()
        self.live = live
        self.lease_rows = rows
        self._pending_catalog = (catalog, catalog_epoch, placement)
        owners = {p: str(owner) for p, (owner, _, _, left) in rows.items()
                  if owner is not None and left > 0
                  and (owner != self.id or p in self.partitions)}
        plan = balance(self.id, live, owners, self.db.partitions)
        releases = [n for n in plan.release
                    if n in self.partitions and self.partitions[n].runtime is not None]
        acquires = list(plan.acquire)
        self._step(token, releases, acquires)

    def _step(self, token: int, releases: list[int], acquires: list[int]) -> None:
        if token != self._round_token or self.stopping:
            return
        if releases:
            number = releases.pop(0)
            self._hand_off(number, lambda: self._step(token, releases, acquires))
            return
        if acquires:
            number = acquires.pop(0)
            if number in self.partitions:
                self._step(token, releases, acquires)
                return
            sent_at = self.local() / 1000
            self.db.submit(self, lambda: self.db.acquire(self, number, self.lease_ms),
                           lambda epoch: self._acquired(token, number, sent_at, epoch,
                                                        releases, acquires),
                           self._statement_timeout())
            return
        catalog, epoch, placement = self._pending_catalog
        self.adopt_catalog(catalog, epoch, placement)
        self._end_round()

    def _acquired(self, token: int, number: int, sent_at: float, epoch: Any,
                  releases: list[int], acquires: list[int]) -> None:
        if isinstance(epoch, int) and number not in self.partitions and not self.stopping:
            part = Part(number, LocalLease.granted(number, epoch, self.lease_ms, sent_at))
            self.partitions[number] = part
            self.log(f"acquired p{number} epoch {epoch}")
            self._arm_expiry()
            self._load(part)
        self._step(token, releases, acquires)

    def _end_round(self) -> None:
        self._expire()
        # host.run: the next round after a tick, or when a dead owner's lease runs out.
        live = set(self.live) | {self.id}
        waits = [left + EXPIRY_MARGIN_MS for owner, _, _, left in self.lease_rows.values()
                 if owner is not None and left > 0 and owner not in live]
        delay = min([self.lease_ms // TICKS_PER_LEASE, *[max(0, w) for w in waits]])
        self.after_local(max(1, delay), self._round)

    # ------------------------------------------------------------ partitions

    def _load(self, part: Part) -> None:
        part.loads += 1
        load = part.loads
        self.db.submit(self, lambda: self.db.load(part.number),
                       lambda records: self._loaded(part, load, records), READ_TIMEOUT_MS)

    def _loaded(self, part: Part, load: int, records: Any) -> None:
        if part.loads != load or part.leaving or self.partitions.get(part.number) is not part:
            return
        if isinstance(records, StatementFailed):
            self._drop(part.number, "its load failed")
            return
        runtime = self.cluster.make_runtime(self, part, records)
        part.runtime = runtime
        self.log(f"serving p{part.number} epoch {part.lease.epoch} "
                 f"({len(records)} records)")
        runtime.start()
        if runtime.core is not None:
            runtime.submit(AdoptCatalog(tuple(sorted(self.catalog.items())),
                                        self.resources_epoch,
                                        tuple(sorted(self.placement.items()))))

    def write(self, part: Part, runtime: SimCoordinator, batch: tuple[Record, ...]) -> None:
        """PartitionStore.write: checked against the lease by this clock, then
        fenced by the epoch at the database (timeout: a lease)."""
        if not part.lease.valid(self.local() / 1000):
            self._failed(part, runtime, "its lease ran out by this coordinator's clock")
            return
        records = list(batch)
        epoch = part.lease.epoch

        def done(result: Any) -> None:
            failed = isinstance(result, StatementFailed)
            if failed:
                self._failed(part, runtime, f"write failed: {result}")
            runtime.write_result(batch, not failed)

        self.db.write(self, part.number, epoch, records, done, self.lease_ms)

    def _failed(self, part: Part, runtime: SimCoordinator, why: str) -> None:
        if self.partitions.get(part.number) is part and part.runtime is runtime:
            self._drop(part.number, why)

    def _hand_off(self, number: int, then: Callable[[], None]) -> None:
        part = self.partitions.get(number)
        if part is None or part.leaving:
            then()
            return
        part.leaving = True
        self.log(f"hand-off p{number} epoch {part.lease.epoch}")

        def release() -> None:
            self._forget(part)
            self.db.submit(self, lambda: self.db.release(self, number, part.lease.epoch),
                           lambda _: then(), self._statement_timeout())

        if part.runtime is not None:
            part.runtime.stop(release)
        else:
            release()

    def _drop(self, number: int, why: str) -> None:
        part = self.partitions.get(number)
        if part is None:
            return
        part.leaving = True
        self.log(f"drop p{number} epoch {part.lease.epoch}: {why}")
        if part.runtime is not None:
            part.runtime.abandon()
        self._forget(part)
        if not self.stopping:
            self.db.submit(self, lambda: self.db.release(self, number, part.lease.epoch),
                           lambda _: None, self._statement_timeout())

    def _forget(self, part: Part) -> None:
        if self.partitions.get(part.number) is part:
            del self.partitions[part.number]

    def _expire(self, _: Any = None) -> None:
        now = self.local() / 1000
        for number, part in sorted(self.partitions.items()):
            if not part.lease.valid(now):
                self._drop(number, "its lease ran out by this coordinator's clock")
        self._arm_expiry()

    def _arm_expiry(self) -> None:
        """host._arm_expiry: a timer at the earliest ``valid_until`` of the owned
        leases. One event at a time: an armed one that fires earlier than needed
        (the lease was renewed since) just arms the next."""
        if not self.partitions or self.stopping:
            return
        earliest = min(p.lease.valid_until for p in self.partitions.values())
        # One ms past: LocalLease.valid is then false by this clock.
        when = self.clock.global_at(int(earliest * 1000) + 1)
        armed = self._expiry_at
        if armed is not None and self.sim.now <= armed <= when:
            return
        self._expiry_at = when
        self.at(when, self._expiry_event, when)

    def _expiry_event(self, when: int) -> None:
        if self._expiry_at == when:
            self._expiry_at = None
            self._expire()

    def adopt_catalog(self, catalog: dict[str, int], epoch: int,
                      placement: dict[str, Placement]) -> None:
        if epoch <= self.resources_epoch:
            return
        self.catalog, self.resources_epoch = dict(catalog), epoch
        self.placement = dict(placement)
        command = AdoptCatalog(tuple(sorted(catalog.items())), epoch,
                               tuple(sorted(placement.items())))
        for part in self.partitions.values():
            runtime = part.runtime
            if runtime is not None and runtime.up and runtime.core is not None \
                    and not part.leaving:
                runtime.submit(command)

    # ------------------------------------------------------------ routing (host.route)

    def owner_url(self, number: int) -> str:
        row = self.lease_rows.get(number)
        if row is None or row[0] is None or row[3] <= 0 or row[0] == self.id:
            return ""
        return row[1]

    def on_request(self, conn: Conn) -> None:
        if self.state == NODE_DOWN:
            self.cluster.net.reset(conn, "connection refused (coordinator down)")
            return
        if self.state == NODE_PAUSED:
            # Read when it resumes, if the member has not moved the call on
            # meanwhile (a find given up and sent elsewhere).
            self.deferred.append((self._request_later, (conn, conn.leg)))
            return
        self._route(conn)

    def _request_later(self, arg: tuple[Conn, int]) -> None:
        conn, leg = arg
        if conn.leg == leg:
            self._route(conn)

    def _route(self, conn: Conn) -> None:
        net = self.cluster.net
        number = self.cluster.group_partition
        if conn.finding:
            part = self.partitions.get(number)
            if part is not None and not part.leaving:
                net.answer(conn, FindCoordinatorResponse(None, self.url, number))
                return
            url = self.owner_url(number)
            net.answer(conn, FindCoordinatorResponse(
                None if url else ErrorCode.COORDINATOR_NOT_AVAILABLE, url, number))
            return
        if conn.api == Api.RESOURCES:
            net.answer(conn, CatalogResponse(self.resources_epoch, dict(self.catalog),
                                             dict(self.placement)))
            return
        part = self.partitions.get(number)
        if part is None or part.leaving:
            net.answer(conn, NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR,
                                                  self.owner_url(number)))
            return
        if not part.lease.valid(self.local() / 1000):
            self._drop(number, "its lease ran out by this coordinator's clock")
            net.answer(conn, NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, ""))
            return
        runtime = part.runtime
        if runtime is None or not runtime.up:
            net.answer(conn, NotCoordinatorAnswer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
            return
        conn.server = runtime
        runtime.on_request(conn)

    def on_close(self, conn: Conn) -> None:
        if self.state == NODE_PAUSED:
            self.deferred.append((self.on_close, conn))
            return
        runtime = conn.server
        if self.state == NODE_UP and isinstance(runtime, SimCoordinator):
            runtime.on_close(conn)


class Cluster:
    """The coordinators and their database, as the world sees them."""

    def __init__(self, sim: Sim, net: Network, *, coordinators: int, partitions: int,
                 lease_ms: int, drift_ppm: tuple[int, ...], seed: int, core: CoreConfig,
                 db_ms: tuple[int, int], catalog: dict[str, int], group: str,
                 placement: dict[str, Placement] | None = None) -> None:
        self.sim = sim
        self.net = net
        self.core_config = core
        self.lease_ms = lease_ms
        self.rng = random.Random(seed * 97 + 13)
        self.db = SimDatabase(sim, random.Random(seed * 89 + 29), partitions, db_ms, catalog)
        self.db.idle_timeout_ms = lease_ms
        self.db.placement = dict(placement or {})
        self.group_partition = partition_of(group, partitions)
        # The coordinators' wall clocks: NTP keeps them within WALL_SKEW_MS of one
        # another (far more than a lease, far less than a group's retention, which
        # one coordinator counts from the time another wrote).
        clock_rng = random.Random(seed * 83 + 31)
        wall = clock_rng.randint(0, 10**9)
        self.nodes = [SimNode(self, i, DriftClock(wall + clock_rng.randint(0, WALL_SKEW_MS),
                                                  drift_ppm[i]))
                      for i in range(coordinators)]
        self.db.nodes = self.nodes
        self.urls = tuple(n.url for n in self.nodes)
        self.by_url = {n.url: n for n in self.nodes}
        self.core_errors: list[str] = []
        self._member_ids = 0
        #: hooks of the world: a runtime made for a partition (it wires its checks).
        self.on_runtime: Callable[[SimCoordinator, bool], None] | None = None

    @property
    def verbose(self) -> bool:
        return self.sim.verbose

    def start(self) -> None:
        for node in self.nodes:
            # They start within a few ms of each other.
            self.sim.at(self.rng.randint(0, 20), lambda n: n.start(), node)

    def new_member_id(self, name: str) -> str:
        self._member_ids += 1
        return f"{name}-m{self._member_ids}"

    def make_runtime(self, node: SimNode, part: Part, records: list[Record]) -> SimCoordinator:
        runtime = SimCoordinator(self.sim, self.net, random.Random(self.rng.getrandbits(64)),
                                 self.core_config, disk_ms=(0, 0), clock=node.clock)
        runtime.durable = records
        runtime.core_errors = self.core_errors
        runtime.gate = node.gate
        runtime.new_member_id = self.new_member_id
        runtime.write = lambda batch: node.write(part, runtime, batch)
        if self.on_runtime is not None:
            self.on_runtime(runtime, part.number == self.group_partition)
        return runtime

    def group_runtime(self) -> SimCoordinator | None:
        """The runtime serving the group now: of the newest epoch among those up."""
        best: tuple[int, SimCoordinator] | None = None
        for node in self.nodes:
            if node.state == NODE_DOWN:
                continue
            part = node.partitions.get(self.group_partition)
            if part is None or part.runtime is None or not part.runtime.up:
                continue
            if best is None or part.lease.epoch > best[0]:
                best = (part.lease.epoch, part.runtime)
        return best[1] if best is not None else None

    def group_owner(self) -> SimNode | None:
        """The coordinator serving the group now, if one does."""
        runtime = self.group_runtime()
        for node in self.nodes:
            part = node.partitions.get(self.group_partition)
            if part is not None and runtime is not None and part.runtime is runtime:
                return node
        return None

    def node(self, name: str) -> SimNode | None:
        for node in self.nodes:
            if node.id == name:
                return node
        return None

    def change_catalog(self, name: str, partitions: int,
                       placement: Placement | None = None) -> None:
        """An admin's catalog change, through the first coordinator up (it adopts
        it at once; the others at their next round); ``placement`` None: the set
        keeps its weights and zones."""
        self.db.change_catalog(name, partitions, placement)
        for node in self.nodes:
            if node.state == NODE_UP:
                node.adopt_catalog(self.db.catalog, self.db.catalog_epoch, self.db.placement)
                break


# ---------------------------------------------------------------- the member's router

class SimRouter:
    """One member process's ``CoordinatorRouter`` (see the module docs)."""

    def __init__(self, member: SimMember, cluster: Cluster) -> None:
        self.member = member
        self.cluster = cluster
        self.choice = CoordinatorChoice(cluster.urls)
        # GroupMember gives its router the timing rule's reply allowance.
        self.find_timeout_ms = member.config.timing.reply_ms

    def open(self, conn: Conn) -> None:
        current = self.choice.current
        if current is not None:
            self._send(conn, current)
        else:
            self._find(conn, self.choice.find_order())

    def _send(self, conn: Conn, url: str) -> None:
        conn.finding = False
        conn.url = url
        self.cluster.net.send_leg(conn, self.cluster.by_url[url])

    def _find(self, conn: Conn, order: list[str]) -> None:
        if not order:
            self.choice.none_answered()
            self._final(conn, CoordinatorUnavailableError(
                f"{conn.api}: find_coordinator got no answer"))
            return
        url = order[0]
        conn.finding = True
        conn.url = url
        conn.find_left = order[1:]
        self.cluster.net.send_leg(conn, self.cluster.by_url[url])
        member = self.member
        member.sim.at(member.clock.global_at(member.local() + self.find_timeout_ms),
                      member.router_event, (self._find_timeout, (conn, conn.leg)))

    def _find_timeout(self, arg: tuple[Conn, int]) -> None:
        conn, leg = arg
        if conn.closed or conn.leg != leg or not conn.finding:
            return
        self._find(conn, conn.find_left)

    def _final(self, conn: Conn, response: Any) -> None:
        """The call's outcome, as the member gets it (``on_answer`` goes on)."""
        self.member.router_final(conn, response)

    def on_answer(self, conn: Conn, response: Any, leg: int) -> tuple[bool, Any]:
        """A leg's answer: (True, the call's outcome) or (False, _) while it goes on."""
        if leg != conn.leg:
            return False, None
        choice = self.choice
        url = conn.url
        if conn.finding:
            if isinstance(response, Exception):
                self._find(conn, conn.find_left)
                return False, None
            assert isinstance(response, FindCoordinatorResponse)
            choice.answered(url)
            try:
                owner = choice.found_target(url, response)
            except CoordinatorUnavailableError as exc:
                return True, CoordinatorUnavailableError(f"{conn.api}: {exc}")
            self._use(owner)
            self._send(conn, owner)
            return False, None
        error = getattr(response, "error", None)
        if error is ErrorCode.NOT_COORDINATOR:
            owner = getattr(response, "url", "")
            target = choice.redirect_target(url, owner)
            if target is None:
                choice.forget(url)
            elif target:
                self._use(target)
            conn.redirects += 1
            if conn.redirects > CoordinatorRouter.MAX_REDIRECTS:
                return True, NotCoordinatorError(f"{conn.api}: NOT_COORDINATOR", error, owner)
            self.open(conn)
            return False, None
        if error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return True, NotCoordinatorError(f"{conn.api}: loading", error)
        if isinstance(response, CoordinatorUnavailableError) \
                or error is ErrorCode.COORDINATOR_NOT_AVAILABLE:
            choice.forget(url)
        return True, response

    def _use(self, url: str) -> None:
        self.choice.current = url
        # The calls still waiting on another coordinator fail (router._use).
        member = self.member
        for conn in (member.main, member.bg, member.commit_conn):
            if conn is not None and not conn.closed and not conn.finding and conn.url != url:
                member.sim.after(0, member.router_event, (member.gone, (conn, conn.leg)))

    def timed_out(self, conn: Conn) -> None:
        """The member's own timeout ended the call: its coordinator is given up."""
        if not conn.finding and conn.url:
            self.choice.forget(conn.url)
