"""The coordinator's durable state in one SQLite file, through aiosqlite.

Durability (docs/protocol.md, "Durability"; docs/architecture.md practice 5): the database runs
in WAL mode with ``synchronous=FULL``, so a transaction's WAL frames are
fsynced before ``COMMIT`` returns. The runtime releases a reply only after the
write it depends on returned from :meth:`Storage.write`, hence:

- a ``kill -9`` of the server loses nothing that was acknowledged (that would
  already hold with ``synchronous=NORMAL``: the WAL is in the OS page cache);
- a power loss or kernel crash loses nothing acknowledged either, as long as
  the disk honours fsync (``FULL`` syncs the WAL at every commit; ``NORMAL``
  would lose the last transactions).

Every batch of records is written in one transaction, in order, so memory and
disk move together: either the whole batch is on disk or none of it.

The file is the server's alone while it is open (docs/operations.md,
"Files, backups, one instance"):

- :meth:`Storage.open` takes an exclusive ``flock`` on the database file
  itself, so a second server on the same file (by any path: a symlink, a
  hard link, another mount of the volume on this host) is refused with the
  first one's pid. SQLite's own locks are POSIX record locks, which do not
  interact with ``flock`` on Linux and the BSDs; read-only readers
  (``groupcoord journal export``, ``groupcoord analyze``, ``sqlite3``) take
  no ``flock`` and keep working while a server runs.
- It proves the file writable (a real, no-op commit) before the server
  reports ready.
- After every commit, and when the runtime asks (:meth:`Storage.check`),
  the path must still name the file that is open, and ``-wal`` the
  write-ahead log that is open: a database deleted, renamed or replaced
  under a running server is a storage failure, never an acknowledged write
  into a file the next start will not see.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import logging
import os
import sqlite3
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar, cast, get_args, get_type_hints

import aiosqlite

from coordinator import offload
from coordinator.core.records import (
    CatalogChanged,
    CheckpointMeta,
    CheckpointsWritten,
    GroupDeleted,
    GroupOwner,
    GroupRecord,
    JournalEntry,
    MemberRecord,
    Record,
    Snapshot,
    journal_member,
)
from coordinator.core.states import GroupState
from coordinator.storage.schema import COLUMNS, MIGRATIONS, SCHEMA_VERSION
from coordinator.storage.tables import (
    CATALOG,
    CHECKPOINTS,
    GENERATIONS,
    GROUP_OWNERS,
    GROUPS,
    JOURNAL,
    LAST_COMMITS,
    META,
    SNAPSHOT_TABLES,
    SQLITE,
    Statements,
    Table,
    select,
)
from protocol.catalog import Placement, Weights, Zones, parse_weights, parse_zones
from protocol.codec import DecodeError, decode, encode
from protocol.limits import MAX_PARTITIONS
from protocol.validate import Scalar, ValidationError, value_problem

RESOURCES_EPOCH_KEY = "resources_epoch"

log = logging.getLogger("groupcoord.storage")


class StorageError(RuntimeError):
    """The database cannot be used (newer schema, unreadable file, failed write)."""


class CorruptDatabaseError(StorageError):
    """A table or row of the database cannot be read back into the state it stands for.

    Raised by :meth:`Storage.open` (missing table or column) and
    :meth:`Storage.load` (a row that does not decode), before anything is
    restored, so a server never serves part of a database. ``str()`` is one
    line naming the file, the table, the row's key and what is wrong.
    """

    def __init__(self, path: str, table: str, key: str, problem: str) -> None:
        self.path = path
        self.table = table
        self.key = key
        self.problem = problem
        where = f"table {table}" + (f", row {key}" if key else "")
        super().__init__(f"database {path}: {where}: {problem}")


_S = TypeVar("_S")
#: What SQLite raises for a value it will not take (as opposed to the file or
#: the disk failing): checked by :meth:`Storage.write`.
_SQLITE_RECORD_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError,
                         OverflowError, UnicodeEncodeError)


class RecordError(StorageError):
    """A record of the batch cannot be stored as it is (a value outside what the
    store holds), as opposed to the database failing: nothing of the batch was
    written, and writing the other records alone can succeed. ``group_id`` is the
    record's group when known (``None``: the database refused one of the batch's
    records without saying which, or the record is the catalog's)."""

    def __init__(self, path: str, group_id: str | None, problem: str) -> None:
        self.path = path
        self.group_id = group_id
        self.problem = problem
        whose = f"a record of group {group_id!r}" if group_id is not None else "a record"
        super().__init__(f"write to {path} refused {whose}: {problem}")


#: What encoding a record's values may raise (``BadValue`` and ``UnicodeEncodeError``
#: are ``ValueError``\ s; msgpack raises ``OverflowError`` for an integer past 64 bits).
RECORD_ENCODING_ERRORS = (ValueError, TypeError, OverflowError)


