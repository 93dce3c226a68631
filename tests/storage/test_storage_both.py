"""The record round-trips of test_storage_sqlite.py, run against both stores.

Both stores are behind the same seam (open, load, write in one transaction,
journal, generations) and must give back the same durable state; they also
store the same bytes (test_the_two_stores_hold_the_same_bytes).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from test_storage_sqlite import group, member

from coordinator import offload
from coordinator.core.records import (
    CatalogChanged,
    CheckpointMeta,
    CheckpointsWritten,
    GroupDeleted,
    JournalEntry,
    Record,
    Snapshot,
)
from coordinator.core.replay import fold
from coordinator.storage.postgres import PostgresStorage
from coordinator.storage.sqlite import CorruptDatabaseError, Storage, StorageError
from protocol.catalog import Placement, Weights, Zones

AnyStore = Storage | PostgresStorage
Opener = Callable[[], Awaitable[AnyStore]]


@pytest.fixture(params=["sqlite", "postgres"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens the test's database (a new one per test), closing all it opened at the end."""
    opened: list[AnyStore] = []
    if request.param == "sqlite":
        async def open_store() -> AnyStore:
            opened.append(await Storage.open(tmp_path / "g.db"))
            return opened[-1]
    else:
        url = request.getfixturevalue("pg_url")

        async def open_store() -> AnyStore:
            opened.append(await PostgresStorage.open(url, partitions=8))
            return opened[-1]
    yield open_store
    for store in opened:
        await store.close()


JOURNAL = JournalEntry(group_id="g1", generation_id=2, protocol_type="resources",
                       protocol_name="sticky", leader="m1",
                       members=(("m1", None, "c1"), ("m2", "i2", "c2")), joined=("m2",),
                       left=("m0",), reason="join", started_ms=100, ended_ms=250,
                       assignments={"m1": b"a", "m2": b"b"})


async def test_group_records_round_trip_and_fill_generations(opener: Opener) -> None:
    storage = await opener()
    formed = group("g1", "CompletingRebalance", 3, member("m1"), member("m2", instance="i2"))
    await storage.write([formed])
    assert (await storage.load()).groups == (formed,)
    gens = await storage.generations("g1")
    assert [(g["generation_id"], g["assignments"], g["member_count"]) for g in gens] == [
        (3, None, 2)]
    assert gens[0]["members"] == [["m1", None, "c-m1"], ["m2", "i2", "c-m2"]]
    stable = group("g1", "Stable", 3, member("m1", b"a1"), member("m2", b"", instance="i2"))
    await storage.write([stable])
    assert (await storage.load()).groups == (stable,)
    gens = await storage.generations("g1")
    assert len(gens) == 1
    assert gens[0]["assignments"] == {"m1": b"a1", "m2": b""}
    assert gens[0]["formed_ms"] == formed.state_timestamp_ms
    empty = group("g1", "Empty", 4)
    await storage.write([empty])
    assert (await storage.load()).groups == (empty,)
    assert [g["generation_id"] for g in await storage.generations("g1")] == [3]


async def test_a_static_members_incarnation_round_trips(opener: Opener) -> None:
    # v1.1 (incarnations): kept with the member across a restart, with or
    # without an owner; a member without one loads as before.
    storage = await opener()
    stable = group("g1", "Stable", 2, member("m1", b"a"),
                   replace(member("m2", b"b", instance="i2"), incarnation="9f0c",
                           incarnation_ms=1_700_000_000_123),
                   replace(member("m3", b"", instance="i3"), owner="alice",
                           incarnation="77aa"))
    await storage.write([stable])
    assert (await storage.load()).groups == (stable,)


