"""The PostgreSQL store: migrations, partitions, per-partition loads, refusals in one line.

A real PostgreSQL (tests/pg_harness.py); the record round-trips shared with
the SQLite store are in test_storage_both.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import zlib

import asyncpg
import pytest
from pg_harness import PASSWORD, PostgresServer, free_port
from test_storage_both import JOURNAL
from test_storage_sqlite import group, member

from coordinator.core.records import CatalogChanged, CheckpointMeta, CheckpointsWritten, Snapshot
from coordinator.storage.pg_schema import COLUMNS, SCHEMA_VERSION
from coordinator.storage.pg_schema import MIGRATIONS as PG_MIGRATIONS
from coordinator.storage.postgres import (
    DEFAULT_PARTITIONS,
    PostgresStorage,
    partition_of,
)
from coordinator.storage.sqlite import CorruptDatabaseError, StorageError
from protocol.catalog import Placement, Zones
from protocol.codec import encode


async def _sql(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _redacted(url: str) -> str:
    return url.replace(PASSWORD, "***")


async def _refusal(url: str, **options: object) -> str:
    """Open ``url``; the one line of the StorageError, checked to be password-free."""
    with pytest.raises(StorageError) as caught:
        store = await PostgresStorage.open(url, **options)  # type: ignore[arg-type]
        await store.close()
    message = str(caught.value)
    assert "\n" not in message
    assert PASSWORD not in message and PASSWORD not in repr(caught.value)
    return message


def test_partition_of_is_zlib_crc32_of_the_utf8_group_id() -> None:
    assert partition_of("orders", 64) == zlib.crc32(b"orders") % 64
    assert partition_of("gr\u00fcppe", 7) == zlib.crc32("gr\u00fcppe".encode()) % 7
    assert partition_of("anything", 1) == 0


async def test_fresh_database_is_migrated_with_default_partitions(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url)
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        assert store.partitions == DEFAULT_PARTITIONS
        assert await store.load() == Snapshot()
        assert PASSWORD not in repr(store) and PASSWORD not in store.path
    finally:
        await store.close()
    leases = await _sql(pg_url, "SELECT partition, owner_id, epoch FROM partition_leases "
                                "ORDER BY partition")
    assert [tuple(r) for r in leases] == [(p, None, 0) for p in range(DEFAULT_PARTITIONS)]
    # The columns the store checks at open are the ones the migrations made.
    rows = await _sql(pg_url, "SELECT table_name, column_name FROM information_schema.columns "
                              "WHERE table_schema = current_schema()")
    made: dict[str, set[str]] = {}
    for table, column in rows:
        made.setdefault(table, set()).add(column)
    assert {t: set(c) for t, c in COLUMNS.items()} == made


async def test_reopening_does_not_migrate_again_and_keeps_partitions(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url, partitions=12)
    await store.write([CatalogChanged("orders", 12, 1)])
    await store.close()
    store = await PostgresStorage.open(pg_url)  # None: whatever the database has
    try:
        assert store.partitions == 12
        assert (await store.load()).catalog == {"orders": 12}
    finally:
        await store.close()
    assert [r[0] for r in await _sql(pg_url, "SELECT count(*) FROM partition_leases")] == [12]


async def test_coordinators_starting_together_migrate_once(pg_url: str) -> None:
    stores = await asyncio.gather(*(PostgresStorage.open(pg_url, partitions=16)
                                    for _ in range(4)))
    try:
        assert {s.partitions for s in stores} == {16}
    finally:
        for store in stores:
            await store.close()
    assert [r[0] for r in await _sql(pg_url, "SELECT count(*) FROM partition_leases")] == [16]


async def test_other_partitions_are_refused_in_one_line_changing_nothing(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url, partitions=8)
    await store.close()
    message = await _refusal(pg_url, partitions=16)
    assert message == (f"database {_redacted(pg_url)} was created with 8 partitions; it "
                       f"cannot be opened with 16 (the partitions of a database are fixed "
                       f"when it is created)")
    assert [r[0] for r in await _sql(pg_url, "SELECT value FROM meta WHERE key = "
                                             "'partitions'")] == [8]
    assert "1..4096" in await _refusal(pg_url, partitions=0)


async def test_newer_schema_is_refused_naming_database_and_versions(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url)
    await store.close()
    await _sql(pg_url, "UPDATE meta SET value = $1 WHERE key = 'schema_version'",
               SCHEMA_VERSION + 1)
    message = await _refusal(pg_url)
    assert message.startswith(f"database {_redacted(pg_url)} has schema version "
                              f"{SCHEMA_VERSION + 1}, ")
    assert f"up to {SCHEMA_VERSION}" in message and "never downgraded" in message
    assert [r[0] for r in await _sql(pg_url, "SELECT value FROM meta WHERE key = "
                                             "'schema_version'")] == [SCHEMA_VERSION + 1]


async def test_missing_table_or_column_is_refused_naming_it(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url)
    await store.close()
    await _sql(pg_url, "ALTER TABLE checkpoints DROP COLUMN partition")
    with pytest.raises(CorruptDatabaseError) as caught:
        await PostgresStorage.open(pg_url)
    assert str(caught.value) == (
        f"database {_redacted(pg_url)}: table checkpoints: column(s) partition missing "
        f"(schema version {SCHEMA_VERSION} has them)")
    await _sql(pg_url, "ALTER TABLE checkpoints ADD COLUMN partition INTEGER")
    await _sql(pg_url, "DROP TABLE last_commits")
    with pytest.raises(CorruptDatabaseError, match="table last_commits: the table is missing"):
        await PostgresStorage.open(pg_url)


async def test_a_row_in_the_wrong_partition_or_undecodable_is_named(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url, partitions=8)
    try:
        await store.write([group("g1", "Stable", 2, member("m1", b"a"))])
        right = partition_of("g1", 8)
        await _sql(pg_url, "UPDATE groups SET partition = $1", (right + 1) % 8)
        with pytest.raises(CorruptDatabaseError) as caught:
            await store.load()
        assert str(caught.value) == (
            f"database {_redacted(pg_url)}: table groups, row group_id='g1': column "
            f"partition: {(right + 1) % 8}, but the group maps to partition {right} of 8")
        await _sql(pg_url, "UPDATE groups SET partition = $1, members = $2", right,
                   b"\xc1 garbage")
        with pytest.raises(CorruptDatabaseError, match=r"table groups, row group_id='g1' "
                           r"generation_id=2: column members \(generation 2\) is not valid"):
            await store.load()
    finally:
        await store.close()


async def test_load_partition_loads_one_partition_and_the_global_catalog(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url, partitions=4)
    try:
        ids = [f"group-{i}" for i in range(40)]
        await store.write([CatalogChanged("orders", 6, 3)]
                          + [group(g, "Stable", 1, member("m-" + g, b"x")) for g in ids]
                          + [CheckpointsWritten(g, (("orders", 0, i),), committed_ms=10 + i)
                             for i, g in enumerate(ids)])
        seen: list[str] = []
        for p in range(4):
            snap = await store.load_partition(p)
            mine = sorted(g for g in ids if partition_of(g, 4) == p)
            assert sorted(g.group_id for g in snap.groups) == mine
            assert sorted(snap.checkpoints) == mine
            assert sorted(snap.last_commit_ms) == mine
            assert snap.catalog == {"orders": 6} and snap.resources_epoch == 3
            seen.extend(mine)
        assert sorted(seen) == sorted(ids)
        everything = await store.load()
        assert len(everything.groups) == 40
        with pytest.raises(ValueError, match=r"partition 4 is outside 0\.\.3"):
            await store.load_partition(4)
    finally:
        await store.close()


async def test_rebalances_are_the_newest_journal_rows_first(pg_url: str) -> None:
    store = await PostgresStorage.open(pg_url)
    try:
        entries = [dataclasses.replace(JOURNAL, generation_id=gen) for gen in (1, 2, 3)]
        await store.write(entries)
        rows = await store.rebalances("g1", 2)
        assert [r["generation_id"] for r in rows] == [3, 2]
        assert await store.rebalances("other", 5) == []
        with pytest.raises(ValueError, match="limit must be 0 or more, got -1"):
            await store.rebalances("g1", -1)
    finally:
        await store.close()


async def test_unreachable_database_names_the_host_never_the_password(
        postgres_server: PostgresServer) -> None:
    port = free_port()
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/groupcoord"
    message = await _refusal(url)
    assert message.startswith(f"cannot connect to PostgreSQL at postgresql://postgres:***@"
                              f"127.0.0.1:{port}/groupcoord: ")
    assert "refused" in message.lower()
    # Several hosts: every one is named, none of the password.
    url = (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port},127.0.0.1:{free_port()}"
           f"/groupcoord")
    message = await _refusal(url, connect_timeout=5)
    assert "127.0.0.1:" + str(port) in message
    # A wrong password: the server says so; the password stays out.
    url = postgres_server.url("postgres", password="not-" + PASSWORD)
    message = await _refusal(url)
    assert "password authentication failed" in message
    assert "not-" + PASSWORD not in message
    # A database that does not exist.
    message = await _refusal(postgres_server.url("no_such_db"))
    assert 'database "no_such_db" does not exist' in message


async def test_a_lost_connection_fails_one_write_and_is_made_again(
        postgres_server: PostgresServer, pg_url: str) -> None:
    """PostgreSQL restarted under an open store: the next write fails (one line, no
    password), the one after reconnects; nothing committed was lost."""
    store = await PostgresStorage.open(pg_url, partitions=8)
    try:
        await store.write([CheckpointsWritten("g", (("s", 0, 1),))])
        postgres_server.stop()
        postgres_server.start()
        with pytest.raises(StorageError) as caught:
            await store.write([CheckpointsWritten("g", (("s", 1, 2),))])
        message = str(caught.value)
        assert message.startswith(f"write to {_redacted(pg_url)} failed: ")
        assert "\n" not in message and PASSWORD not in message
        await store.write([CheckpointsWritten("g", (("s", 2, 3),))])
        assert (await store.load()).checkpoints == {"g": {("s", 0): 1, ("s", 2): 3}}
    finally:
        await store.close()


def test_sqlite_serving_does_not_need_asyncpg() -> None:
    """asyncpg is imported on the first PostgreSQL connection only."""
    code = (
        "import sys, asyncio\n"
        "sys.modules['asyncpg'] = None  # as if not installed\n"
        "import coordinator.serve, coordinator.storage.postgres, coordinator.storage.leases\n"
        "from coordinator.storage.postgres import PostgresStorage\n"
        "from coordinator.storage.sqlite import StorageError\n"
        "try:\n"
        "    asyncio.run(PostgresStorage.open('postgresql://u:pw@127.0.0.1:1/db'))\n"
        "except StorageError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == ("a postgresql:// database needs the asyncpg package: "
                           "pip install 'asyncpg>=0.29'")


async def test_a_load_that_fails_on_the_server_is_not_called_a_damaged_database(
        pg_url: str) -> None:
    """A damaged database stops the server for good (exit 2); a statement the server
    cancelled (here: a lock held past ``statement_timeout``) must not be taken for one:
    it is a plain StorageError, which a restart may cure."""
    store = await PostgresStorage.open(pg_url + "&statement_timeout=300", partitions=8)
    locker = await asyncpg.connect(pg_url)
    try:
        await store.write([group("g1", "Stable", 1, member("m1", b"a"))])
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE groups IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StorageError) as caught:
            await store.load()
        await tx.rollback()
        assert not isinstance(caught.value, CorruptDatabaseError)
        assert str(caught.value).startswith(
            f"database {_redacted(pg_url)}&statement_timeout=300: table groups: cannot "
            f"read it: canceling statement due to statement timeout")
        assert len((await store.load()).groups) == 1
        await _sql(pg_url, "ALTER TABLE groups DROP COLUMN leader")
        with pytest.raises(CorruptDatabaseError, match="table groups: cannot read it: "
                                                       "column \"leader\" does not exist"):
            await store.load()
    finally:
        await locker.close()
        await store.close()


async def test_a_version_1_catalog_is_migrated_with_the_default_weights_and_zones(
        pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(PG_MIGRATIONS[0])
        await conn.execute("INSERT INTO meta VALUES ('schema_version', 1), "
                           "('resources_epoch', 3)")
        await conn.execute("INSERT INTO catalog VALUES ('orders', 12)")
    finally:
        await conn.close()
    store = await PostgresStorage.open(pg_url, partitions=8)
    try:
        snapshot = await store.load()
        assert (snapshot.catalog, snapshot.placement, snapshot.resources_epoch) == (
            {"orders": 12}, {}, 3)
        hot = Placement(zones=Zones(("eu-1a",)))
        await store.write([CatalogChanged("orders", 12, 4, hot)])
        assert await store.catalog_state() == ({"orders": 12}, {"orders": hot}, 4)
    finally:
        await store.close()


async def test_a_version_2_database_keeps_its_checkpoints_without_a_sequence(
        pg_url: str) -> None:
    """Migration 3 adds each checkpoint's commit sequence; rows written before hold
    none, and a commit after the upgrade stores its own."""
    conn = await asyncpg.connect(pg_url)
    try:
        for script in PG_MIGRATIONS[:2]:
            await conn.execute(script)
        await conn.execute("INSERT INTO meta VALUES ('schema_version', 2)")
        await conn.execute("INSERT INTO checkpoints VALUES ('g', 's', 0, $1, $2, 1000, "
                           "'m-1', 3)", zlib.crc32(b"g") % 8, encode(11))
    finally:
        await conn.close()
    store = await PostgresStorage.open(pg_url, partitions=8)
    try:
        assert (await store.load()).checkpoint_meta == {
            "g": {("s", 0): CheckpointMeta(1000, "m-1", 3, None)}}
        await store.write([CheckpointsWritten("g", (("s", 1, 12),), 1001, "m-1", 3, 8)])
        assert (await store.load()).checkpoint_meta == {
            "g": {("s", 0): CheckpointMeta(1000, "m-1", 3, None),
                  ("s", 1): CheckpointMeta(1001, "m-1", 3, 8)}}
    finally:
        await store.close()
