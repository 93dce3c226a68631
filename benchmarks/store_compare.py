"""Store cost: PostgreSQL against SQLite in the same run (the "Store cost" target).

Measured for each store, each write awaited before the next (as the runtime
does when nothing else is queued; group commit would share commits):

- checkpoint commits: one and 100 checkpoints per transaction;
- fenced checkpoint commits (PostgreSQL only): the same with
  ``fence={partition: epoch}``, i.e. the lease row read ``FOR SHARE`` in the
  transaction, what each write of a coordinator sharing the database costs;
- generation commits: a group's record with every member's assignment plus its
  journal row, as when a leader's assignment arrives;
- load: ``load()`` of 10,000 groups (10 members each, one checkpoint each) by
  a freshly opened store, and for PostgreSQL ``load_partition`` of one of 64.

Both stores are durable at commit: SQLite in WAL mode with ``synchronous=FULL``,
PostgreSQL with its defaults (``fsync=on``, ``synchronous_commit=on``), over
TCP on 127.0.0.1. Without ``--pg-url`` a throw-away PostgreSQL cluster is
started for the run (tests/pg_harness.py: Debian's binaries or pgserver's).

    .venv/bin/python benchmarks/store_compare.py --commits 500 --groups 10000
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
from collections.abc import Awaitable, Callable
from pathlib import Path

from coordinator.core.records import (
    CheckpointsWritten,
    GroupRecord,
    JournalEntry,
    MemberRecord,
    Record,
)
from coordinator.storage.leases import Leases
from coordinator.storage.postgres import PostgresStorage, partition_of
from coordinator.storage.sqlite import Storage

ROOT = Path(__file__).resolve().parent.parent
Store = Storage | PostgresStorage


def generation(group: str, gen: int, members: int) -> list[Record]:
    """The records of one formed generation (as benchmarks/server_storage.py)."""
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


def checkpoints(group: str, i: int, size: int) -> list[Record]:
    return [CheckpointsWritten(group, tuple(("orders", (i * size + j) % 5000, i)
                                            for j in range(size)), committed_ms=i + 1)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(label: str, elapsed: float, latencies: list[float]) -> None:
    ms = [x * 1000 for x in latencies]
    print(f"{label:<52} {len(latencies) / elapsed:>8,.0f} commits/s   "
          f"p50 {statistics.median(ms):6.2f} ms   p99 {percentile(ms, 0.99):6.2f} ms",
          flush=True)


async def timed_writes(store: Store, batches: list[list[Record]],
                       fence: dict[int, int] | None = None) -> tuple[float, list[float]]:
    latencies = []
    started = time.perf_counter()
    for batch in batches:
        t = time.perf_counter()
        if fence is None:
            await store.write(batch)
        else:
            assert isinstance(store, PostgresStorage)
            await store.write(batch, fence=fence)
        latencies.append(time.perf_counter() - t)
    return time.perf_counter() - started, latencies


async def run(label: str, opener: Callable[[], Awaitable[Store]], commits: int,
              members: list[int], groups: int, pg_url: str | None) -> None:
    store = await opener()
    try:
        for size in (1, 100):
            batches = [checkpoints("g-cp", i, size) for i in range(commits)]
            report(f"{label}: checkpoint commit, {size} checkpoint(s)",
                   *await timed_writes(store, batches))
        if isinstance(store, PostgresStorage) and pg_url is not None:
            leases = await Leases.open(pg_url, "bench", "http://127.0.0.1:1")
            try:
                p = partition_of("g-cp", store.partitions)
                epoch = await leases.acquire(p, 600_000)
                assert epoch is not None, "the partition is held by someone else"
                for size in (1, 100):
                    batches = [checkpoints("g-cp", i, size) for i in range(commits)]
                    report(f"{label}: fenced checkpoint commit, {size} checkpoint(s)",
                           *await timed_writes(store, batches, fence={p: epoch}))
                await leases.release(p, epoch)
            finally:
                await leases.close()
        for n in members:
            batches = [generation(f"g{i % 10}", i + 1, n) for i in range(commits)]
            report(f"{label}: generation commit, {n:,} members",
                   *await timed_writes(store, batches))
        # 10,000 groups (10 members, one checkpoint each), written 500 a transaction.
        for start in range(0, groups, 500):
            batch: list[Record] = []
            for i in range(start, min(groups, start + 500)):
                batch.append(generation(f"load-{i}", 1, 10)[0])
                batch.append(CheckpointsWritten(f"load-{i}", (("orders", i % 64, i),)))
            await store.write(batch)
    finally:
        await store.close()
    fresh = await opener()
    try:
        t = time.perf_counter()
        snapshot = await fresh.load()
        elapsed = time.perf_counter() - t
        print(f"{label}: load() of {len(snapshot.groups):,} groups: {elapsed * 1000:,.0f} ms",
              flush=True)
        if isinstance(fresh, PostgresStorage):
            t = time.perf_counter()
            part = await fresh.load_partition(0)
            elapsed = time.perf_counter() - t
            print(f"{label}: load_partition(0) of {fresh.partitions}, "
                  f"{len(part.groups):,} groups: {elapsed * 1000:,.0f} ms", flush=True)
    finally:
        await fresh.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--members", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--dir", help="directory for the SQLite file (default: a temp dir; "
                                      "the throw-away cluster is in the system's temp dir)")
    parser.add_argument("--pg-url", help="an existing, empty PostgreSQL database to use "
                                         "instead of a throw-away cluster")
    args = parser.parse_args()

    server = None
    pg_url = args.pg_url
    if pg_url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from pg_harness import PostgresServer

        server = PostgresServer()
        server.start()
        pg_url = server.url("groupcoord")
    try:
        version = "PostgreSQL"
        if server is not None:
            version = server.psql("SHOW server_version").strip() or version
        print(f"# {time.strftime('%Y-%m-%d %H:%M')}  SQLite WAL synchronous=FULL vs "
              f"PostgreSQL {version} (fsync, synchronous_commit=on, TCP 127.0.0.1); "
              f"{args.commits} sequential transactions each; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            path = Path(tmp) / "g.db"

            async def sqlite() -> Store:
                return await Storage.open(path)

            async def postgres() -> Store:
                return await PostgresStorage.open(pg_url, partitions=64, coordinator_id="bench")

            asyncio.run(run("SQLite", sqlite, args.commits, args.members, args.groups, None))
            asyncio.run(run("PostgreSQL", postgres, args.commits, args.members, args.groups,
                            pg_url))
    except subprocess.CalledProcessError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.remove()
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
