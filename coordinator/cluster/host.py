"""One coordinator among several on PostgreSQL: partition leases, one runtime each.

docs/protocol.md, "Several coordinators sharing groups"; docs/operations.md,
"Running several coordinators". As Kafka's group coordinator runs one shard
per ``__consumer_offsets`` partition, a coordinator here runs one
:class:`~coordinator.runtime.runtime.Runtime` (with its own core, timers and
group commit) per partition it owns, and drops it whole when it stops owning
the partition. A partition's runtime is exactly a one-process server's,
restored from :meth:`PostgresStorage.load_partition`: a takeover resumes
groups as a restart does.

The loop (:meth:`PartitionHost.run`), every ``lease_ms / 5`` and at the
moment a lease it waits for runs out:

1. renew every owned lease in one statement (``sent_at`` noted first: the
   owner's own rule, :class:`~coordinator.storage.leases.LocalLease`); a
   partition not renewed was lost: dropped at once;
2. refresh this coordinator's row, read the live coordinators (seen within
   ``lease_ms / 2``) and every lease;
3. :func:`~coordinator.storage.leases.balance`: acquire free partitions up to
   this coordinator's share (each then loads: ``COORDINATOR_LOAD_IN_PROGRESS``
   meanwhile), hand off what others are short of (the runtime finishes its
   writes, then the lease is released);
4. adopt a catalog changed through another coordinator.

Safety does not depend on the loop keeping time: :meth:`route` checks the
partition's lease by the monotonic clock on every call and drops an expired
one before answering, and every write is fenced by the partition's epoch in
its transaction (:class:`SharedWriter`), so a coordinator that was paused or
cut off can neither answer nor write for a partition once another may own
it. A write that fails (fenced, or the database gone) drops that partition:
memory is then ahead of the database, and the partition is loaded again from
the database by whoever acquires it next (this coordinator included).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.commands import AdoptCatalog
from coordinator.core.records import Record, Snapshot
from coordinator.metrics import Metrics
from coordinator.runtime.clock import Clock
from coordinator.runtime.runtime import Core, Runtime
from coordinator.storage.leases import CoordinatorRow, LeaseRow, Leases, LocalLease, balance
from coordinator.storage.postgres import (
    CatalogState,
    FencedError,
    PostgresStorage,
    partition_of,
)
from coordinator.storage.sqlite import RecordError, StorageError
from protocol.catalog import Placement
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse, NotCoordinatorAnswer

log = logging.getLogger("groupcoord.cluster")


def number_ranges(numbers: Sequence[int]) -> str:
    """``0-3,7``: partition numbers, sorted, runs folded (for one log line)."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)

#: the loop runs at least this many times per lease (renewals: lease / 5).
TICKS_PER_LEASE = 5
#: seconds a read (a partition's load, an admin read) may take; a load longer than a
#: lease is fine (a loading partition's lease is renewed), a hung connection is not.
READ_TIMEOUT_S = 30.0


def writer_settings(lease_ms: int) -> dict[str, str]:
    """Session settings of the writing connection: a transaction left open (this
    process paused mid-write) is ended by the server after a lease, so its locks on
    the lease rows never hold up another coordinator's takeover."""
    return {"idle_in_transaction_session_timeout": str(lease_ms)}


