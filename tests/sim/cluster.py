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
    one coordinator process: the production
    :class:`~coordinator.cluster.host.PartitionHost` (:class:`SimHost`, which
    only makes its partitions' runtimes observable) on an event loop of its
    own (:class:`~sim.loop.SimLoop`) whose time is the coordinator's drifting
    clock: the host's timers (the next round, the expiry timer, the reader's
    timeout, its runtimes' timers through :class:`NodeClock`) are timers of
    that loop, and the simulation wakes it when the earliest is due. Its
    connections are :class:`SimLeases` and :class:`SimPostgres`, fakes of
    ``Leases`` and ``PostgresStorage`` whose statements run at the simulated
    database (each after its latencies, cut off with the coordinator, within
    the connection's timeout) and raise what the real ones raise. Every
    decision and every effect is the host's; the node's own are the
    process's life -- crash (its loop and memory go), pause (events wait for
    the resume), a start that fails (the process exits and is started again
    a lease later), a graceful stop -- and the HTTP layer's part: a call is
    routed with ``PartitionHost.route`` and becomes its runtime's command
    (:class:`SimPartition`).

:class:`SimRouter`
    a member's ``CoordinatorRouter``: the simulator's driver of the production
    :class:`~client.routing.Routing`, which decides every leg of a call (the
    ``find_coordinator`` round, one at a time, over the bootstrap URLs; the
    call to the coordinator found; ``NOT_COORDINATOR`` followed, at most
    ``MAX_REDIRECTS`` times; ``COORDINATOR_LOAD_IN_PROGRESS`` and failures
    handed to the member; a call that timed out giving its coordinator up;
    the calls still waiting on the old coordinator failed when another is
    found). The driver's own are the legs' travel on one connection, the
    ``find_timeout_ms`` timer (the member's ``reply_ms``, as ``GroupMember``
    sets it) on the member's drifting clock, and the translation of a
    ``NOT_COORDINATOR`` answer into the transport's ``NotCoordinatorError``.

Simplifications (docs/reliability.md): a renewal ignores the lock of a write
in flight; the catalog is changed at the database and adopted by each
coordinator at its next round (by the one it went through at once).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from client.errors import NotCoordinatorError
from client.routing import (
    Answer,
    AskFind,
    Fail,
    RoutedCall,
    Routing,
    RoutingEffect,
    SendCall,
)
from client.transport import CatalogResponse
from coordinator.cluster.host import PartitionHost, PartitionStore
from coordinator.cluster.host_machine import HostMachine, Partition
from coordinator.core.config import CoreConfig
from coordinator.core.records import Record, Snapshot
from coordinator.core.replay import fold
from coordinator.metrics import Metrics
from coordinator.runtime import effects as fx
from coordinator.runtime.commits import record_group
from coordinator.runtime.runtime import Runtime
from coordinator.storage.leases import CoordinatorRow, LeaseRow, Leases, quotas
from coordinator.storage.postgres import CatalogState, FencedError, PostgresStorage, partition_of
from coordinator.storage.sqlite import StorageError
from protocol.catalog import Placement
from protocol.messages import Api, NotCoordinatorAnswer
from sim.events import DriftClock, Sim
from sim.loop import SimLoop
from sim.server import SimCore, SimRuntime, SimServing

if TYPE_CHECKING:
    from sim.member import SimMember
    from sim.network import Conn, Network

__all__ = ["NODE_DOWN", "NODE_PAUSED", "NODE_UP", "Cluster", "NodeClock", "SimDatabase",
           "SimHost", "SimLeases", "SimNode", "SimPartition", "SimPostgres", "SimRouter"]

NODE_UP, NODE_PAUSED, NODE_DOWN = "up", "paused", "down"
#: when every coordinator row says it started (nothing reads it).
STARTED_AT = datetime(2026, 1, 1, tzinfo=UTC)
#: a read (a partition's load) is given up after this (host.READ_TIMEOUT_S).
READ_TIMEOUT_MS = 30_000
#: a statement's round trip takes at most a lease / this (its latency each way is
#: drawn up to half of it; docs/operations.md, "Sizing the lease").
DB_RTT_PER_LEASE = 25
#: the database's name in what its connections raise.
SIM_DATABASE = "postgresql://simulated/groupcoord"
#: how far apart the coordinators' wall clocks are at most (docs/operations.md,
#: "Clocks"): a minute, hundreds of leases.
WALL_SKEW_MS = 60_000


class StatementFailed(Exception):
    """A statement got no answer in time, or the database refused it."""


class Fenced(StatementFailed):
    """A write whose partition's lease is no longer this coordinator's at its epoch."""

    def __init__(self, partition: int, expected: int, owner: str | None, epoch: int) -> None:
        super().__init__(f"partition {partition}: lease at epoch {epoch} of {owner}, "
                         f"not epoch {expected}")
        self.partition = partition
        self.expected = expected
        self.owner = owner
        self.epoch = epoch


@dataclass(slots=True)
class DbLease:
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
    #: a write's fence: partition -> the epoch it was written at.
    fence: dict[int, int] | None = None


class SimDatabase:
    def __init__(self, sim: Sim, rng: random.Random, partitions: int,
                 latency_ms: tuple[int, int], catalog: dict[str, int]) -> None:
        self.sim = sim
        self.rng = rng
        self.partitions = partitions
        self.latency_ms = latency_ms
        self.leases = {p: DbLease() for p in range(partitions)}
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

    def register(self, node: SimNode) -> None:
        self.seen[node.id] = (node.url, self.sim.now)

    def renew(self, node: SimNode, held: dict[int, int], lease_ms: int) -> set[int]:
        renewed: set[int] = set()
        for p, epoch in held.items():
            row = self.leases[p]
            if row.epoch == epoch and row.owner == node.id:
                row.expires_at = self.sim.now + lease_ms
                renewed.add(p)
        return renewed

    def live_coordinators(self, within_ms: int) -> list[CoordinatorRow]:
        now = self.sim.now
        return [CoordinatorRow(cid, url, STARTED_AT, now - seen)
                for cid, (url, seen) in sorted(self.seen.items()) if seen > now - within_ms]

    def lease_rows(self) -> list[LeaseRow]:
        now = self.sim.now
        return [LeaseRow(p, r.owner, r.url or None, r.epoch,
                         r.expires_at - now if r.expires_at >= 0 else -1, None)
                for p, r in sorted(self.leases.items())]

    def catalog_state(self, since: int | None) -> CatalogState | None:
        if since is not None and self.catalog_epoch <= since:
            return None
        return CatalogState(dict(self.catalog), dict(self.placement), self.catalog_epoch)

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

    def write(self, node: SimNode, fence: dict[int, int], records: list[Record],
              done: Callable[[Any], None], timeout_ms: int) -> None:
        """A fenced write (see the class docs); ``done(None)`` once committed."""
        st = Statement(node, node.life, lambda: None, done, timeout_ms, fence=fence)
        self.inflight.setdefault(node.id, []).append(st)
        arg = (st, records)
        if node.id in self.cut:
            self._arm_timeout(st)
            self.held.setdefault(node.id, []).append((self._write_fence, arg))
            return
        self.sim.after(self._latency(slow=True), self._write_fence, arg)

    def _write_fence(self, arg: tuple[Statement, list[Record]]) -> None:
        st, _ = arg
        node = st.node
        if st.life != node.life:
            return
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((self._write_fence, arg))
            return
        fence = st.fence or {}
        result: StatementFailed | None = None
        for partition, epoch in sorted(fence.items()):
            row = self.leases[partition]
            if row.owner != node.id or row.epoch != epoch:
                self.fenced += 1
                result = Fenced(partition, epoch, row.owner, row.epoch)
            elif partition in self.locks:
                result = StatementFailed(f"partition {partition}: lease row locked")
            if result is not None:
                self._on_link(node, self._reply, (st, result), at_node=True)
                return
        for partition in sorted(fence):
            self.locks[partition] = st
            self.sim.after(self.idle_timeout_ms, self._idle_end, (st, partition))
        self._on_link(node, self._write_send_commit, arg, at_node=True)

    def _write_send_commit(self, arg: tuple[Statement, list[Record]]) -> None:
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

    def _write_commit(self, arg: tuple[Statement, list[Record]]) -> None:
        st, records = arg
        node = st.node
        if st.life != node.life:
            return
        if node.id in self.cut:
            self.held.setdefault(node.id, []).append((self._write_commit, arg))
            return
        fence = st.fence or {}
        result: StatementFailed | None = None
        if any(self.locks.get(partition) is not st for partition in fence):
            self.ended += 1
            result = StatementFailed("the server ended the transaction (idle in transaction)")
        else:
            for partition in sorted(fence):
                del self.locks[partition]
                self._check_write(node, partition, fence[partition])
            self.writes += 1
            self._store(fence, records)
        self._on_link(node, self._reply, (st, result), at_node=True)

    def _store(self, fence: dict[int, int], records: list[Record]) -> None:
        """The records of a committed write, each in its group's partition (a
        record of no group, in every partition written)."""
        if len(fence) == 1:
            self.records[next(iter(fence))].extend(records)
            return
        for record in records:
            group_id = record_group(record)
            for partition in ([partition_of(group_id, self.partitions)] if group_id is not None
                              else sorted(fence)):
                self.records[partition].append(record)

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

    def _check_write(self, node: SimNode, partition: int, epoch: int) -> None:
        """The invariant, from the checker's own log of acquisitions: a write
        commits only for the latest acquisition of its partition, and never
        after a write of a newer epoch (two owners' writes never both commit)."""
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


class NodeClock:
    """The clock a coordinator's partition runtimes are given (``WallClock`` in
    production): the process's own time; a timer is one on its event loop."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def now_ms(self) -> int:
        return self.node.local()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_at(deadline_ms / 1000, callback)


# Not native classes when mypyc compiles the simulator: they extend production classes.
@mypyc_attr(native_class=False)
class SimLeases(Leases):
    """The lease connection (``Leases``): each statement runs at the simulated
    database, after its latencies, within ``timeout_s``; a failure raises
    ``StorageError``, as the real connection does."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(None, SIM_DATABASE, node.id, node.url, node.db.partitions)
        self.node = node

    async def _statement(self, run: Callable[[], Any]) -> Any:
        timeout_s = self.timeout_s or READ_TIMEOUT_MS / 1000
        return await self.node.statement(run, int(timeout_s * 1000))

    async def register(self) -> None:
        node = self.node
        await self._statement(lambda: node.db.register(node))

    async def heartbeat(self) -> None:
        node = self.node
        await self._statement(lambda: node.db.register(node))

    async def deregister(self) -> None:
        node = self.node
        await self._statement(lambda: node.db.deregister(node))

    async def live_coordinators(self, within_ms: int) -> list[CoordinatorRow]:
        db = self.node.db
        rows: list[CoordinatorRow] = await self._statement(
            lambda: db.live_coordinators(within_ms))
        return rows

    async def leases(self) -> list[LeaseRow]:
        rows: list[LeaseRow] = await self._statement(self.node.db.lease_rows)
        return rows

    async def acquire(self, partition: int, lease_ms: int) -> int | None:
        node = self.node
        epoch: int | None = await self._statement(
            lambda: node.db.acquire(node, partition, lease_ms))
        return epoch

    async def renew(self, held: Mapping[int, int], lease_ms: int) -> set[int]:
        node = self.node
        renewed: set[int] = await self._statement(
            lambda: node.db.renew(node, dict(held), lease_ms))
        return renewed

    async def release(self, partition: int, epoch: int) -> bool:
        node = self.node
        released: bool = await self._statement(lambda: node.db.release(node, partition, epoch))
        return released


@mypyc_attr(native_class=False)
class SimPostgres(PostgresStorage):
    """A connection of the coordinator's to the shared database
    (``PostgresStorage``: the writer's, or the reader's): fenced writes, loads of
    a partition or a group, the catalog."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(None, SIM_DATABASE, node.db.partitions, node.id)
        self.node = node

    async def write(self, records: Sequence[Record], *, fence: Mapping[int, int] | None = None,
                    timeout: float | None = None) -> float:
        node = self.node
        started = node.sim.now
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        timeout_ms = int((timeout or READ_TIMEOUT_MS / 1000) * 1000)
        node.db.write(node, dict(fence or {}), list(records), partial(node.answered, future),
                      timeout_ms)
        result = await future
        if isinstance(result, Fenced):
            raise FencedError(self.path, result.partition, result.expected, node.id,
                              result.owner, result.epoch)
        if isinstance(result, StatementFailed):
            raise StorageError(f"database {self.path}: write failed: {result}")
        return (node.sim.now - started) / 1000

    async def load_partition(self, partition: int) -> Snapshot:
        db = self.node.db
        records: list[Record] = await self.node.statement(lambda: db.load(partition),
                                                          READ_TIMEOUT_MS)
        return fold(records)

    async def load_group(self, group_id: str) -> Snapshot:
        db = self.node.db
        records: list[Record] = await self.node.statement(
            lambda: db.load(partition_of(group_id, db.partitions)), READ_TIMEOUT_MS)
        return fold([r for r in records if record_group(r) == group_id])

    async def catalog_since(self, since: int) -> CatalogState | None:
        db = self.node.db
        state: CatalogState | None = await self.node.statement(
            lambda: db.catalog_state(since), READ_TIMEOUT_MS)
        return state

    def drop_connection(self) -> None:
        """A read given up: its statement's answer is no longer awaited (the
        simulated connection holds nothing else)."""


@mypyc_attr(native_class=False)
class SimHost(PartitionHost):
    """The production partition host of one coordinator's life, on its loop; its
    partitions' runtimes are made as :class:`~sim.server.SimRuntime`, each with
    its :class:`SimPartition` (see the module docs)."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(writer_store=SimPostgres(node), reader_store=SimPostgres(node),
                         leases=SimLeases(node), lease_ms=node.lease_ms,
                         make_core=partial(SimCore, node.cluster.core_config),
                         clock=NodeClock(node),
                         metrics=Metrics(), monotonic=node.now)
        self.node = node
        self.url = node.url

    def _new_runtime(self, number: int, store: PartitionStore) -> Runtime:
        serving = SimPartition(self.node, number)
        runtime = SimRuntime(serving, self._make_core(), store, self.clock, self.metrics,
                             max_parked_requests=self.max_parked_requests,
                             max_parked_per_token=self.max_parked_per_token,
                             partition=number, request_ids=self._request_ids)
        serving.attach(runtime)
        return runtime


