"""Soak: 2,000 members in 200 groups with churn, for a while (10 minutes by default).

    .venv/bin/python benchmarks/soak.py --minutes 10

Starts ``groupcoord serve`` on 127.0.0.1 with a fresh database, then runs
lightweight members in this process that speak the protocol directly over
aiohttp (join with the MEMBER_ID_REQUIRED step, leader assigns round-robin
over the catalog, sync, heartbeat every ``--heartbeat-ms``, commit their
checkpoints every ``--commit-ms``). Churn: every ``--churn-ms`` one member
leaves cleanly and a new one joins its group; every ``--crash-every``-th churn
event the member vanishes instead (no leave: its session expires).

Every ``--report-s`` it prints a line: heartbeats sent and their latency
p50/p99 in that window, rebalances completed, unexpected errors, the server's
resident memory. At the end: memory growth after warm-up, the error total by
kind (target 0) and the p99 over time. Expected outcomes are not errors:
``MEMBER_ID_REQUIRED`` on a first join, ``REBALANCE_IN_PROGRESS`` anywhere,
``ILLEGAL_GENERATION``/``UNKNOWN_MEMBER_ID`` to a member right after its group
expired a crashed peer's generation only when the member itself was crashed.
Everything else -- HTTP errors, timeouts, a live member expired, another
code -- is counted and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from protocol import codec
from protocol.resources import MemberMetadata, ResourceAssignment

GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))
MSGPACK = {"Content-Type": codec.CONTENT_TYPE}
SET = "soak"
EXPECTED = {"REBALANCE_IN_PROGRESS", "MEMBER_ID_REQUIRED"}


@dataclass
class Stats:
    hb_latencies: list[float] = field(default_factory=list)
    heartbeats: int = 0
    rebalances: int = 0
    commits: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    expected: Counter[str] = field(default_factory=Counter)

    def reset(self) -> Stats:
        old = Stats(self.hb_latencies, self.heartbeats, self.rebalances, self.commits,
                    self.errors, self.expected)
        self.hb_latencies, self.heartbeats, self.rebalances, self.commits = [], 0, 0, 0
        self.errors, self.expected = Counter(), Counter()
        return old


class Member:
    def __init__(self, soak: Soak, group: str) -> None:
        self.soak = soak
        self.group = group
        self.member_id = ""
        self.generation = -1
        self.assigned: list[int] = []
        self.stop = asyncio.Event()
        self.crash = False
        self.task: asyncio.Task[None] | None = None

    async def call(self, api: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """One protocol call; None (and an error counted) when it failed outright."""
        try:
            async with self.soak.session.post(f"{self.soak.url}/v1/{api}",
                                              data=codec.encode(body), headers=MSGPACK) as r:
                data = await r.read()
                if r.status != 200:
                    self.soak.stats.errors[f"{api}: HTTP {r.status}"] += 1
                    return None
                doc: dict[str, Any] = codec.decode(data)
                return doc
        except (aiohttp.ClientError, TimeoutError, codec.DecodeError) as exc:
            if not self.stop.is_set():
                self.soak.stats.errors[f"{api}: {type(exc).__name__}"] += 1
            return None

    def outcome(self, api: str, error: str | None) -> bool:
        """Count a protocol outcome; True when the member may carry on."""
        if error is None:
            return True
        if error in EXPECTED:
            self.soak.stats.expected[error] += 1
        elif not self.stop.is_set():
            self.soak.stats.errors[f"{api}: {error}"] += 1
        return False

    async def run(self) -> None:
        s = self.soak
        meta = MemberMetadata(sets=(SET,)).encode()
        while not self.stop.is_set():
            join = {"group_id": self.group, "member_id": self.member_id,
                    "protocol_type": "resources", "protocols": [["roundrobin", meta]],
                    "session_timeout_ms": s.args.session_ms,
                    "rebalance_timeout_ms": s.args.rebalance_ms, "client_id": "soak"}
            resp = await self.call("join", join)
            if resp is None:
                await asyncio.sleep(0.5)
                continue
            if resp["error"] == "MEMBER_ID_REQUIRED":
                s.stats.expected["MEMBER_ID_REQUIRED"] += 1
                self.member_id = resp["member_id"]
                continue
            if not self.outcome("join", resp["error"]):
                if resp["error"] in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"):
                    self.member_id = ""
                await asyncio.sleep(0.2)
                continue
            self.generation = resp["generation_id"]
            assignments = []
            if resp["leader"] == self.member_id:
                ids = sorted(m["member_id"] for m in resp["members"])
                for k, mid in enumerate(ids):
                    parts = list(range(k, s.args.partitions, len(ids)))
                    assignments.append({"member_id": mid,
                                        "assignment": ResourceAssignment({SET: parts}).encode()})
            sync = await self.call("sync", {"group_id": self.group, "member_id": self.member_id,
                                            "generation_id": self.generation,
                                            "assignments": assignments})
            if sync is None or not self.outcome("sync", sync["error"]):
                continue
            self.assigned = list(ResourceAssignment.decode(sync["assignment"]).assigned
                                 .get(SET, []))
            s.stats.rebalances += 1
            await self.heartbeat_until_rebalance()
        if not self.crash and self.member_id:
            await self.call("leave", {"group_id": self.group,
                                      "members": [{"member_id": self.member_id}]})

    async def heartbeat_until_rebalance(self) -> None:
        s = self.soak
        rng = s.rng
        next_commit = time.monotonic() + rng.uniform(0, s.args.commit_ms / 1000)
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), s.args.heartbeat_ms / 1000)
            if self.stop.is_set():
                return
            started = time.perf_counter()
            hb = await self.call("heartbeat", {"group_id": self.group,
                                               "member_id": self.member_id,
                                               "generation_id": self.generation})
            if hb is None:
                continue
            s.stats.heartbeats += 1
            s.stats.hb_latencies.append(time.perf_counter() - started)
            if not self.outcome("heartbeat", hb["error"]):
                if hb["error"] in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"):
                    self.member_id = "" if hb["error"] == "UNKNOWN_MEMBER_ID" else self.member_id
                return
            if self.assigned and time.monotonic() >= next_commit:
                next_commit += s.args.commit_ms / 1000
                value = time.monotonic_ns()
                commit = await self.call("commit", {
                    "group_id": self.group, "member_id": self.member_id,
                    "generation_id": self.generation,
                    "checkpoints": [[SET, p, value] for p in self.assigned]})
                if commit is not None and self.outcome("commit", commit["error"]):
                    s.stats.commits += 1


class Soak:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url
        self.rng = random.Random(args.seed)
        self.stats = Stats()
        self.members: list[Member] = []
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=args.rebalance_ms / 1000 + 30))

    def add(self, group: str) -> Member:
        m = Member(self, group)
        m.task = asyncio.create_task(m.run())
        self.members.append(m)
        return m

    async def churn(self, stop: asyncio.Event) -> Counter[str]:
        done: Counter[str] = Counter()
        n = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.churn_ms / 1000)
            if stop.is_set():
                break
            n += 1
            victim = self.rng.choice(self.members)
            self.members.remove(victim)
            victim.crash = self.args.crash_every > 0 and n % self.args.crash_every == 0
            done["crash" if victim.crash else "leave"] += 1
            victim.stop.set()
            self.add(victim.group)
            done["join"] += 1
        return done


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="groupcoord-soak-"))
    proc = subprocess.Popen(
        [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
         "--db", str(workdir / "soak.db"), "--initial-rebalance-delay-ms",
         str(args.initial_delay_ms), "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=(workdir / "server.log").open("wb"), text=True)
    assert proc.stdout is not None
    # The admin listener's line comes first, then the protocol listener's.
    admin = re.match(r"admin listening on (http://\S+)", proc.stdout.readline())
    m = re.match(r"listening on (http://\S+)", proc.stdout.readline())
    if not m or not admin:
        proc.kill()
        print(f"server did not start; see {workdir / 'server.log'}")
        return 2
    url = m.group(1)
    soak = Soak(args, url)
    try:
        async with soak.session.put(f"{admin.group(1)}/v1/resources/{SET}",
                                    json={"partitions": args.partitions}) as resp:
            assert resp.status == 200, await resp.text()
        groups = [f"soak-{g:03d}" for g in range(args.groups)]
        started = time.monotonic()
        for i in range(args.members):
            soak.add(groups[i % args.groups])
            if i % 100 == 99:
                await asyncio.sleep(0.05)  # do not open 2,000 connections in one tick
        print(f"groupcoord soak: {args.members} members in {args.groups} groups, "
              f"{args.minutes:g} min, heartbeat {args.heartbeat_ms} ms, session "
              f"{args.session_ms} ms, churn every {args.churn_ms} ms "
              f"(every {args.crash_every}th a crash); server pid {proc.pid}", flush=True)
        print(f"{'t(s)':>6} {'hb/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'rebal':>6} "
              f"{'commits':>7} {'errors':>6} {'rss MiB':>8}", flush=True)
        stop = asyncio.Event()
        churn = asyncio.create_task(soak.churn(stop))
        end = started + args.minutes * 60
        rows: list[tuple[float, float, float, int]] = []
        totals = Stats()
        while time.monotonic() < end:
            await asyncio.sleep(min(args.report_s, max(0.0, end - time.monotonic())))
            window = soak.stats.reset()
            t = time.monotonic() - started
            rss = rss_bytes(proc.pid)
            p50, p99 = pct(window.hb_latencies, 0.5) * 1000, pct(window.hb_latencies, 0.99) * 1000
            rows.append((t, p99, rss / 2**20, sum(window.errors.values())))
            totals.errors.update(window.errors)
            totals.expected.update(window.expected)
            totals.heartbeats += window.heartbeats
            totals.rebalances += window.rebalances
            totals.commits += window.commits
            totals.hb_latencies += window.hb_latencies
            print(f"{t:6.0f} {window.heartbeats / args.report_s:7.0f} {p50:7.1f} {p99:7.1f} "
                  f"{window.rebalances:6d} {window.commits:7d} "
                  f"{sum(window.errors.values()):6d} {rss / 2**20:8.1f}", flush=True)
        stop.set()
        churned = await churn
        for member in soak.members:
            member.stop.set()
        await asyncio.gather(*(m.task for m in soak.members if m.task is not None),
                             return_exceptions=True)
        warm = [r for r in rows if r[0] >= args.warmup_s] or rows
        growth = warm[-1][2] - warm[0][2]
        per_min = growth / max(1e-9, (warm[-1][0] - warm[0][0]) / 60)
        print()
        print(f"churn:            {dict(churned)}")
        print(f"heartbeats:       {totals.heartbeats}, p50 "
              f"{pct(totals.hb_latencies, 0.5) * 1000:.1f} ms, p99 "
              f"{pct(totals.hb_latencies, 0.99) * 1000:.1f} ms, max "
              f"{max(totals.hb_latencies, default=0) * 1000:.1f} ms")
        print("p99 over time:    " + ", ".join(f"{t:.0f}s {p:.0f}ms" for t, p, _, _ in rows))
        print(f"rebalances:       {totals.rebalances} completed syncs; commits {totals.commits}")
        print(f"expected:         {dict(totals.expected)}")
        print(f"server memory:    {warm[0][2]:.1f} MiB at {warm[0][0]:.0f}s -> "
              f"{warm[-1][2]:.1f} MiB at {warm[-1][0]:.0f}s ({growth:+.1f} MiB, "
              f"{per_min:+.2f} MiB/min after warm-up)")
        print(f"errors:           {sum(totals.errors.values())} unexpected"
              + (f": {dict(totals.errors.most_common(10))}" if totals.errors else ""))
        return 1 if totals.errors and args.strict else 0
    finally:
        await soak.session.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--members", type=int, default=2000)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--partitions", type=int, default=64, help="resources per group")
    p.add_argument("--heartbeat-ms", type=int, default=3000)
    p.add_argument("--session-ms", type=int, default=30000)
    p.add_argument("--rebalance-ms", type=int, default=30000)
    p.add_argument("--commit-ms", type=int, default=10000)
    p.add_argument("--churn-ms", type=int, default=1000, help="one leave+join every so often")
    p.add_argument("--crash-every", type=int, default=5,
                   help="every Nth churn event is a crash (no leave); 0: never")
    p.add_argument("--initial-delay-ms", type=int, default=1000)
    p.add_argument("--report-s", type=float, default=30.0)
    p.add_argument("--warmup-s", type=float, default=60.0,
                   help="memory growth is measured from the first report after this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--strict", action="store_true", help="exit 1 on any unexpected error")
    args = p.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