def lease_settings(lease_ms: int) -> dict[str, str]:
    """Session settings of the lease connection: a statement waits at most one round
    for a row lock (a lease row locked by another coordinator's write), so a round is
    never stuck behind a paused coordinator and renewals keep their pace."""
    return {"lock_timeout": str(max(50, lease_ms // TICKS_PER_LEASE))}


class LeaseExpired(StorageError):
    """A partition's lease ran out by this coordinator's clock (raised by the
    partition's store check; the host drops the partition)."""


# ---------------------------------------------------------------- writes


@dataclass(slots=True, eq=False)
class _Write:
    partition: int
    epoch: int
    records: list[Record]
    future: asyncio.Future[float]


class SharedWriter:
    """The fenced writes of every owned partition, merged into one transaction.

    Each partition's runtime has at most one write in flight; while one
    transaction runs, the writes of all partitions that arrive collect, and go
    together in the next one, fenced by each partition's epoch (group commit
    across partitions: one round trip and one WAL flush for many). A fenced
    partition's records are taken out and the rest retried at once (the
    transaction was rolled back: nothing of it is in the database); a record the
    database will not take (:class:`RecordError`) has each partition's writes
    retried alone, so only that partition's write fails; any other failure fails
    every write of the transaction.
    """

    def __init__(self, store: PostgresStorage, timeout_s: float | None = None) -> None:
        self._store = store
        #: a transaction taking longer is given up (its partitions are dropped).
        self._timeout_s = timeout_s
        self._pending: list[_Write] = []
        self._task: asyncio.Task[None] | None = None

    async def write(self, partition: int, epoch: int, records: Sequence[Record]) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(partition, epoch, list(records), future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return await future

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._commit(batch)
        finally:
            self._task = None

    async def _commit(self, batch: list[_Write]) -> None:
        # A partition dropped and acquired again may have an old write still queued:
        # only its newest epoch is fenced for; the older one cannot succeed.
        newest: dict[int, int] = {}
        for w in batch:
            newest[w.partition] = max(newest.get(w.partition, w.epoch), w.epoch)
        for w in [w for w in batch if w.epoch != newest[w.partition]]:
            _fail(w, FencedError(self._store.path, w.partition, w.epoch,
                                 str(self._store.coordinator_id), None, newest[w.partition]))
        batch = [w for w in batch if w.epoch == newest[w.partition]]
        while batch:
            records = [r for w in batch for r in w.records]
            try:
                seconds = await self._store.write(records,
                                                  fence={w.partition: w.epoch for w in batch},
                                                  timeout=self._timeout_s)
            except FencedError as exc:
                for w in batch:
                    if w.partition == exc.partition:
                        _fail(w, exc)
                batch = [w for w in batch if w.partition != exc.partition]
                continue
            except RecordError as exc:
                if len(batch) == 1:
                    _fail(batch[0], exc)
                    return
                # One partition's record the database would not take: nothing was
                # written. Each partition's writes go alone, so only the one holding
                # that record fails (its runtime isolates the group), never the rest.
                for w in batch:
                    await self._commit([w])
                return
            except Exception as exc:
                for w in batch:
                    _fail(w, exc)
                return
            for w in batch:
                if not w.future.done():
                    w.future.set_result(seconds)
            return


def _fail(write: _Write, exc: BaseException) -> None:
    if not write.future.done():
        write.future.set_exception(exc)


# ---------------------------------------------------------------- one partition


@dataclass(slots=True, eq=False)
class Partition:
    """A partition this coordinator owns: its lease, and its runtime once loaded."""

    number: int
    lease: LocalLease
    #: ``None`` while loading (calls answered ``COORDINATOR_LOAD_IN_PROGRESS``).
    runtime: Runtime | None = None
    #: True from the start of a hand-off or drop: no call is routed to it any more.
    leaving: bool = False
    #: the load, then the watch of the runtime's failure.
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def loader(self) -> asyncio.Task[Any] | None:
        return self.tasks[0] if self.tasks else None


class PartitionStore:
    """The storage seam of one partition's runtime: loads the partition, writes
    fenced by its epoch, and checks its lease by the monotonic clock."""

    def __init__(self, host: PartitionHost, partition: Partition) -> None:
        self._host = host
        self._partition = partition

    async def load(self) -> Snapshot:
        snapshot: Snapshot = await self._host.read(
            lambda store: store.load_partition(self._partition.number))
        return snapshot

    async def load_group(self, group_id: str) -> Snapshot:
        snapshot: Snapshot = await self._host.read(lambda store: store.load_group(group_id))
        return snapshot

    async def write(self, records: Sequence[Record]) -> float:
        self.check()  # nothing is sent once the lease may have run out
        p = self._partition
        return await self._host.writer.write(p.number, p.lease.epoch, records)

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self._host.read(
            lambda store: store.rebalances(group_id, limit))
        return rows

    def check(self) -> None:
        p = self._partition
        if not p.lease.valid(time.monotonic()):
            raise LeaseExpired(f"partition {p.number}: lease (epoch {p.lease.epoch}) ran out "
                               f"by this coordinator's clock")


# ---------------------------------------------------------------- the host


class PartitionHost:
    """This coordinator's partitions: the lease loop, and routing by partition."""

    def __init__(self, *, writer_store: PostgresStorage, reader_store: PostgresStorage,
                 leases: Leases, lease_ms: int, make_core: Callable[[], Core],
                 clock: Clock, metrics: Metrics, max_parked_requests: int = 0,
                 max_parked_per_token: int = 0) -> None:
        # A write still running after a lease is of no use: every partition in it has
        # run out by then (the caller's reply was refused).
        self.writer = SharedWriter(writer_store, timeout_s=lease_ms / 1000)
        self._reader = reader_store
        self._read_lock = asyncio.Lock()
        self.leases = leases
        # A renewal answered after the lease is useless: give up on a statement sooner.
        leases.timeout_s = max(0.5, lease_ms / 1000 / 2)
        self.partition_count = leases.partitions
        self.coordinator_id = leases.coordinator_id
        self.url = leases.advertised_url
        self.lease_ms = lease_ms
        #: a coordinator is live while seen within this (it is seen every round, a
        #: fifth of a lease): half a lease, so a dead one stops counting before its
        #: leases run out, and the survivors' shares already include its partitions
        #: when they become free (a failover costs the lease, not a lease and a round).
        self.live_window_ms = lease_ms // 2
        self._make_core = make_core
        self.clock = clock
        self.metrics = metrics
        self.max_parked_requests = max_parked_requests
        self.max_parked_per_token = max_parked_per_token
        #: owned partitions (loading, serving or leaving).
        self.partitions: dict[int, Partition] = {}
        #: every lease as last read, and the live coordinators.
        self.lease_rows: dict[int, LeaseRow] = {}
        self.coordinators: list[CoordinatorRow] = []
        self.catalog: dict[str, int] = {}
        #: the weights and zones of the catalog's sets that have them.
        self.placement: dict[str, Placement] = {}
        self.resources_epoch = 0
        #: True once registered and the first round ran; False from stop on.
        self.ready = False
        self._stopping = False
        self._wake = asyncio.Event()
        #: releases after a drop, kept referenced until done.
        self._background: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[Any] | None = None
        #: fires when the earliest owned lease runs out, whatever the loop is doing.
        self._expiry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ reads

    async def read(self, fn: Callable[[PostgresStorage], Any]) -> Any:
        """A read on the reader connection (loads, admin reads), one at a time, given
        up after :data:`READ_TIMEOUT_S` (the connection is then made again)."""
        async with self._read_lock:
            try:
                return await asyncio.wait_for(fn(self._reader), READ_TIMEOUT_S)
            except TimeoutError:
                self._reader.drop_connection()
                raise StorageError(f"database {self._reader.path}: a read took over "
                                   f"{READ_TIMEOUT_S:.0f}s; gave up") from None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Register, read the catalog and run the first round (acquiring this
        coordinator's share of what is free)."""
        await self.leases.register()
        state: CatalogState = await self.read(lambda store: store.catalog_state())
        self.catalog, self.placement, self.resources_epoch = state
        await self._round()
        # Ready once the first share is loaded (a restarted coordinator serves its
        # groups from the first answer on).
        loading = [p.loader for p in self.partitions.values() if p.loader is not None]
        await asyncio.gather(*loading, return_exceptions=True)
        self.ready = True
        self.metrics.ready.set(1)

    async def run(self) -> None:
        """The lease loop, until :meth:`stop`."""
        self._runner = asyncio.current_task()
        tick = self.lease_ms / TICKS_PER_LEASE / 1000
        while not self._stopping:
            delay = min(tick, self._next_expiry_wait())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if self._stopping:
                break
            try:
                await self._round()
            except StorageError as exc:
                # The database is unreachable: leases are not renewed and run out by
                # the monotonic clock (route() and the stores drop them); keep trying.
                log.warning("lease round failed (partitions are kept only until their "
                            "leases run out): %s", exc)
            self._expire(time.monotonic())

    async def stop(self) -> None:
        """SIGTERM: hand every partition off (writes finished, then the lease
        released), then leave the list of coordinators."""
        self._stopping = True
        self.ready = False
        self.metrics.ready.set(0)
        self._wake.set()
        if self._expiry is not None:
            self._expiry.cancel()
        # The loop may be in the middle of a round (acquiring, say): end it first, so
        # that every partition it could still take is in the list handed off below.
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task() and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        handed = sorted(self.partitions)
        for number in handed:
            await self._hand_off(number)
        if handed:
            log.info("handed off %d partition(s) (%s)", len(handed), number_ranges(handed))
        with contextlib.suppress(StorageError):
            await self.leases.deregister()

    def _next_expiry_wait(self) -> float:
        """Seconds until a lease this coordinator waits for may be taken: one held by a
        coordinator that is no longer live (its owner died), a little after it runs
        out, so a failover is not late by up to a tick."""
        live = {c.id for c in self.coordinators} | {self.coordinator_id}
        waits = [row.expires_in_ms / 1000 + 0.02 for row in self.lease_rows.values()
                 if row.held and row.owner_id not in live]
        return max(0.0, min(waits)) if waits else float("inf")

    # ------------------------------------------------------------ one round

    async def _round(self) -> None:
        await self._renew()
        await self.leases.heartbeat()
        self.coordinators = await self.leases.live_coordinators(self.live_window_ms)
        rows = await self.leases.leases()
        self.lease_rows = {row.partition: row for row in rows}
        # A lease the database still gives this coordinator for a partition it dropped
        # is not its share: it is being released (or runs out) and then acquired again.
        owners = {row.partition: str(row.owner_id) for row in rows
                  if row.held and row.owner_id is not None
                  and (row.owner_id != self.coordinator_id or row.partition in self.partitions)}
        if self._stopping:
            return
        plan = balance(self.coordinator_id, [c.id for c in self.coordinators], owners,
                       self.partition_count)
        handed = []
        for number in plan.release:
            if number in self.partitions and self.partitions[number].runtime is not None:
                await self._hand_off(number)
                handed.append(number)
        if handed:
            log.info("handed off %d partition(s) (%s) to share them with the other "
                     "coordinators", len(handed), number_ranges(handed))
        started = time.monotonic()
        acquired = []
        for number in plan.acquire:
            try:
                if await self._acquire(number):
                    acquired.append(number)
            except StorageError as exc:
                # Held up (a lock of a paused coordinator's write) or failed: the
                # next round tries again; the others are still worth trying now.
                log.info("partition %d: not acquired this round: %s", number, exc)
        if acquired and self.ready:
            # One line for the round once its partitions are loaded (the first
            # round's are in the "ready" line of the start instead).
            task = asyncio.get_running_loop().create_task(self._report_loaded(acquired, started))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        await self._adopt_catalog()

    async def _report_loaded(self, numbers: list[int], started: float) -> None:
        """One INFO line once the partitions a round acquired are loaded."""
        loaders = []
        for number in numbers:
            partition = self.partitions.get(number)
            if partition is not None and partition.loader is not None:
                loaders.append(partition.loader)
        await asyncio.gather(*loaders, return_exceptions=True)
        serving, groups = [], 0
        for number in numbers:
            partition = self.partitions.get(number)
            if partition is not None and partition.runtime is not None:
                serving.append(number)
                groups += len(partition.runtime.core.list_groups())
        log.info("acquired %d partition(s) (%s): %d group(s) loaded in %.0f ms", len(serving),
                 number_ranges(serving) or "none", groups, (time.monotonic() - started) * 1000)

    async def _renew(self) -> None:
        held = {n: p.lease.epoch for n, p in self.partitions.items() if not p.leaving}
        if not held:
            return
        sent_at = time.monotonic()
        renewed = await self.leases.renew(held, self.lease_ms)
        for number in held:
            partition = self.partitions.get(number)
            if partition is None or partition.leaving:
                continue
            if number in renewed:
                partition.lease = partition.lease.renewed(sent_at)
            else:
                self._drop(number, "its lease was not renewed (another coordinator took it "
                                   "over, or it ran out)")
        self._arm_expiry()

    async def _acquire(self, number: int) -> bool:
        """Take partition ``number`` and start loading it; ``False`` when another
        coordinator took it meanwhile (or this one has it already)."""
        if number in self.partitions:
            return False
        sent_at = time.monotonic()
        epoch = await self.leases.acquire(number, self.lease_ms)
        if epoch is None:
            return False  # taken by another coordinator meanwhile
        partition = Partition(number, LocalLease.granted(number, epoch, self.lease_ms, sent_at))
        self.partitions[number] = partition
        self._arm_expiry()
        log.debug("partition %d: acquired at epoch %d; loading", number, epoch)
        partition.tasks.append(asyncio.get_running_loop().create_task(self._load(partition)))
        return True

    async def _load(self, partition: Partition) -> None:
        runtime = Runtime(self._make_core(), PartitionStore(self, partition), self.clock,
                          self.metrics, max_parked_requests=self.max_parked_requests,
                          max_parked_per_token=self.max_parked_per_token,
                          partition=partition.number)
        started = time.monotonic()
        try:
            await runtime.start()
        except Exception as exc:
            log.error("partition %d: load failed, releasing it: %s", partition.number, exc)
            self._drop(partition.number, "its load failed")
            if self._stopping:  # _drop releases it otherwise
                await self._release(partition)
            return
        if partition.leaving or self.partitions.get(partition.number) is not partition:
            await runtime.stop(ErrorCode.NOT_COORDINATOR)
            return
        runtime.submit(self._adoption())
        partition.runtime = runtime
        partition.tasks.append(asyncio.get_running_loop().create_task(
            self._watch(partition, runtime)))
        log.debug("partition %d: serving (epoch %d), loaded in %.0f ms", partition.number,
                 partition.lease.epoch, (time.monotonic() - started) * 1000)

    async def _watch(self, partition: Partition, runtime: Runtime) -> None:
        """A failed write or check of the partition's runtime drops the partition."""
        await runtime.failed.wait()
        if self.partitions.get(partition.number) is partition:
            self._drop(partition.number, "a write or check failed (see above)")

    async def _hand_off(self, number: int) -> None:
        """An orderly hand-off: stop routing calls to it, let the runtime finish its
        writes (parked calls answered ``NOT_COORDINATOR``), then release the lease."""
        partition = self.partitions.get(number)
        if partition is None or partition.leaving:
            return
        partition.leaving = True
        if partition.runtime is not None:
            await partition.runtime.stop(ErrorCode.NOT_COORDINATOR)
        self._forget(partition)
        await self._release(partition)
        log.debug("partition %d: handed off (epoch %d)", number, partition.lease.epoch)

    async def _release(self, partition: Partition) -> None:
        """Free the lease if the database still has it at this epoch (a no-op once
        another coordinator took it: the statement checks owner and epoch)."""
        with contextlib.suppress(StorageError):
            await self.leases.release(partition.number, partition.lease.epoch)

    def _drop(self, number: int, why: str) -> None:
        """Stop serving a partition at once (lost, expired, failed); nothing waits."""
        partition = self.partitions.get(number)
        if partition is None:
            return
        partition.leaving = True
        if partition.runtime is not None:
            partition.runtime.abandon()
        self._forget(partition)
        log.warning("partition %d: dropped (epoch %d): %s", number, partition.lease.epoch, why)
        # If the database still has the lease (a write failed while it was reachable,
        # or came back), free it now so that it is acquired again (and reloaded) at
        # the next round rather than after it runs out.
        if not self._stopping:
            task = asyncio.get_running_loop().create_task(self._release(partition))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _forget(self, partition: Partition) -> None:
        if self.partitions.get(partition.number) is partition:
            del self.partitions[partition.number]
        current = asyncio.current_task()
        for task in partition.tasks:
            if task is not current:
                task.cancel()

    def _expire(self, now: float) -> None:
        for number, partition in list(self.partitions.items()):
            if not partition.lease.valid(now):
                self._drop(number, "its lease ran out by this coordinator's clock")
        self._arm_expiry()

    def _arm_expiry(self) -> None:
        """A timer at the earliest ``valid_until`` of the owned leases, so a partition
        is dropped (its parked calls answered, its timers stopped) the moment its lease
        may have run out, even while the loop waits on the database. The event loop's
        clock is the monotonic one the leases are counted on."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.partitions and not self._stopping:
            earliest = min(p.lease.valid_until for p in self.partitions.values())
            self._expiry = asyncio.get_running_loop().call_at(
                earliest, lambda: self._expire(time.monotonic()))

    # ------------------------------------------------------------ catalog

    async def _adopt_catalog(self) -> None:
        # Only the epoch is read unless it moved.
        epoch = self.resources_epoch
        state = await self.read(lambda store: store.catalog_since(epoch))
        if state is not None:
            self.adopt_catalog(state)

    def adopt_catalog(self, state: CatalogState) -> None:
        """Take the shared catalog if newer and give it to every serving partition."""
        if state.epoch <= self.resources_epoch:
            return
        self.catalog, self.placement = dict(state.catalog), dict(state.placement)
        self.resources_epoch = state.epoch
        command = self._adoption()
        for partition in self.partitions.values():
            if partition.runtime is not None:
                partition.runtime.submit(command)

    def _adoption(self) -> AdoptCatalog:
        """The catalog held here, as the command a partition's core takes it by."""
        return AdoptCatalog(tuple(sorted(self.catalog.items())), self.resources_epoch,
                            tuple(sorted(self.placement.items())))

    # ------------------------------------------------------------ routing

    def partition_of(self, group_id: str) -> int:
        return partition_of(group_id, self.partition_count)

    def route(self, group_id: str) -> Runtime | NotCoordinatorAnswer:
        """The runtime serving ``group_id`` here, or the answer that sends the caller on.

        The lease is checked by the monotonic clock on every call: an owner stops
        answering as soon as its lease may have run out (docs/protocol.md,
        "Several coordinators sharing groups").
        """
        number = self.partition_of(group_id)
        partition = self.partitions.get(number)
        if partition is None or partition.leaving:
            return NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, self._owner_url(number))
        if not partition.lease.valid(time.monotonic()):
            self._drop(number, "its lease ran out by this coordinator's clock")
            return NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, "")
        runtime = partition.runtime
        if runtime is None or not runtime.ready:
            return NotCoordinatorAnswer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "")
        return runtime

    def serving(self) -> list[Runtime]:
        """The runtimes of the partitions served now."""
        return [p.runtime for p in self.partitions.values()
                if p.runtime is not None and not p.leaving and p.runtime.ready]

    def _other_owner(self, number: int) -> LeaseRow | None:
        """The partition's lease as last read, if another coordinator holds it.

        Both the protocol URL (find_coordinator, ``NOT_COORDINATOR``) and the admin
        URL (forwarded admin calls) of the owner come from this one row: whether the
        owner is live (seen within ``live_window_ms``) does not matter, its lease
        does (an owner whose round runs late still holds it)."""
        row = self.lease_rows.get(number)
        if row is None or not row.held or row.owner_id == self.coordinator_id:
            return None
        return row

    def _owner_url(self, number: int) -> str:
        row = self._other_owner(number)
        return (row.owner_url or "") if row is not None else ""

    def find_coordinator(self, group_id: str) -> FindCoordinatorResponse:
        number = self.partition_of(group_id)
        partition = self.partitions.get(number)
        if partition is not None and not partition.leaving:
            return FindCoordinatorResponse(None, self.url, number)
        url = self._owner_url(number)
        if not url:
            return FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, "", number)
        return FindCoordinatorResponse(None, url, number)

    def admin_url_of_owner(self, group_id: str) -> str | None:
        """The admin URL of the coordinator holding ``group_id``'s partition's lease,
        if another one does (where admin calls about the group are forwarded)."""
        row = self._other_owner(self.partition_of(group_id))
        return row.owner_admin_url if row is not None else None
