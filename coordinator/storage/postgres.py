"""The coordinator's durable state in PostgreSQL, through asyncpg.

The same storage seam as :class:`coordinator.storage.sqlite.Storage`
(``open``, ``load``, ``write`` in one transaction returning its seconds,
``journal``, ``generations``, ``close``, a schema version that refuses a
newer database) and the same bytes in the same tables (the record encodings
are imported from the SQLite store, see ``pg_schema.py``), plus what several
coordinators sharing one database need:

- every group-owned row carries its ``partition``, ``crc32(utf-8 group_id) %
  P`` (:func:`partition_of`), and :meth:`PostgresStorage.load_partition`
  loads one partition's groups, checkpoints and commit times (with the
  global catalog and resources epoch, which every partition's core needs);
- ``P`` is fixed when the database is created (``meta.partitions``); opening
  it with another ``partitions`` is refused;
- :meth:`PostgresStorage.write` takes ``fence={partition: epoch}``: in the
  same transaction as the records, the lease rows of those partitions are
  read ``FOR SHARE`` and the write fails with :class:`FencedError` unless
  this coordinator holds each of them at that epoch. ``FOR SHARE`` conflicts
  with the ``UPDATE`` that moves a lease to another owner, so a takeover
  either commits before the write (the write sees the new epoch and fails) or
  waits for it (the new owner's load then sees the write). Leases themselves
  are in :mod:`coordinator.storage.leases`.

Durability: a transaction is durable when ``COMMIT`` returns, as PostgreSQL's
``synchronous_commit`` (default ``on``; ``remote_apply``/``on`` with a
synchronous standby) makes it; the runtime replies after :meth:`write`
returned, as with SQLite.

asyncpg is imported lazily, on the first connection: ``groupcoord serve`` on
SQLite must start where asyncpg is not installed. The password of the URL
never appears in an error message or ``repr`` (:mod:`coordinator.storage.pgurl`).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from coordinator import offload
from coordinator.core.records import (
    CatalogChanged,
    Record,
    Snapshot,
)
from coordinator.core.views import GroupSummary
from coordinator.storage import pgurl
from coordinator.storage.pg_schema import (
    ADVISORY_LOCK,
    COLUMNS,
    MIGRATIONS,
    PARTITIONS_KEY,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
)

# The record encodings, statements and row decoders are the SQLite store's, so both
# stores hold and accept the same bytes.
from coordinator.storage.sqlite import (
    GENERATION_COLUMNS,
    JOURNAL_COLUMNS,
    RESOURCES_EPOCH_KEY,
    CorruptDatabaseError,
    RecordError,
    Statement,
    StorageError,
    batch_rows,
    check_columns,
    decode_catalog_row,
    decode_members,
    decode_snapshot,
    decoded,
    generation_row,
    journal_row,
    record_rows,
    record_statements,
)
from coordinator.storage.tables import (
    CATALOG,
    GENERATIONS,
    JOURNAL,
    POSTGRES,
    SNAPSHOT_TABLES,
    Statements,
    Table,
    select,
)
from protocol.catalog import DEFAULT_PLACEMENT, Placement, Weights, Zones, put_placement

#: ``--partitions`` when the database is created and none is given (docs/protocol.md,
#: "Several coordinators sharing groups").
DEFAULT_PARTITIONS = 64
#: Partitions a database may have: each is a lease row renewed by its owner.
MAX_GROUP_PARTITIONS = 4096
#: Seconds to wait for a connection (every host of the URL) before giving up.
CONNECT_TIMEOUT_S = 10.0


def partition_of(group_id: str, partitions: int) -> int:
    """The partition of a group: zlib's crc32 of the utf-8 group id, modulo ``P``."""
    return zlib.crc32(group_id.encode("utf-8")) % partitions


class CatalogState(NamedTuple):
    """The shared catalog as one snapshot read it: set name -> partitions, the
    placement of the sets that have one, and the ``resources_epoch``."""

    catalog: dict[str, int]
    placement: dict[str, Placement]
    epoch: int


