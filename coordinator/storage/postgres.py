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
import json
import re
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple, TypeVar

from coordinator import offload
from coordinator.core.records import (
    CatalogChanged,
    CheckpointMeta,
    CheckpointsWritten,
    GroupDeleted,
    GroupOwner,
    GroupRecord,
    JournalEntry,
    Record,
    Snapshot,
)
from coordinator.core.views import GroupSummary
from coordinator.storage import pgurl
from coordinator.storage.pg_schema import (
    ADVISORY_LOCK,
    MIGRATIONS,
    PARTITIONS_KEY,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
)

# The record encodings and row decoders are the SQLite store's, so both stores
# hold and accept the same bytes.
from coordinator.storage.sqlite import (
    CATALOG_COLUMNS,
    RESOURCES_EPOCH_KEY,
    BadValue,
    CorruptDatabaseError,
    RecordError,
    StorageError,
    batch_rows,
    decode_catalog_row,
    decode_checkpoint_meta,
    decode_checkpoint_row,
    decode_epoch_row,
    decode_group_row,
    decode_last_commit_row,
    decode_members,
    decode_owner_row,
    decode_problem,
    encode_members,
    encode_placement,
    encode_value,
    member_triples,
    record_statements,
)
from protocol.catalog import DEFAULT_PLACEMENT, Placement, Weights, Zones, put_placement
from protocol.codec import DecodeError, decode, encode
from protocol.validate import Scalar

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

_UPSERT_GROUP = """
INSERT INTO groups (group_id, partition, state, generation_id, protocol_type, protocol_name,
                    leader, state_timestamp_ms, members)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (group_id) DO UPDATE SET
    partition = EXCLUDED.partition, state = EXCLUDED.state,
    generation_id = EXCLUDED.generation_id, protocol_type = EXCLUDED.protocol_type,
    protocol_name = EXCLUDED.protocol_name, leader = EXCLUDED.leader,
    state_timestamp_ms = EXCLUDED.state_timestamp_ms, members = EXCLUDED.members
"""

# As in SQLite: ``formed_ms`` keeps the time the generation formed.
_UPSERT_GENERATION = """
INSERT INTO generations (group_id, generation_id, partition, protocol_type, protocol_name,
                         leader, formed_ms, member_count, members, assignments)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (group_id, generation_id) DO UPDATE SET
    protocol_type = EXCLUDED.protocol_type, protocol_name = EXCLUDED.protocol_name,
    leader = EXCLUDED.leader, member_count = EXCLUDED.member_count,
    members = EXCLUDED.members,
    assignments = COALESCE(EXCLUDED.assignments, generations.assignments)
"""

_UPSERT_CHECKPOINT = """
INSERT INTO checkpoints (group_id, resource_set, idx, partition, value, committed_ms,
                         member_id, generation_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (group_id, resource_set, idx) DO UPDATE SET
    value = EXCLUDED.value, committed_ms = EXCLUDED.committed_ms,
    member_id = EXCLUDED.member_id, generation_id = EXCLUDED.generation_id
"""

_DELETE_CHECKPOINT = (
    "DELETE FROM checkpoints WHERE group_id = $1 AND resource_set = $2 AND idx = $3")

# The largest time wins: a wall-clock step back must not bring an expiry forward.
_UPSERT_LAST_COMMIT = """
INSERT INTO last_commits (group_id, partition, committed_ms) VALUES ($1, $2, $3)
ON CONFLICT (group_id) DO UPDATE SET
    committed_ms = GREATEST(last_commits.committed_ms, EXCLUDED.committed_ms)
"""

_INSERT_JOURNAL = """
INSERT INTO rebalance_journal (group_id, partition, generation_id, protocol_type,
                               protocol_name, leader, member_count, members, joined, "left",
                               reason, started_ms, ended_ms, assignments)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
"""

_SET_META = """
INSERT INTO meta (key, value) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
"""

_UPSERT_CATALOG = """
INSERT INTO catalog (name, partitions, weights, zones) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET partitions = EXCLUDED.partitions,
                                 weights = EXCLUDED.weights, zones = EXCLUDED.zones
"""

_GROUP_TABLES = ("groups", "generations", "checkpoints", "last_commits", "group_owners")

_UPSERT_OWNER = """
INSERT INTO group_owners (group_id, partition, owner) VALUES ($1, $2, $3)
ON CONFLICT (group_id) DO UPDATE SET owner = EXCLUDED.owner
"""