class SimPartition(SimServing):
    """The calls of one partition runtime of a coordinator (:class:`SimServing`),
    as its HTTP layer makes them. Its stops are the host's (a failed or fenced
    write stops it, and the host drops the partition): expected, not findings."""

    def __init__(self, node: SimNode, number: int) -> None:
        super().__init__(node.sim, node.cluster.net)
        self.node = node
        self.life = node.life
        self.number = number
        self.core_errors = node.cluster.core_errors
        #: the checker was shown its restored state (once it served).
        self.restored = False
        node.servings.append(self)

    def attach(self, runtime: SimRuntime) -> None:
        self.runtime = runtime
        core = runtime.core
        assert isinstance(core, SimCore)
        self.core = core
        cluster = self.node.cluster
        if cluster.on_runtime is not None:
            cluster.on_runtime(self, self.number == cluster.group_partition)

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        self.node.run(fn, *args)

    def new_request_id(self) -> int:
        host = self.node.host
        assert host is not None
        return host.new_request_id()

    def new_member_id(self, name: str) -> str:
        return self.node.cluster.new_member_id(name)

    def accepting(self) -> bool:
        return self.node.life == self.life and self.node.state == NODE_UP

    def serving(self) -> bool:
        """Whether its runtime serves (loaded, not stopped or failed)."""
        runtime = self.runtime
        return self.accepting() and runtime is not None and runtime.ready

    def observe(self, effect: fx.MachineEffect) -> None:
        if isinstance(effect, fx.ServingStopped):
            self.expect_stop = True
        super().observe(effect)


