"""One coordinator among several on PostgreSQL: partition leases, one runtime each.

docs/protocol.md, "Several coordinators sharing groups"; docs/operations.md,
"Running several coordinators". As Kafka's group coordinator runs one shard
per ``__consumer_offsets`` partition, a coordinator here runs one
:class:`~coordinator.runtime.runtime.Runtime` (with its own core, timers and
group commit) per partition it owns, and drops it whole when it stops owning
the partition. A partition's runtime is exactly a one-process server's,
restored from :meth:`PostgresStorage.load_partition`: a takeover resumes
groups as a restart does.

Every decision -- when to renew, which partitions to acquire or hand off
(:func:`~coordinator.storage.leases.balance`), when a partition is dropped --
is :class:`~coordinator.cluster.host_machine.HostMachine`'s (its module docs
give the round); :class:`PartitionHost` is its asyncio driver: it runs the
machine's statements on PostgreSQL (:class:`~coordinator.storage.leases.Leases`,
the reader connection), loads and stops the runtimes, keeps the expiry timer
and the loop (:meth:`PartitionHost.run`), and feeds every outcome back. The
simulator runs this very host (``tests/sim/cluster.py``) on an event loop whose
time is the simulated coordinator's clock (``monotonic``).

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
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.cluster import host_effects as hx
from coordinator.cluster.host_machine import TICKS_PER_LEASE, HostMachine, Partition
from coordinator.core.records import Record, Snapshot
from coordinator.metrics import Metrics
from coordinator.runtime.clock import Clock
from coordinator.runtime.runtime import Core, Runtime
from coordinator.storage.leases import CoordinatorRow, LeaseRow, Leases
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


class PartitionStore:
    """The storage seam of one partition's runtime: loads the partition, writes
    fenced by its epoch, and checks its lease by the monotonic clock."""

    def __init__(self, host: PartitionHost, partition: Partition[Runtime]) -> None:
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
        if not p.lease.valid(self._host.monotonic()):
            raise LeaseExpired(f"partition {p.number}: lease (epoch {p.lease.epoch}) ran out "
                               f"by this coordinator's clock")


# ---------------------------------------------------------------- the host


class PartitionHost:
    """This coordinator's partitions: the asyncio driver of a :class:`HostMachine`
    (every decision is the machine's; this runs its statements on PostgreSQL, its
    loads, hand-offs and timers, and feeds their outcomes back)."""

    def __init__(self, *, writer_store: PostgresStorage, reader_store: PostgresStorage,
                 leases: Leases, lease_ms: int, make_core: Callable[[], Core],
                 clock: Clock, metrics: Metrics, max_parked_requests: int = 0,
                 max_parked_per_token: int = 0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        # A write still running after a lease is of no use: every partition in it has
        # run out by then (the caller's reply was refused).
        self.writer = SharedWriter(writer_store, timeout_s=lease_ms / 1000)
        self._reader = reader_store
        self._read_lock = asyncio.Lock()
        self.leases = leases
        # A renewal answered after the lease is useless: give up on a statement sooner.
        leases.timeout_s = max(0.5, lease_ms / 1000 / 2)
        self.machine: HostMachine[Runtime] = HostMachine(
            leases.coordinator_id, leases.advertised_url, leases.partitions, lease_ms)
        self.partition_count = leases.partitions
        self.coordinator_id = leases.coordinator_id
        self.lease_ms = lease_ms
        self._make_core = make_core
        self.clock = clock
        #: the clock the leases count on, in seconds: the event loop's (whose
        #: ``call_at`` arms the expiry timer); ``time.monotonic`` in production.
        self.monotonic = monotonic
        self.metrics = metrics
        self.max_parked_requests = max_parked_requests
        self.max_parked_per_token = max_parked_per_token
        #: the request ids of every partition runtime this host starts, from one
        #: counter: an admin call's command is built, its id minted
        #: (:meth:`new_request_id`), before the service routes it by its group, and
        #: the id is then unique in whichever partition runtime runs it (one started
        #: since, too). Simpler than routing before minting: a catalog change runs on
        #: no runtime, and nothing is re-stamped.
        self._request_ids = itertools.count(1)
        #: True once registered and the first round ran; False from stop on.
        self.ready = False
        #: True from stop on: the loop ends.
        self._stopping = False
        self._wake = asyncio.Event()
        #: the load, then the watch of the runtime's failure, of each owned
        #: (partition, epoch).
        self._tasks: dict[tuple[int, int], list[asyncio.Task[Any]]] = {}
        #: releases after a drop, stops of discarded runtimes, load reports: kept
        #: referenced until done.
        self._background: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[Any] | None = None
        #: fires when the earliest owned lease runs out, whatever the loop is doing.
        self._expiry: asyncio.TimerHandle | None = None
        #: when the machine wants its next round (monotonic seconds).
        self._next_round = 0.0
        self._start_failure: str | None = None

    def new_request_id(self) -> int:
        """A request id unique within every partition runtime of this host."""
        return next(self._request_ids)

    # ------------------------------------------------------------ the machine's state

    @property
    def url(self) -> str:
        """The advertised URL (find_coordinator's answer for an owned partition)."""
        return self.machine.url

    @url.setter
    def url(self, url: str) -> None:
        self.machine.url = url

    @property
    def partitions(self) -> dict[int, Partition[Runtime]]:
        """Owned partitions (loading, serving or leaving)."""
        return self.machine.partitions

    @property
    def lease_rows(self) -> dict[int, LeaseRow]:
        """Every lease as last read."""
        return self.machine.lease_rows

    @property
    def coordinators(self) -> list[CoordinatorRow]:
        """The live coordinators as last read."""
        return self.machine.coordinators

    @property
    def catalog(self) -> dict[str, int]:
        return self.machine.catalog

    @property
    def placement(self) -> dict[str, Placement]:
        """The weights and zones of the catalog's sets that have them."""
        return self.machine.placement

    @property
    def resources_epoch(self) -> int:
        return self.machine.resources_epoch

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
        self.machine.start(self.monotonic())
        await self._drive()
        if self._start_failure is not None:
            raise StorageError(self._start_failure)
        # Ready once the first share is loaded (a restarted coordinator serves its
        # groups from the first answer on).
        await asyncio.gather(*self._loaders(self.partitions), return_exceptions=True)
        self.ready = True
        self.metrics.ready.set(1)

    async def run(self) -> None:
        """The lease loop, until :meth:`stop`."""
        self._runner = asyncio.current_task()
        while not self._stopping:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       max(0.0, self._next_round - self.monotonic()))
            if self._stopping:
                break
            await self._round()

    async def stop(self) -> None:
        """SIGTERM: hand every partition off (writes finished, then the lease
        released), then leave the list of coordinators."""
        self._stopping = True
        self.ready = False
        self.metrics.ready.set(0)
        self._wake.set()
        # The loop may be in the middle of a round (acquiring, say): end it first, so
        # that every partition it could still take is in the list handed off below.
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task() and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        self.machine.stop(self.monotonic())
        await self._drive()

    async def _round(self) -> None:
        """One round of the lease loop (the machine's module docs)."""
        self.machine.begin_round(self.monotonic())
        await self._drive()

    # ------------------------------------------------------------ carrying effects out

    async def _drive(self) -> None:
        """Carry out the machine's effects, running its steps one after the other
        until none is outstanding (the sequence is over)."""
        while True:
            self._perform()
            step = self.machine.step
            if step is None:
                return
            try:
                answer = await self._run(step)
            except StorageError as exc:
                self.machine.failed(self.monotonic(), step, str(exc))
            else:
                self.machine.done(self.monotonic(), step, answer)

    async def _run(self, step: hx.Step) -> Any:
        """One step: a statement on the lease connection or the reader, or a hand-off."""
        leases = self.leases
        if isinstance(step, hx.Renew):
            return await leases.renew(dict(step.held), self.lease_ms)
        if isinstance(step, hx.ReadCluster):
            await leases.heartbeat()
            coordinators = await leases.live_coordinators(step.live_window_ms)
            return coordinators, await leases.leases()
        if isinstance(step, hx.Acquire):
            return await leases.acquire(step.partition, step.lease_ms)
        if isinstance(step, hx.HandOff):
            if step.runtime is not None:
                await step.runtime.stop(ErrorCode.NOT_COORDINATOR)
            self._cancel_tasks(step.partition, step.epoch)
            log.debug("partition %d: handed off (epoch %d)", step.partition, step.epoch)
            return None
        if isinstance(step, hx.Release):
            return await leases.release(step.partition, step.epoch)
        if isinstance(step, hx.ReadCatalog):
            since = step.since
            if since is None:
                return await self.read(lambda store: store.catalog_state())
            return await self.read(lambda store: store.catalog_since(since))
        if isinstance(step, hx.Register):
            return await leases.register()
        if isinstance(step, hx.Deregister):
            return await leases.deregister()
        raise TypeError(f"unknown step {step!r}")

    def _perform(self) -> None:
        """The machine's effects other than its steps, at once."""
        for effect in self.machine.take():
            match effect:
                case hx.Load(partition=number, epoch=epoch):
                    self._tasks[number, epoch] = [asyncio.get_running_loop().create_task(
                        self._load(number, epoch))]
                case hx.Serve(partition=number, epoch=epoch, runtime=runtime,
                           adoption=adoption):
                    runtime.submit(adoption)
                    self._tasks.setdefault((number, epoch), []).append(
                        asyncio.get_running_loop().create_task(
                            self._watch(number, runtime)))
                    log.debug("partition %d: serving (epoch %d)", number, epoch)
                case hx.Discard(runtime=runtime):
                    self._spawn(runtime.stop(ErrorCode.NOT_COORDINATOR))
                case hx.Drop(partition=number, epoch=epoch, runtime=runtime, why=why):
                    if runtime is not None:
                        runtime.abandon()
                    self._cancel_tasks(number, epoch)
                    log.warning("partition %d: dropped (epoch %d): %s", number, epoch, why)
                case hx.FreeDropped(partition=number, epoch=epoch):
                    self._spawn(self._release(number, epoch))
                case hx.Adopt(runtimes=runtimes, command=command):
                    for runtime in runtimes:
                        runtime.submit(command)
                case hx.ArmExpiry(at=at):
                    # The event loop's clock is the monotonic one the leases count on.
                    self._disarm_expiry()
                    self._expiry = asyncio.get_running_loop().call_at(at, self._expire)
                case hx.DisarmExpiry():
                    self._disarm_expiry()
                case hx.NextRound(at=at):
                    self._next_round = at
                case hx.RoundFailed(why=why):
                    # The database is unreachable: leases are not renewed and run out
                    # by the monotonic clock (route() and the stores drop them).
                    log.warning("lease round failed (partitions are kept only until "
                                "their leases run out): %s", why)
                case hx.NotAcquired(partition=number, why=why):
                    log.info("partition %d: not acquired this round: %s", number, why)
                case hx.SharedOut(partitions=numbers):
                    log.info("handed off %d partition(s) (%s) to share them with the other "
                             "coordinators", len(numbers), number_ranges(numbers))
                case hx.RoundAcquired(partitions=numbers, started=started):
                    # One line for the round once its partitions are loaded (the first
                    # round's are in the "ready" line of the start instead).
                    if self.ready:
                        self._spawn(self._report_loaded(numbers, started))
                case hx.StartFailed(why=why):
                    self._start_failure = why
                case hx.Stopped(handed=numbers):
                    if numbers:
                        log.info("handed off %d partition(s) (%s)", len(numbers),
                                 number_ranges(numbers))
                case _:
                    pass  # a step (run by _drive), Started

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cancel_tasks(self, number: int, epoch: int) -> None:
        current = asyncio.current_task()
        for task in self._tasks.pop((number, epoch), []):
            if task is not current:
                task.cancel()

    def _loaders(self, numbers: Iterable[int]) -> list[asyncio.Task[Any]]:
        loaders = []
        for number in numbers:
            partition = self.partitions.get(number)
            tasks = (self._tasks.get((number, partition.lease.epoch))
                     if partition is not None else None)
            if tasks:
                loaders.append(tasks[0])
        return loaders

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        self._expiry = None
        self.machine.expire(self.monotonic())
        self._perform()

    def _drop(self, number: int, why: str) -> None:
        """Stop serving a partition at once (its lease freed in the background)."""
        self.machine.drop(number, why)
        self._perform()

    async def _load(self, number: int, epoch: int) -> None:
        partition = self.partitions.get(number)
        assert partition is not None and partition.lease.epoch == epoch
        runtime = self._new_runtime(number, PartitionStore(self, partition))
        try:
            await runtime.start()
        except Exception as exc:
            log.error("partition %d: load failed, releasing it: %s", number, exc)
            self.machine.load_failed(self.monotonic(), number, epoch)
        else:
            self.machine.loaded(self.monotonic(), number, epoch, runtime)
        self._perform()

    def _new_runtime(self, number: int, store: PartitionStore) -> Runtime:
        """Partition ``number``'s runtime, not started (the simulator makes its own
        subclass here, to watch what the runtime does)."""
        return Runtime(self._make_core(), store, self.clock, self.metrics,
                       max_parked_requests=self.max_parked_requests,
                       max_parked_per_token=self.max_parked_per_token,
                       partition=number, request_ids=self._request_ids)

    async def _watch(self, number: int, runtime: Runtime) -> None:
        """A failed write or check of the partition's runtime drops the partition."""
        await runtime.failed.wait()
        self.machine.runtime_failed(self.monotonic(), number, runtime,
                                    "a write or check failed (see above)")
        self._perform()

    async def _release(self, number: int, epoch: int) -> None:
        """Free the lease if the database still has it at this epoch (a no-op once
        another coordinator took it: the statement checks owner and epoch)."""
        with contextlib.suppress(StorageError):
            await self.leases.release(number, epoch)

    async def _report_loaded(self, numbers: Sequence[int], started: float) -> None:
        """One INFO line once the partitions a round acquired are loaded."""
        await asyncio.gather(*self._loaders(numbers), return_exceptions=True)
        serving, groups = [], 0
        for number in numbers:
            partition = self.partitions.get(number)
            if partition is not None and partition.runtime is not None:
                serving.append(number)
                groups += len(partition.runtime.core.list_groups())
        log.info("acquired %d partition(s) (%s): %d group(s) loaded in %.0f ms", len(serving),
                 number_ranges(serving) or "none", groups, (self.monotonic() - started) * 1000)

    # ------------------------------------------------------------ catalog

    def adopt_catalog(self, state: CatalogState) -> None:
        """Take the shared catalog if newer and give it to every serving partition."""
        self.machine.adopt_catalog(state)
        self._perform()

    # ------------------------------------------------------------ routing

    def partition_of(self, group_id: str) -> int:
        return partition_of(group_id, self.partition_count)

    def route(self, group_id: str) -> Runtime | NotCoordinatorAnswer:
        """The runtime serving ``group_id`` here, or the answer that sends the caller on.

        The lease is checked by the monotonic clock on every call: an owner stops
        answering as soon as its lease may have run out (docs/protocol.md,
        "Several coordinators sharing groups").
        """
        target = self.machine.route(self.monotonic(), self.partition_of(group_id))
        self._perform()
        if isinstance(target, Runtime) and not target.ready:
            return NotCoordinatorAnswer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "")
        return target

    def serving(self) -> list[Runtime]:
        """The runtimes of the partitions served now."""
        return [runtime for runtime in self.machine.serving() if runtime.ready]

    def find_coordinator(self, group_id: str) -> FindCoordinatorResponse:
        return self.machine.find_coordinator(self.partition_of(group_id))

    def admin_url_of_owner(self, group_id: str) -> str | None:
        """The admin URL of the coordinator holding ``group_id``'s partition's lease,
        if another one does (where admin calls about the group are forwarded)."""
        row = self.machine.other_owner(self.partition_of(group_id))
        return row.owner_admin_url if row is not None else None
