"""Helpers of the server benchmarks: start ``groupcoord serve``, form groups.

Everything listens on 127.0.0.1. The server can be pinned to one CPU with
``taskset`` so "one core" figures mean what they say.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import msgpack

ROOT = Path(__file__).resolve().parent.parent
GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))
MSGPACK = {"Content-Type": "application/msgpack"}
_LISTENING = re.compile(r"^listening on http://([^:\s]+):(\d+)")
_ADMIN_LISTENING = re.compile(r"^admin listening on (http://\S+)")


def pinned(cpu: int | None, args: list[str]) -> list[str]:
    if cpu is None or shutil.which("taskset") is None:
        return args
    return ["taskset", "-c", str(cpu), *args]


class Server:
    """A child process that prints ``listening on http://HOST:PORT`` when ready
    (``groupcoord serve`` prints ``admin listening on ...`` before it: ``admin_url``)."""

    def __init__(self, args: list[str], cpu: int | None = None, timeout_s: float = 30,
                 stderr: int | IO[bytes] = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(pinned(cpu, args), stdout=subprocess.PIPE,
                                     stderr=stderr, text=True)
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        self.admin_url = ""
        while True:
            line = self.proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{args[0]} did not start (exit {self.proc.poll()})")
            admin = _ADMIN_LISTENING.match(line)
            if admin:
                self.admin_url = admin.group(1)
            m = _LISTENING.match(line)
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                break

    def cpu_seconds(self) -> float:
        """User + system CPU time the server used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def sched_seconds(self, main_thread_only: bool = False) -> tuple[float, float]:
        """(on a CPU, waiting for a CPU) so far, summed over the server's threads, or of
        its main thread (the event loop's) alone."""
        return sched_seconds(self.proc.pid, self.proc.pid if main_thread_only else None)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def sched_seconds(pid: int, tid: int | None = None) -> tuple[float, float]:
    """Seconds the process ``pid`` (its thread ``tid`` alone if given) ran and waited
    in a run queue, from the scheduler's per-thread ``/proc/PID/task/TID/schedstat``
    (nanoseconds; Linux): on a shared machine the wait says how much of a wall-clock
    figure was other tenants' time."""
    ran = waited = 0
    tasks = Path(f"/proc/{pid}/task")
    for task in [tasks / str(tid)] if tid is not None else tasks.iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        ran += int(fields[0])
        waited += int(fields[1])
    return ran / 1e9, waited / 1e9


def start_groupcoord(cpu: int | None, **settings: object
                     ) -> tuple[Server, tempfile.TemporaryDirectory[str]]:
    tmp = tempfile.TemporaryDirectory(prefix="groupcoord-bench-")
    args = [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
            "--db", os.path.join(tmp.name, "bench.db"), "--log-level", "WARNING"]
    for name, value in settings.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return Server(args, cpu), tmp


async def post(http: aiohttp.ClientSession, url: str, api: str, body: dict[str, Any]
               ) -> dict[str, Any]:
    async with http.post(f"{url}/v1/{api}", data=msgpack.packb(body, use_bin_type=True),
                         headers=MSGPACK) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{api}: HTTP {resp.status}: {await resp.read()!r}")
        doc: dict[str, Any] = msgpack.unpackb(await resp.read(), raw=False)
        return doc


@dataclass
class BenchMember:
    group_id: str
    member_id: str = ""
    generation_id: int = -1
    leader: str = ""
    peers: list[str] = field(default_factory=list)
    #: part of the member's metadata: changing it makes a rejoin rebalance the
    #: group (a follower rejoining with the same metadata gets the current
    #: generation back, as in Kafka).
    epoch: int = 0

    def join_body(self, session_ms: int) -> dict[str, Any]:
        metadata = msgpack.packb({"v": 1, "sets": ["orders"], "epoch": self.epoch})
        return {"group_id": self.group_id, "member_id": self.member_id,
                "protocol_type": "resources", "protocols": [["range", metadata]],
                "session_timeout_ms": session_ms, "rebalance_timeout_ms": session_ms,
                "client_id": "bench"}

    def sync_body(self) -> dict[str, Any]:
        assignments = []
        if self.member_id == self.leader:
            # A trivial plan: one index each. The assignor is not what is measured.
            assignments = [{"member_id": m, "assignment": msgpack.packb(
                {"v": 1, "assigned": {"orders": [i]}}, use_bin_type=True)}
                for i, m in enumerate(sorted(self.peers))]
        return {"group_id": self.group_id, "member_id": self.member_id,
                "generation_id": self.generation_id, "assignments": assignments}

    def heartbeat_body(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "member_id": self.member_id,
                "generation_id": self.generation_id}

    async def join(self, http: aiohttp.ClientSession, url: str, session_ms: int) -> None:
        answer = await post(http, url, "join", self.join_body(session_ms))
        if answer["error"] == "MEMBER_ID_REQUIRED":
            self.member_id = answer["member_id"]
            answer = await post(http, url, "join", self.join_body(session_ms))
        if answer["error"] is not None:
            raise RuntimeError(f"join: {answer['error']}")
        self.generation_id = answer["generation_id"]
        self.leader = answer["leader"]
        self.peers = [m["member_id"] for m in answer["members"]]

    async def sync(self, http: aiohttp.ClientSession, url: str) -> None:
        answer = await post(http, url, "sync", self.sync_body())
        if answer["error"] is not None:
            raise RuntimeError(f"sync: {answer['error']}")


async def form_group(http: aiohttp.ClientSession, url: str, group_id: str, size: int,
                     session_ms: int) -> list[BenchMember]:
    """``size`` members that joined one generation together and synced."""
    for _attempt in range(5):
        members = [BenchMember(group_id) for _ in range(size)]
        await asyncio.gather(*(m.join(http, url, session_ms) for m in members))
        if len({m.generation_id for m in members}) == 1:
            await asyncio.gather(*(m.sync(http, url) for m in members))
            return members
        # Some arrived after the generation formed: a longer initial delay fixes it.
    raise RuntimeError(f"{group_id}: members did not land in one generation")


def client_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=120))