class SimNode:
    """One coordinator process: the production
    :class:`~coordinator.cluster.host.PartitionHost` on an event loop of its own
    (see the module docs)."""

    def __init__(self, cluster: Cluster, index: int, clock: DriftClock) -> None:
        self.cluster = cluster
        self.sim = cluster.sim
        self.db = cluster.db
        self.index = index
        self.id = f"c{index}"
        self.url = f"http://c{index}"
        self.clock = clock
        self.lease_ms = cluster.lease_ms
        self.state = NODE_DOWN
        #: bumped by every crash and start: events of an older life are dropped.
        self.life = 0
        self.deferred: list[tuple[Callable[[Any], None], Any]] = []
        #: the process's memory: its loop and host, new at every start.
        self.loop: SimLoop | None = None
        self.host: SimHost | None = None
        #: the partitions' calls of this life (their connections die with it).
        self.servings: list[SimPartition] = []
        #: the global time of the loop's wake-up armed (None: none).
        self._wake_at: int | None = None
        #: what a graceful stop calls once the process exited.
        self._then: Callable[[], None] | None = None
        #: the process ends after the loop's step: "failed" (its start failed: it
        #: is started again a lease later) or "stopped" (a graceful stop).
        self._ending: str | None = None
        #: a pause armed for the next write's COMMIT (its duration; 0: none).
        self.pause_mid_write = 0

    @property
    def partitions(self) -> dict[int, Partition[Runtime]]:
        return self.host.partitions if self.host is not None else {}

    @property
    def machine(self) -> HostMachine[Runtime] | None:
        return self.host.machine if self.host is not None else None

    @property
    def stopping(self) -> bool:
        return self.host is not None and self.host.machine.stopping

    # ------------------------------------------------------------ events and clock

    def local(self) -> int:
        return self.clock.local(self.sim.now)

    def now(self) -> float:
        """The host's monotonic clock (and the loop's): this process's seconds."""
        return self.local() / 1000

    def at(self, when: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """An event of this process at global ``when``: dropped if the process
        died meanwhile, kept for its resume while it is paused."""
        self.sim.at(when, self._event, (self.life, fn, arg))

    def _event(self, arg: tuple[int, Callable[[Any], None], Any]) -> None:
        life, fn, inner = arg
        if life != self.life or self.state == NODE_DOWN:
            return
        if self.state == NODE_PAUSED:
            self.deferred.append((fn, inner))
            return
        fn(inner)

    def log(self, line: str) -> None:
        self.sim.log(f"{self.id} {line}")

    # ------------------------------------------------------------ the loop

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the process's loop, as one step (``SimLoop.run``)."""
        loop = self.loop
        assert loop is not None
        if loop.run(fn, *args):
            self._stepped(loop)

    def _step(self, loop: SimLoop) -> None:
        loop.step()
        self._stepped(loop)

    def _stepped(self, loop: SimLoop) -> None:
        """After a step: the checker shown each runtime restored, then the
        process's exit if it ends."""
        if loop.dead:
            loop.close()
            return
        for serving in self.servings:
            if not serving.restored and serving.serving():
                serving.restored = True
                if serving.on_restored is not None:
                    serving.on_restored()
        ending, self._ending = self._ending, None
        if ending == "failed":
            # The process exits; its supervisor starts it again a lease later.
            self._exit()
            self.sim.after(self.lease_ms, self.start)
        elif ending == "stopped":
            self.log("stopped")
            then, self._then = self._then, None
            self._exit()  # the process exits: nothing of it remains
            if then is not None:
                then()

    def _wake_in(self, seconds: float) -> None:
        """The loop waits for a timer ``seconds`` away: an event then (at least a
        ms on, past the timer by this clock)."""
        when = self.clock.global_at(max(self.local() + 1, math.ceil((self.now() + seconds)
                                                                   * 1000)))
        armed = self._wake_at
        if armed is not None and self.sim.now <= armed <= when:
            return
        self._wake_at = when
        self.at(when, self._wake, when)

    def _wake(self, when: int) -> None:
        if self._wake_at == when:
            self._wake_at = None
            loop = self.loop
            if loop is not None:
                self._step(loop)

    async def statement(self, run: Callable[[], Any], timeout_ms: int) -> Any:
        """``run()`` at the database (see :meth:`SimDatabase.submit`), its answer
        awaited; ``StorageError`` when it failed or got no answer in time."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.db.submit(self, run, partial(self.answered, future), timeout_ms)
        result = await future
        if isinstance(result, StatementFailed):
            raise StorageError(f"database {SIM_DATABASE}: {result}")
        return result

    def answered(self, future: asyncio.Future[Any], result: Any) -> None:
        """The database's answer to a statement of this life (an event at this
        process: it waits while the process is paused)."""
        if self.loop is not None and not future.done():
            self.run(future.set_result, result)

    # ------------------------------------------------------------ life cycle

    def start(self, _: Any = None) -> None:
        if self.state != NODE_DOWN:
            return
        self.state = NODE_UP
        self.life += 1
        self.log(f"up (life {self.life})")
        loop = self.loop = SimLoop(self.cluster.core_errors, clock=self.now, wake=self._wake_in)
        self.host = SimHost(self)
        self.servings = []
        loop.create_task(self._serve())
        self._step(loop)

    async def _serve(self) -> None:
        """``groupcoord serve``'s part: the host started (or the process exits),
        then its lease loop until the stop."""
        host = self.host
        assert host is not None
        try:
            await host.start()
        except StorageError as exc:
            self.log(f"start failed: {exc}")
            self._ending = "failed"
            return
        await host.run()

    def crash(self) -> None:
        if self.state == NODE_DOWN:
            return
        self.log("CRASH " + " ".join(f"p{n}@{p.lease.epoch}" for n, p in
                                     sorted(self.partitions.items())))
        self._exit()

    def _exit(self) -> None:
        self._wake_at = None
        self.state = NODE_DOWN
        self.life += 1
        self.deferred.clear()
        for serving in self.servings:
            serving.reset_calls()
        self.servings = []
        loop = self.loop
        if loop is not None:
            loop.dead = True
            if not loop.is_running():
                loop.close()
        self.loop = None
        self.host = None
        self.db.process_gone(self)

    def shut_down(self) -> None:
        """The run is over: the loop is closed, what it left pending dropped."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.dead = True
            loop.close()

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
        """SIGTERM (``PartitionHost.stop``): every partition handed off, then the
        coordinator's row deleted; the process exits."""
        if self.state != NODE_UP or self.stopping:
            return
        self.log("STOP")
        self._then = then
        self.run(self._begin_stop)

    def _begin_stop(self) -> None:
        loop = self.loop
        assert loop is not None
        loop.create_task(self._stop())

    async def _stop(self) -> None:
        host = self.host
        assert host is not None
        await host.stop()
        self._ending = "stopped"

    def adopt_catalog(self, state: CatalogState) -> None:
        host = self.host
        if host is not None:
            self.run(host.adopt_catalog, state)

    # ------------------------------------------------------------ routing (the HTTP layer)

    def on_request(self, conn: Conn) -> None:
        if self.state == NODE_DOWN:
            self.cluster.net.reset(conn, "connection refused (coordinator down)")
            return
        if self.state == NODE_PAUSED:
            # Read when it resumes, if the member has not moved the call on
            # meanwhile (a find given up and sent elsewhere).
            self.deferred.append((self._request_later, (conn, conn.leg)))
            return
        self.run(self._route, conn)

    def _request_later(self, arg: tuple[Conn, int]) -> None:
        conn, leg = arg
        if conn.leg == leg:
            self.run(self._route, conn)

    def _route(self, conn: Conn) -> None:
        net = self.cluster.net
        host = self.host
        assert host is not None
        group = self.cluster.group
        if conn.finding:
            net.answer(conn, host.find_coordinator(group))
            return
        if conn.api == Api.RESOURCES:
            net.answer(conn, CatalogResponse(host.resources_epoch, dict(host.catalog),
                                             dict(host.placement)))
            return
        target = host.route(group)
        if isinstance(target, NotCoordinatorAnswer):
            net.answer(conn, target)
            return
        assert isinstance(target, SimRuntime)
        serving = target.observer
        conn.server = serving
        serving.serve(conn)

    def on_close(self, conn: Conn) -> None:
        if self.state == NODE_PAUSED:
            self.deferred.append((self.on_close, conn))
            return
        serving = conn.server
        if self.state == NODE_UP and isinstance(serving, SimPartition):
            serving.on_close(conn)


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
        # A database sized as docs/operations.md says: a round trip well inside a
        # lease (a round is about six statements in a row); a slower one is a fault.
        db_ms = (db_ms[0], min(db_ms[1], max(2, lease_ms // DB_RTT_PER_LEASE)))
        self.db = SimDatabase(sim, random.Random(seed * 89 + 29), partitions, db_ms, catalog)
        self.db.idle_timeout_ms = lease_ms
        self.db.placement = dict(placement or {})
        self.group = group
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
        self.on_runtime: Callable[[SimPartition, bool], None] | None = None
        for node in self.nodes:
            sim.at_end.append(node.shut_down)

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

    def group_runtime(self) -> SimPartition | None:
        """The runtime serving the group now: of the newest epoch among those up."""
        best: tuple[int, SimPartition] | None = None
        for node in self.nodes:
            if node.state == NODE_DOWN:
                continue
            part = node.partitions.get(self.group_partition)
            runtime = part.runtime if part is not None else None
            if part is None or not isinstance(runtime, SimRuntime):
                continue
            serving = runtime.observer
            if not isinstance(serving, SimPartition) or not serving.serving():
                continue
            if best is None or part.lease.epoch > best[0]:
                best = (part.lease.epoch, serving)
        return best[1] if best is not None else None

    def group_owner(self) -> SimNode | None:
        """The coordinator serving the group now, if one does."""
        runtime = self.group_runtime()
        for node in self.nodes:
            part = node.partitions.get(self.group_partition)
            if part is not None and runtime is not None and part.runtime is runtime.runtime:
                return node
        return None

    def placed(self) -> bool:
        """Every partition served (loaded, not leaving) by exactly one coordinator
        that is up, each of those holding its quota (``quotas``, the real
        share), and every one of them able to name each partition's owner
        (``find_coordinator``: its last read of the leases is that recent): the
        cluster's start-up hand-offs are over."""
        up = [n for n in self.nodes if n.state == NODE_UP]
        if not up:
            return False
        share = quotas((n.id for n in up), self.db.partitions)
        served: dict[int, int] = {}
        for node in up:
            mine = [p for p, part in node.partitions.items()
                    if part.runtime is not None and not part.leaving]
            if len(mine) != len(node.partitions) or len(mine) != share[node.id]:
                return False
            for p in mine:
                served[p] = served.get(p, 0) + 1
        return (len(served) == self.db.partitions
                and all(count == 1 for count in served.values())
                and all(node.host is not None
                        and node.host.machine.find_coordinator(p).error is None
                        for node in up for p in range(self.db.partitions)))

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
                node.adopt_catalog(CatalogState(dict(self.db.catalog), dict(self.db.placement),
                                                self.db.catalog_epoch))
                break


# ---------------------------------------------------------------- the member's router

class SimRouter:
    """One member process's ``CoordinatorRouter`` (see the module docs): the
    simulator's driver of the production :class:`~client.routing.Routing`."""

    def __init__(self, member: SimMember, cluster: Cluster) -> None:
        self.member = member
        self.cluster = cluster
        # GroupMember gives its router the timing rule's reply allowance.
        self.routing = Routing(cluster.urls, cluster.group,
                               find_timeout_ms=member.config.timing.reply_ms)
        self._conns: dict[RoutedCall, Conn] = {}

    def open(self, conn: Conn) -> None:
        routed = self.routing.new_call(conn.api)
        conn.routed = routed
        self._conns[routed] = conn
        final, _ = self._perform(self.routing.route(routed), conn)
        assert not final, "a call's first step is a leg"

    def on_answer(self, conn: Conn, response: Any, leg: int) -> tuple[bool, Any]:
        """A leg's answer: (True, the call's outcome) or (False, _) while it goes on."""
        routed = conn.routed
        if leg != conn.leg or routed is None:
            return False, None  # an older leg's (a find given up)
        if isinstance(response, NotCoordinatorAnswer):
            # The transport's translation (AiohttpTransport._check_served).
            response = NotCoordinatorError(
                f"{conn.api}: {response.error.value} at {conn.url}", response.error,
                response.url)
        if isinstance(response, Exception):
            effects = self.routing.failed(routed, response)
        else:
            effects = self.routing.answered(routed, response)
        return self._perform(effects, conn)

    def _find_timeout(self, arg: tuple[Conn, int]) -> None:
        conn, leg = arg
        routed = conn.routed
        if conn.closed or conn.leg != leg or routed is None:
            return  # answered in time, or closed
        final, outcome = self._perform(self.routing.find_timed_out(routed), conn)
        if final:
            self.member.router_final(conn, outcome)

    def cancelled(self, conn: Conn) -> None:
        """The member closed ``conn`` before its outcome (its timeout, a reset,
        its process killed)."""
        if conn.routed is not None:
            self._perform(self.routing.cancelled(conn.routed), conn)

    def timed_out(self, conn: Conn) -> None:
        """The member's own timeout ended the call: its coordinator is given up."""
        self.cancelled(conn)
        self.routing.timed_out(conn.api)

    def _perform(self, effects: list[RoutingEffect], current: Conn) -> tuple[bool, Any]:
        """Carry ``effects`` out; (True, outcome) when they end ``current``'s call."""
        final: tuple[bool, Any] = (False, None)
        member = self.member
        for effect in effects:
            if isinstance(effect, (SendCall, AskFind)):
                conn = self._conns[effect.call]
                conn.finding = isinstance(effect, AskFind)
                conn.url = effect.url
                self.cluster.net.send_leg(conn, self.cluster.by_url[effect.url])
                if conn.finding:
                    member.sim.at(member.clock.global_at(member.local()
                                                         + self.routing.find_timeout_ms),
                                  member.router_event, (self._find_timeout, (conn, conn.leg)))
            elif isinstance(effect, (Answer, Fail)):
                conn = self._conns.pop(effect.call)
                outcome = effect.response if isinstance(effect, Answer) else effect.error
                if conn is current:
                    final = (True, outcome)
                else:
                    # A call waiting on a coordinator given up: closed, then failed
                    # (as CoordinatorRouter cancels its leg).
                    member.sim.after(0, member.router_event, (member.gone, (conn, outcome)))
            elif member.sim.verbose:
                member.sim.log(f"{member.tag} router {effect}")
        if current.routed is not None and current.routed.done:
            self._conns.pop(current.routed, None)
        return final
