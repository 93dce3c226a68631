"""The coordinator's durable state in one SQLite file, through aiosqlite.

Durability (PROTOCOL.md, "Durability"; DESIGN.md practice 5): the database runs
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
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from coordinator.core.records import (
    CatalogChanged,
    CheckpointsWritten,
    GroupDeleted,
    GroupRecord,
    JournalEntry,
    MemberRecord,
    Record,
    Snapshot,
)
from coordinator.storage.schema import MIGRATIONS, SCHEMA_VERSION
from protocol.codec import decode, encode
from protocol.validate import Scalar

RESOURCES_EPOCH_KEY = "resources_epoch"


class StorageError(RuntimeError):
    """The database cannot be used (newer schema, unreadable file, failed write)."""


# ---------------------------------------------------------------- encoding


def encode_members(members: Sequence[MemberRecord]) -> bytes:
    """A group's members as one msgpack blob (schema.py, ``groups.members``).

    Each member is an array ``[member_id, group_instance_id, client_id,
    client_host, session_timeout_ms, rebalance_timeout_ms, protocols,
    assignment]`` rather than a map: a 1,000-member group is written at every
    generation, and arrays encode in half the time and space of maps.
    """
    return encode([
        (m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
         m.rebalance_timeout_ms, m.protocols, m.assignment)
        for m in members
    ])


def decode_members(blob: bytes) -> tuple[MemberRecord, ...]:
    out = []
    for (member_id, instance, client_id, client_host, session_ms, rebalance_ms, protocols,
         assignment) in decode(blob):
        out.append(MemberRecord(
            member_id=member_id, group_instance_id=instance, client_id=client_id,
            client_host=client_host, session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocols=tuple((name, meta) for name, meta in protocols),
            assignment=assignment))
    return tuple(out)


def _member_triples(members: Iterable[MemberRecord]) -> str:
    return json.dumps([[m.member_id, m.group_instance_id, m.client_id] for m in members])


# ---------------------------------------------------------------- statements


_UPSERT_GROUP = """
INSERT INTO groups (group_id, state, generation_id, protocol_type, protocol_name, leader,
                    state_timestamp_ms, members)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (group_id) DO UPDATE SET
    state = excluded.state, generation_id = excluded.generation_id,
    protocol_type = excluded.protocol_type, protocol_name = excluded.protocol_name,
    leader = excluded.leader, state_timestamp_ms = excluded.state_timestamp_ms,
    members = excluded.members
"""

# ``formed_ms`` keeps the time the generation formed; later records of the same
# generation (the leader's assignment, a static member replaced) update the rest.
_UPSERT_GENERATION = """
INSERT INTO generations (group_id, generation_id, protocol_type, protocol_name, leader,
                         formed_ms, member_count, members, assignments)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (group_id, generation_id) DO UPDATE SET
    protocol_type = excluded.protocol_type, protocol_name = excluded.protocol_name,
    leader = excluded.leader, member_count = excluded.member_count,
    members = excluded.members,
    assignments = COALESCE(excluded.assignments, generations.assignments)
"""

_UPSERT_CHECKPOINT = """
INSERT INTO checkpoints (group_id, resource_set, idx, value) VALUES (?, ?, ?, ?)
ON CONFLICT (group_id, resource_set, idx) DO UPDATE SET value = excluded.value
"""

_INSERT_JOURNAL = """
INSERT INTO rebalance_journal (group_id, generation_id, protocol_type, protocol_name, leader,
                               member_count, members, joined, left, reason, started_ms,
                               ended_ms, assignments)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

_SET_META = """
INSERT INTO meta (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value
"""


