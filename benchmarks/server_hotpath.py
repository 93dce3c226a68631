"""CPU cost of one heartbeat in-process: the real core, runtime, storage and calls layer.

No sockets and no load generator, so the figure is the server's own Python on
the heartbeat path, which ``server_heartbeat.py`` measures only through wrk and
a shared machine. Groups of ``--group-size`` members are written to a temporary
SQLite database as Stable generations and restored by ``Runtime.start`` (the
state a formed group is in); then ``--heartbeats`` heartbeats, cycling through
every member, are answered through one of two layers:

- ``calls``: ``Calls.call``, as the protocol listener calls it
  (``coordinator/http/fast.py``, ``FastServer.answer``);
- ``http``: a whole request fed to ``FastProtocol.data_received`` on a fake
  transport that drops the response (parser, headers, the call, the response
  bytes).

Every answer is checked (``error: nil``). Prints µs of CPU per heartbeat
(``time.process_time``, best and median of ``--repeat`` rounds); ``--profile``
adds a cProfile top list. Wall time on a shared machine is noisy, so
``--instructions`` instead runs this script twice under
``valgrind --tool=callgrind`` (with no heartbeats and with ``--heartbeats``)
and prints the difference per heartbeat: instructions do not depend on what
else the machine is running.

    .venv/bin/python benchmarks/server_hotpath.py --members 1000 10000
    .venv/bin/python benchmarks/server_hotpath.py --members 1000 --profile
    .venv/bin/python benchmarks/server_hotpath.py --members 1000 --instructions
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.records import GroupRecord, MemberRecord
from coordinator.http.calls import Calls
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.limits import DEFAULT_MAX_BODY_BYTES
from protocol.messages import Api

SESSION_MS = 120_000


def group_records(members: int, group_size: int, now_ms: int) -> tuple[list[GroupRecord],
                                                                       list[bytes]]:
    """Stable generation-1 groups of ``members`` members, and one heartbeat body each."""
    records: list[GroupRecord] = []
    bodies: list[bytes] = []
    metadata = msgpack.packb({"v": 1, "sets": ["orders"]}, use_bin_type=True)
    for g in range((members + group_size - 1) // group_size):
        group_id = f"bench-{g:05d}"
        # Fixed ids (same length as minted ones), so instruction counts repeat.
        ids = [f"bench-{g}-{i}-{g * group_size + i:016x}"
               for i in range(min(group_size, members - g * group_size))]
        records.append(GroupRecord(
            group_id, "Stable", 1, "resources", "range", ids[0],
            tuple(MemberRecord(m, None, "bench", "127.0.0.1", SESSION_MS, SESSION_MS,
                               (("range", metadata),), b"") for m in ids),
            now_ms))
        bodies += [msgpack.packb({"group_id": group_id, "member_id": m, "generation_id": 1},
                                 use_bin_type=True) for m in ids]
    return records, bodies


class NullTransport:
    """Enough of a transport for ``FastProtocol``: responses are counted, not sent."""

    def __init__(self) -> None:
        self.written = 0
        self.last = b""

    def write(self, data: bytes) -> None:
        self.written += 1
        self.last = data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        raise AssertionError("the benchmark connection was closed")

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True


async def measure(args: argparse.Namespace, members: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        storage = await Storage.open(Path(tmp) / "hotpath.db")
        clock = WallClock()
        records, bodies = group_records(members, args.group_size, clock.now_ms())
        await storage.write(records)
        core = GroupCoordinator(CoreConfig())
        metrics = Metrics()
        metrics.watch_core(core.state_counts, core.member_count)
        runtime = Runtime(core, storage, clock, metrics)
        await runtime.start()
        calls = Calls(runtime, metrics, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
        gc.freeze()  # as `groupcoord serve` does once the state is loaded

        if args.layer == "calls":
            def run(count: int) -> None:
                n = len(bodies)
                call = calls.call
                for i in range(count):
                    answer = call(Api.HEARTBEAT, bodies[i % n], False, "127.0.0.1", None,
                                  time.perf_counter())
                    if not isinstance(answer, tuple):
                        raise AssertionError("a heartbeat waited")
                    status, payload = answer
                    if status != 200 or msgpack.unpackb(payload)["error"] is not None:
                        raise AssertionError(f"heartbeat failed: {status} {payload!r}")
        else:
            from coordinator.http.fast import FastServer
            server = FastServer(calls)
            protocol = server()
            transport = NullTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            requests = [b"POST /v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/msgpack\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body) for body in bodies]

            def run(count: int) -> None:
                n = len(requests)
                feed = protocol.data_received
                for i in range(count):
                    feed(requests[i % n])
                    last = transport.last
                    if not last.startswith(b"HTTP/1.1 200") or b"\xa5error\xc0" not in last:
                        raise AssertionError(f"heartbeat failed: {last!r}")

        # Warm up, also in the run without heartbeats that --instructions subtracts.
        run(min(len(bodies), 2000))
        rounds: list[float] = []
        for _ in range(args.repeat if args.heartbeats else 0):
            t0 = time.process_time()
            run(args.heartbeats)
            rounds.append((time.process_time() - t0) / args.heartbeats * 1e6)
        if rounds:
            print(f"{args.layer}: {members} members, {args.heartbeats} heartbeats x "
                  f"{args.repeat}: {min(rounds):.1f} us/heartbeat best, "
                  f"{statistics.median(rounds):.1f} median "
                  f"({', '.join(f'{r:.1f}' for r in rounds)})", flush=True)
        if args.profile and args.heartbeats:
            profile = cProfile.Profile()
            profile.runcall(run, args.heartbeats)
            stats = pstats.Stats(profile)
            stats.sort_stats("tottime").print_stats(args.top)
        if args.layer == "http":
            protocol.connection_lost(None)
        await runtime.stop()
        await storage.close()
        gc.unfreeze()


def instructions(args: argparse.Namespace) -> None:
    """Instructions per heartbeat: two callgrind runs, without and with heartbeats."""
    counts: dict[int, int] = {}
    for heartbeats in (0, args.heartbeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                   sys.executable, __file__, "--members", str(args.members[0]),
                   "--group-size", str(args.group_size), "--heartbeats", str(heartbeats),
                   "--repeat", "1", "--layer", args.layer]
            env = dict(os.environ, PYTHONHASHSEED="0")
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            match = re.search(r"Collected : (\d+)", done.stderr)
            if match is None:
                raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr}")
            counts[heartbeats] = int(match.group(1))
    per = (counts[args.heartbeats] - counts[0]) / args.heartbeats
    print(f"{args.layer}: {args.members[0]} members: {per:,.0f} instructions/heartbeat "
          f"(callgrind, a run with {args.heartbeats} heartbeats minus one without; "
          f"totals {counts[0]:,} and {counts[args.heartbeats]:,})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1000])
    parser.add_argument("--group-size", type=int, default=100)
    parser.add_argument("--heartbeats", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layer", choices=("calls", "http"), default="calls")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind instead of timing")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    if args.instructions:
        instructions(args)
        return
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} load {os.getloadavg()[0]:.2f}, "
          f"python {sys.version.split()[0]}, {args.loop}", flush=True)
    for members in args.members:
        if args.loop == "uvloop":
            import uvloop
            uvloop.run(measure(args, members))
        else:
            asyncio.run(measure(args, members))


if __name__ == "__main__":
    main()
