"""Retention (KIP-211) on disk: last commit times, schema version 2 from a version 1
database, and an expired Empty group deleted durably by a restarted server; and
the checkpoints of a version 5 database on version 6."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.records import (
    CheckpointMeta,
    CheckpointsWritten,
    GroupDeleted,
    GroupOwner,
    GroupRecord,
    MemberRecord,
    Record,
    Snapshot,
)
from coordinator.core.replay import fold
from coordinator.runtime.clock import FakeClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.schema import MIGRATIONS, SCHEMA_VERSION
from coordinator.storage.sqlite import Storage
from protocol.codec import encode

T0 = 1_700_000_000_000
HOUR = 3_600_000


async def _written(path: Path, records: list[Record]) -> Snapshot:
    storage = await Storage.open(path)
    try:
        for record in records:
            await storage.write([record])
        return await storage.load()
    finally:
        await storage.close()


async def test_last_commit_times_round_trip_like_fold(tmp_path: Path) -> None:
    member = MemberRecord("m", None, "c", "h", 10_000, 30_000, (("range", b""),), b"a")
    records: list[Record] = [
        CheckpointsWritten("simple", (("s", 0, 1),), T0),
        CheckpointsWritten("simple", (("s", 1, 2),), T0 + 50),
        # A clock stepped back: the later time stays (an expiry never comes forward).
        CheckpointsWritten("simple", (("s", 1, 3),), T0 + 20),
        GroupRecord("had-members", "Stable", 1, "resources", "range", "m", (member,), T0),
        CheckpointsWritten("had-members", (("s", 0, 9),), T0 + 5),
        GroupRecord("had-members", "Empty", 2, "resources", None, None, (), T0 + 7),
        CheckpointsWritten("unknown-time", (("s", 0, 1),)),  # before version 2: no time
        CheckpointsWritten("deleted", (("s", 0, 1),), T0),
        GroupDeleted("deleted"),
        CheckpointsWritten("cleared", (("s", 0, 1),), T0),
        CheckpointsWritten("cleared", (("s", 0, None),), T0 + 1),
    ]
    loaded = await _written(tmp_path / "g.db", records)
    assert loaded.last_commit_ms == {"simple": T0 + 50, "had-members": T0 + 5}
    assert loaded.checkpoints["simple"] == {("s", 0): 1, ("s", 1): 3}
    # The Empty row keeps when the group became Empty: what restore counts from.
    assert [(g.group_id, g.state, g.state_timestamp_ms) for g in loaded.groups] == [
        ("had-members", "Empty", T0 + 7)]
    assert loaded == fold(records)


async def test_a_version_1_database_is_migrated_to_version_2(tmp_path: Path) -> None:
    # (and on to the latest version: later migrations only add tables)
    assert SCHEMA_VERSION >= 2
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    con.executescript(MIGRATIONS[0])
    con.execute("PRAGMA user_version = 1")
    con.execute("INSERT INTO groups VALUES ('old', 'Empty', 3, 'resources', NULL, NULL, ?, ?)",
                (T0, encode([])))
    con.execute("INSERT INTO checkpoints VALUES ('old', 's', 0, ?)", (encode(11),))
    con.execute("INSERT INTO checkpoints VALUES ('simple', 's', 0, ?)", (encode(12),))
    con.commit()
    con.close()

    storage = await Storage.open(path)
    try:
        assert await storage.schema_version() == SCHEMA_VERSION
        snapshot = await storage.load()
        assert snapshot.checkpoints == {"old": {("s", 0): 11}, "simple": {("s", 0): 12}}
        assert [(g.group_id, g.state_timestamp_ms) for g in snapshot.groups] == [("old", T0)]
        # Version 1 kept no commit times: unknown, so restore counts from its own start.
        assert snapshot.last_commit_ms == {}
        await storage.write([CheckpointsWritten("simple", (("s", 0, 13),), T0 + 9)])
        assert (await storage.load()).last_commit_ms == {"simple": T0 + 9}
    finally:
        await storage.close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()

    # The restored core: 'old' counts from its Empty time, 'simple' from its commit.
    core = GroupCoordinator(CoreConfig(group_retention_ms=HOUR))
    storage = await Storage.open(path)
    try:
        effects = core.restore(await storage.load(), T0 + 10)
    finally:
        await storage.close()
    assert {getattr(e, "key", ""): getattr(e, "deadline_ms", 0) for e in effects} == {
        "retention:old": T0 + HOUR, "retention:simple": T0 + 9 + HOUR}


async def test_a_restarted_server_deletes_an_expired_group_from_disk(tmp_path: Path) -> None:
    """Runtime + SQLite + fake clock: the expiry's GroupDeleted is committed."""
    path = tmp_path / "g.db"
    await _written(path, [
        GroupRecord("stale", "Empty", 4, "resources", None, None, (), T0),
        CheckpointsWritten("stale", (("s", 0, 1),), T0 - 10),
        GroupRecord("fresh", "Empty", 1, "resources", None, None, (), T0 + 2 * HOUR),
        CheckpointsWritten("fresh", (("s", 0, 2),), T0 + 2 * HOUR)])

    storage = await Storage.open(path)
    clock = FakeClock(T0 + 2 * HOUR + 1)
    core = GroupCoordinator(CoreConfig(group_retention_ms=HOUR))
    runtime = Runtime(core, storage, clock)
    try:
        await runtime.start()
        assert core.describe_group("stale") is not None
        clock.advance(0)  # 'stale' ran out an hour ago: its timer is due at once
        assert core.describe_group("stale") is None
        for _ in range(200):  # bounded: the write is one transaction on a local file
            if runtime.pending_writes == 0:
                break
            await asyncio.sleep(0.01)
        assert runtime.pending_writes == 0
        on_disk = await storage.load()
        assert [g.group_id for g in on_disk.groups] == ["fresh"]
        assert set(on_disk.checkpoints) == {"fresh"}
        assert on_disk.last_commit_ms == {"fresh": T0 + 2 * HOUR}
    finally:
        await runtime.stop()
        await storage.close()