def _statements(record: Record) -> list[tuple[str, tuple[Any, ...]]]:
    """The SQL that makes one record durable."""
    match record:
        case GroupRecord():
            stmts: list[tuple[str, tuple[Any, ...]]] = [(_UPSERT_GROUP, (
                record.group_id, record.state, record.generation_id, record.protocol_type,
                record.protocol_name, record.leader, record.state_timestamp_ms,
                encode_members(record.members)))]
            # A generation row exists for every generation that formed with members;
            # its assignments are filled once every member has one (the leader's sync).
            if record.members and record.generation_id > 0:
                assigned = all(m.assignment is not None for m in record.members)
                assignments = (encode({m.member_id: m.assignment for m in record.members})
                               if assigned else None)
                stmts.append((_UPSERT_GENERATION, (
                    record.group_id, record.generation_id, record.protocol_type,
                    record.protocol_name, record.leader, record.state_timestamp_ms,
                    len(record.members), _member_triples(record.members), assignments)))
            return stmts
        case GroupDeleted():
            # Kafka deletes a group's offsets with the group; generation numbers of a
            # group created again under the same id restart, so its old generation
            # rows go too. The rebalance journal keeps the history.
            return [(f"DELETE FROM {table} WHERE group_id = ?", (record.group_id,))
                    for table in ("groups", "generations", "checkpoints")]
        case CheckpointsWritten():
            out: list[tuple[str, tuple[Any, ...]]] = []
            for resource_set, idx, value in record.checkpoints:
                if value is None:
                    out.append(("DELETE FROM checkpoints WHERE group_id = ? AND "
                                "resource_set = ? AND idx = ?",
                                (record.group_id, resource_set, idx)))
                else:
                    out.append((_UPSERT_CHECKPOINT,
                                (record.group_id, resource_set, idx, encode(value))))
            return out
        case CatalogChanged():
            change: tuple[str, tuple[Any, ...]] = (
                ("DELETE FROM catalog WHERE name = ?", (record.name,))
                if record.partitions is None else
                ("INSERT INTO catalog (name, partitions) VALUES (?, ?) ON CONFLICT (name) "
                 "DO UPDATE SET partitions = excluded.partitions",
                 (record.name, record.partitions)))
            return [change, (_SET_META, (RESOURCES_EPOCH_KEY, record.resources_epoch))]
        case JournalEntry():
            return [(_INSERT_JOURNAL, (
                record.group_id, record.generation_id, record.protocol_type,
                record.protocol_name, record.leader, len(record.members),
                json.dumps([list(m) for m in record.members]), json.dumps(list(record.joined)),
                json.dumps(list(record.left)), record.reason, record.started_ms,
                record.ended_ms, encode(dict(record.assignments))))]
    raise TypeError(f"not a storage record: {record!r}")


# ---------------------------------------------------------------- storage