class FencedError(StorageError):
    """A fenced write found a partition's lease not held by this coordinator at its epoch.

    Nothing of the batch was written. The coordinator lost the partition (it
    was paused or cut off past its lease and another took it over): it must
    drop the partition's groups, not retry. ``partition`` is the first fenced
    partition found; ``owner``/``epoch`` are the lease's holder and epoch now.
    A subclass of :class:`StorageError`, so code that knows only that one still
    stops; catch this one first.
    """

    def __init__(self, database: str, partition: int, expected_epoch: int, me: str,
                 owner: str | None, epoch: int) -> None:
        self.partition = partition
        self.expected_epoch = expected_epoch
        self.owner = owner
        self.epoch = epoch
        super().__init__(
            f"database {database}: write fenced off: partition {partition} is not held by "
            f"{me!r} at epoch {expected_epoch} any more (held by "
            f"{'nobody' if owner is None else repr(owner)} at epoch {epoch}); nothing written")


# ---------------------------------------------------------------- the driver


def _driver() -> Any:
    """asyncpg, imported on first use (see the module's docstring)."""
    try:
        import asyncpg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise StorageError("a postgresql:// database needs the asyncpg package: "
                           "pip install 'asyncpg>=0.29'") from exc
    return asyncpg


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", "; ", text.strip())


def describe_error(exc: BaseException, url: str) -> str:
    """A driver exception as one line without the password: ``Type: message``."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
        text = f"{type(exc).__name__}: {text}"
    elif isinstance(exc, TimeoutError):
        text = "timed out"
    return pgurl.scrub(_one_line(text), url)


async def connect(url: str, *, timeout: float = CONNECT_TIMEOUT_S,
                  settings: Mapping[str, str] | None = None) -> Any:
    """An asyncpg connection to the primary named by ``url``.

    With several hosts (``postgresql://u@h1:5432,h2:5432/db``) the first that
    accepts writes is taken (``target_session_attrs=read-write`` unless the URL
    says otherwise), so after a failover the standby that was promoted is
    found. Any failure is one :class:`StorageError` line naming the hosts and
    database, never the password.
    """
    asyncpg = _driver()
    options: dict[str, Any] = {}
    if "target_session_attrs" not in url:
        options["target_session_attrs"] = "read-write"
    if settings:
        # Merged by asyncpg with any set in the URL's query string (these win).
        options["server_settings"] = dict(settings)
    try:
        return await asyncpg.connect(url, timeout=timeout, **options)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
            ValueError) as exc:
        raise StorageError(f"cannot connect to PostgreSQL at {pgurl.redact(url)}: "
                           f"{describe_error(exc, url)}") from None


def record_errors() -> tuple[type[BaseException], ...]:
    """What a statement raises for a value PostgreSQL (or the driver's encoder) will
    not take, as opposed to the database or the link failing."""
    exceptions = _driver().exceptions
    # The driver's own "invalid input for query argument" is a ValueError.
    return (exceptions.DataError, exceptions.IntegrityConstraintViolationError,
            ValueError, OverflowError)


def database_errors() -> tuple[type[BaseException], ...]:
    """What a statement may raise when the database or the link to it fails."""
    asyncpg = _driver()
    return (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


# ---------------------------------------------------------------- statements

SQL = Statements.of(POSTGRES)

# Lease rows of a fenced write, locked against a change of owner until COMMIT.
_FENCE = """
SELECT partition, owner_id, epoch FROM partition_leases
WHERE partition = ANY($1::integer[]) ORDER BY partition FOR SHARE
"""



def record_partition(record: Record, partitions: int) -> int | None:
    """The partition a record belongs to; ``None`` for the global catalog."""
    if isinstance(record, CatalogChanged):
        return None
    return partition_of(record.group_id, partitions)


def statements(record: Record, partitions: int) -> list[Statement]:
    """The SQL that makes one record durable (the SQLite store's, plus ``partition``)."""
    return record_rows(SQL, record_partition(record, partitions), record)


# ---------------------------------------------------------------- schema


async def _schema_version(conn: Any, name: str) -> int:
    if await conn.fetchval("SELECT to_regclass('meta') IS NULL"):
        return 0
    value = await conn.fetchval("SELECT value FROM meta WHERE key = $1", SCHEMA_VERSION_KEY)
    if value is None:
        raise CorruptDatabaseError(name, "meta", f"key={SCHEMA_VERSION_KEY!r}",
                                   "the row is missing (a table meta that groupcoord did not "
                                   "make, or a damaged database)")
    return int(value)


async def read_schema_version(conn: Any, name: str) -> int:
    """The schema version of the database ``conn`` is connected to, changing nothing.

    ``0`` when it has no ``meta`` table (not a groupcoord database, or an empty
    one). For tools that only read (``groupcoord journal export`` and
    ``analyze``): :meth:`PostgresStorage.open` would migrate such a database,
    creating groupcoord's tables in whatever database the URL named.
    """
    return await _schema_version(conn, name)


async def _migrate(conn: Any, name: str) -> None:
    """Apply the missing migrations, one transaction each, under the advisory lock."""
    while True:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK)
            version = await _schema_version(conn, name)
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"database {name} has schema version {version}, but this groupcoord "
                    f"knows versions up to {SCHEMA_VERSION}: it was written by a newer "
                    f"groupcoord; refusing to open it (never downgraded)")
            if version == SCHEMA_VERSION:
                return
            await conn.execute(MIGRATIONS[version])
            await conn.execute(SQL.set_meta, SCHEMA_VERSION_KEY, version + 1)


async def _check_tables(conn: Any, name: str) -> None:
    """Every table and column of the current schema is there (a dropped table, say)."""
    rows = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ANY($1::text[])",
        list(COLUMNS))
    present: dict[str, set[str]] = {}
    for row in rows:
        present.setdefault(row[0], set()).add(row[1])
    check_columns(name, COLUMNS, present, SCHEMA_VERSION)


