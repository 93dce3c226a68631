"""Helpers of the multi-coordinator benchmarks: a throw-away PostgreSQL,
``groupcoord serve --db postgresql://...`` processes, routing, CPU accounting.

Everything listens on 127.0.0.1 on free ports; every process started here is
stopped by the caller's ``finally`` (``Cluster.stop``, ``PostgresServer.remove``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import GROUPCOORD, Server, post

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pg_harness import PostgresServer  # noqa: E402

__all__ = ["Cluster", "PostgresServer", "cpu_seconds", "find_owner", "free_port",
           "postgres_cpu_seconds", "set_affinity", "start_postgres"]

_schemas = itertools.count()


def start_postgres() -> PostgresServer:
    """A fresh PostgreSQL cluster (tests/pg_harness.py), started."""
    server = PostgresServer()
    try:
        server.start()
    except BaseException:  # interrupted or failed: no cluster directory left behind
        server.remove()
        raise
    return server


def new_database(server: PostgresServer, name: str) -> str:
    """The URL of a new empty schema in the cluster's ``groupcoord`` database."""
    schema = f"bench_{name}_{os.getpid()}_{next(_schemas)}"
    server.psql(f"CREATE SCHEMA {schema}", "groupcoord")
    return server.url("groupcoord") + f"?search_path={schema}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds(server: PostgresServer) -> float:
    """CPU seconds of the PostgreSQL cluster: the postmaster and every backend and
    auxiliary process (its children), live ones only."""
    try:
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        if pid == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def set_affinity(pid: int, cpus: set[int] | None) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (None: every CPU of this machine)."""
    target = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), target)


def admin_get(admin_url: str, path: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(admin_url + path, timeout=timeout) as resp:
        return json.loads(resp.read())


class Cluster:
    """``n`` coordinators sharing one PostgreSQL database, each on a fixed port
    (so a restarted one keeps its URL, as a bootstrap list expects)."""

    def __init__(self, db_url: str, n: int, *, lease_ms: int, partitions: int,
                 extra: list[str] | None = None, log_dir: Path | None = None) -> None:
        self.db_url = db_url
        #: each coordinator's stderr (its log) is appended to ``log_dir/cN.log`` if given.
        self.log_dir = log_dir
        self.lease_ms = lease_ms
        self.partitions = partitions
        self.extra = list(extra or [])
        self.ports = [(free_port(), free_port()) for _ in range(n)]
        self.urls = [f"http://127.0.0.1:{port}" for port, _ in self.ports]
        self.servers: list[Server | None] = [None] * n

    def args(self, i: int) -> list[str]:
        port, admin_port = self.ports[i]
        return [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", str(port),
                "--admin-port", str(admin_port), "--db", self.db_url,
                "--lease-ms", str(self.lease_ms), "--partitions", str(self.partitions),
                "--log-level", "WARNING", *self.extra]

    def start(self, i: int, timeout_s: float = 60) -> Server:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.log_dir is None:
                    server = Server(self.args(i), timeout_s=timeout_s)
                else:
                    with (self.log_dir / f"c{i}.log").open("ab") as log:
                        server = Server(self.args(i), timeout_s=timeout_s, stderr=log)
                break
            except RuntimeError:
                # The old process's port may still be held for a moment after kill -9.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.servers[i] = server
        return server

    def start_all(self) -> None:
        for i in range(len(self.servers)):
            self.start(i)

    def kill(self, i: int) -> None:
        """kill -9, reaped."""
        server = self.servers[i]
        if server is not None:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(30)
            self.servers[i] = None

    def stop(self) -> None:
        for i, server in enumerate(self.servers):
            if server is None:
                continue
            try:
                server.stop()
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(30)
            self.servers[i] = None

    def log_lines(self, needle: str) -> dict[int, int]:
        """How many lines of each coordinator's log contain ``needle``."""
        if self.log_dir is None:
            return {}
        out = {}
        for i in range(len(self.servers)):
            path = self.log_dir / f"c{i}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            out[i] = sum(needle in line for line in text.splitlines())
        return out

    def live(self) -> list[Server]:
        return [s for s in self.servers if s is not None]

    def owners(self) -> dict[int, str]:
        """partition -> owner URL, from the first live coordinator's admin listener."""
        for server in self.live():
            try:
                rows = admin_get(server.admin_url, "/v1/coordinators")
            except OSError:
                continue
            rows = rows.get("coordinators", rows) if isinstance(rows, dict) else rows
            return {p["partition"]: c["url"] for c in rows for p in c["partitions"]}
        return {}

    def wait_balanced(self, timeout_s: float = 60) -> dict[int, str]:
        """Until every partition is owned and the live coordinators hold even shares."""
        deadline = time.monotonic() + timeout_s
        live = len(self.live())
        while True:
            owners = self.owners()
            counts: dict[str, int] = {}
            for url in owners.values():
                counts[url] = counts.get(url, 0) + 1
            if (len(owners) == self.partitions and len(counts) == live
                    and max(counts.values()) - min(counts.values()) <= 1):
                return owners
            if time.monotonic() > deadline:
                raise RuntimeError(f"partitions not balanced after {timeout_s} s: {counts}")
            time.sleep(0.2)


async def find_owner(http: aiohttp.ClientSession, urls: list[str], group_id: str,
                     timeout_s: float = 30) -> str:
    """The URL of the coordinator serving ``group_id`` (asked at each URL in turn,
    until one answers without error)."""
    deadline = time.monotonic() + timeout_s
    for url in itertools.cycle(urls):
        try:
            answer = await post(http, url, "find_coordinator", {"group_id": group_id})
            if answer["error"] is None and answer["url"]:
                return str(answer["url"])
        except (aiohttp.ClientError, RuntimeError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{group_id}: no coordinator found within {timeout_s} s")
        await asyncio.sleep(0.05)
    raise AssertionError("unreachable")
