"""Storage: generation commits per second and commit latency (SQLite, WAL, synchronous=FULL).

A "generation commit" is what the core asks storage to make durable when a
leader's assignment arrives: the group's record (``Stable``, every member with
its assignment) and the rebalance journal row, in one transaction. Each is
written and awaited in turn, as the runtime does when nothing else is queued
(group commit would only share fsyncs between them). Also measured: batches
of checkpoint commits, the other frequent write.

    .venv/bin/python benchmarks/server_storage.py --members 10 100 1000 --commits 500
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coordinator.core.records import (
    CheckpointsWritten,
    GroupRecord,
    JournalEntry,
    MemberRecord,
    Record,
)
from coordinator.storage.sqlite import Storage


def generation(group: str, gen: int, members: int) -> list[Record]:
    recs = tuple(
        MemberRecord(member_id=f"bench-{i:032x}", group_instance_id=None, client_id="bench",
                     client_host="127.0.0.1", session_timeout_ms=45_000,
                     rebalance_timeout_ms=300_000,
                     protocols=(("cooperative-sticky", b"\x84" + b"m" * 60),),
                     assignment=b"\x82" + b"a" * 40)
        for i in range(members))
    record = GroupRecord(group_id=group, state="Stable", generation_id=gen,
                         protocol_type="resources", protocol_name="cooperative-sticky",
                         leader=recs[0].member_id, members=recs,
                         state_timestamp_ms=1_700_000_000_000 + gen)
    journal = JournalEntry(group_id=group, generation_id=gen, protocol_type="resources",
                           protocol_name="cooperative-sticky", leader=recs[0].member_id,
                           members=tuple((m.member_id, None, "bench") for m in recs),
                           joined=(), left=(), reason="rejoin", started_ms=0, ended_ms=1,
                           assignments={m.member_id: m.assignment or b"" for m in recs})
    return [record, journal]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(path: Path, batches: list[list[Record]]) -> tuple[float, list[float]]:
    storage = await Storage.open(path)
    try:
        latencies = []
        started = time.perf_counter()
        for batch in batches:
            t = time.perf_counter()
            await storage.write(batch)
            latencies.append(time.perf_counter() - t)
        return time.perf_counter() - started, latencies
    finally:
        await storage.close()


def report(label: str, elapsed: float, latencies: list[float]) -> None:
    ms = [x * 1000 for x in latencies]
    print(f"{label:<44} {len(latencies) / elapsed:>8,.0f} commits/s   "
          f"p50 {statistics.median(ms):6.2f} ms   p99 {percentile(ms, 0.99):6.2f} ms   "
          f"max {max(ms):6.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--dir", help="directory for the database (default: a temp dir; "
                                      "put it on the disk you will run on)")
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  SQLite WAL, synchronous=FULL, "
          f"{args.commits} sequential transactions each")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in args.members:
            batches = [generation(f"g{i % 10}", i + 1, n) for i in range(args.commits)]
            elapsed, lat = asyncio.run(measure(Path(tmp) / f"gen{n}.db", batches))
            report(f"generation commit, {n:,} members", elapsed, lat)
        for size in (1, 100):
            batches = [[CheckpointsWritten(f"g{i % 10}", tuple(
                ("orders", (i * size + j) % 5000, i) for j in range(size)))]
                for i in range(args.commits)]
            elapsed, lat = asyncio.run(measure(Path(tmp) / f"cp{size}.db", batches))
            report(f"checkpoint commit, {size} checkpoint(s)", elapsed, lat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