class Storage:
    """One open database. Not safe for concurrent :meth:`write` calls: the
    runtime has at most one write in flight (it batches the rest)."""

    def __init__(self, db: aiosqlite.Connection, path: str) -> None:
        self._db = db
        self.path = path

    @classmethod
    async def open(cls, path: str | Path) -> Storage:
        """Open (creating if missing) and migrate to :data:`SCHEMA_VERSION`.

        Raises :class:`StorageError` for a database of a newer groupcoord: it is
        never downgraded.
        """
        path = str(path)
        try:
            db = await aiosqlite.connect(path, isolation_level=None)
        except Exception as exc:
            raise StorageError(f"cannot open database {path}: {exc}") from exc
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=FULL")
            await db.execute("PRAGMA busy_timeout=5000")
            await _migrate(db, path)
        except BaseException:
            await db.close()
            raise
        return cls(db, path)

    async def close(self) -> None:
        await self._db.close()

    async def schema_version(self) -> int:
        async with self._db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def load(self) -> Snapshot:
        """Everything durable, for ``GroupCoordinator.restore``."""
        groups = []
        async with self._db.execute(
                "SELECT group_id, state, generation_id, protocol_type, protocol_name, leader, "
                "state_timestamp_ms, members FROM groups ORDER BY group_id") as cur:
            async for row in cur:
                groups.append(GroupRecord(
                    group_id=row[0], state=row[1], generation_id=row[2], protocol_type=row[3],
                    protocol_name=row[4], leader=row[5], state_timestamp_ms=row[6],
                    members=decode_members(row[7])))
        checkpoints: dict[str, dict[tuple[str, int], Scalar]] = {}
        async with self._db.execute(
                "SELECT group_id, resource_set, idx, value FROM checkpoints "
                "ORDER BY group_id, resource_set, idx") as cur:
            async for row in cur:
                checkpoints.setdefault(row[0], {})[(row[1], row[2])] = decode(row[3])
        catalog: dict[str, int] = {}
        async with self._db.execute("SELECT name, partitions FROM catalog ORDER BY name") as cur:
            async for row in cur:
                catalog[row[0]] = row[1]
        async with self._db.execute("SELECT value FROM meta WHERE key = ?",
                                    (RESOURCES_EPOCH_KEY,)) as cur:
            epoch_row = await cur.fetchone()
        return Snapshot(groups=tuple(groups), checkpoints=checkpoints, catalog=catalog,
                        resources_epoch=int(epoch_row[0]) if epoch_row else 0)

    async def write(self, records: Sequence[Record]) -> float:
        """Make ``records`` durable in one transaction; returns the seconds it took.

        On any failure the transaction is rolled back and :class:`StorageError`
        raised: none of the batch is on disk.
        """
        statements = [stmt for record in records for stmt in _statements(record)]
        started = time.perf_counter()
        try:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                # Consecutive statements of the same SQL go in one executemany:
                # one hop to the database thread instead of one per row, and the
                # order of the records is kept.
                for sql, run in itertools.groupby(statements, key=lambda s: s[0]):
                    await self._db.executemany(sql, [params for _, params in run])
                await self._db.execute("COMMIT")
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
        except Exception as exc:
            raise StorageError(f"write to {self.path} failed: {exc}") from exc
        return time.perf_counter() - started

    async def journal(self, group_id: str | None = None) -> list[dict[str, Any]]:
        """Rows of the rebalance journal (oldest first), decoded, for tests and tools."""
        sql = ("SELECT group_id, generation_id, protocol_type, protocol_name, leader, "
               "member_count, members, joined, left, reason, started_ms, ended_ms, assignments "
               "FROM rebalance_journal")
        params: tuple[Any, ...] = ()
        if group_id is not None:
            sql += " WHERE group_id = ?"
            params = (group_id,)
        rows = []
        async with self._db.execute(sql + " ORDER BY id", params) as cur:
            async for r in cur:
                rows.append({
                    "group_id": r[0], "generation_id": r[1], "protocol_type": r[2],
                    "protocol_name": r[3], "leader": r[4], "member_count": r[5],
                    "members": json.loads(r[6]), "joined": json.loads(r[7]),
                    "left": json.loads(r[8]), "reason": r[9], "started_ms": r[10],
                    "ended_ms": r[11], "assignments": decode(r[12]),
                })
        return rows

    async def generations(self, group_id: str) -> list[dict[str, Any]]:
        """Rows of the ``generations`` table for one group, oldest first."""
        rows = []
        async with self._db.execute(
                "SELECT generation_id, protocol_type, protocol_name, leader, formed_ms, "
                "member_count, members, assignments FROM generations WHERE group_id = ? "
                "ORDER BY generation_id", (group_id,)) as cur:
            async for r in cur:
                rows.append({
                    "generation_id": r[0], "protocol_type": r[1], "protocol_name": r[2],
                    "leader": r[3], "formed_ms": r[4], "member_count": r[5],
                    "members": json.loads(r[6]),
                    "assignments": None if r[7] is None else decode(r[7]),
                })
        return rows


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
        except BaseException:
            await db.execute("ROLLBACK")
            raise


def _split(script: str) -> list[str]:
    """Statements of a migration script (executescript would commit on its own).

    Migrations hold plain DDL, no triggers or string literals with ``;``.
    """
    return [s.strip() for s in script.split(";") if s.strip()]
