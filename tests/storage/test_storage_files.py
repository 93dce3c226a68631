"""The database file under the storage: one holder, writable, still there, real causes.

A file deleted or replaced while open must fail the
next write (before anything is acknowledged) and :meth:`Storage.check`; a
second :class:`Storage` on the same file is refused naming the holder; a
full database reports SQLite's cause, never the failed rollback behind it.
(Read-only files and real processes: tests/e2e/test_e2e_storage_files.py.)
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from coordinator.core.records import CatalogChanged, CheckpointsWritten
from coordinator.storage.sqlite import Storage, StorageError
from pipeline.sources import open_sqlite


def checkpoints(group_id: str, count: int, value: str = "v") -> CheckpointsWritten:
    return CheckpointsWritten(group_id, tuple(("s", i, value * 100) for i in range(count)))


async def scalar(storage: Storage, sql: str) -> int:
    async with storage._db.execute(sql) as cur:
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# ---------------------------------------------------------------- item 15: the real cause


async def test_a_full_database_reports_sqlite_full_not_the_failed_rollback(
        tmp_path: Path) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL; the ROLLBACK that
    followed failed ("no transaction is active") and its error replaced the cause."""
    storage = await Storage.open(tmp_path / "g.db")
    try:
        pages = await scalar(storage, "PRAGMA page_count")
        # The portable way to fill a database: cap its size at what it has now.
        await storage._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageError) as caught:
            await storage.write([checkpoints("g", 2_000)])
        message = str(caught.value)
        assert message == (f"write to {tmp_path / 'g.db'} failed: database or disk is full "
                           "(SQLITE_FULL)"), message
        assert "rollback" not in message
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        # Nothing of the batch is there, and with room again the storage writes.
        assert await scalar(storage, "SELECT count(*) FROM checkpoints") == 0
        await storage._db.execute(f"PRAGMA max_page_count = {pages * 1000}")
        await storage.write([checkpoints("g", 2_000)])
        assert await scalar(storage, "SELECT count(*) FROM checkpoints") == 2_000
    finally:
        await storage.close()


# ---------------------------------------------------------------- item 14: one holder


async def test_a_second_storage_on_the_same_file_is_refused_naming_the_holder(
        tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    link = tmp_path / "link.db"
    link.symlink_to(path.name)
    first = await Storage.open(path)
    try:
        for other in (path, link):
            with pytest.raises(StorageError) as caught:
                await Storage.open(other)
            message = str(caught.value)
            assert message.startswith(f"database {other} is in use by another process"), message
            if Path("/proc/locks").exists():
                assert f"(pid {os.getpid()})" in message, message
            assert "\n" not in message
        await first.write([CatalogChanged("orders", 3, 1)])
    finally:
        await first.close()
    # Released with the close: the next holder opens it and sees the write.
    second = await Storage.open(link)
    try:
        assert (await second.load()).catalog == {"orders": 3}
    finally:
        await second.close()


async def test_readers_keep_working_while_a_storage_holds_the_file(tmp_path: Path) -> None:
    """``groupcoord journal export`` and ``analyze`` read a running server's file."""
    path = tmp_path / "g.db"
    storage = await Storage.open(path)
    try:
        await storage.write([CatalogChanged("orders", 3, 1)])
        journal = open_sqlite(path)
        assert journal.path == path
        con = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)
        try:
            assert con.execute("SELECT name, partitions FROM catalog").fetchall() == [
                ("orders", 3)]
        finally:
            con.close()
        await storage.write([CatalogChanged("users", 2, 2)])
    finally:
        await storage.close()


# ---------------------------------------------------------------- item 13: still the file


@pytest.mark.parametrize("removed", [("",), ("", "-wal"), ("", "-wal", "-shm")],
                         ids=["db", "db+wal", "db+wal+shm"])
async def test_a_deleted_database_fails_the_next_write(tmp_path: Path,
                                                       removed: tuple[str, ...]) -> None:
    path = tmp_path / "g.db"
    storage = await Storage.open(path)
    try:
        await storage.write([CatalogChanged("orders", 3, 1)])
        storage.check()
        for suffix in removed:
            os.unlink(f"{path}{suffix}")
        with pytest.raises(StorageError) as caught:
            storage.check()
        assert str(caught.value).startswith(
            f"database {path}: the file was deleted while the server had it open"), caught.value
        with pytest.raises(StorageError, match="the file was deleted"):
            await storage.write([CatalogChanged("users", 2, 2)])
    finally:
        await storage.close()


async def test_a_replaced_database_fails_the_next_write(tmp_path: Path) -> None:
    """Renamed away, another file moved in: the path no longer names the open file."""
    path = tmp_path / "g.db"
    storage = await Storage.open(path)
    try:
        await storage.write([CatalogChanged("orders", 3, 1)])
        os.rename(path, tmp_path / "old.db")
        with pytest.raises(StorageError, match="the file was renamed or removed"):
            await storage.write([CatalogChanged("users", 2, 2)])
        (tmp_path / "other.db").write_bytes(b"")
        os.rename(tmp_path / "other.db", path)
        with pytest.raises(StorageError) as caught:
            await storage.write([CatalogChanged("users", 2, 2)])
        assert str(caught.value).startswith(
            f"database {path}: the path names another file now: the database was replaced "
            "while the server had it open"), caught.value
    finally:
        await storage.close()


async def test_a_removed_wal_fails_the_next_write_and_close_keeps_what_it_held(
        tmp_path: Path) -> None:
    """The WAL holds acknowledged commits not yet checkpointed into the file. Removed,
    the next write fails; closing (the file itself still there) checkpoints the open,
    unlinked WAL into the file, so nothing acknowledged before is lost."""
    path = tmp_path / "g.db"
    storage = await Storage.open(path)
    try:
        await storage.write([checkpoints("g", 10, "a")])
        os.unlink(f"{path}-wal")
        with pytest.raises(StorageError) as caught:
            await storage.write([CatalogChanged("orders", 3, 1)])
        assert str(caught.value) == (
            f"database {path}: its write-ahead log {path}-wal was removed while the server "
            "had it open; nothing written from now on would be seen by the next start")
    finally:
        await storage.close()
    reopened = await Storage.open(path)
    try:
        assert len((await reopened.load()).checkpoints["g"]) == 10
    finally:
        await reopened.close()


async def test_closing_a_replaced_database_leaves_the_replacement_s_files_alone(
        tmp_path: Path) -> None:
    """SQLite's close deletes ``-wal`` and ``-shm`` by name; after the file was replaced
    (and a new server opened the replacement), those names are the new server's."""
    path = tmp_path / "g.db"
    old = await Storage.open(path)
    await old.write([CatalogChanged("orders", 3, 1)])
    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{path}{suffix}")
    new = await Storage.open(path)
    try:
        await new.write([CatalogChanged("users", 2, 1)])
        await old.close()
        assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
        new.check()
        await new.write([CatalogChanged("users", 4, 2)])
    finally:
        await new.close()
    reopened = await Storage.open(path)
    try:
        assert (await reopened.load()).catalog == {"users": 4}
    finally:
        await reopened.close()


async def test_an_sqlite_url_names_the_same_file_as_a_path(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    storage = await Storage.open("sqlite:///relative.db")     # SQLAlchemy's spelling
    await storage.close()
    assert (tmp_path / "relative.db").exists()
    storage = await Storage.open(f"sqlite:///{tmp_path}/absolute.db")
    await storage.close()
    assert (tmp_path / "absolute.db").exists()
    with pytest.raises(StorageError, match="sqlite:///PATH"):
        await Storage.open("sqlite://host/x.db")