# Lease rows of a fenced write, locked against a change of owner until COMMIT.
_FENCE = """
SELECT partition, owner_id, epoch FROM partition_leases
WHERE partition = ANY($1::integer[]) ORDER BY partition FOR SHARE
"""

Statement = tuple[str, tuple[Any, ...]]


def record_partition(record: Record, partitions: int) -> int | None:
    """The partition a record belongs to; ``None`` for the global catalog."""
    if isinstance(record, CatalogChanged):
        return None
    return partition_of(record.group_id, partitions)


def statements(record: Record, partitions: int) -> list[Statement]:
    """The SQL that makes one record durable (the SQLite store's, plus ``partition``)."""
    match record:
        case GroupRecord():
            p = partition_of(record.group_id, partitions)
            out: list[Statement] = [(_UPSERT_GROUP, (
                record.group_id, p, record.state, record.generation_id, record.protocol_type,
                record.protocol_name, record.leader, record.state_timestamp_ms,
                encode_members(record.members)))]
            if record.members and record.generation_id > 0:
                assigned = all(m.assignment is not None for m in record.members)
                assignments = (encode({m.member_id: m.assignment for m in record.members})
                               if assigned else None)
                out.append((_UPSERT_GENERATION, (
                    record.group_id, record.generation_id, p, record.protocol_type,
                    record.protocol_name, record.leader, record.state_timestamp_ms,
                    len(record.members), member_triples(record.members), assignments)))
            return out
        case GroupDeleted():
            return [(f"DELETE FROM {table} WHERE group_id = $1", (record.group_id,))
                    for table in _GROUP_TABLES]
        case GroupOwner():
            return [(_UPSERT_OWNER, (record.group_id, partition_of(record.group_id, partitions),
                                     record.owner))]
        case CheckpointsWritten():
            p = partition_of(record.group_id, partitions)
            out = []
            for resource_set, idx, value in record.checkpoints:
                if value is None:
                    out.append((_DELETE_CHECKPOINT, (record.group_id, resource_set, idx)))
                else:
                    out.append((_UPSERT_CHECKPOINT,
                                (record.group_id, resource_set, idx, p, encode_value(value),
                                 record.committed_ms or None, record.member_id,
                                 record.generation_id)))
            if record.committed_ms > 0:
                out.append((_UPSERT_LAST_COMMIT, (record.group_id, p, record.committed_ms)))
            return out
        case CatalogChanged():
            change: Statement = (
                ("DELETE FROM catalog WHERE name = $1", (record.name,))
                if record.partitions is None else
                (_UPSERT_CATALOG, (record.name, record.partitions,
                                   *encode_placement(record.placement))))
            return [change, (_SET_META, (RESOURCES_EPOCH_KEY, record.resources_epoch))]
        case JournalEntry():
            return [(_INSERT_JOURNAL, (
                record.group_id, partition_of(record.group_id, partitions),
                record.generation_id, record.protocol_type, record.protocol_name,
                record.leader, len(record.members),
                json.dumps([list(m) for m in record.members]), json.dumps(list(record.joined)),
                json.dumps(list(record.left)), record.reason, record.started_ms,
                record.ended_ms, encode(dict(record.assignments))))]
    raise TypeError(f"not a storage record: {record!r}")


# ---------------------------------------------------------------- schema


@cache
def expected_columns() -> dict[str, tuple[str, ...]]:
    """Tables and columns the migrations create, read from their ``CREATE TABLE`` text."""
    tables: dict[str, list[str]] = {}
    for script in MIGRATIONS:
        for name, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\s*\)", script, re.S):
            columns = tables.setdefault(name, [])
            for line in body.split("\n"):
                word = line.strip().split(" ", 1)[0].strip('"')
                if word and word.upper() not in ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK"):
                    columns.append(word)
        for name, column in re.findall(r"ALTER TABLE (\w+) ADD COLUMN \"?(\w+)", script):
            tables[name].append(column)
    return {name: tuple(columns) for name, columns in tables.items()}


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
            await conn.execute(_SET_META, SCHEMA_VERSION_KEY, version + 1)


