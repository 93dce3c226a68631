"""Heartbeat throughput and latency of one ``groupcoord serve`` process.

For each member count, starts the server pinned to one CPU, forms groups of
``--group-size`` members (join, rejoin with the member id, sync), then drives
heartbeats from wrk (pinned to another CPU, another process) with
``wrk_heartbeat.lua``, cycling through every member. The same wrk run against
``server_echo.py`` on the same CPU gives two floors: a bare aiohttp msgpack
endpoint (what the target compares with) and a bare httptools one (the least any
Python HTTP server on this loop costs); the ratios show what the coordinator
costs on top of HTTP + msgpack.

    .venv/bin/python benchmarks/server_heartbeat.py --members 1000 10000

Target (docs/benchmarks.md): >= 8,000 heartbeats/s at p99 < 20 ms on one core. wrk is a
closed-loop generator (no coordinated-omission correction): latency is
measured at the throughput the server sustains with ``--connections`` open.
Runs against groupcoord and the echo endpoints alternate (``--repeat``), so
all see the same background load; medians are printed, with the range, and
the server's CPU time per request (from /proc, so time spent waiting for a
CPU is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import (
    BenchMember,
    Server,
    client_session,
    form_group,
    pinned,
    post,
    start_groupcoord,
)

HERE = Path(__file__).resolve().parent
SESSION_MS = 120_000
_RESULT = re.compile(r"RESULT (.*)")


async def form_groups(url: str, members: int, group_size: int, parallel_groups: int
                      ) -> list[BenchMember]:
    out: list[BenchMember] = []
    groups = [f"bench-{i:05d}" for i in range((members + group_size - 1) // group_size)]
    async with client_session() as http:
        for start in range(0, len(groups), parallel_groups):
            batch = groups[start:start + parallel_groups]
            sizes = [min(group_size, members - (start + i) * group_size)
                     for i in range(len(batch))]
            formed = await asyncio.gather(*(form_group(http, url, g, n, SESSION_MS)
                                            for g, n in zip(batch, sizes, strict=True)))
            for group in formed:
                out.extend(group)
        # Every member heartbeats fine before the measured run.
        for m in out[:: max(1, len(out) // 50)]:
            answer = await post(http, url, "heartbeat", m.heartbeat_body())
            assert answer["error"] is None, answer
    return out


def write_bodies(members: list[BenchMember], path: str) -> None:
    with open(path, "wb") as fh:
        for m in members:
            body = msgpack.packb(m.heartbeat_body(), use_bin_type=True)
            fh.write(struct.pack(">H", len(body)) + body)


def run_wrk(server: Server, bodies: str, args: argparse.Namespace) -> dict[str, int]:
    cmd = pinned(args.wrk_cpu, ["wrk", "-t", str(args.threads), "-c", str(args.connections),
                                "-d", f"{args.duration}s", "--timeout", "5s",
                                "-s", str(HERE / "wrk_heartbeat.lua"), server.url])
    cpu_before = server.cpu_seconds()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60,
                          env={**os.environ, "GROUPCOORD_BODIES": bodies})
    cpu_used = server.cpu_seconds() - cpu_before
    m = _RESULT.search(done.stdout)
    if m is None:
        raise RuntimeError(f"wrk printed no RESULT line:\n{done.stdout}\n{done.stderr}")
    result = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    result["cpu_us_per_request"] = round(cpu_used * 1e6 / max(1, result["requests"]))
    return result


def rate(r: dict[str, int]) -> float:
    return r["requests"] / (r["duration_us"] / 1e6)


def summary(label: str, runs: list[dict[str, int]]) -> str:
    """Medians over the runs (each figure's own median), plus the run-to-run range."""
    med = statistics.median
    rps = [rate(r) for r in runs]
    cpu = [r["cpu_us_per_request"] for r in runs]
    return (f"{label:<28} {med(rps):>8,.0f}/s ({min(rps):,.0f}-{max(rps):,.0f})  "
            f"p50 {med(r['p50_us'] for r in runs) / 1000:6.2f} ms  "
            f"p90 {med(r['p90_us'] for r in runs) / 1000:6.2f} ms  "
            f"p99 {med(r['p99_us'] for r in runs) / 1000:6.2f} ms "
            f"({min(r['p99_us'] for r in runs) / 1000:.2f}-"
            f"{max(r['p99_us'] for r in runs) / 1000:.2f})  "
            f"server CPU {med(cpu):.0f} us/request ({min(cpu)}-{max(cpu)}; "
            f"= {1e6 / max(1.0, med(cpu)):,.0f}/s per core)  "
            f"failures {sum(r['failures'] for r in runs)}  "
            f"socket errors {sum(r['socket_errors'] for r in runs)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--group-size", type=int, default=100)
    parser.add_argument("--parallel-groups", type=int, default=20)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=3,
                        help="wrk runs per server, alternating groupcoord and echo")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--wrk-cpu", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        # Found on a new machine: the first wrk run failed after the groups formed,
        # with "taskset: failed to execute wrk" inside a traceback.
        print("server_heartbeat: wrk is not on PATH (Debian: apt-get install wrk)",
              file=sys.stderr)
        return 2

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  wrk -t{args.threads} -c{args.connections} "
          f"-d{args.duration}s x {args.repeat}, alternating with the echo endpoints; "
          f"server on CPU {args.server_cpu}, wrk on CPU {args.wrk_cpu}; "
          f"load average {os.getloadavg()[0]:.1f}")
    echo = Server([sys.executable, str(HERE / "server_echo.py")], args.server_cpu)
    lean_echo = Server([sys.executable, str(HERE / "server_echo.py"), "--kind", "httptools"],
                       args.server_cpu)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            bodies = os.path.join(tmp, "bodies.bin")
            for n in args.members:
                server, db_dir = start_groupcoord(args.server_cpu,
                                                  initial_rebalance_delay_ms=1000,
                                                  min_session_timeout_ms=1000)
                ours: list[dict[str, int]] = []
                bare: list[dict[str, int]] = []
                lean: list[dict[str, int]] = []
                try:
                    t0 = time.perf_counter()
                    members = asyncio.run(form_groups(server.url, n, args.group_size,
                                                      args.parallel_groups))
                    print(f"# {n} members in {len(members) // args.group_size} groups "
                          f"formed in {time.perf_counter() - t0:.1f} s")
                    write_bodies(members, bodies)
                    # Alternate, so both servers see the same background load.
                    for _ in range(args.repeat):
                        ours.append(run_wrk(server, bodies, args))
                        bare.append(run_wrk(echo, bodies, args))
                        lean.append(run_wrk(lean_echo, bodies, args))
                finally:
                    status = server.stop()
                    db_dir.cleanup()
                    if status != 0:
                        print(f"# server exited with status {status}")
                print(summary(f"groupcoord, {n:,} members", ours))
                print(summary("bare aiohttp msgpack echo", bare))
                print(summary("bare httptools msgpack echo", lean), flush=True)
                for label, floor in (("aiohttp", bare), ("httptools", lean)):
                    ratios = [rate(a) / rate(b) for a, b in zip(ours, floor, strict=True)]
                    cpu_ratios = [b["cpu_us_per_request"] / max(1, a["cpu_us_per_request"])
                                  for a, b in zip(ours, floor, strict=True)]
                    print(f"ratio to the bare {label} echo, {n:,} members: throughput "
                          f"{statistics.median(ratios):.2f} "
                          f"(runs: {', '.join(f'{x:.2f}' for x in ratios)}); "
                          f"CPU per request (echo/ours) {statistics.median(cpu_ratios):.2f} "
                          f"(runs: {', '.join(f'{x:.2f}' for x in cpu_ratios)})", flush=True)
    finally:
        echo.stop()
        lean_echo.stop()
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
