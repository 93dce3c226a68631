"""``groupcoord serve`` on a damaged database: exit 2, one clear line on stderr, no traceback.

Exit status 2 is the one ``serve`` uses for everything an operator must fix
before the server can start (bad settings, an unusable database); 1 is kept
for a storage failure while serving (docs/operations.md, "Exit status").
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from pathlib import Path

from server_harness import GROUPCOORD

from coordinator.core.records import CheckpointsWritten, GroupRecord, MemberRecord
from coordinator.storage.sqlite import Storage

RUN_TIMEOUT_S = 30


def _serve(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
         "--db", str(db)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def _write_database(path: Path) -> None:
    async def write() -> None:
        storage = await Storage.open(path)
        try:
            member = MemberRecord("m1", None, "c", "127.0.0.1", 10_000, 30_000,
                                  (("range", b""),), b"")
            await storage.write([
                GroupRecord("orders", "Stable", 3, "resources", "range", "m1", (member,), 1),
                CheckpointsWritten("orders", (("s", 0, 1),))])
        finally:
            await storage.close()
    asyncio.run(write())


def _damage(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute(sql, params)
        con.commit()
    finally:
        con.close()


def _assert_refused(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "listening on" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if expected in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("groupcoord serve: database "), lines[0]


def test_serve_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    db.write_bytes(b"not sqlite at all\n" * 300)
    _assert_refused(_serve(db), f"database {db}: cannot use it: file is not a database")


def test_serve_refuses_a_database_missing_a_table(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    _write_database(db)
    _damage(db, "DROP TABLE catalog")
    _assert_refused(_serve(db), f"database {db}: table catalog: the table is missing")


def test_serve_refuses_a_database_with_a_bad_row(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    _write_database(db)
    _damage(db, "UPDATE groups SET members = ? WHERE group_id = 'orders'", (b"\xc1garbage",))
    _assert_refused(_serve(db), f"database {db}: table groups, row group_id='orders' "
                                "generation_id=3: column members (generation 3) is not valid "
                                "msgpack")