async def _check_tables(conn: Any, name: str) -> None:
    """Every table and column of the current schema is there (a dropped table, say)."""
    rows = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ANY($1::text[])",
        list(expected_columns()))
    present: dict[str, set[str]] = {}
    for row in rows:
        present.setdefault(row[0], set()).add(row[1])
    for table, columns in expected_columns().items():
        if table not in present:
            raise CorruptDatabaseError(name, table, "", f"the table is missing (schema version "
                                       f"{SCHEMA_VERSION} has it)")
        missing = [c for c in columns if c not in present[table]]
        if missing:
            raise CorruptDatabaseError(name, table, "", f"column(s) {', '.join(missing)} missing "
                                       f"(schema version {SCHEMA_VERSION} has them)")


async def _fix_partitions(conn: Any, name: str, wanted: int | None) -> int:
    """``P`` of the database: set (with its lease rows) at creation, checked after."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK)
        stored = await conn.fetchval("SELECT value FROM meta WHERE key = $1", PARTITIONS_KEY)
        if stored is None:
            count = wanted or DEFAULT_PARTITIONS
            await conn.execute(_SET_META, PARTITIONS_KEY, count)
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

_T = TypeVar("_T")

_GROUP_COLUMNS = ("group_id", "state", "generation_id", "protocol_type", "protocol_name",
                  "leader", "state_timestamp_ms", "members")
_CHECKPOINT_COLUMNS = ("group_id", "resource_set", "idx", "value", "committed_ms",
                       "member_id", "generation_id")


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
        one = group_id
        groups = []
        for row in await self._rows("groups", _GROUP_COLUMNS, "group_id", partition, one):
            key = f"group_id={row[0]!r} generation_id={row[2]!r}"
            groups.append(self._decoded("groups", key, decode_group_row, row))
        checkpoints: dict[str, dict[tuple[str, int], Scalar]] = {}
        checkpoint_meta: dict[str, dict[tuple[str, int], CheckpointMeta]] = {}
        for row in await self._rows("checkpoints", _CHECKPOINT_COLUMNS,
                                    "group_id, resource_set, idx", partition, one):
            key = f"group_id={row[0]!r} resource_set={row[1]!r} idx={row[2]!r}"
            group_id, resource_set, idx, value = self._decoded(
                "checkpoints", key, decode_checkpoint_row, row)
            checkpoints.setdefault(group_id, {})[(resource_set, idx)] = value
            written = self._decoded("checkpoints", key, decode_checkpoint_meta, row)
            if written is not None:
                checkpoint_meta.setdefault(group_id, {})[(resource_set, idx)] = written
        catalog: dict[str, int] = {}
        placement: dict[str, Placement] = {}
        for row in await self._rows("catalog", CATALOG_COLUMNS, "name", None):
            name, count, placed = self._decoded("catalog", f"name={row[0]!r}",
                                                decode_catalog_row, row)
            catalog[name] = count
            if not placed.is_default:
                placement[name] = placed
        epoch = 0
        for row in await self._rows("meta", ("key", "value"), "key", None):
            if row[0] == RESOURCES_EPOCH_KEY:
                epoch = self._decoded("meta", f"key={row[0]!r}", decode_epoch_row, row)
        last_commit: dict[str, int] = {}
        for row in await self._rows("last_commits", ("group_id", "committed_ms"), "group_id",
                                    partition, one):
            group_id, committed_ms = self._decoded("last_commits", f"group_id={row[0]!r}",
                                                   decode_last_commit_row, row)
            if group_id in checkpoints:
                last_commit[group_id] = committed_ms
        owners: dict[str, str] = {}
        for row in await self._rows("group_owners", ("group_id", "owner"), "group_id",
                                    partition, one):
            group_id, owner = self._decoded("group_owners", f"group_id={row[0]!r}",
                                            decode_owner_row, row)
            owners[group_id] = owner
        return Snapshot(groups=tuple(groups), checkpoints=checkpoints, catalog=catalog,
                        resources_epoch=epoch, last_commit_ms=last_commit, owners=owners,
                        checkpoint_meta=checkpoint_meta, placement=placement)

    async def _rows(self, table: str, columns: Sequence[str], order: str,
                    partition: int | None, group_id: str | None = None
                    ) -> list[tuple[Any, ...]]:
        """Rows of one table (of one partition, of one group); group rows' ``partition``
        is checked."""
        grouped = "group_id" in columns
        select = ", ".join(columns) + (", partition" if grouped else "")
        sql = f"SELECT {select} FROM {table}"
        args: tuple[Any, ...] = ()
        if partition is not None and grouped:
            sql += " WHERE partition = $1"
            args = (partition,)
            if group_id is not None:
                sql += " AND group_id = $2"
                args = (partition, group_id)
        try:
            rows = await (await self._connection()).fetch(f"{sql} ORDER BY {order}", *args)
        except database_errors() as exc:
            problem = f"cannot read it: {describe_error(exc, self._url)}"
            exceptions = _driver().exceptions
            if isinstance(exc, exceptions.SyntaxOrAccessError | exceptions.InternalServerError):
                # A table or column gone, or PostgreSQL's "data corrupted" class (XX):
                # the database itself must be fixed.
                raise CorruptDatabaseError(self.path, table, "", problem) from None
            # The link or the server failed (not the data): a restart may cure it.
            raise StorageError(f"database {self.path}: table {table}: {problem}") from None
        out = []
        for record in rows:
            row = tuple(record)
            if grouped:
                *row_values, stored = row
                group_id = row[0]
                if isinstance(group_id, str):
                    actual = partition_of(group_id, self.partitions)
                    if stored != actual:
                        raise CorruptDatabaseError(
                            self.path, table, f"group_id={group_id!r}",
                            f"column partition: {stored}, but the group maps to partition "
                            f"{actual} of {self.partitions}")
                row = tuple(row_values)
            out.append(row)
        return out

    def _decoded(self, table: str, key: str, decoder: Callable[[Any], _T], row: Any) -> _T:
        try:
            return decoder(row)
        except BadValue as exc:
            raise CorruptDatabaseError(self.path, table, key, str(exc)) from exc
        except DecodeError as exc:
            raise CorruptDatabaseError(self.path, table, key, decode_problem(exc)) from exc

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
        sql = ('SELECT group_id, generation_id, protocol_type, protocol_name, leader, '
               'member_count, members, joined, "left", reason, started_ms, ended_ms, '
               'assignments FROM rebalance_journal')
        args: list[Any] = []
        if group_id is not None:
            args.append(group_id)
            sql += f" WHERE group_id = ${len(args)}"
        sql += " ORDER BY id" + (" DESC" if newest_first else "")
        if limit is not None:
            args.append(limit)
            sql += f" LIMIT ${len(args)}"
        rows = await self._fetch("the rebalance journal", sql, *args)
        return [{
            "group_id": r[0], "generation_id": r[1], "protocol_type": r[2],
            "protocol_name": r[3], "leader": r[4], "member_count": r[5],
            "members": json.loads(r[6]), "joined": json.loads(r[7]),
            "left": json.loads(r[8]), "reason": r[9], "started_ms": r[10],
            "ended_ms": r[11], "assignments": decode(r[12]),
        } for r in rows]

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
                rows = await conn.fetch(f"SELECT {', '.join(CATALOG_COLUMNS)} FROM catalog "
                                        f"ORDER BY name")
        except database_errors() as exc:
            raise StorageError(f"database {self.path}: cannot read the catalog: "
                               f"{describe_error(exc, self._url)}") from None
        catalog: dict[str, int] = {}
        placement: dict[str, Placement] = {}
        for row in rows:
            name, count, placed = self._decoded("catalog", f"name={row[0]!r}",
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
                row = await conn.fetchrow(f"SELECT {', '.join(CATALOG_COLUMNS)} FROM catalog "
                                          f"WHERE name = $1", name)
                if partitions is None and row is None:
                    return epoch, False
                current: tuple[int, Placement] | None = None
                if row is not None:
                    _, count, placed = self._decoded("catalog", f"name={name!r}",
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
            members = self._decoded("groups", r[0], decode_members, r[5])
            out.append(GroupSummary(r[0], r[1], r[2], r[3], int(r[4]), len(members)))
        return out

    async def generations(self, group_id: str) -> list[dict[str, Any]]:
        """Rows of the ``generations`` table for one group, oldest first."""
        rows = await self._fetch(
            "generations",
            "SELECT generation_id, protocol_type, protocol_name, leader, formed_ms, "
            "member_count, members, assignments FROM generations WHERE group_id = $1 "
            "ORDER BY generation_id", group_id)
        return [{
            "generation_id": r[0], "protocol_type": r[1], "protocol_name": r[2],
            "leader": r[3], "formed_ms": r[4], "member_count": r[5],
            "members": json.loads(r[6]),
            "assignments": None if r[7] is None else decode(r[7]),
        } for r in rows]
