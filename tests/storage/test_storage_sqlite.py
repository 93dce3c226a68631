"""Storage: migrations, every record type round-trips, newer schemas refused.

The record round-trips that hold for both stores (catalog, group deletion, the
journal, replay against fold) run on SQLite and PostgreSQL in
test_storage_both.py; this file keeps what is SQLite's own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from coordinator.core.records import (
    CatalogChanged,
    CheckpointsWritten,
    GroupRecord,
    MemberRecord,
    Snapshot,
)
from coordinator.storage.schema import MIGRATIONS, SCHEMA_VERSION
from coordinator.storage.sqlite import Storage, StorageError, encode_members
from protocol.catalog import Placement, Weights
from protocol.codec import encode


def member(mid: str, assignment: bytes | None = None, instance: str | None = None) -> MemberRecord:
    return MemberRecord(member_id=mid, group_instance_id=instance, client_id="c-" + mid,
                        client_host="127.0.0.1", session_timeout_ms=10_000,
                        rebalance_timeout_ms=30_000,
                        protocols=(("range", b"\x81\xa1v\x01"), ("sticky", b"")),
                        assignment=assignment)


def group(gid: str, state: str, generation: int, *members: MemberRecord) -> GroupRecord:
    return GroupRecord(group_id=gid, state=state, generation_id=generation,
                       protocol_type="resources" if members else None,
                       protocol_name="range" if members else None,
                       leader=members[0].member_id if members else None,
                       members=tuple(members), state_timestamp_ms=1_700_000_000_000 + generation)


async def open_storage(path: Path) -> Storage:
    return await Storage.open(path)


async def test_fresh_database_is_migrated_and_empty(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path / "g.db")
    try:
        assert await storage.schema_version() == SCHEMA_VERSION
        assert await storage.load() == Snapshot()
    finally:
        await storage.close()
    # WAL mode is a property of the file: a plain connection sees it.
    con = sqlite3.connect(tmp_path / "g.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


async def test_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path / "g.db")
    await storage.write([CatalogChanged("orders", 12, 1)])
    await storage.close()
    storage = await open_storage(tmp_path / "g.db")
    try:
        assert (await storage.load()).catalog == {"orders": 12}
    finally:
        await storage.close()


async def test_newer_schema_is_refused_naming_file_and_versions(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(StorageError) as info:
        await Storage.open(path)
    message = str(info.value)
    assert str(path) in message
    assert f"version {SCHEMA_VERSION + 1}" in message
    assert f"up to {SCHEMA_VERSION}" in message
    # Refusing changed nothing.
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    con.close()


async def test_group_records_round_trip_and_fill_generations(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path / "g.db")
    try:
        formed = group("g1", "CompletingRebalance", 3, member("m1"), member("m2", instance="i2"))
        await storage.write([formed])
        assert (await storage.load()).groups == (formed,)
        gens = await storage.generations("g1")
        assert [(g["generation_id"], g["assignments"], g["member_count"]) for g in gens] == [
            (3, None, 2)]
        assert gens[0]["members"] == [["m1", None, "c-m1"], ["m2", "i2", "c-m2"]]

        stable = group("g1", "Stable", 3, member("m1", b"a1"), member("m2", b"", instance="i2"))
        await storage.write([stable])
        snapshot = await storage.load()
        assert snapshot.groups == (stable,)
        gens = await storage.generations("g1")
        assert len(gens) == 1
        assert gens[0]["assignments"] == {"m1": b"a1", "m2": b""}
        assert gens[0]["formed_ms"] == formed.state_timestamp_ms

        # The group empties: the row is replaced, no generation row for no members.
        empty = group("g1", "Empty", 4)
        await storage.write([empty])
        assert (await storage.load()).groups == (empty,)
        assert [g["generation_id"] for g in await storage.generations("g1")] == [3]
    finally:
        await storage.close()


async def test_checkpoints_written_and_deleted(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path / "g.db")
    try:
        await storage.write([CheckpointsWritten("g1", (
            ("orders", 0, 17), ("orders", 1, b"\x00\x01"), ("users", 3, "s"),
            ("users", 4, 1.5), ("users", 5, True)))])
        await storage.write([CheckpointsWritten("g1", (("orders", 0, 18), ("users", 3, None))),
                             CheckpointsWritten("g2", (("orders", 0, -1),))])
        snapshot = await storage.load()
        assert snapshot.checkpoints == {
            "g1": {("orders", 0): 18, ("orders", 1): b"\x00\x01", ("users", 4): 1.5,
                   ("users", 5): True},
            "g2": {("orders", 0): -1},
        }
    finally:
        await storage.close()


async def test_a_failed_batch_writes_nothing(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path / "g.db")
    try:
        await storage.write([CatalogChanged("orders", 1, 1)])
        # Make the second statement of the batch fail: the first must not stay.
        con = sqlite3.connect(tmp_path / "g.db")
        con.execute("CREATE TRIGGER boom BEFORE INSERT ON checkpoints "
                    "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
        con.commit()
        con.close()
        with pytest.raises(StorageError, match="disk says no"):
            await storage.write([CatalogChanged("orders", 5, 2),
                                 CheckpointsWritten("g1", (("orders", 0, 1),))])
        snapshot = await storage.load()
        assert snapshot.catalog == {"orders": 1}
        assert snapshot.resources_epoch == 1
    finally:
        await storage.close()


async def test_a_committed_write_survives_without_close(tmp_path: Path) -> None:
    """What kill -9 leaves: another connection sees every committed batch.

    The other connection is a read-only one (a second Storage on the file is
    refused while the first holds it: test_storage_files.py).
    """
    storage = await open_storage(tmp_path / "g.db")
    try:
        stable = group("g1", "Stable", 1, member("m1", b"a"))
        await storage.write([stable, CheckpointsWritten("g1", (("orders", 0, 5),))])
        other = sqlite3.connect((tmp_path / "g.db").absolute().as_uri() + "?mode=ro", uri=True)
        try:
            groups = other.execute("SELECT group_id, generation_id, members FROM groups").fetchall()
            checkpoints = other.execute(
                "SELECT group_id, resource_set, idx, value FROM checkpoints").fetchall()
        finally:
            other.close()
        assert groups == [("g1", 1, encode_members(stable.members))]
        assert checkpoints == [("g1", "orders", 0, encode(5))]
    finally:
        await storage.close()




async def test_a_version_4_catalog_is_migrated_with_the_default_weights_and_zones(
        tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    con = sqlite3.connect(path)
    for script in MIGRATIONS[:4]:
        con.executescript(script)
    con.execute("PRAGMA user_version = 4")
    con.execute("INSERT INTO catalog VALUES ('orders', 12)")
    con.execute("INSERT INTO meta VALUES ('resources_epoch', 3)")
    con.commit()
    con.close()
    storage = await Storage.open(path)
    try:
        assert await storage.schema_version() == SCHEMA_VERSION >= 5
        snapshot = await storage.load()
        assert (snapshot.catalog, snapshot.placement, snapshot.resources_epoch) == (
            {"orders": 12}, {}, 3)
        hot = Placement(Weights(1.0, ((3, 40.0),)))
        await storage.write([CatalogChanged("orders", 12, 4, hot)])
        assert (await storage.load()).placement == {"orders": hot}
    finally:
        await storage.close()