async def _fix_partitions(conn: Any, name: str, wanted: int | None) -> int:
    """``P`` of the database: set (with its lease rows) at creation, checked after."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK)
        stored = await conn.fetchval("SELECT value FROM meta WHERE key = $1", PARTITIONS_KEY)
        if stored is None:
            count = wanted or DEFAULT_PARTITIONS
            await conn.execute(SQL.set_meta, PARTITIONS_KEY, count)
            await conn.execute(
                "INSERT INTO partition_leases (partition) SELECT generate_series(0, $1::int - 1)",
                count)
            return count
    if not 1 <= stored <= MAX_GROUP_PARTITIONS:
        raise CorruptDatabaseError(name, "meta", f"key={PARTITIONS_KEY!r}",
                                   f"column value: {stored} is outside 1..{MAX_GROUP_PARTITIONS}")
    if wanted is not None and wanted != stored:
        raise StorageError(
            f"database {name} was created with {stored} partitions; it cannot be opened with "
            f"{wanted} (the partitions of a database are fixed when it is created)")
    count, low, high = await conn.fetchrow(
        "SELECT count(*), min(partition), max(partition) FROM partition_leases")
    if (count, low, high) != (stored, 0, stored - 1):
        raise CorruptDatabaseError(
            name, "partition_leases", "",
            f"expected one row for each partition 0..{stored - 1}, found {count} rows "
            f"(partitions {low}..{high})")
    return int(stored)


# ---------------------------------------------------------------- the store


class PostgresStorage:
    """One coordinator's connection to the shared database.

    Not safe for concurrent :meth:`write` calls (the runtime has at most one
    in flight); leases renew on their own connection
    (:class:`coordinator.storage.leases.Leases`) so a long write never delays
    a renewal. A connection lost (PostgreSQL restarted, failed over) is made
    again at the next call; the call that saw it lost fails.
    """

    def __init__(self, conn: Any, url: str, partitions: int,
                 coordinator_id: str | None, settings: Mapping[str, str] | None = None
                 ) -> None:
        self._conn = conn
        self._url = url
        self._settings = dict(settings or {})
        #: the URL without its password: for every message that names the database.
        self.path = pgurl.redact(url)
        self.partitions = partitions
        self.coordinator_id = coordinator_id

    def __repr__(self) -> str:
        return f"PostgresStorage({self.path!r}, partitions={self.partitions})"

    @classmethod
    async def open(cls, url: str, *, partitions: int | None = None,
                   coordinator_id: str | None = None,
                   connect_timeout: float = CONNECT_TIMEOUT_S,
                   settings: Mapping[str, str] | None = None) -> PostgresStorage:
        """Connect, migrate to :data:`SCHEMA_VERSION`, and fix or check ``P``.

        ``partitions`` is used when the database is new (default
        :data:`DEFAULT_PARTITIONS`) and must match it otherwise; ``None``
        accepts what the database has (tools that only read).
        ``coordinator_id`` is needed for fenced writes. Refusals, each one
        :class:`StorageError` line naming the database without its password:
        no connection, a newer schema, other partitions, a missing table or
        column (:class:`CorruptDatabaseError`).
        """
        name = pgurl.redact(url)
        if partitions is not None and not 1 <= partitions <= MAX_GROUP_PARTITIONS:
            raise StorageError(f"partitions must be 1..{MAX_GROUP_PARTITIONS}, "
                               f"got {partitions}")
        conn = await connect(url, timeout=connect_timeout, settings=settings)
        try:
            await _migrate(conn, name)
            await _check_tables(conn, name)
            count = await _fix_partitions(conn, name, partitions)
        except StorageError:
            await conn.close()
            raise
        except database_errors() as exc:
            await conn.close()
            raise StorageError(f"database {name}: cannot use it: "
                               f"{describe_error(exc, url)}") from None
        except BaseException:
            await conn.close()
            raise
        return cls(conn, url, count, coordinator_id, settings)

    async def close(self) -> None:
        await self._conn.close()

    def drop_connection(self) -> None:
        """Close the connection at once, whatever it is doing (a statement given up):
        the next call makes a new one."""
        self._conn.terminate()

    async def _connection(self) -> Any:
        if self._conn.is_closed():
            self._conn = await connect(self._url, settings=self._settings)
        return self._conn

    async def schema_version(self) -> int:
        try:
            return await _schema_version(await self._connection(), self.path)
        except database_errors() as exc:
            raise StorageError(f"database {self.path}: cannot read the schema version: "
                               f"{describe_error(exc, self._url)}") from None

    async def _fetch(self, what: str, sql: str, *args: Any) -> list[Any]:
        """Rows of a query for tools; a failure is one :class:`StorageError` line."""
        try:
            return list(await (await self._connection()).fetch(sql, *args))
        except database_errors() as exc:
            raise StorageError(f"database {self.path}: cannot read {what}: "
                               f"{describe_error(exc, self._url)}") from None

    # ------------------------------------------------------------ loading

    async def load(self) -> Snapshot:
        """Everything durable, every partition (a one-coordinator server, tools)."""
        return await self._load(None)

    async def load_partition(self, partition: int) -> Snapshot:
        """One partition's groups, checkpoints and commit times, for a takeover.

        The catalog and resources epoch are global: they come with every
        partition's snapshot (each partition's core serves resource-aware
        assignors from them; the catalog is small).
        """
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is outside 0..{self.partitions - 1}")
        return await self._load(partition)

    async def load_group(self, group_id: str) -> Snapshot:
        """One group's durable state, with the catalog (a partition's runtime reloads
        a group from it when memory may be ahead of the database for that group)."""
        return await self._load(partition_of(group_id, self.partitions), group_id)

    async def _load(self, partition: int | None, group_id: str | None = None) -> Snapshot:
        """Every row checked as decoded; the first bad one raises, naming table and row.
        With ``group_id``, that group's rows only (of its ``partition``)."""
        return decode_snapshot(self.path, {table.name: await self._rows(table, partition,
                                                                        group_id)
                                           for table in SNAPSHOT_TABLES})

    async def _rows(self, table: Table, partition: int | None, group_id: str | None = None
                    ) -> list[tuple[Any, ...]]:
        """Rows of one table by key (of one partition, of one group, for a group's
        tables); group rows' ``partition`` is checked."""
        grouped = table.partitioned
        by: tuple[str, ...] = ()
        if partition is not None and grouped:
            by = ("partition",) if group_id is None else ("partition", "group_id")
        sql = select(POSTGRES, table, table.common + (("partition",) if grouped else ()),
                     by=by)
        args = (partition, group_id)[:len(by)]
        try:
            rows = await (await self._connection()).fetch(sql, *args)
        except database_errors() as exc:
            problem = f"cannot read it: {describe_error(exc, self._url)}"
            exceptions = _driver().exceptions
            if isinstance(exc, exceptions.SyntaxOrAccessError | exceptions.InternalServerError):
                # A table or column gone, or PostgreSQL's "data corrupted" class (XX):
                # the database itself must be fixed.
                raise CorruptDatabaseError(self.path, table.name, "", problem) from None
            # The link or the server failed (not the data): a restart may cure it.
            raise StorageError(f"database {self.path}: table {table.name}: {problem}") from None
        out = []
        for record in rows:
            row = tuple(record)
            if grouped:
                *row_values, stored = row
                group = row[0]
                if isinstance(group, str):
                    actual = partition_of(group, self.partitions)
                    if stored != actual:
                        raise CorruptDatabaseError(
                            self.path, table.name, f"group_id={group!r}",
                            f"column partition: {stored}, but the group maps to partition "
                            f"{actual} of {self.partitions}")
                row = tuple(row_values)
            out.append(row)
        return out

    # ------------------------------------------------------------ writing

    async def write(self, records: Sequence[Record], *,
                    fence: Mapping[int, int] | None = None,
                    timeout: float | None = None) -> float:
        """Make ``records`` durable in one transaction; returns the seconds it took.

        With ``fence`` (``{partition: epoch}``), the write goes through only if
        this coordinator holds every one of those partitions' leases at that
        epoch, checked in the same transaction; else :class:`FencedError` and
        nothing is written. Every group record must then be of a fenced
        partition (:class:`ValueError` otherwise, before anything is sent).
        On any other failure :class:`StorageError` is raised and the batch is not
        acknowledged: the transaction is rolled back, unless the connection broke
        after its ``COMMIT`` was sent (then it may be in the database). With
        ``timeout`` (seconds), a write that takes longer (a database cut off
        without a reset) is given up: the connection is dropped (the next call makes
        a new one) and :class:`StorageError` raised, the outcome as for a broken
        connection.
        """
        def encoded() -> list[Statement]:
            return record_statements(self.path, records,
                                     lambda record: statements(record, self.partitions))

        # A large batch is encoded off the event loop (coordinator.offload).
        batch = (await offload.run(encoded)
                 if batch_rows(records) >= offload.LARGE_BATCH_ROWS else encoded())
        if fence is not None:
            self._check_fence_covers(records, fence)
        started = time.perf_counter()
        conn = None
        try:
            conn = await self._connection()
            await asyncio.wait_for(self._transaction(conn, batch, fence), timeout)
        except StorageError:
            raise
        except TimeoutError:
            if conn is not None:
                conn.terminate()
            raise StorageError(f"write to {self.path} took over {timeout}s: given up, "
                               f"connection dropped") from None
        except record_errors() as exc:
            # PostgreSQL refused a value (classes 22 and 23: out of range, not in the
            # encoding, a constraint), or the driver could not encode one: one
            # record's doing, not the database's; rolled back.
            raise RecordError(self.path, None, describe_error(exc, self._url)) from None
        except database_errors() as exc:
            raise StorageError(f"write to {self.path} failed: "
                               f"{describe_error(exc, self._url)}") from None
        return time.perf_counter() - started

    async def _transaction(self, conn: Any, batch: list[Statement],
                           fence: Mapping[int, int] | None) -> None:
        async with conn.transaction():
            if fence:
                await self._check_fence(conn, fence)
            for sql, run in itertools.groupby(batch, key=lambda s: s[0]):
                rows = [params for _, params in run]
                if len(rows) == 1:
                    await conn.execute(sql, *rows[0])
                else:
                    await conn.executemany(sql, rows)

    def _check_fence_covers(self, records: Sequence[Record], fence: Mapping[int, int]) -> None:
        if self.coordinator_id is None:
            raise ValueError("a fenced write needs the store opened with a coordinator_id")
        for record in records:
            if isinstance(record, CatalogChanged):
                continue  # global, not a partition's
            p = partition_of(record.group_id, self.partitions)
            if p not in fence:
                raise ValueError(f"record of group {record.group_id!r} (partition {p}) "
                                 f"is not covered by the fence {dict(fence)}")

    async def _check_fence(self, conn: Any, fence: Mapping[int, int]) -> None:
        rows = {row[0]: (row[1], row[2]) for row in await conn.fetch(_FENCE, sorted(fence))}
        for partition in sorted(fence):
            owner, epoch = rows.get(partition, (None, -1))
            if owner != self.coordinator_id or epoch != fence[partition]:
                raise FencedError(self.path, partition, fence[partition],
                                  str(self.coordinator_id), owner, epoch)

    # ------------------------------------------------------------ reading for tools

    async def journal(self, group_id: str | None = None) -> list[dict[str, Any]]:
        """Rows of the rebalance journal (oldest first), decoded, as the SQLite store's."""
        return await self._journal(group_id, newest_first=False, limit=None)

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        """The group's most recent journal rows, newest first (at most ``limit``)."""
        if limit < 0:
            raise ValueError(f"limit must be 0 or more, got {limit}")
        return await self._journal(group_id, newest_first=True, limit=limit)

    async def _journal(self, group_id: str | None, *, newest_first: bool,
                       limit: int | None) -> list[dict[str, Any]]:
        args: tuple[Any, ...] = (group_id,) if group_id is not None else ()
        sql = select(POSTGRES, JOURNAL, JOURNAL_COLUMNS, by=("group_id",)[:len(args)],
                     order="id DESC" if newest_first else "id", limit=limit is not None)
        if limit is not None:
            args += (limit,)
        return [journal_row(r) for r in await self._fetch("the rebalance journal", sql, *args)]

    # ------------------------------------------------------------ several coordinators

    async def catalog_state(self) -> CatalogState:
        """The shared catalog (each row checked as :meth:`load` checks it) and its
        ``resources_epoch``, read in one snapshot."""
        state = await self.catalog_since(-1)
        assert state is not None  # every epoch is past -1
        return state

    async def catalog_since(self, since: int) -> CatalogState | None:
        """:meth:`catalog_state`, or ``None`` when the epoch is not past ``since`` (the
        rows are then not read: a coordinator's round costs one small read)."""
        try:
            conn = await self._connection()
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                epoch = int(await conn.fetchval("SELECT value FROM meta WHERE key = $1",
                                                RESOURCES_EPOCH_KEY) or 0)
                if epoch <= since:
                    return None
                rows = await conn.fetch(select(POSTGRES, CATALOG, CATALOG.common))
        except database_errors() as exc:
            raise StorageError(f"database {self.path}: cannot read the catalog: "
                               f"{describe_error(exc, self._url)}") from None
        catalog: dict[str, int] = {}
        placement: dict[str, Placement] = {}
        for row in rows:
            name, count, placed = decoded(self.path, "catalog", f"name={row[0]!r}",
                                                decode_catalog_row, tuple(row))
            catalog[name] = count
            if not placed.is_default:
                placement[name] = placed
        return CatalogState(catalog, placement, epoch)

    async def change_catalog(self, name: str, partitions: int | None,
                             weights: Weights | None = None,
                             zones: Zones | None = None) -> tuple[int, bool]:
        """Put (``partitions``, with ``weights`` and ``zones``: ``None`` keeps the set's)
        or delete (``None``) one resource set of the shared catalog, bumping
        ``resources_epoch`` when it changes, in one transaction that holds the
        epoch's row: changes made through different coordinators are ordered by
        the database. Returns the epoch after it, and whether the set existed (for a
        delete; always True for a put). An unchanged put or the delete of an
        unknown set writes nothing. A put that would keep an override beyond the
        new size raises :class:`~protocol.validate.ValidationError`, writing nothing."""
        try:
            conn = await self._connection()
            async with conn.transaction():
                await conn.execute("INSERT INTO meta (key, value) VALUES ($1, 0) "
                                   "ON CONFLICT (key) DO NOTHING", RESOURCES_EPOCH_KEY)
                epoch = int(await conn.fetchval(
                    "SELECT value FROM meta WHERE key = $1 FOR UPDATE", RESOURCES_EPOCH_KEY))
                row = await conn.fetchrow(
                    select(POSTGRES, CATALOG, CATALOG.common, by=CATALOG.key), name)
                if partitions is None and row is None:
                    return epoch, False
                current: tuple[int, Placement] | None = None
                if row is not None:
                    _, count, placed = decoded(self.path, "catalog", f"name={name!r}",
                                                     decode_catalog_row, tuple(row))
                    current = count, placed
                placement = DEFAULT_PLACEMENT
                if partitions is not None:
                    placement = put_placement(DEFAULT_PLACEMENT if current is None
                                              else current[1], partitions, weights, zones)
                    if current == (partitions, placement):
                        return epoch, True
                for sql, args in statements(CatalogChanged(name, partitions, epoch + 1,
                                                           placement), self.partitions):
                    await conn.execute(sql, *args)
        except database_errors() as exc:
            raise StorageError(f"write to {self.path} failed: "
                               f"{describe_error(exc, self._url)}") from None
        return epoch + 1, True

    async def group_summaries(self, exclude: Sequence[int]) -> list[GroupSummary]:
        """Every group of the database outside the partitions ``exclude``, as its
        owner last wrote it (the admin list of a coordinator that does not own it)."""
        rows = await self._fetch(
            "groups", "SELECT group_id, state, protocol_type, protocol_name, generation_id, "
            "members FROM groups WHERE NOT (partition = ANY($1::integer[])) "
            "AND state <> 'Dead' ORDER BY group_id", list(exclude))
        out = []
        for r in rows:
            members = decoded(self.path, "groups", r[0], decode_members, r[5])
            out.append(GroupSummary(r[0], r[1], r[2], r[3], int(r[4]), len(members)))
        return out

    async def generations(self, group_id: str) -> list[dict[str, Any]]:
        """Rows of the ``generations`` table for one group, oldest first."""
        rows = await self._fetch("generations", select(
            POSTGRES, GENERATIONS, GENERATION_COLUMNS, by=("group_id",)), group_id)
        return [generation_row(r) for r in rows]
