"""Another group's heartbeat latency while 1 MB checkpoint commits stream in.

Starts ``groupcoord serve`` (SQLite, 127.0.0.1), forms a one-member group
whose member heartbeats every ``--interval-ms`` (``wait_ms`` 0, one at a time,
each timed), and, after ``--idle-s`` seconds of heartbeats alone, sends
``--commits`` simple commits one after another, each of ``--checkpoints``
checkpoints (about 1 MB of msgpack with the defaults), filling
``--checkpoints-per-group`` per group before moving to a new group. The
commit bodies are encoded before the stream starts, so the client's own work
does not delay its heartbeats.

Printed: the heartbeat latencies (count, p50, p99, max) with no commits and
during the stream, the commits' latencies, and the CPU time the server's
event-loop thread spent per commit (from ``/proc``, so time spent waiting for
a CPU on a shared machine is not counted): the loop cannot answer another
group's heartbeat while it runs a commit's share that is on the loop.

    .venv/bin/python benchmarks/commit_stall.py --commits 20
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import MSGPACK, client_session, form_group, post, start_groupcoord


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: none"
    return (f"{name}: n={len(values)} p50 {percentile(values, 0.5):.1f} ms, "
            f"p99 {percentile(values, 0.99):.1f} ms, max {max(values):.1f} ms")


def commit_bodies(args: argparse.Namespace) -> list[bytes]:
    """The commits of the stream: simple commits (generation -1), integer values."""
    bodies = []
    per_group = max(1, args.checkpoints_per_group // args.checkpoints)
    for n in range(args.commits):
        group, part = divmod(n, per_group)
        first = part * args.checkpoints
        checkpoints = [[f"set-{(first + i) % 16:02d}", first + i, 10_000_000_000 + i]
                       for i in range(args.checkpoints)]
        bodies.append(msgpack.packb({"group_id": f"filler-{group}", "member_id": "filler",
                                     "generation_id": -1, "checkpoints": checkpoints},
                                    use_bin_type=True))
    return bodies


async def heartbeats(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                     interval_s: float, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        answer = await post(http, url, "heartbeat", body)
        out.append((time.perf_counter() - started) * 1000)
        if answer["error"] is not None:
            raise RuntimeError(f"heartbeat: {answer['error']}")
        await asyncio.sleep(interval_s)


async def run(args: argparse.Namespace) -> None:
    bodies = commit_bodies(args)
    print(f"{len(bodies)} commits of {args.checkpoints} checkpoints, "
          f"{sum(map(len, bodies)) / len(bodies) / 1e6:.2f} MB each on average")
    server, tmp = start_groupcoord(None, initial_rebalance_delay_ms=0,
                                   max_body_bytes=2 * 1024 * 1024)
    try:
        async with client_session() as http, client_session() as committer:
            [member] = await form_group(http, server.url, "victim", 1, 30_000)
            beat = member.heartbeat_body()
            idle: list[float] = []
            stop = asyncio.Event()
            task = asyncio.create_task(heartbeats(http, server.url, beat,
                                                  args.interval_ms / 1000, stop, idle))
            await asyncio.sleep(args.idle_s)
            stop.set()
            await task
            busy: list[float] = []
            stop = asyncio.Event()
            task = asyncio.create_task(heartbeats(http, server.url, beat,
                                                  args.interval_ms / 1000, stop, busy))
            commits: list[float] = []
            loop_cpu_before = server.sched_seconds(main_thread_only=True)[0]
            cpu_before = server.cpu_seconds()
            deadline = time.monotonic() + args.max_seconds
            for body in bodies:
                if time.monotonic() > deadline:
                    print(f"stopped after {len(commits)} commits: --max-seconds reached")
                    break
                started = time.perf_counter()
                async with committer.post(f"{server.url}/v1/commit", data=body,
                                          headers=MSGPACK) as resp:
                    answer = msgpack.unpackb(await resp.read(), raw=False)
                    if resp.status != 200 or answer["error"] is not None:
                        raise RuntimeError(f"commit: HTTP {resp.status}: {answer}")
                commits.append((time.perf_counter() - started) * 1000)
            loop_cpu = server.sched_seconds(main_thread_only=True)[0] - loop_cpu_before
            cpu = server.cpu_seconds() - cpu_before
            stop.set()
            await task
        print(summary("heartbeats, no commits", idle))
        print(summary("heartbeats during the commits", busy))
        print(summary("commits", commits))
        n = max(1, len(commits))
        print(f"server CPU per commit: {cpu / n * 1000:.1f} ms in all, "
              f"{loop_cpu / n * 1000:.1f} ms on the event-loop thread")
    finally:
        server.stop()
        tmp.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--checkpoints", type=int, default=50_000,
                        help="checkpoints per commit (50,000: about 1 MB)")
    parser.add_argument("--checkpoints-per-group", type=int, default=100_000)
    parser.add_argument("--interval-ms", type=float, default=5.0,
                        help="pause between one heartbeat's answer and the next")
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