async def test_checkpoints_written_and_deleted_with_commit_times(opener: Opener) -> None:
    storage = await opener()
    await storage.write([CheckpointsWritten("g1", (
        ("orders", 0, 17), ("orders", 1, b"\x00\x01"), ("users", 3, "s"),
        ("users", 4, 1.5), ("users", 5, True), ("users", 6, 2**63 - 1)), committed_ms=50)])
    await storage.write([CheckpointsWritten("g1", (("orders", 0, 18), ("users", 3, None)),
                                            committed_ms=40),
                         CheckpointsWritten("g2", (("orders", 0, -1),), committed_ms=70),
                         CheckpointsWritten("g3", (("orders", 0, 1),), committed_ms=80),
                         CheckpointsWritten("g3", (("orders", 0, None),), committed_ms=90)])
    snapshot = await storage.load()
    assert snapshot.checkpoints == {
        "g1": {("orders", 0): 18, ("orders", 1): b"\x00\x01", ("users", 4): 1.5,
               ("users", 5): True, ("users", 6): 2**63 - 1},
        "g2": {("orders", 0): -1},
    }
    # The largest commit time wins; a group without checkpoints has none to expire.
    assert snapshot.last_commit_ms == {"g1": 50, "g2": 70}


async def test_catalog_changes_and_epoch(opener: Opener) -> None:
    storage = await opener()
    await storage.write([CatalogChanged("orders", 12, 1), CatalogChanged("users", 4, 2)])
    await storage.write([CatalogChanged("orders", 24, 3), CatalogChanged("users", None, 4)])
    snapshot = await storage.load()
    assert snapshot.catalog == {"orders": 24}
    assert snapshot.resources_epoch == 4


HOT = Placement(Weights(0.5, ((3, 40.0), (7, 12.5))),
                Zones(("eu-1a", "eu-1b"), ((3, ("eu-1a",)), (5, None))))


async def test_catalog_weights_and_zones_round_trip_and_survive_a_reopen(
        opener: Opener) -> None:
    storage = await opener()
    records: list[Record] = [
        CatalogChanged("orders", 12, 1, HOT),
        CatalogChanged("users", 4, 2, Placement(zones=Zones(("eu-1c",)))),
        CatalogChanged("plain", 2, 3),
        CatalogChanged("users", 4, 4),                # back to the default
        CatalogChanged("orders", 24, 5, HOT),         # resized, kept
    ]
    await storage.write(records)
    loads = [await storage.load()]
    if isinstance(storage, PostgresStorage):
        # Another coordinator's store reads it too (SQLite's restart is in
        # tests/admin/test_catalog_placement.py: one server per file).
        loads.append(await (await opener()).load())
    for snapshot in loads:
        assert snapshot.catalog == {"orders": 24, "plain": 2, "users": 4}
        assert snapshot.placement == {"orders": HOT}
        assert snapshot.placement == fold(records).placement
        assert snapshot.resources_epoch == 5
    await storage.write([CatalogChanged("orders", None, 6)])
    assert (await storage.load()).placement == {}


@pytest.mark.parametrize(("column", "value", "problem"), [
    ("weights", '{"default": -2}', "column weights.default: must be a finite number >= 0"),
    ("zones", '{"overrides": [[30, ["eu-1a"]]]}',
     "column zones.overrides[0][0]: index 30 is beyond the set's 12 partitions"),
])
async def test_a_damaged_catalog_row_is_named_and_nothing_is_loaded(
        opener: Opener, request: pytest.FixtureRequest, tmp_path: Path, column: str,
        value: str, problem: str) -> None:
    storage = await opener()
    await storage.write([CatalogChanged("orders", 12, 1, HOT)])
    sql = f"UPDATE catalog SET {column} = '{value}'"
    if isinstance(storage, Storage):
        with sqlite3.connect(tmp_path / "g.db") as con:
            con.execute(sql)
    else:
        conn = await asyncpg.connect(request.getfixturevalue("pg_url"))
        await conn.execute(sql)
        await conn.close()
    with pytest.raises(CorruptDatabaseError) as caught:
        await storage.load()
    assert f"table catalog, row name='orders': {problem}" in str(caught.value)
    if isinstance(storage, PostgresStorage):   # the cluster's catalog read checks it too
        with pytest.raises(CorruptDatabaseError) as caught:
            await storage.catalog_state()
        assert f"table catalog, row name='orders': {problem}" in str(caught.value)


async def test_group_deleted_removes_group_checkpoints_and_generations(opener: Opener) -> None:
    storage = await opener()
    await storage.write([group("g1", "Stable", 1, member("m1", b"x")),
                         group("g2", "Stable", 1, member("m9", b"y")),
                         CheckpointsWritten("g1", (("orders", 0, 1),)),
                         CheckpointsWritten("g2", (("orders", 0, 2),)), JOURNAL])
    await storage.write([GroupDeleted("g1")])
    snapshot = await storage.load()
    assert [g.group_id for g in snapshot.groups] == ["g2"]
    assert snapshot.checkpoints == {"g2": {("orders", 0): 2}}
    assert await storage.generations("g1") == []
    assert len(await storage.journal("g1")) == 1  # the journal keeps the history