def record_statements(path: str, records: Sequence[Record],
                      statements_of: Callable[[Record], list[_S]]) -> list[_S]:
    """Every record's statements, in order; a record whose values cannot be encoded
    raises :class:`RecordError` naming its group before anything is sent."""
    out: list[_S] = []
    for record in records:
        try:
            out += statements_of(record)
        except RECORD_ENCODING_ERRORS as exc:
            group_id = None if isinstance(record, CatalogChanged) else record.group_id
            raise RecordError(path, group_id,
                              f"{type(record).__name__}: {_cause(exc)}") from exc
    return out


def encode_value(value: Scalar) -> bytes:
    """A checkpoint value as stored (msgpack), refusing what no call may store
    (:func:`protocol.validate.value_problem`, the one definition)."""
    problem = value_problem(value)
    if problem is not None:
        raise BadValue(f"checkpoint value: {problem}")
    return encode(value)


def _cause(exc: BaseException) -> str:
    """What went wrong, as SQLite or the OS said it, with SQLite's error name when known
    (``database or disk is full (SQLITE_FULL)``)."""
    name = getattr(exc, "sqlite_errorname", None)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{exc} ({name})" if isinstance(name, str) and name not in str(exc) else str(exc)


class BadValue(ValueError):
    """One column of one row is wrong (caught by :meth:`Storage.load`, which adds where)."""


# ---------------------------------------------------------------- encoding


# A member's storage row is derived from MemberRecord's fields (records.py):
# the array of its fields in their order, trailing "tail" fields left out while
# None; each field read back is checked against its type hint.
_MEMBER_FIELDS = fields(MemberRecord)
_member_values = attrgetter(*(f.name for f in _MEMBER_FIELDS))
#: fields every row has; the "tail" ones after them are written only when set.
_MEMBER_REQUIRED = len(_MEMBER_FIELDS) - sum(
    1 for f in _MEMBER_FIELDS if f.metadata.get("tail", False))
_PROTOCOLS = tuple[tuple[str, bytes], ...]


def _field_checks() -> tuple[list[tuple[int, str, type, bool]], int]:
    """(index, name, type, nullable) of each scalar member field, and the index of
    the protocols; a field of another type fails at import, not at the first read."""
    scalars: list[tuple[int, str, type, bool]] = []
    protocols = -1
    hints = get_type_hints(MemberRecord)
    for i, f in enumerate(_MEMBER_FIELDS):
        hint = hints[f.name]
        args = get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = [a for a in args if a is not type(None)]
        if hint == _PROTOCOLS:
            protocols = i
        elif len(kinds) == 1 and kinds[0] in (str, int, bytes):
            scalars.append((i, f.name, kinds[0], len(args) == 2))
        else:
            raise TypeError(f"MemberRecord.{f.name}: no storage check for {hint!r}")
    assert protocols >= 0
    return scalars, protocols


_SCALAR_CHECKS, _PROTOCOLS_AT = _field_checks()


def _member_row(member: MemberRecord) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _member_values(member)
    end = len(values)
    while end > _MEMBER_REQUIRED and values[end - 1] is None:
        end -= 1
    return values if end == len(values) else values[:end]


def encode_members(members: Sequence[MemberRecord]) -> bytes:
    """A group's members as one msgpack blob (schema.py, ``groups.members``).

    Each member is an array of :class:`MemberRecord`'s fields in order
    (``[member_id, group_instance_id, client_id, client_host,
    session_timeout_ms, rebalance_timeout_ms, protocols, assignment]``) rather
    than a map: a 1,000-member group is written at every generation, and
    arrays encode in half the time and space of maps. Then the trailing fields
    while any of them is set (a static instance bound to a token: ``owner``;
    one whose process sent an incarnation: ``incarnation``, ``incarnation_ms``).
    """
    return encode([_member_row(m) for m in members])