async def test_group_owners_and_static_instance_owners_round_trip_like_fold(
        tmp_path: Path) -> None:
    """Who created a group (--max-groups-per-token) and which token owns a
    static instance are on disk, and go with the group."""
    static = MemberRecord("s", "i1", "c", "h", 10_000, 30_000, (("range", b""),), b"a",
                          owner="alice")
    dynamic = MemberRecord("d", None, "c", "h", 10_000, 30_000, (("range", b""),), b"b")
    records: list[Record] = [
        GroupOwner("team", "alice"),
        GroupRecord("team", "Stable", 1, "resources", "range", "s", (static, dynamic), T0),
        GroupOwner("simple", "bob"),
        CheckpointsWritten("simple", (("s", 0, 1),), T0),
        GroupOwner("gone", "bob"),
        CheckpointsWritten("gone", (("s", 0, 1),), T0),
        GroupDeleted("gone"),
    ]
    loaded = await _written(tmp_path / "g.db", records)
    assert loaded.owners == {"team": "alice", "simple": "bob"}
    assert [m.owner for m in loaded.groups[0].members] == ["alice", None]
    assert loaded == fold(records)


async def test_a_version_5_database_keeps_its_checkpoints_without_a_sequence(
        tmp_path: Path) -> None:
    """Version 6 adds each checkpoint's commit sequence; rows written before hold
    none, and a commit after the upgrade stores its own."""
    path = tmp_path / "v5.db"
    con = sqlite3.connect(path)
    for script in MIGRATIONS[:5]:
        con.executescript(script)
    con.execute("PRAGMA user_version = 5")
    con.execute("INSERT INTO checkpoints VALUES ('g', 's', 0, ?, ?, 'm-1', 3)",
                (encode(11), T0))
    con.commit()
    con.close()

    storage = await Storage.open(path)
    try:
        assert await storage.schema_version() == SCHEMA_VERSION
        assert (await storage.load()).checkpoint_meta == {
            "g": {("s", 0): CheckpointMeta(T0, "m-1", 3, None)}}
        await storage.write([CheckpointsWritten("g", (("s", 1, 12),), T0 + 1, "m-1", 3, 8)])
        assert (await storage.load()).checkpoint_meta == {
            "g": {("s", 0): CheckpointMeta(T0, "m-1", 3, None),
                  ("s", 1): CheckpointMeta(T0 + 1, "m-1", 3, 8)}}
    finally:
        await storage.close()