async def test_journal_entries_are_appended(opener: Opener) -> None:
    storage = await opener()
    await storage.write([JOURNAL])
    await storage.write([JOURNAL])
    rows = await storage.journal("g1")
    assert len(rows) == 2
    assert rows[0] == {
        "group_id": "g1", "generation_id": 2, "protocol_type": "resources",
        "protocol_name": "sticky", "leader": "m1", "member_count": 2,
        "members": [["m1", None, "c1"], ["m2", "i2", "c2"]], "joined": ["m2"],
        "left": ["m0"], "reason": "join", "started_ms": 100, "ended_ms": 250,
        "assignments": {"m1": b"a", "m2": b"b"},
    }
    assert await storage.journal("other") == []
    assert len(await storage.journal()) == 2
    assert await storage.load() == Snapshot()


async def test_a_committed_write_survives_without_close(opener: Opener,
                                                        request: pytest.FixtureRequest) -> None:
    """What kill -9 leaves: a second connection sees every committed batch.

    SQLite's variant is in test_storage_sqlite.py: a second ``Storage`` on the
    same file is refused there (the exclusive lock), so it reads the file
    through a read-only connection instead."""
    if request.node.callspec.params["opener"] == "sqlite":
        pytest.skip("a second Storage on one SQLite file is refused by design: "
                    "test_storage_sqlite.py::test_a_committed_write_survives_without_close")
    storage = await opener()
    stable = group("g1", "Stable", 1, member("m1", b"a"))
    await storage.write([stable, CheckpointsWritten("g1", (("orders", 0, 5),))])
    snapshot = await (await opener()).load()
    assert snapshot.groups == (stable,)
    assert snapshot.checkpoints == {"g1": {("orders", 0): 5}}


async def test_replay_round_trip_matches_fold(opener: Opener) -> None:
    """records -> storage -> load gives what the core's own fold of them gives."""
    records: list[Record] = [
        CatalogChanged("orders", 4, 1),
        group("g1", "CompletingRebalance", 1, member("m1"), member("m2")),
        group("g1", "Stable", 1, member("m1", b"a"), member("m2", b"b")),
        CheckpointsWritten("g1", (("orders", 0, 10), ("orders", 1, 11))),
        group("g2", "Stable", 5, member("x", b"q", instance="ix")),
        CheckpointsWritten("g1", (("orders", 1, None),)),
        CatalogChanged("users", 2, 2),
        group("g3", "Stable", 1, member("z", b"")),
        GroupDeleted("g3"),
    ]
    storage = await opener()
    for record in records:
        await storage.write([record])
    loaded = await storage.load()
    folded = fold(records)
    assert sorted(loaded.groups, key=lambda g: g.group_id) == sorted(
        folded.groups, key=lambda g: g.group_id)
    assert {k: dict(v) for k, v in loaded.checkpoints.items() if v} == {
        k: dict(v) for k, v in folded.checkpoints.items() if v}
    assert dict(loaded.catalog) == dict(folded.catalog)
    assert loaded.resources_epoch == folded.resources_epoch


