"""The database file under a real ``groupcoord serve``.

- 13: the file (or its WAL) deleted while the server runs: the next commit is
  not acknowledged, ``/readyz`` stops answering ready, the server exits 1;
  an idle server notices by itself.
- 14: a second server on the same file exits 2 with one line naming the file
  and the first server's pid; readers (``groupcoord journal export``) keep
  working beside the running server.
- 15: a file the server may not write is refused at start (exit 2, one line);
  a full filesystem is reported as such, not as the failed rollback behind it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from server_harness import GROUPCOORD, ServerProcess, StartServer, wait_until

RUN_TIMEOUT_S = 20
#: the idle check runs every second; a loaded machine gets some slack.
NOTICE_S = 10


def serve_args(db: Path) -> list[str]:
    return [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--db", str(db)]


def only_line(stderr: str, expected: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if expected in line]
    assert len(lines) == 1, stderr
    return lines[0]


async def put_catalog(http: aiohttp.ClientSession, url: str) -> None:
    async with http.put(f"{url}/v1/resources/orders", json={"partitions": 1000}) as resp:
        assert resp.status == 200, await resp.text()


async def call(http: aiohttp.ClientSession, url: str, api: str,
               body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{url}/v1/{api}", data=msgpack.packb(body, use_bin_type=True),
                         headers={"Content-Type": "application/msgpack"}) as resp:
        assert resp.status == 200, await resp.read()
        doc: dict[str, Any] = msgpack.unpackb(await resp.read(), raw=False)
        return doc


async def commit(http: aiohttp.ClientSession, url: str,
                 checkpoints: list[list[Any]]) -> str | None:
    """A simple commit (no member, generation -1); the error code, ``None`` when
    acknowledged, ``"no answer"`` when the connection failed."""
    try:
        answer = await call(http, url, "commit", {
            "group_id": "g", "member_id": "tool", "generation_id": -1, "checkpoints": checkpoints})
    except aiohttp.ClientError:
        return "no answer"
    error: str | None = answer["error"]
    return error


async def fetched(http: aiohttp.ClientSession, url: str) -> dict[int, Any]:
    answer = await call(http, url, "fetch", {"group_id": "g"})
    assert answer["error"] is None, answer
    return {idx: value for _, idx, value in answer["checkpoints"]}


async def readyz(http: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with http.get(f"{url}/readyz") as resp:
            return resp.status
    except aiohttp.ClientError:
        return None


# ---------------------------------------------------------------- item 14


def test_a_second_server_on_the_same_file_is_refused(start_server: StartServer,
                                                     tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    link = tmp_path / "link.db"
    link.symlink_to(db.name)
    first = start_server(db)
    for path in (db, link):
        result = subprocess.run(serve_args(path), capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S, check=False)
        assert result.returncode == 2, (result.returncode, result.stderr)
        assert "listening on" not in result.stdout
        line = only_line(result.stderr, "is in use by")
        pid = f" (pid {first.proc.pid})" if Path("/proc/locks").exists() else ""
        assert line == (f"groupcoord serve: database {path} is in use by another process{pid}: "
                        "one server per database file; stop that one or give this one "
                        "another --db"), line
    # Readers work beside the running server.
    out = tmp_path / "export"
    export = subprocess.run([GROUPCOORD, "journal", "export", str(db), "-o", str(out)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert export.returncode == 0, export.stderr
    assert first.running()
    assert first.terminate() == 0
    # The lock went with the first server.
    second = start_server(link)
    assert second.terminate() == 0


# ---------------------------------------------------------------- item 13


async def test_a_commit_after_the_database_was_deleted_is_not_acknowledged(
        start_server: StartServer, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        await put_catalog(http, server.admin_url)
        assert await commit(http, server.url, [["orders", 0, 1]]) is None
        for suffix in ("", "-wal", "-shm"):
            os.unlink(f"{db}{suffix}")
        # Whatever the idle check did meanwhile, this commit is not acknowledged.
        assert await commit(http, server.url, [["orders", 1, 2]]) in (
            "COORDINATOR_NOT_AVAILABLE", "no answer")
        assert await readyz(http, server.admin_url) in (503, None)
    assert server.proc.wait(NOTICE_S) == 1
    only_line(server.stderr, "the file was deleted while the server had it open")


async def test_an_idle_server_notices_its_database_was_replaced(start_server: StartServer,
                                                              tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        await put_catalog(http, server.admin_url)
        assert await readyz(http, server.admin_url) == 200
    os.rename(db, tmp_path / "old.db")
    db.write_bytes(b"")
    assert wait_until(lambda: not server.running(), NOTICE_S), "the server kept serving"
    assert server.proc.returncode == 1
    line = only_line(server.stderr, "the path names another file now")
    assert "CRITICAL" in line and str(db) in line, line


async def test_a_removed_wal_stops_the_server_and_keeps_what_was_acknowledged(
        start_server: StartServer, tmp_path: Path) -> None:
    """The WAL holds acknowledged commits not yet checkpointed into the file; the server
    stops, and its close checkpoints the open (unlinked) WAL into the file."""
    db = tmp_path / "g.db"
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        await put_catalog(http, server.admin_url)
        assert await commit(http, server.url, [["orders", 0, "kept"]]) is None
    os.unlink(f"{db}-wal")
    assert wait_until(lambda: not server.running(), NOTICE_S), "the server kept serving"
    assert server.proc.returncode == 1
    only_line(server.stderr, f"its write-ahead log {db}-wal was removed")
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        assert await fetched(http, server.url) == {0: "kept"}
    assert server.terminate() == 0


# ---------------------------------------------------------------- item 15


#: prctl(2) option and capability numbers (linux/prctl.h, linux/capability.h).
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2


def drop_file_mode_override() -> None:
    """In the child before exec: drop the capabilities that let root ignore file
    modes from the bounding set, so the server, still uid 0, obeys them."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_database_the_server_cannot_write_is_refused_at_start(
        start_server: StartServer, tmp_path: Path) -> None:
    """A file of mode 0444: SQLite opens it read-only without a word, and before the
    check the server reported ready and died at its first write. Root ignores file
    modes, so as root the server runs without CAP_DAC_OVERRIDE (and
    CAP_DAC_READ_SEARCH): the file's owner, root, may then only read it, as any
    owner of a 0444 file. The directory stays writable: SQLite creates -wal and
    -shm beside the file."""
    db = tmp_path / "g.db"
    server = start_server(db)
    assert server.terminate() == 0
    db.chmod(0o444)
    as_root: dict[str, Any] = {}
    if os.geteuid() == 0:
        if not sys.platform.startswith("linux"):
            pytest.skip("root ignores file modes; dropping that needs Linux capabilities")
        as_root = {"preexec_fn": drop_file_mode_override}
    try:
        result = subprocess.run(serve_args(db), capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S, check=False, **as_root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server started on a file it cannot write (still running after "
                    f"{RUN_TIMEOUT_S} s)")
    except subprocess.SubprocessError as exc:  # prctl refused (no CAP_SETPCAP here)
        pytest.skip(f"cannot drop CAP_DAC_OVERRIDE for the server: {exc}")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "listening on" not in result.stdout
    line = only_line(result.stderr, "cannot write to it")
    assert line == (f"groupcoord serve: database {db}: cannot write to it: attempt to write "
                    "a readonly database (SQLITE_READONLY)"), line


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs; skipped where mounting is not permitted (not root, a container
    without CAP_SYS_ADMIN). tests/storage/test_storage_files.py fills a database
    with ``PRAGMA max_page_count`` instead, everywhere."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory: Path) -> None:
    """Take every free byte of the filesystem."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


async def test_a_full_filesystem_is_reported_as_such(start_server: StartServer,
                                                     small_filesystem: Path) -> None:
    server: ServerProcess = start_server(small_filesystem / "g.db")
    async with aiohttp.ClientSession() as http:
        await put_catalog(http, server.admin_url)
        assert await commit(http, server.url, [["orders", 0, 1]]) is None
        fill(small_filesystem)
        big = [["orders", i, "x" * 200] for i in range(1000)]
        assert await commit(http, server.url, big) in ("COORDINATOR_NOT_AVAILABLE",
                                                       "no answer")
    assert server.proc.wait(NOTICE_S) == 1
    assert "cannot rollback" not in server.stderr, server.stderr
    only_line(server.stderr, "database or disk is full (SQLITE_FULL)")
