"""Failover costs no rebalance: kill -9 the owner of a busy group's partition, again and
again (the "Failover" target of docs/benchmarks.md).

Three ``groupcoord serve`` coordinators share a throw-away PostgreSQL
(tests/pg_harness.py). One group of ``--members`` members (100) with a
``--session-ms`` session (10 s) shares the resource set ``orders`` of
``--resources`` resources (1,000), cooperative-sticky. The members are
``client.member.GroupMember`` instances given the list of the three
coordinators' URLs (the bootstrap list), ``--workers`` processes holding an
equal share each, so 100 members fit 2 cores. They heartbeat every
``--heartbeat-interval-ms`` (1 s: with a 10 s session and the default 5 s
lease, docs/operations.md's sizing rule asks for it; 0 takes the client's
default, 3 s, which that rule says does not fit). Every member commits a
checkpoint for each resource it owns every ``--commit-interval-ms``; the value
is the monotonic clock in nanoseconds, so a later commit of a resource always
carries a larger value.

Once the group is Stable with every resource owned, the driver repeats, up to
``--kills`` times and within ``--max-seconds``: find the owner of the group's
partition (``GET /v1/coordinators``), ``kill -9`` it, wait until another
coordinator serves the partition and for ``--settle-s``, start the killed
coordinator again on the same ports (it takes its share back by an orderly
hand-off), and wait until the partitions are balanced.

Each worker process writes a ledger (JSON lines, the chaos ledger's
conventions, tests/chaos/ledger.py): ``assigned``/``revoked``/``lost`` with the
resources and the generation, and every commit with the time it was sent and
answered, its value and outcome. Measured from them and from the coordinators:

- **answered again**: for each kill and each member, the time from the kill to
  the answer of the member's first commit sent after it that was acknowledged:
  only the new owner can have answered it (target: within lease + 1 s);
- **rebalances**: generations and journal rows of the group from the first
  kill to the end (admin API), and generation changes the members saw;
- **on_lost** calls;
- **double ownership**: resource-seconds during which two members owned one
  resource (their assigned .. revoked/lost intervals);
- **acknowledged checkpoints lost**: after the run, each resource's stored
  checkpoint (fetched through the admin API) against the largest value a
  member's commit of it was acknowledged with; smaller means lost.

    .venv/bin/python benchmarks/cluster_failover.py --kills 20 --max-seconds 600

Needs the client's bootstrap list (``GroupMember([url, url, url], ...)``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster_common import Cluster, new_database, start_postgres

GROUP = "failover-bench"
SET = "orders"
Resource = tuple[str, int]


# ---------------------------------------------------------------- worker process


class Ledger:
    def __init__(self, path: Path, worker: str) -> None:
        self._f: TextIO = path.open("a", encoding="utf-8")
        self._worker = worker

    def write(self, ev: str, **fields: Any) -> None:
        self._f.write(json.dumps({"t": time.monotonic(), "ev": ev, "w": self._worker,
                                  **fields}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


async def worker_main(args: argparse.Namespace) -> int:
    from client.errors import (
        CommitFailedError,
        CoordinatorUnavailableError,
        GroupCoordError,
        MemberClosedError,
        NotOwnedError,
    )
    from client.listener import RebalanceListener
    from client.member import GroupMember

    urls: list[str] = args.urls.split(",")
    ledger = Ledger(Path(args.ledger), f"w{args.worker}")

    class Slot(RebalanceListener):
        def __init__(self, name: str) -> None:
            self.name = name
            self.member: GroupMember | None = None
            self.lock = asyncio.Lock()

        def _ids(self) -> dict[str, Any]:
            assert self.member is not None
            return {"m": self.name, "member": self.member.member_id,
                    "gen": self.member.generation_id}

        async def on_assigned(self, resources: set[Resource]) -> None:
            ledger.write("assigned", res=sorted(resources), **self._ids())

        async def on_revoked(self, resources: set[Resource]) -> None:
            if resources:
                await self.commit(frozenset(resources))
            ledger.write("revoked", res=sorted(resources), **self._ids())

        async def on_lost(self, resources: set[Resource]) -> None:
            ledger.write("lost", res=sorted(resources), **self._ids())

        async def commit(self, resources: frozenset[Resource]) -> None:
            assert self.member is not None
            if not resources:
                return
            async with self.lock:
                value = time.monotonic_ns()
                sent = time.monotonic()
                outcome, error = "unknown", "cancelled"
                try:
                    await self.member.commit({r: value for r in resources})
                    outcome, error = "ok", None
                except (NotOwnedError, MemberClosedError) as exc:
                    outcome, error = "local", type(exc).__name__
                except CommitFailedError as exc:
                    outcome, error = "refused", exc.code.value
                except CoordinatorUnavailableError as exc:
                    outcome, error = "unknown", str(exc)[:200]
                except GroupCoordError as exc:
                    outcome, error = "local", type(exc).__name__
                finally:
                    ledger.write("commit", sent=sent, res=sorted(resources), value=value,
                                 outcome=outcome, error=error, **self._ids())

    slots: list[Slot] = []
    for i in range(args.count):
        slot = Slot(f"m{args.first + i:03d}")
        # The bootstrap list: any of the coordinators answers find_coordinator.
        slot.member = GroupMember(urls, GROUP, [SET], listener=slot,
                                  session_timeout_ms=args.session_ms,
                                  rebalance_timeout_ms=args.session_ms,
                                  heartbeat_interval_ms=args.heartbeat_interval_ms or None,
                                  client_id=f"bench-{slot.name}")
        slots.append(slot)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    for slot in slots:
        assert slot.member is not None
        slot.member.start()
        await asyncio.sleep(0.02)  # not all at once: 2 cores

    async def work(slot: Slot) -> None:
        assert slot.member is not None
        await asyncio.sleep(random.random() * args.commit_interval_ms / 1000)
        while not stop.is_set():
            await slot.commit(slot.member.assignment)
            await asyncio.sleep(args.commit_interval_ms / 1000)

    tasks = [asyncio.create_task(work(s)) for s in slots]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # Commits in flight were answered (or cancelled: "unknown"); mark the end of the
    # measured part before closing (the close revokes, commits and leaves).
    ledger.write("end")
    await asyncio.gather(*(s.member.close() for s in slots if s.member is not None),
                         return_exceptions=True)
    ledger.write("closed")
    ledger.close()
    return 0


# ---------------------------------------------------------------- driver


def admin(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def partition_of(group_id: str, partitions: int) -> int:
    return zlib.crc32(group_id.encode()) % partitions


def any_admin(cluster: Cluster, method: str, path: str, body: dict[str, Any] | None = None
              ) -> Any:
    last: Exception | None = None
    for server in cluster.live():
        try:
            return admin(server.admin_url, method, path, body)
        except OSError as exc:
            last = exc
    raise RuntimeError(f"no coordinator answered {path}: {last}")


def group_state(cluster: Cluster) -> dict[str, Any]:
    doc: dict[str, Any] = any_admin(cluster, "GET", f"/v1/groups/{GROUP}")
    return doc


def journal_rows(cluster: Cluster) -> int:
    doc = any_admin(cluster, "GET", f"/v1/groups/{GROUP}/rebalances?limit=1000")
    return len(doc["rebalances"])


def wait_stable(cluster: Cluster, members: int, resources: int, timeout_s: float) -> int:
    """Until the group is Stable with every member and every resource assigned and its
    generation has not moved for 3 s; returns the generation."""
    deadline = time.monotonic() + timeout_s
    seen: tuple[int, float] | None = None
    while time.monotonic() < deadline:
        try:
            doc = group_state(cluster)
        except (RuntimeError, OSError, KeyError):
            time.sleep(0.5)
            continue
        owned = sum(len(m.get("assignment", {}).get(SET, []))
                    for m in doc["members"] if isinstance(m.get("assignment"), dict))
        if doc["state"] == "Stable" and len(doc["members"]) == members and owned == resources:
            gen = int(doc["generation_id"])
            if seen is None or seen[0] != gen:
                seen = (gen, time.monotonic())
            elif time.monotonic() - seen[1] >= 3:
                return gen
        else:
            seen = None
        time.sleep(0.5)
    raise RuntimeError(f"the group did not settle within {timeout_s} s")


def owner_index(cluster: Cluster) -> int | None:
    url = cluster.owners().get(partition_of(GROUP, cluster.partitions))
    return cluster.urls.index(url) if url in cluster.urls else None


def read_ledgers(paths: list[Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for raw in fh:
                if raw.strip():
                    events.append(json.loads(raw))
    events.sort(key=lambda e: e["t"])
    return events


def double_ownership(events: list[dict[str, Any]], end: float) -> tuple[float, int]:
    """(resource-seconds owned by two members at once, resources ever owned twice)."""
    owned: dict[str, dict[Resource, float]] = defaultdict(dict)
    intervals: dict[Resource, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        member = e.get("m")
        if e["ev"] == "assigned":
            for r in map(tuple, e["res"]):
                owned[member].setdefault(r, e["t"])  # type: ignore[arg-type]
        elif e["ev"] in ("revoked", "lost"):
            for r in map(tuple, e["res"]):
                start = owned[member].pop(r, None)  # type: ignore[arg-type]
                if start is not None:
                    intervals[r].append((start, e["t"], member))  # type: ignore[index]
    for member, rs in owned.items():
        for r, start in rs.items():
            intervals[r].append((start, end, member))
    total = 0.0
    twice = 0
    for spans in intervals.values():
        spans.sort()
        overlap = 0.0
        for i, (_s1, e1, m1) in enumerate(spans):
            for s2, e2, m2 in spans[i + 1:]:
                if s2 >= e1:
                    break
                if m1 != m2:
                    overlap += min(e1, e2) - s2
        total += overlap
        twice += overlap > 0
    return total, twice


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinators", type=int, default=3)
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--resources", type=int, default=1_000)
    parser.add_argument("--session-ms", type=int, default=10_000)
    parser.add_argument("--lease-ms", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--max-seconds", type=float, default=600,
                        help="stop killing after this long (the run's bound)")
    parser.add_argument("--workers", type=int, default=4, help="member processes")
    parser.add_argument("--commit-interval-ms", type=int, default=500)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000,
                        help="the members' (0: the client's default, min(3000, session / 3)); "
                             "1000 fits a 10 s session to a 5 s lease by docs/operations.md, "
                             "'Sizing the lease against the session timeout'")
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="after the takeover, before the restart")
    # worker mode (started by the driver)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ledger", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return asyncio.run(worker_main(args))

    started = time.monotonic()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} UTC  {args.coordinators} coordinators, "
          f"lease {args.lease_ms} ms, {args.partitions} partitions; 1 group of "
          f"{args.members} members (session {args.session_ms} ms, heartbeat interval "
          f"{args.heartbeat_interval_ms or 'default'} ms, {args.workers} member "
          f"processes) over {args.resources:,} resources, each member committing every "
          f"{args.commit_interval_ms} ms; up to {args.kills} kills within "
          f"{args.max_seconds:.0f} s; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    pg = start_postgres()
    cluster: Cluster | None = None
    workers: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.TemporaryDirectory(prefix="groupcoord-failover-")
    ledgers = [Path(tmp.name) / f"w{i}.jsonl" for i in range(args.workers)]
    kills: list[tuple[float, int, float]] = []  # (kill time, coordinator, takeover seconds)
    try:
        cluster = Cluster(new_database(pg, "failover"), args.coordinators,
                          lease_ms=args.lease_ms, partitions=args.partitions,
                          extra=["--min-session-timeout-ms", "1000"])
        cluster.start_all()
        cluster.wait_balanced()
        any_admin(cluster, "PUT", f"/v1/resources/{SET}", {"partitions": args.resources})
        per = -(-args.members // args.workers)
        for i in range(args.workers):
            first, count = i * per, min(per, args.members - i * per)
            if count <= 0:
                continue
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", str(i), "--urls", ",".join(cluster.urls),
                 "--first", str(first), "--count", str(count), "--ledger", str(ledgers[i]),
                 "--session-ms", str(args.session_ms),
                 "--commit-interval-ms", str(args.commit_interval_ms),
                 "--heartbeat-interval-ms", str(args.heartbeat_interval_ms)],
                stderr=open(Path(tmp.name) / f"w{i}.log", "wb")))  # noqa: SIM115
        gen0 = wait_stable(cluster, args.members, args.resources, 180)
        journal0 = journal_rows(cluster)
        t0 = time.monotonic()
        print(f"# group Stable at generation {gen0} with {args.members} members after "
              f"{t0 - started:.0f} s; journal rows {journal0}", flush=True)

        for k in range(args.kills):
            if time.monotonic() - started > args.max_seconds:
                print(f"# stopping after {k} kills: --max-seconds reached", flush=True)
                break
            victim = owner_index(cluster)
            if victim is None:
                raise RuntimeError("nobody owns the group's partition")
            killed_at = time.monotonic()
            cluster.kill(victim)
            while True:
                now_owner = owner_index(cluster)
                if now_owner is not None and now_owner != victim:
                    break
                if time.monotonic() - killed_at > args.lease_ms / 1000 * 3 + 10:
                    raise RuntimeError("no takeover")
                time.sleep(0.05)
            takeover = time.monotonic() - killed_at
            kills.append((killed_at, victim, takeover))
            print(f"kill {k + 1}: coordinator {victim} (kill -9); partition served by "
                  f"coordinator {now_owner} after {takeover:.2f} s (as seen by polling "
                  f"GET /v1/coordinators)", flush=True)
            time.sleep(args.settle_s)
            cluster.start(victim)
            cluster.wait_balanced()
            time.sleep(1.0)
        end_mark = time.monotonic()
        state = group_state(cluster)
        gen1 = int(state["generation_id"])
        journal1 = journal_rows(cluster)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(60)
        checkpoints = any_admin(cluster, "GET", f"/v1/groups/{GROUP}/checkpoints")
    finally:
        try:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait(30)
            if cluster is not None:
                cluster.stop()
        finally:
            pg.remove()

    events = read_ledgers(ledgers)
    tmp.cleanup()
    measured = [e for e in events if t0 <= e["t"] <= end_mark]
    ends = [e["t"] for e in events if e["ev"] == "end"]
    last = min(ends) if ends else end_mark
    commits = [e for e in events if e["ev"] == "commit" and e["t"] <= last]
    lost_calls = [e for e in measured if e["ev"] == "lost"]
    gens_seen = {e["gen"] for e in measured if e["ev"] in ("assigned", "revoked", "commit")}
    overlap_s, twice = double_ownership([e for e in events if e["t"] <= last], last)

    # answered again, per kill: each member's first acknowledged commit sent after it.
    lease_s = args.lease_ms / 1000
    recoveries: list[list[float]] = []
    acked = [c for c in commits if c["outcome"] == "ok"]
    by_member: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in acked:
        by_member[c["m"]].append(c)
    for i, (k_at, _victim, _takeover) in enumerate(kills):
        upto = kills[i + 1][0] if i + 1 < len(kills) else last
        delays = []
        for cs in by_member.values():
            first = next((c for c in cs if k_at <= c["sent"] < upto), None)
            if first is not None:
                delays.append(first["t"] - k_at)
        recoveries.append(delays)
    worst = [max(d) if d else float("nan") for d in recoveries]

    # acknowledged checkpoints lost
    best: dict[tuple[str, int], int] = {}
    for c in acked:
        for r in c["res"]:
            key = (r[0], int(r[1]))
            best[key] = max(best.get(key, 0), int(c["value"]))
    stored = {(row["set"], int(row["index"])): row["value"] for row in checkpoints["checkpoints"]}
    lost_acks = [r for r, v in best.items() if not isinstance(stored.get(r), int)
                 or int(stored[r]) < v]
    outcomes: dict[str, int] = defaultdict(int)
    for c in commits:
        if c["t"] >= t0:
            outcomes[c["outcome"]] += 1

    print(f"kills: {len(kills)} in {end_mark - t0:.0f} s; takeover seen by polling: median "
          f"{statistics.median(k[2] for k in kills):.2f} s, max {max(k[2] for k in kills):.2f} s"
          if kills else "kills: 0")
    if kills:
        flat = [d for ds in recoveries for d in ds]
        print(f"members answered again by the new owner (first acknowledged commit sent after "
              f"the kill): median {statistics.median(flat):.2f} s, worst member per kill: "
              f"median {statistics.median(worst):.2f} s, max {max(worst):.2f} s "
              f"(target <= lease + 1 s = {lease_s + 1:.1f} s: "
              f"{'met' if max(worst) <= lease_s + 1 else 'NOT met'}); members measured per "
              f"kill: {min(len(d) for d in recoveries)}-{max(len(d) for d in recoveries)}")
        print("worst member per kill, s: " + ", ".join(f"{w:.2f}" for w in worst))
        after = [sum(1 for e in lost_calls
                     if k_at <= e["t"] < (kills[i + 1][0] if i + 1 < len(kills) else last))
                 for i, (k_at, _v, _t) in enumerate(kills)]
        print("on_lost calls per kill: " + ", ".join(map(str, after)))
    print(f"rebalances from the first kill to the end: generation {gen0} -> {gen1} "
          f"({gen1 - gen0}); journal rows {journal0} -> {journal1} ({journal1 - journal0}); "
          f"generations the members used: {sorted(gens_seen)}")
    print(f"on_lost calls: {len(lost_calls)}")
    print(f"double ownership: {overlap_s:.3f} resource-seconds ({twice} resources)")
    print(f"acknowledged checkpoints lost: {len(lost_acks)} of {len(best):,} resources "
          f"(each resource's stored checkpoint against its largest acknowledged value)")
    print("commits from the first kill to the end: " +
          ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items())))
    print(f"# run took {time.monotonic() - started:.0f} s; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    ok = (kills and max(worst) <= lease_s + 1 and gen1 == gen0 and not lost_calls
          and overlap_s == 0 and not lost_acks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
