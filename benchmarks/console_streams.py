"""Another group's heartbeats while web console overviews are open.

Starts ``groupcoord serve`` (of this checkout, or of ``--source DIR``, e.g. an
older tree from ``git archive``), forms ``--groups`` groups of one member,
then times one member's heartbeats (one at a time, ``--heartbeats`` of them,
10 ms apart) first with no live page open, then with ``--streams`` overview
event streams open (``GET /console/events?page=overview``, as a browser tab
opens it; spread over the loopback addresses 127.0.0.1-127.0.0.4 so that the
per-client limit of 8 lets 32 in). Nothing changes on the pages meanwhile.
Prints the heartbeat round trip's median, p90 and max, and the server's CPU
use, for each.

    .venv/bin/python benchmarks/console_streams.py --groups 2000 --streams 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import ROOT, BenchMember, Server, client_session, form_group, post

SESSION_MS = 300_000
ADDRESSES = [f"127.0.0.{n}" for n in range(1, 5)]


def start(source: Path, cpu: int | None, db_dir: str) -> Server:
    args = [sys.executable, "-P", "-m", "coordinator.cli", "serve", "--host", "127.0.0.1",
            "--port", "0", "--admin-port", "0", "--db", os.path.join(db_dir, "bench.db"),
            "--log-level", "CRITICAL", "--initial-rebalance-delay-ms", "0"]
    # -P and PYTHONPATH: the child imports coordinator from there, not from the cwd.
    os.environ["PYTHONPATH"] = str(source)
    return Server(args, cpu, stderr=subprocess.DEVNULL)


async def form_groups(url: str, count: int) -> list[BenchMember]:
    members: list[BenchMember] = []
    async with client_session() as http:
        for first in range(0, count, 50):
            formed = await asyncio.gather(*(
                form_group(http, url, f"bench-{i:05d}", 1, SESSION_MS)
                for i in range(first, min(count, first + 50))))
            members.extend(m for group in formed for m in group)
    return members


async def heartbeats(url: str, member: BenchMember, count: int) -> list[float]:
    """Round trips in ms, one heartbeat at a time."""
    out = []
    async with client_session() as http:
        for _ in range(count):
            started = time.perf_counter()
            answer = await post(http, url, "heartbeat", member.heartbeat_body())
            out.append((time.perf_counter() - started) * 1000)
            assert answer["error"] is None, answer
            await asyncio.sleep(0.01)
    return out


async def open_streams(admin_url: str, count: int
                       ) -> tuple[list[aiohttp.ClientSession], list[asyncio.Task[None]]]:
    """``count`` overview streams, each read (and dropped) until cancelled; returns
    once every one has sent its first fragment."""
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        local_addr=(address, 0), limit=0)) for address in ADDRESSES]
    ready: list[asyncio.Future[None]] = []

    async def read(session: aiohttp.ClientSession, first: asyncio.Future[None]) -> None:
        async with session.get(f"{admin_url}/console/events?page=overview") as resp:
            if resp.status != 200:
                raise RuntimeError(f"stream refused: {resp.status} {await resp.text()}")
            seen = b""
            while True:
                chunk = await resp.content.readany()
                if not chunk:
                    return
                if not first.done():
                    seen += chunk
                    if b"event: fragment" in seen:
                        first.set_result(None)

    loop = asyncio.get_running_loop()
    tasks = []
    for n in range(count):
        first: asyncio.Future[None] = loop.create_future()
        ready.append(first)
        tasks.append(asyncio.create_task(read(sessions[n % len(sessions)], first)))
    await asyncio.wait_for(asyncio.gather(*ready), 120)
    return sessions, tasks


def summary(label: str, times: list[float], cpu_s: float, wall_s: float) -> str:
    times = sorted(times)
    return (f"{label:<22} median {statistics.median(times):7.2f} ms  "
            f"p90 {times[int(len(times) * 0.9)]:7.2f} ms  max {times[-1]:7.1f} ms  "
            f"server CPU {cpu_s / wall_s:4.0%} of a core")


async def measure(server: Server, args: argparse.Namespace) -> None:
    members = await form_groups(server.url, args.groups)
    member = members[len(members) // 2]
    await heartbeats(server.url, member, 20)  # warm up
    for streams in (0, args.streams):
        sessions: list[aiohttp.ClientSession] = []
        tasks: list[asyncio.Task[None]] = []
        if streams:
            sessions, tasks = await open_streams(server.admin_url, streams)
            await asyncio.sleep(1.0)
        cpu = server.cpu_seconds()
        started = time.perf_counter()
        times = await heartbeats(server.url, member, args.heartbeats)
        wall = time.perf_counter() - started
        print(summary(f"{streams} streams open", times, server.cpu_seconds() - cpu, wall),
              flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for session in sessions:
            await session.close()
        await asyncio.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--heartbeats", type=int, default=300)
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="the tree whose coordinator is served (default: this one)")
    parser.add_argument("--server-cpu", type=int, default=0)
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {args.groups} groups of 1 member, "
          f"{args.heartbeats} heartbeats; server of {args.source} on CPU {args.server_cpu}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="groupcoord-bench-") as db_dir:
        server = start(args.source, args.server_cpu, db_dir)
        try:
            asyncio.run(measure(server, args))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