def decode_members(blob: bytes) -> tuple[MemberRecord, ...]:
    """The inverse of :func:`encode_members`; :class:`ValueError` names what is wrong.

    Every field is type-checked: the blob comes from disk, and a member with,
    say, a ``None`` session timeout would only fail later, inside the core.
    """
    items = decode(blob)
    if not isinstance(items, list):
        raise BadValue(f"expected an array of members, got {type(items).__name__}")
    out = []
    seen: set[str] = set()
    total = len(_MEMBER_FIELDS)
    counts = (f"{_MEMBER_REQUIRED} or {total}" if total == _MEMBER_REQUIRED + 1
              else f"{_MEMBER_REQUIRED} to {total}")
    for i, item in enumerate(items):
        if not isinstance(item, list) or not _MEMBER_REQUIRED <= len(item) <= total:
            raise BadValue(f"member {i}: expected an array of {counts} fields, "
                           f"got {_short(item)}")
        member_id = item[0]
        where = f"member {i} ({member_id!r})" if isinstance(member_id, str) else f"member {i}"
        for at, name, kind, nullable in _SCALAR_CHECKS:
            _check(where, name, item[at] if at < len(item) else None, kind, nullable=nullable)
        if member_id in seen:
            raise BadValue(f"{where}: member id listed twice")
        seen.add(member_id)
        protocols = item[_PROTOCOLS_AT]
        if not isinstance(protocols, list) or not protocols:
            raise BadValue(f"{where}: protocols: expected a non-empty array, "
                           f"got {_short(protocols)}")
        for pair in protocols:
            if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str)
                    or not isinstance(pair[1], bytes)):
                raise BadValue(f"{where}: protocols: expected [name, metadata bytes] pairs, "
                               f"got {_short(pair)}")
        item[_PROTOCOLS_AT] = tuple((name, meta) for name, meta in protocols)
        out.append(MemberRecord(*item))
    return tuple(out)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(where: str, name: str, value: object, kind: type, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    # bool is an int subclass: a True timeout is as wrong as a string one.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ + (" or null" if nullable else "")
        raise BadValue(f"{where}: {name}: expected {expected}, got {_short(value)}")


def member_triples(members: Iterable[MemberRecord]) -> str:
    """The members as the ``generations`` table lists them (records.journal_member)."""
    return json.dumps([list(journal_member(m)) for m in members])


# ---------------------------------------------------------------- statements


#: One statement: its SQL and parameters.
Statement = tuple[str, tuple[Any, ...]]

SQL = Statements.of(SQLITE)


def record_rows(sql: Statements, partition: int | None, record: Record) -> list[Statement]:
    """The SQL that makes one record durable, in either store: ``sql`` is the store's
    dialect's, and ``partition`` the record's group's where rows carry it (appended
    to the parameters of its group's rows; ``None`` in SQLite). The parameters are
    the columns in the order tables.py declares them."""
    # ``row + tail`` rather than ``(*row, *tail)``: adding the empty tuple hands the
    # row itself back (SQLite's rows pay ~10 ns), unpacking builds a list first
    # (~70 ns a row, a tenth of the encoding of a large commit).
    tail = () if partition is None else (partition,)
    row: tuple[Any, ...]
    match record:
        case GroupRecord():
            row = (record.group_id, record.state, record.generation_id, record.protocol_type,
                   record.protocol_name, record.leader, record.state_timestamp_ms,
                   encode_members(record.members))
            out: list[Statement] = [(sql.upsert_group, row + tail)]
            # A generation row exists for every generation that formed with members;
            # its assignments are filled once every member has one (the leader's sync).
            if record.members and record.generation_id > 0:
                assigned = all(m.assignment is not None for m in record.members)
                assignments = (encode({m.member_id: m.assignment for m in record.members})
                               if assigned else None)
                row = (record.group_id, record.generation_id, record.protocol_type,
                       record.protocol_name, record.leader, record.state_timestamp_ms,
                       len(record.members), member_triples(record.members), assignments)
                out.append((sql.upsert_generation, row + tail))
            return out
        case GroupDeleted():
            # Kafka deletes a group's offsets with the group; generation numbers of a
            # group created again under the same id restart, so its old generation
            # rows go too. The rebalance journal keeps the history.
            return [(delete, (record.group_id,)) for delete in sql.delete_group]
        case GroupOwner():
            row = (record.group_id, record.owner)
            return [(sql.upsert_owner, row + tail)]
        case CheckpointsWritten():
            out = []
            # The loop of a large commit (thousands of rows): its names are local.
            group_id, upsert, delete = record.group_id, sql.upsert_checkpoint, sql.delete_checkpoint
            written = (record.committed_ms or None, record.member_id, record.generation_id,
                       record.sequence)
            for resource_set, idx, value in record.checkpoints:
                if value is None:
                    out.append((delete, (group_id, resource_set, idx)))
                else:
                    row = (group_id, resource_set, idx, encode_value(value), *written)
                    out.append((upsert, row + tail))
            if record.committed_ms > 0:
                row = (record.group_id, record.committed_ms)
                out.append((sql.upsert_last_commit, row + tail))
            return out
        case CatalogChanged():
            change: Statement = (
                (sql.delete_catalog, (record.name,)) if record.partitions is None else
                (sql.upsert_catalog, (record.name, record.partitions,
                                      *encode_placement(record.placement))))
            return [change, (sql.set_meta, (RESOURCES_EPOCH_KEY, record.resources_epoch))]
        case JournalEntry():
            row = (record.group_id, record.generation_id, record.protocol_type,
                   record.protocol_name, record.leader, len(record.members),
                   json.dumps([list(m) for m in record.members]),
                   json.dumps(list(record.joined)), json.dumps(list(record.left)),
                   record.reason, record.started_ms, record.ended_ms,
                   encode(dict(record.assignments)))
            return [(sql.insert_journal, row + tail)]
    raise TypeError(f"not a storage record: {record!r}")


#: The SQL that makes one record durable in SQLite.
_statements: Callable[[Record], list[Statement]] = functools.partial(record_rows, SQL, None)


def batch_rows(records: Sequence[Record]) -> int:
    """About how many rows ``records`` write: their checkpoints, one per other record."""
    return sum(len(r.checkpoints) if type(r) is CheckpointsWritten else 1 for r in records)


def _runs(path: str, records: Sequence[Record]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The statements of ``records`` in order, consecutive ones of the same SQL in one
    run: one ``executemany``, one hop to the database thread, instead of one per row.
    A record whose values cannot be encoded raises :class:`RecordError`."""
    statements = record_statements(path, records, _statements)
    return [(sql, [params for _, params in run])
            for sql, run in itertools.groupby(statements, key=lambda s: s[0])]


# ---------------------------------------------------------------- loading

_T = TypeVar("_T")
_P = TypeVar("_P")

_STATES = frozenset(state.value for state in GroupState)


def _column(name: str, value: object, kind: type, *, nullable: bool = False) -> None:
    if value is None:
        if nullable:
            return
        raise BadValue(f"column {name} is NULL")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadValue(f"column {name}: expected {_SQL_TYPES[kind]}, got "
                        f"{type(value).__name__} {_short(value)}")


_SQL_TYPES: dict[type, str] = {str: "TEXT", int: "INTEGER", bytes: "BLOB"}


def decode_problem(exc: DecodeError) -> str:
    # protocol.codec speaks of request bodies; here it is a stored blob.
    text = str(exc).removeprefix("body ")
    if text.endswith(": ") and exc.__cause__ is not None:
        # msgpack raises some errors (FormatError, StackError) without a message.
        text += type(exc.__cause__).__name__
    return text


def decode_group_row(row: Any) -> GroupRecord:
    group_id, state, generation_id, protocol_type, protocol_name, leader, timestamp, blob = row
    _column("group_id", group_id, str)
    _column("state", state, str)
    if state not in _STATES:
        raise BadValue(f"column state: unknown group state {state!r} "
                        f"(known: {', '.join(sorted(_STATES))})")
    _column("generation_id", generation_id, int)
    if generation_id < 0:
        raise BadValue(f"column generation_id: negative ({generation_id})")
    _column("protocol_type", protocol_type, str, nullable=True)
    _column("protocol_name", protocol_name, str, nullable=True)
    _column("leader", leader, str, nullable=True)
    _column("state_timestamp_ms", timestamp, int)
    _column("members", blob, bytes)
    try:
        members = decode_members(blob)
    except DecodeError as exc:
        raise BadValue(f"column members (generation {generation_id}) "
                        f"{decode_problem(exc)}") from exc
    except BadValue as exc:
        raise BadValue(f"column members (generation {generation_id}): {exc}") from exc
    if members and state in (GroupState.STABLE.value, GroupState.COMPLETING_REBALANCE.value):
        # The core answers joins and syncs with the chosen protocol's metadata:
        # a generation whose protocol some member lacks cannot be served.
        if protocol_name is None:
            raise BadValue(f"column protocol_name is NULL for a {state} group "
                            f"(generation {generation_id}) with members")
        for m in members:
            if all(name != protocol_name for name, _ in m.protocols):
                raise BadValue(f"generation {generation_id}: protocol {protocol_name!r} is "
                                f"not among the protocols of member {m.member_id!r}")
    return GroupRecord(group_id=group_id, state=state, generation_id=generation_id,
                       protocol_type=protocol_type, protocol_name=protocol_name, leader=leader,
                       state_timestamp_ms=timestamp, members=members)


def decode_checkpoint_row(row: Any) -> tuple[str, str, int, Scalar]:
    group_id, resource_set, idx, blob = row[:4]
    _column("group_id", group_id, str)
    _column("resource_set", resource_set, str)
    _column("idx", idx, int)
    _column("value", blob, bytes)
    try:
        value = decode(blob)
    except DecodeError as exc:
        raise BadValue(f"column value {decode_problem(exc)}") from exc
    if value is None or isinstance(value, (list, dict)):
        # A stored checkpoint is a non-null scalar (None deletes: docs/protocol.md,
        # "POST /v1/commit and POST /v1/fetch").
        raise BadValue(f"column value: expected a msgpack scalar, got {_short(value)}")
    return group_id, resource_set, idx, value


def decode_checkpoint_meta(row: Any) -> CheckpointMeta | None:
    """Who wrote a checkpoint row and when (columns 4-7); ``None`` if not kept."""
    committed_ms, member_id, generation_id, sequence = row[4:8]
    if committed_ms is None:
        return None
    _column("committed_ms", committed_ms, int)
    _column("member_id", member_id, str, nullable=True)
    _column("generation_id", generation_id, int)
    _column("sequence", sequence, int, nullable=True)
    return CheckpointMeta(committed_ms, member_id, generation_id, sequence)


def encode_placement(placement: Placement) -> tuple[str | None, str | None]:
    """The ``weights`` and ``zones`` columns of a catalog row: JSON text, NULL for
    the default."""
    weights, zones = placement.weights, placement.zones
    return (None if weights.is_default else json.dumps(weights.to_json(), separators=(",", ":")),
            None if zones.is_default else json.dumps(zones.to_json(), separators=(",", ":")))


def _placement_column(name: str, text: object, partitions: int,
                      parse: Callable[[object, str, int], _P]) -> _P | None:
    _column(name, text, str, nullable=True)
    if text is None:
        return None
    try:
        doc = json.loads(cast(str, text))
    except ValueError as exc:
        raise BadValue(f"column {name}: not JSON ({exc})") from None
    try:
        return parse(doc, f"column {name}", partitions)
    except ValidationError as exc:
        raise BadValue(str(exc)) from None


def decode_catalog_row(row: Any) -> tuple[str, int, Placement]:
    """A catalog row (``CATALOG.common``): the set's name, partitions and
    placement, checked as a ``PUT`` checks them."""
    name, partitions, weights, zones = row
    _column("name", name, str)
    _column("partitions", partitions, int)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise BadValue(f"column partitions: {partitions} is outside 1..{MAX_PARTITIONS}")
    return name, partitions, Placement(
        _placement_column("weights", weights, partitions, parse_weights) or Weights(),
        _placement_column("zones", zones, partitions, parse_zones) or Zones())


def decode_last_commit_row(row: Any) -> tuple[str, int]:
    group_id, committed_ms = row
    _column("group_id", group_id, str)
    _column("committed_ms", committed_ms, int)
    return group_id, committed_ms


def decode_owner_row(row: Any) -> tuple[str, str]:
    group_id, owner = row
    _column("group_id", group_id, str)
    _column("owner", owner, str)
    return group_id, owner


def decode_epoch_row(row: Any) -> int:
    value = row[1]
    _column("value", value, int)
    if value < 0:
        raise BadValue(f"column value: negative resources epoch ({value})")
    return int(value)


def decoded(path: str, table: str, key: str, decoder: Callable[[Any], _T], row: Any) -> _T:
    """``decoder(row)``; a row that does not decode raises :class:`CorruptDatabaseError`
    naming the database, the table and the row's ``key``."""
    try:
        return decoder(row)
    except BadValue as exc:
        raise CorruptDatabaseError(path, table, key, str(exc)) from exc
    except DecodeError as exc:
        raise CorruptDatabaseError(path, table, key, decode_problem(exc)) from exc


def decode_snapshot(path: str, rows: Mapping[str, Sequence[Any]]) -> Snapshot:
    """The state the rows of :data:`~coordinator.storage.tables.SNAPSHOT_TABLES` stand
    for (``rows``: table name -> its rows, the columns ``Table.common`` in key
    order), every row checked; the first that cannot stand for what its table holds
    raises :class:`CorruptDatabaseError` naming the database, the table, the row's key
    and the problem."""
    groups = tuple(decoded(path, "groups", f"group_id={row[0]!r} generation_id={row[2]!r}",
                           decode_group_row, row) for row in rows[GROUPS.name])
    checkpoints: dict[str, dict[tuple[str, int], Scalar]] = {}
    checkpoint_meta: dict[str, dict[tuple[str, int], CheckpointMeta]] = {}
    for row in rows[CHECKPOINTS.name]:
        key = f"group_id={row[0]!r} resource_set={row[1]!r} idx={row[2]!r}"
        group_id, resource_set, idx, value = decoded(path, "checkpoints", key,
                                                     decode_checkpoint_row, row)
        checkpoints.setdefault(group_id, {})[(resource_set, idx)] = value
        written = decoded(path, "checkpoints", key, decode_checkpoint_meta, row)
        if written is not None:
            checkpoint_meta.setdefault(group_id, {})[(resource_set, idx)] = written
    catalog: dict[str, int] = {}
    placement: dict[str, Placement] = {}
    for row in rows[CATALOG.name]:
        name, partitions, placed = decoded(path, "catalog", f"name={row[0]!r}",
                                           decode_catalog_row, row)
        catalog[name] = partitions
        if not placed.is_default:
            placement[name] = placed
    epoch = 0
    for row in rows[META.name]:
        if row[0] == RESOURCES_EPOCH_KEY:
            epoch = decoded(path, "meta", f"key={row[0]!r}", decode_epoch_row, row)
    last_commit: dict[str, int] = {}
    for row in rows[LAST_COMMITS.name]:
        group_id, committed_ms = decoded(path, "last_commits", f"group_id={row[0]!r}",
                                         decode_last_commit_row, row)
        # A group whose checkpoints were all deleted keeps its row; it has
        # nothing left to expire.
        if group_id in checkpoints:
            last_commit[group_id] = committed_ms
    owners: dict[str, str] = {}
    for row in rows[GROUP_OWNERS.name]:
        group_id, owner = decoded(path, "group_owners", f"group_id={row[0]!r}",
                                  decode_owner_row, row)
        owners[group_id] = owner
    return Snapshot(groups=groups, checkpoints=checkpoints, catalog=catalog,
                    resources_epoch=epoch, last_commit_ms=last_commit, owners=owners,
                    checkpoint_meta=checkpoint_meta, placement=placement)


def check_columns(path: str, expected: Mapping[str, Sequence[str]],
                  present: Mapping[str, set[str]], version: int) -> None:
    """Every table and column of schema ``version`` (``expected``) is ``present`` (the
    table's columns in the database; a table absent or without columns is missing)."""
    for table, columns in expected.items():
        if not present.get(table):
            raise CorruptDatabaseError(path, table, "", f"the table is missing (schema version "
                                       f"{version} has it)")
        missing = [c for c in columns if c not in present[table]]
        if missing:
            raise CorruptDatabaseError(path, table, "", f"column(s) {', '.join(missing)} missing "
                                       f"(schema version {version} has them)")


#: The journal's columns as :func:`journal_row` reads them.
JOURNAL_COLUMNS = tuple(c for c in JOURNAL.common if c != "id")


def journal_row(r: Sequence[Any]) -> dict[str, Any]:
    """A row of the rebalance journal (:data:`JOURNAL_COLUMNS`), decoded."""
    return {
        "group_id": r[0], "generation_id": r[1], "protocol_type": r[2],
        "protocol_name": r[3], "leader": r[4], "member_count": r[5],
        "members": json.loads(r[6]), "joined": json.loads(r[7]),
        "left": json.loads(r[8]), "reason": r[9], "started_ms": r[10],
        "ended_ms": r[11], "assignments": decode(r[12]),
    }


#: The ``generations`` columns of one group's rows, as :func:`generation_row` reads them.
GENERATION_COLUMNS = tuple(c for c in GENERATIONS.common if c != "group_id")


def generation_row(r: Sequence[Any]) -> dict[str, Any]:
    """A row of ``generations`` (:data:`GENERATION_COLUMNS`), decoded."""
    return {
        "generation_id": r[0], "protocol_type": r[1], "protocol_name": r[2],
        "leader": r[3], "formed_ms": r[4], "member_count": r[5],
        "members": json.loads(r[6]),
        "assignments": None if r[7] is None else decode(r[7]),
    }


# ---------------------------------------------------------------- storage


@dataclass(frozen=True, slots=True)
class _FileId:
    """Which file a path names: its device and inode."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> _FileId:
        return cls(st.st_dev, st.st_ino)


def sqlite_path(db: str) -> str:
    """The file of ``--db``: a path, or an ``sqlite:///PATH`` URL as SQLAlchemy spells it
    (``sqlite:///groupcoord.db`` relative, ``sqlite:////var/lib/groupcoord.db``
    absolute)."""
    if db.lower().startswith("sqlite:"):
        rest = db[len("sqlite:"):]
        if not rest.startswith("///") or len(rest) == 3:
            raise StorageError(f"--db {db!r}: an SQLite URL is sqlite:///PATH (relative) or "
                               f"sqlite:////PATH (absolute)")
        return rest[3:]
    return db


class Storage:
    """One open database. Not safe for concurrent :meth:`write` calls: the
    runtime has at most one write in flight (it batches the rest)."""

    def __init__(self, db: aiosqlite.Connection, path: str, *, lock_fd: int,
                 wal_path: str, wal: _FileId) -> None:
        self._db = db
        self.path = path
        #: our own descriptor of the database file: holds the flock, and fstat says
        #: which file SQLite has open (the path is checked against it).
        self._lock_fd = lock_fd
        self._wal_path = wal_path
        self._wal = wal

    @classmethod
    async def open(cls, path: str | Path) -> Storage:
        """Lock, open (creating if missing), migrate to :data:`SCHEMA_VERSION`, and
        prove the file writable.

        Raises :class:`StorageError` for a file another process holds (naming
        its pid when the system says), a file that is not an SQLite database, a
        database of a newer groupcoord (it is never downgraded) and a database
        that cannot be written (read-only file or filesystem, ...), and
        :class:`CorruptDatabaseError` when a table or column of the schema is
        missing. Every message is one line naming the file.
        """
        path = sqlite_path(str(path))
        lock_fd = _lock(path)
        db: aiosqlite.Connection | None = None
        try:
            try:
                db = await aiosqlite.connect(path, isolation_level=None)
            except Exception as exc:
                raise StorageError(f"cannot open database {path}: {exc}") from exc
            try:
                async with db.execute("PRAGMA journal_mode=WAL") as cur:
                    row = await cur.fetchone()
                mode = str(row[0]) if row else "?"
                if mode.lower() != "wal":
                    raise StorageError(f"database {path}: cannot switch it to WAL mode "
                                       f"(journal mode stays {mode!r})")
                await db.execute("PRAGMA synchronous=FULL")
                await db.execute("PRAGMA busy_timeout=5000")
                await _migrate(db, path)
                await _check_tables(db, path)
                await _check_writable(db, path)
            except sqlite3.Error as exc:
                # "file is not a database", "database disk image is malformed", ...
                raise StorageError(f"database {path}: cannot use it: {_cause(exc)}") from exc
            # The write above created the WAL if it was missing. SQLite names it
            # after the file a symlink points to.
            wal_path = os.path.realpath(path) + "-wal"
            try:
                wal = _FileId.of(os.stat(wal_path))
            except OSError as exc:
                raise StorageError(f"database {path}: its write-ahead log {wal_path} is "
                                   f"missing after a commit: {_cause(exc)}") from exc
            storage = cls(db, path, lock_fd=lock_fd, wal_path=wal_path, wal=wal)
            # The path still names the file locked before SQLite opened it.
            storage.check()
            return storage
        except BaseException:
            if db is not None:
                await db.close()
            os.close(lock_fd)
            raise

    async def close(self) -> None:
        """Close the database, then release the lock (in this order: closing any
        descriptor of the file drops SQLite's POSIX locks on it).

        SQLite's close checkpoints the WAL into the file and deletes ``-wal`` and
        ``-shm``, but not when the file was deleted or renamed while open
        (``SQLITE_FCNTL_HAS_MOVED``): those names may then be a replacement's.
        A removed WAL whose file is still in place is checkpointed from the
        open descriptor, so what it held is kept.
        """
        try:
            await self._db.close()
        finally:
            os.close(self._lock_fd)

    def check(self) -> None:
        """Raise :class:`StorageError` unless the path still names the open
        database file and ``-wal`` the open write-ahead log.

        Three ``stat`` calls, no I/O: cheap next to the fsync of a commit
        (docs/operations.md, "The file under a running server").
        """
        problem = self._db_problem() or self._wal_problem()
        if problem is not None:
            raise StorageError(f"database {self.path}: {problem}; nothing written from now on "
                               f"would be seen by the next start")

    def _db_problem(self) -> str | None:
        try:
            opened = os.fstat(self._lock_fd)
        except OSError as exc:
            return f"cannot stat the open file: {_cause(exc)}"
        if opened.st_nlink == 0:
            return "the file was deleted while the server had it open"
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return "the file was renamed or removed while the server had it open"
        except OSError as exc:
            return f"cannot stat the path: {_cause(exc)}"
        if _FileId.of(named) != _FileId.of(opened):
            return ("the path names another file now: the database was replaced while "
                    "the server had it open")
        return None

    def _wal_problem(self) -> str | None:
        try:
            named = os.stat(self._wal_path)
        except FileNotFoundError:
            return (f"its write-ahead log {self._wal_path} was removed while the server "
                    f"had it open")
        except OSError as exc:
            return f"cannot stat its write-ahead log {self._wal_path}: {_cause(exc)}"
        if _FileId.of(named) != self._wal:
            return (f"its write-ahead log {self._wal_path} was replaced while the server "
                    f"had it open")
        return None

    async def schema_version(self) -> int:
        async with self._db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def load(self) -> Snapshot:
        """Everything durable, for ``GroupCoordinator.restore``.

        Every row is checked as it is decoded; the first one that cannot stand
        for what its table holds raises :class:`CorruptDatabaseError` naming
        the file, the table, the row's key and the problem, and nothing is
        returned: a server must not start on part of its state.
        """
        return await self._load(None)

    async def load_group(self, group_id: str) -> Snapshot:
        """One group's durable state (its record, checkpoints, commit time and
        owner, with the catalog), checked as :meth:`load` checks it: what the
        runtime reloads a group from when memory may be ahead of disk for it."""
        return await self._load(group_id)

    async def _load(self, only: str | None) -> Snapshot:
        return decode_snapshot(self.path, {table.name: await self._rows(table, only)
                                           for table in SNAPSHOT_TABLES})

    async def _rows(self, table: Table, group_id: str | None = None) -> list[Any]:
        """The rows of one table (of one group's, with ``group_id``: the group's
        tables only), by key; an SQLite error (a damaged page, a missing column) names
        it."""
        by = ("group_id",) if group_id is not None and table.partitioned else ()
        sql = select(SQLITE, table, table.common, by=by)
        try:
            async with self._db.execute(sql, (group_id,) if by else ()) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as exc:
            raise CorruptDatabaseError(self.path, table.name, "",
                                       f"cannot read it: {exc}") from exc

    async def write(self, records: Sequence[Record]) -> float:
        """Make ``records`` durable in one transaction; returns the seconds it took.

        On any failure the transaction is rolled back and :class:`StorageError`
        raised: none of the batch is on disk.
        """
        # A large batch (commits of thousands of checkpoints) is encoded off the
        # event loop; the rows are then written in the database's own thread.
        runs = (await offload.run(lambda: _runs(self.path, records))
                if batch_rows(records) >= offload.LARGE_BATCH_ROWS else _runs(self.path, records))
        started = time.perf_counter()
        try:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in runs:
                    await self._db.executemany(sql, rows)
                await self._db.execute("COMMIT")
            except BaseException as exc:
                await _rollback(self._db, self.path, exc)
                raise
        except _SQLITE_RECORD_ERRORS as exc:
            # SQLite refused a value (an integer past 64 bits, text that is not
            # Unicode, a constraint): one record's doing, not the database's.
            raise RecordError(self.path, None, _cause(exc)) from exc
        except Exception as exc:
            raise StorageError(f"write to {self.path} failed: {_cause(exc)}") from exc
        # Committed, but into the file the next start will open? Checked before
        # the caller acknowledges anything.
        self.check()
        return time.perf_counter() - started

    async def journal(self, group_id: str | None = None) -> list[dict[str, Any]]:
        """Rows of the rebalance journal (oldest first), decoded, for tests and tools."""
        by = ("group_id",) if group_id is not None else ()
        sql = select(SQLITE, JOURNAL, JOURNAL_COLUMNS, by=by, order="id")
        async with self._db.execute(sql, (group_id,) if by else ()) as cur:
            return [journal_row(r) async for r in cur]

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        """The group's ``limit`` most recent journal rows, newest first (the
        admin API's rebalance history; the index on ``group_id`` serves it)."""
        sql = select(SQLITE, JOURNAL, JOURNAL_COLUMNS, by=("group_id",), order="id DESC",
                     limit=True)
        async with self._db.execute(sql, (group_id, limit)) as cur:
            return [journal_row(r) async for r in cur]

    async def generations(self, group_id: str) -> list[dict[str, Any]]:
        """Rows of the ``generations`` table for one group, oldest first."""
        sql = select(SQLITE, GENERATIONS, GENERATION_COLUMNS, by=("group_id",))
        async with self._db.execute(sql, (group_id,)) as cur:
            return [generation_row(r) async for r in cur]


async def _migrate(db: aiosqlite.Connection, path: str) -> None:
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"database {path} has schema version {version}, but this groupcoord knows "
            f"versions up to {SCHEMA_VERSION}: it was written by a newer groupcoord; "
            f"refusing to open it (never downgraded)")
    for number in range(version + 1, SCHEMA_VERSION + 1):
        # One transaction per migration, user_version included, so a crash
        # mid-migration leaves the previous version intact.
        await db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _split(MIGRATIONS[number - 1]):
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {number}")
            await db.execute("COMMIT")
        except BaseException as exc:
            await _rollback(db, path, exc)
            raise


async def _rollback(db: aiosqlite.Connection, path: str, cause: BaseException) -> None:
    """Roll back after ``cause``, which stays the error reported.

    After some errors (``SQLITE_FULL``, ``SQLITE_IOERR``, ...) SQLite has
    already rolled the transaction back, and a ``ROLLBACK`` would fail with
    "cannot rollback - no transaction is active", hiding the real cause. A
    rollback that fails anyway is logged, never raised.
    """
    if not db.in_transaction:
        return
    try:
        await db.execute("ROLLBACK")
    except Exception as exc:
        log.warning("database %s: rollback after %r failed too: %s", path, cause, exc)


async def _check_writable(db: aiosqlite.Connection, path: str) -> None:
    """A real commit that changes nothing: ``user_version`` set to itself.

    SQLite opens a file it may not write (file mode, read-only filesystem)
    read-only without complaint, and even ``BEGIN IMMEDIATE`` succeeds on it;
    the first page write is what fails. This writes page 1 and fsyncs the
    WAL, as every later commit will.
    """
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    try:
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.execute(f"PRAGMA user_version = {version}")
            await db.execute("COMMIT")
        except BaseException as exc:
            await _rollback(db, path, exc)
            raise
    except sqlite3.Error as exc:
        raise StorageError(f"database {path}: cannot write to it: {_cause(exc)}") from exc


def _lock(path: str) -> int:
    """Open ``path`` (creating it empty if missing) and ``flock`` it exclusively; the
    descriptor returned holds the lock until it is closed.

    ``flock`` rather than a POSIX (``fcntl``) lock: SQLite's locks on the file
    are POSIX locks of this process, which our own would merge with, and
    closing any descriptor of the file drops them all; ``flock`` locks are
    separate, per open file, and conflict even within one process.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot open database {path}: {_cause(exc)}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(os.fstat(fd))
        os.close(fd)
        who = f"another process (pid {holder})" if holder is not None else "another process"
        raise StorageError(f"database {path} is in use by {who}: one server per database "
                           f"file; stop that one or give this one another --db") from None
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"database {path}: cannot lock it: {_cause(exc)}") from exc
    return fd


def _lock_holder(st: os.stat_result) -> int | None:
    """The pid holding a ``flock`` on the file, from ``/proc/locks`` (Linux); ``None``
    when the system does not say (another OS, another pid namespace).

    A line names the file as ``MAJOR:MINOR:INODE``. On overlayfs the device
    there can differ from what ``stat`` reports, so when no line matches the
    device too, a single ``FLOCK`` line with the inode number is taken.
    """
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    exact: list[int] = []
    same_inode: list[int] = []
    for line in text.splitlines():
        # "3: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF"; a blocked waiter's
        # line has "->" after the number and is skipped.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        pid = int(fields[4])
        if fields[5] == where:
            exact.append(pid)
        elif fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            same_inode.append(pid)
    found = exact or (same_inode if len(same_inode) == 1 else [])
    return found[0] if found and found[0] > 0 else None


async def _check_tables(db: aiosqlite.Connection, path: str) -> None:
    """Every table and column of the current schema is there (a dropped table, say)."""
    present: dict[str, set[str]] = {}
    for table in COLUMNS:
        async with db.execute(f"PRAGMA table_info({table})") as cur:
            present[table] = {row[1] for row in await cur.fetchall()}
    check_columns(path, COLUMNS, present, SCHEMA_VERSION)


def _split(script: str) -> list[str]:
    """Statements of a migration script (executescript would commit on its own).

    Migrations hold plain DDL, no triggers or string literals with ``;``.
    """
    return [s.strip() for s in script.split(";") if s.strip()]