async def test_a_failed_batch_writes_nothing(opener: Opener, request: pytest.FixtureRequest,
                                             tmp_path: Path) -> None:
    storage = await opener()
    await storage.write([CatalogChanged("orders", 1, 1)])
    # Make the second statement of the batch fail: the first must not stay.
    if isinstance(storage, Storage):
        con = sqlite3.connect(tmp_path / "g.db")
        con.execute("CREATE TRIGGER boom BEFORE INSERT ON checkpoints "
                    "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
        con.commit()
        con.close()
    else:
        conn = await asyncpg.connect(request.getfixturevalue("pg_url"))
        await conn.execute("""
            CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'disk says no'; END $$;
            CREATE TRIGGER boom BEFORE INSERT ON checkpoints
            FOR EACH ROW EXECUTE FUNCTION boom()""")
        await conn.close()
    with pytest.raises(StorageError, match="disk says no") as caught:
        await storage.write([CatalogChanged("orders", 5, 2),
                             CheckpointsWritten("g1", (("orders", 0, 1),))])
    assert "\n" not in str(caught.value)
    snapshot = await storage.load()
    assert snapshot.catalog == {"orders": 1}
    assert snapshot.resources_epoch == 1


async def _rows(store: AnyStore, sql: str, url: str | None, path: Path) -> list[tuple[Any, ...]]:
    if isinstance(store, Storage):
        con = sqlite3.connect(path)
        try:
            return [tuple(r) for r in con.execute(sql)]
        finally:
            con.close()
    assert url is not None
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_the_two_stores_hold_the_same_bytes(pg_url: str, tmp_path: Path) -> None:
    records: list[Record] = [
        group("g1", "Stable", 3, member("m1", b"a1"), member("m2", b"", instance="i2")),
        CheckpointsWritten("g1", (("orders", 0, 17), ("orders", 1, b"\x00"), ("u", 2, "s"),
                                  ("u", 3, 1.5)), committed_ms=99),
        CatalogChanged("orders", 12, 1, HOT), JOURNAL,
    ]
    lite = await Storage.open(tmp_path / "g.db")
    pg = await PostgresStorage.open(pg_url, partitions=8)
    try:
        await lite.write(records)
        await pg.write(records)
        for sql in (
            "SELECT group_id, state, generation_id, protocol_type, protocol_name, leader, "
            "state_timestamp_ms, members FROM groups ORDER BY group_id",
            "SELECT group_id, generation_id, protocol_type, protocol_name, leader, formed_ms, "
            "member_count, members, assignments FROM generations ORDER BY group_id",
            "SELECT group_id, resource_set, idx, value FROM checkpoints ORDER BY idx",
            "SELECT name, partitions, weights, zones FROM catalog",
            "SELECT group_id, committed_ms FROM last_commits",
            'SELECT group_id, generation_id, protocol_type, protocol_name, leader, '
            'member_count, members, joined, "left", reason, started_ms, ended_ms, assignments '
            "FROM rebalance_journal",
        ):
            assert await _rows(pg, sql, pg_url, tmp_path) == await _rows(
                lite, sql, None, tmp_path / "g.db"), sql
    finally:
        await lite.close()
        await pg.close()


async def test_who_wrote_each_checkpoint_and_when_round_trips(opener: Opener) -> None:
    storage = await opener()
    await storage.write([
        CheckpointsWritten("g1", (("orders", 0, 5), ("orders", 1, 6)), 1_700_000_000_000,
                           "m-1", 4, 2**63 - 1),
        CheckpointsWritten("g1", (("orders", 1, 7),), 1_700_000_000_500, None, -1),
        CheckpointsWritten("g2", (("users", 0, b"x"),)),        # time and writer unknown
    ])
    snapshot = await storage.load()
    assert snapshot.checkpoints["g1"] == {("orders", 0): 5, ("orders", 1): 7}
    assert snapshot.checkpoint_meta == {"g1": {
        ("orders", 0): CheckpointMeta(1_700_000_000_000, "m-1", 4, 2**63 - 1),
        ("orders", 1): CheckpointMeta(1_700_000_000_500, None, -1)}}


async def test_a_large_batch_is_written_in_order_like_a_small_one(opener: Opener) -> None:
    """A batch past ``offload.LARGE_BATCH_ROWS`` is encoded on the worker thread:
    the same rows, in the same order (a later write of a key wins, a delete in
    between removes it), as a batch encoded inline."""
    storage = await opener()
    count = offload.LARGE_BATCH_ROWS + 500
    first = CheckpointsWritten("big", tuple(("s", i, i) for i in range(count)), 1_000)
    second = CheckpointsWritten("big", (("s", 0, None), ("s", 1, "x"), ("s", 1, None),
                                        ("s", 2, None), ("s", 2, "back")), 2_000)
    records: list[Record] = [first, second]
    await storage.write(records)
    loaded = await storage.load()
    assert loaded.checkpoints == fold(records).checkpoints
    big = loaded.checkpoints["big"]
    assert big[("s", 2)] == "back" and ("s", 1) not in big and len(big) == count - 2
