"""A damaged database is refused with one line naming the file, table, row and problem.

Each test writes a real database through :class:`Storage`, damages it with a
plain ``sqlite3`` connection (as a bad disk, a hand edit or a foreign tool
would), and checks that opening or loading it raises :class:`StorageError`
whose message an operator can act on, and that nothing is half-loaded.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from coordinator.core.records import CatalogChanged, CheckpointsWritten, GroupRecord, MemberRecord
from coordinator.storage.schema import SCHEMA_VERSION
from coordinator.storage.sqlite import CorruptDatabaseError, Storage, StorageError
from protocol.codec import encode


def _member(mid: str) -> MemberRecord:
    return MemberRecord(mid, None, "c-" + mid, "127.0.0.1", 10_000, 30_000,
                        (("range", b"meta"),), b"assigned")


GOOD = GroupRecord("good", "Stable", 2, "resources", "range", "m1", (_member("m1"),), 1_000)
ORDERS = GroupRecord("orders", "Stable", 7, "resources", "range", "a", (_member("a"),), 2_000)


async def _database(path: Path) -> None:
    storage = await Storage.open(path)
    try:
        await storage.write([GOOD, ORDERS, CheckpointsWritten("orders", (("s", 0, 5),)),
                             CatalogChanged("s", 4, 1)])
    finally:
        await storage.close()


def _edit(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    con = sqlite3.connect(path)
    try:
        for sql, params in statements:
            con.execute(sql, params)
        con.commit()
    finally:
        con.close()


async def _load_error(path: Path) -> str:
    """Open and load ``path``; returns the one-line message of the refusal."""
    with pytest.raises(StorageError) as caught:
        storage = await Storage.open(path)
        try:
            await storage.load()
        finally:
            await storage.close()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"database {path}: "), message
    return message


def _members_blob(fields: list[object]) -> bytes:
    return encode([fields])


_GOOD_FIELDS: list[object] = ["a", None, "c-a", "127.0.0.1", 10_000, 30_000,
                              [["range", b"meta"]], b"assigned"]


@pytest.mark.parametrize(("damage", "expected"), [
    pytest.param(
        ("UPDATE groups SET members = ? WHERE group_id = 'orders'", (b"\xc1\xff garbage",)),
        "table groups, row group_id='orders' generation_id=7: column members (generation 7) "
        "is not valid msgpack", id="garbage-members-blob"),
    pytest.param(
        ("UPDATE groups SET members = ? WHERE group_id = 'orders'",
         (encode([1, 2, 3]),)),
        "table groups, row group_id='orders' generation_id=7: column members (generation 7): "
        "member 0: expected an array of 8 to 13 fields, got 1", id="members-wrong-shape"),
    pytest.param(
        ("UPDATE groups SET members = ? WHERE group_id = 'orders'",
         (_members_blob([*_GOOD_FIELDS[:4], "10s", *_GOOD_FIELDS[5:]]),)),
        "member 0 ('a'): session_timeout_ms: expected int, got '10s'",
        id="member-field-wrong-type"),
    pytest.param(
        ("UPDATE groups SET members = ? WHERE group_id = 'orders'",
         (_members_blob([*_GOOD_FIELDS[:7], 12]),)),
        "member 0 ('a'): assignment: expected bytes or null, got 12",
        id="assignment-not-bytes"),
    pytest.param(
        ("UPDATE groups SET state = 'Sleeping' WHERE group_id = 'orders'", ()),
        "table groups, row group_id='orders' generation_id=7: column state: unknown group "
        "state 'Sleeping'", id="unknown-state"),
    pytest.param(
        ("UPDATE groups SET generation_id = 'seven' WHERE group_id = 'orders'", ()),
        "row group_id='orders' generation_id='seven': column generation_id: expected INTEGER, "
        "got str 'seven'", id="text-in-integer-column"),
    pytest.param(
        # SQLite lets a NULL into a TEXT PRIMARY KEY (a long-standing quirk).
        ("INSERT INTO groups VALUES (NULL, 'Empty', 1, NULL, NULL, NULL, 0, ?)", (encode([]),)),
        "table groups, row group_id=None generation_id=1: column group_id is NULL",
        id="null-group-id"),
    pytest.param(
        ("UPDATE groups SET protocol_name = 'sticky' WHERE group_id = 'orders'", ()),
        "generation 7: protocol 'sticky' is not among the protocols of member 'a'",
        id="protocol-no-member-supports"),
    pytest.param(
        ("UPDATE checkpoints SET value = ? WHERE group_id = 'orders'", (b"\x92\x01",)),
        "table checkpoints, row group_id='orders' resource_set='s' idx=0: column value is "
        "not valid msgpack", id="truncated-checkpoint"),
    pytest.param(
        ("UPDATE checkpoints SET value = ? WHERE group_id = 'orders'", (encode([1, 2]),)),
        "column value: expected a msgpack scalar, got [1, 2]", id="checkpoint-not-scalar"),
    pytest.param(
        ("UPDATE checkpoints SET idx = 'zero' WHERE group_id = 'orders'", ()),
        "row group_id='orders' resource_set='s' idx='zero': column idx: expected INTEGER",
        id="checkpoint-index-text"),
    pytest.param(
        ("UPDATE catalog SET partitions = 0 WHERE name = 's'", ()),
        "table catalog, row name='s': column partitions: 0 is outside 1..", id="catalog-zero"),
    pytest.param(
        ("UPDATE meta SET value = 'x' WHERE key = 'resources_epoch'", ()),
        "table meta, row key='resources_epoch': column value: expected INTEGER",
        id="epoch-text"),
])
async def test_a_bad_row_is_named(tmp_path: Path, damage: tuple[str, tuple[object, ...]],
                                  expected: str) -> None:
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, damage)
    message = await _load_error(path)
    assert expected in message, message


async def test_a_null_in_a_not_null_column_edited_by_hand(tmp_path: Path) -> None:
    """A table rebuilt without its constraints (a hand edit) can hold NULLs anywhere."""
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path,
          ("ALTER TABLE groups RENAME TO old_groups", ()),
          ("CREATE TABLE groups (group_id TEXT PRIMARY KEY, state TEXT, generation_id INTEGER, "
           "protocol_type TEXT, protocol_name TEXT, leader TEXT, state_timestamp_ms INTEGER, "
           "members BLOB)", ()),
          ("INSERT INTO groups SELECT * FROM old_groups", ()),
          ("DROP TABLE old_groups", ()),
          ("UPDATE groups SET state_timestamp_ms = NULL WHERE group_id = 'orders'", ()))
    message = await _load_error(path)
    assert "table groups, row group_id='orders' generation_id=7: " \
           "column state_timestamp_ms is NULL" in message


async def test_the_error_is_a_storage_error_with_its_parts(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, ("UPDATE groups SET state = '' WHERE group_id = 'good'", ()))
    storage = await Storage.open(path)
    try:
        with pytest.raises(CorruptDatabaseError) as caught:
            await storage.load()
    finally:
        await storage.close()
    err = caught.value
    assert (err.path, err.table, err.key) == (str(path), "groups",
                                              "group_id='good' generation_id=2")
    assert err.problem.startswith("column state: unknown group state ''")


async def test_a_missing_table_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, ("DROP TABLE checkpoints", ()))
    with pytest.raises(CorruptDatabaseError) as caught:
        await Storage.open(path)
    assert str(caught.value) == (f"database {path}: table checkpoints: the table is missing "
                                 f"(schema version {SCHEMA_VERSION} has it)")


async def test_a_missing_column_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, ("ALTER TABLE catalog DROP COLUMN partitions", ()))
    with pytest.raises(CorruptDatabaseError, match=r"table catalog: column\(s\) partitions "
                                                   r"missing"):
        await Storage.open(path)


@pytest.mark.parametrize("content", [
    pytest.param(b"this is a text file, not a database\n" * 200, id="text"),
    pytest.param(b"SQLite format 3\x00" + b"\xff" * 4000, id="bad-header"),
])
async def test_a_file_that_is_not_sqlite_is_refused_at_open(tmp_path: Path,
                                                            content: bytes) -> None:
    path = tmp_path / "g.db"
    path.write_bytes(content)
    with pytest.raises(StorageError) as caught:
        await Storage.open(path)
    message = str(caught.value)
    assert message.startswith(f"database {path}: cannot use it: "), message
    assert "not a database" in message or "malformed" in message, message
    # Refusing it changed nothing.
    assert path.read_bytes() == content


async def test_a_damaged_page_is_named_by_table(tmp_path: Path) -> None:
    """Overwrite the pages after the schema page: the tables' b-trees are garbage."""
    path = tmp_path / "g.db"
    storage = await Storage.open(path)
    try:
        await storage.write([GroupRecord(f"g{i:04}", "Empty", 1, "resources", None, None, (), i)
                             for i in range(300)])
    finally:
        await storage.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) > 4 * page
    data[page:] = b"\x5a" * (len(data) - page)
    path.write_bytes(bytes(data))
    message = await _load_error(path)
    assert "malformed" in message or "not a database" in message, message


async def test_nothing_is_returned_when_a_later_row_is_bad(tmp_path: Path) -> None:
    """Rows before the bad one decode fine; load still refuses as a whole."""
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, ("UPDATE catalog SET partitions = -3", ()))
    message = await _load_error(path)
    assert "table catalog, row name='s'" in message


async def test_a_newer_schema_names_file_and_versions(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    await _database(path)
    _edit(path, (f"PRAGMA user_version = {SCHEMA_VERSION + 3}", ()))
    with pytest.raises(StorageError, match=f"database {path} has schema version "
                                           f"{SCHEMA_VERSION + 3}"):
        await Storage.open(path)

