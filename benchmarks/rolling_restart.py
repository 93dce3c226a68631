"""Rolling restart of a group of worker processes: eager vs cooperative vs
cooperative with static membership vs drain with warm-up standbys (figures in
docs/bench-client.md and docs/benchmarks.md).

    .venv/bin/python benchmarks/rolling_restart.py [--workers 10] [--resources 200]
        [--modes eager cooperative static drain] [--warmup-ms 0]

For each mode it starts ``groupcoord serve`` on a temporary database, creates
one resource set, starts the workers (separate processes, each a
``GroupMember``) and waits until every resource is owned exactly once. Then it
restarts the workers one after another: the replacement process is started
ahead (it imports the library and waits), the old one gets SIGTERM (its
member revokes everything and, unless static, leaves the group) and exits,
the replacement joins, and the orchestrator waits until the group settled
before the next restart. Interpreter start-up is thus kept out of every
mode's gap alike; what remains is the protocol's cost.

Every worker writes a ledger of its callbacks with ``time.time()``; a
resource is owned from the start of its ``on_assigned`` to the start of its
``on_revoked``/``on_lost``. A worker needs ``--warmup-ms`` of work per
resource before it serves it warm (loading state), one resource at a time;
what it owns and has not warmed yet it serves cold. It warms a resource it
is given (in the background, after ``on_assigned``) unless it warmed it as a
standby (``on_standby``, awaited); it forgets a resource's warm state when it
loses it, and a queued warm-up skips a resource lost or dropped meanwhile
(``on_standby_dropped``: stop warming it). Printed per mode: completed
rebalances (the coordinator's ``groupcoord_rebalances_completed_total``),
resource-seconds during which resources had no owner, resource-seconds
served cold, the median time a moved resource had no owner, the drains'
durations (SIGTERM to closed), and the wall time of the rolling restart.
The ledger is also checked: no resource ever had two owners.

Modes: ``eager`` (range assignor, dynamic members), ``cooperative``
(cooperative-sticky, dynamic), ``static`` (cooperative-sticky with
``group_instance_id``: a restart within the session timeout gets the same
resources back without a rebalance, KIP-345), ``drain`` (balanced with
``warmup``: on SIGTERM the worker calls ``member.drain()``, its resources go
to the others through standby first, and a replacement is given its share
the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MODES = {
    "eager": {"assignors": ["range"], "static": False},
    "cooperative": {"assignors": ["cooperative-sticky"], "static": False},
    "static": {"assignors": ["cooperative-sticky"], "static": True},
    "drain": {"assignors": ["balanced"], "static": False},
}
#: the drain mode's assignor: warm moving resources up first.
WARMUP_SETTINGS = {"balanced": {"warmup": True, "warmup_timeout_ms": 30_000}}
SET = "s"

Resource = tuple[str, int]
Event = tuple[float, str, str, list[Resource]]


# ---------------------------------------------------------------- the worker process


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rolling_restart.py worker")
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("ledger")
    p.add_argument("--mode", choices=sorted(MODES), required=True)
    p.add_argument("--instance-id", default=None)
    p.add_argument("--warmup-ms", type=float, default=0.0)
    p.add_argument("--session-ms", type=int, default=10_000)
    args = p.parse_args(argv)
    return asyncio.run(_worker(args))


async def _worker(args: argparse.Namespace) -> int:
    from client import GroupMember, RebalanceListener

    out = open(args.ledger, "a", encoding="utf-8")  # noqa: SIM115 - closed below

    def write(kind: str, resources: Iterable[Resource]) -> None:
        out.write(json.dumps({"t": time.time(), "member": args.name, "kind": kind,
                              "resources": sorted([s, i] for s, i in resources)}) + "\n")
        out.flush()

    warmup_s = args.warmup_ms / 1000
    owned: set[Resource] = set()
    standby: set[Resource] = set()
    warm: set[Resource] = set()
    one_at_a_time = asyncio.Lock()
    background: set[asyncio.Task[None]] = set()

    async def warm_up(resources: Iterable[Resource]) -> None:
        for r in sorted(resources):
            async with one_at_a_time:
                # Neither warm already, nor lost or dropped while waiting for
                # its turn (on_standby_dropped: stop warming it).
                if r in warm or (r not in owned and r not in standby):
                    continue
                await asyncio.sleep(warmup_s)
            if r in owned or r in standby:
                warm.add(r)
                write("warm", [r])

    def forget(resources: Iterable[Resource]) -> None:
        owned.difference_update(resources)
        warm.difference_update(resources)

    class Ledger(RebalanceListener):
        async def on_assigned(self, resources: set[Resource]) -> None:
            write("assigned", resources)
            owned.update(resources)
            standby.difference_update(resources)
            cold = resources - warm
            if cold:
                task = asyncio.ensure_future(warm_up(cold))
                background.add(task)
                task.add_done_callback(background.discard)

        async def on_revoked(self, resources: set[Resource]) -> None:
            write("revoked", resources)
            forget(resources)

        async def on_lost(self, resources: set[Resource]) -> None:
            write("lost", resources)
            forget(resources)

        async def on_standby(self, resources: set[Resource]) -> None:
            write("standby", resources)
            standby.update(resources)
            await warm_up(resources)

        async def on_standby_dropped(self, resources: set[Resource]) -> None:
            write("dropped", resources)
            standby.difference_update(resources)
            warm.difference_update(resources - owned)

    mode = MODES[args.mode]
    assignors: list[str] = list(mode["assignors"])  # type: ignore[call-overload]
    member = GroupMember(args.url, "bench", [SET], assignors=assignors,
                         listener=Ledger(), client_id=args.name,
                         group_instance_id=args.instance_id,
                         session_timeout_ms=args.session_ms,
                         heartbeat_interval_ms=max(100, args.session_ms // 5),
                         rebalance_timeout_ms=30_000,
                         assignor_settings=WARMUP_SETTINGS if args.mode == "drain" else None)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Ready: imports done. Join when the orchestrator says "go".
    print("ready", flush=True)
    go = await loop.run_in_executor(None, sys.stdin.readline)
    if go.strip() != "go":
        return 0
    member.start()
    await stop.wait()
    if args.mode == "drain":
        started = time.time()
        drained = await member.drain(timeout_s=30)
        out.write(json.dumps({"t": time.time(), "member": args.name, "kind": "drained",
                              "resources": [], "took": time.time() - started,
                              "ok": drained}) + "\n")
    await member.close()
    out.close()
    print("closed", flush=True)  # revoked (and left): the replacement may join
    return 0 if member.failure is None else 1


# ---------------------------------------------------------------- ledger arithmetic


def read_events(paths: Iterable[Path]) -> list[Event]:
    events: list[Event] = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    ev = json.loads(line)
                    events.append((ev["t"], ev["member"], ev["kind"],
                                   [(s, i) for s, i in ev["resources"]]))
    events.sort(key=lambda e: e[0])
    return events


def drain_times(paths: Iterable[Path]) -> list[tuple[float, bool]]:
    """Each drain: (seconds from its start to the member owning nothing, ok)."""
    out = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                ev = json.loads(line) if line.strip() else {}
                if ev.get("kind") == "drained":
                    out.append((ev["took"], ev["ok"]))
    return out


def cold_seconds(events: list[Event], start: float, end: float) -> float:
    """Resource-seconds within [start, end] during which a resource was owned
    but its owner had not warmed it yet."""

    def overlap(a: float, b: float) -> float:
        return max(0.0, min(b, end) - max(a, start))

    warm: dict[str, set[Resource]] = {}
    cold_since: dict[tuple[str, Resource], float] = {}
    total = 0.0
    for t, member, kind, rs in events:
        mine = warm.setdefault(member, set())
        for r in rs:
            key = (member, r)
            if kind == "assigned" and r not in mine:
                cold_since[key] = t
            elif kind == "warm":
                mine.add(r)
                if key in cold_since:
                    total += overlap(cold_since.pop(key), t)
            elif kind in ("revoked", "lost", "dropped"):
                mine.discard(r)
                if key in cold_since and kind != "dropped":
                    total += overlap(cold_since.pop(key), t)
    return total + sum(overlap(t0, end) for t0 in cold_since.values())


def unowned_gaps(events: list[Event], start: float, end: float) -> list[float]:
    """Each time a resource changed owner within [start, end]: how long it
    had none (from its revocation to its next ``on_assigned``)."""
    held: dict[Resource, str] = {}
    free_since: dict[Resource, float] = {}
    gaps = []
    for t, member, kind, rs in events:
        for r in rs:
            if kind == "assigned":
                t0 = free_since.pop(r, None)
                if t0 is not None and start <= t0 and t <= end:
                    gaps.append(t - t0)
                held[r] = member
            elif kind in ("revoked", "lost") and held.get(r) == member:
                del held[r]
                free_since[r] = t
    return gaps


def standbys(events: list[Event]) -> set[tuple[str, Resource]]:
    """The standbys given and not yet taken over or dropped (a hand-over under
    way: the group has not settled)."""
    out: set[tuple[str, Resource]] = set()
    for _, member, kind, rs in events:
        for r in rs:
            if kind == "standby":
                out.add((member, r))
            elif kind in ("assigned", "dropped"):
                out.discard((member, r))
    return out


def holders(events: list[Event]) -> dict[Resource, str]:
    """Replay; raise on double ownership."""
    held: dict[Resource, str] = {}
    for t, member, kind, resources in events:
        for r in resources:
            if kind == "assigned":
                if r in held and held[r] != member:
                    raise AssertionError(f"{r} owned by {held[r]} and {member} at {t}")
                held[r] = member
            elif kind in ("revoked", "lost") and held.get(r) == member:
                del held[r]
    return held


def unowned_seconds(events: list[Event], resources: list[Resource], start: float,
                    end: float) -> float:
    """Resource-seconds within [start, end] during which a resource had no owner
    processing it."""

    def overlap(a: float, b: float) -> float:
        return max(0.0, min(b, end) - max(a, start))

    held: dict[Resource, str] = {}
    free_since: dict[Resource, float] = dict.fromkeys(resources, start)
    total = 0.0
    for t, member, kind, rs in events:
        for r in rs:
            if kind == "assigned":
                if r in free_since:
                    total += overlap(free_since.pop(r), t)
                held[r] = member
            elif kind in ("revoked", "lost") and held.get(r) == member:
                del held[r]
                free_since[r] = t
    return total + sum(overlap(t0, end) for t0 in free_since.values())


# ---------------------------------------------------------------- the orchestrator


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[str]


class Bench:
    def __init__(self, mode: str, args: argparse.Namespace, tmp: Path) -> None:
        self.mode = mode
        self.args = args
        self.tmp = tmp
        self.server: subprocess.Popen[str] | None = None
        self.url = ""
        self.admin_url = ""
        self.ledgers: list[Path] = []
        self.live: dict[int, Worker] = {}
        self.generation = 0
        self.resources = [(SET, i) for i in range(args.resources)]

    def start_server(self) -> None:
        cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--host", "127.0.0.1",
               "--port", "0", "--admin-port", "0", "--db", str(self.tmp / f"{self.mode}.db"),
               "--initial-rebalance-delay-ms", "0", "--min-session-timeout-ms", "500",
               "--log-level", "WARNING"]
        self.server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True)
        # The admin listener's line comes first, then the protocol listener's.
        self.admin_url = _read_line(self.server.stdout, r"^admin listening on (\S+)", 20)
        self.url = _read_line(self.server.stdout, r"^listening on (\S+)", 20)
        req = urllib.request.Request(f"{self.admin_url}/v1/resources/{SET}", method="PUT",
                                     data=json.dumps({"partitions": self.args.resources}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def rebalances(self) -> int:
        text = urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=5).read().decode()
        m = re.search(r"^groupcoord_rebalances_completed_total (\S+)$", text, re.M)
        return int(float(m.group(1))) if m else -1

    def prepare(self, slot: int) -> Worker:
        self.generation += 1
        name = f"w{slot}#{self.generation}"
        ledger = self.tmp / f"{self.mode}-{name}.jsonl"
        self.ledgers.append(ledger)
        cmd = [sys.executable, os.path.abspath(__file__), "worker", self.url, name, str(ledger),
               "--mode", self.mode, "--warmup-ms", str(self.args.warmup_ms),
               "--session-ms", str(self.args.session_ms)]
        if MODES[self.mode]["static"]:
            cmd += ["--instance-id", f"worker-{slot}"]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _read_line(proc.stdout, r"^(ready)$", 30)
        return Worker(name, proc)

    def go(self, slot: int, worker: Worker) -> None:
        assert worker.proc.stdin is not None
        worker.proc.stdin.write("go\n")
        worker.proc.stdin.flush()
        self.live[slot] = worker

    def stop(self, slot: int) -> Worker:
        """SIGTERM; return once the worker's member is closed (the process
        may still be tearing down its interpreter)."""
        worker = self.live.pop(slot)
        worker.proc.send_signal(signal.SIGTERM)
        _read_line(worker.proc.stdout, r"^(closed)$", 30)
        return worker

    def wait_settled(self, quiet_s: float = 0.3, timeout_s: float = 60.0) -> None:
        expect = {w.name for w in self.live.values()}
        deadline = time.monotonic() + timeout_s
        last: dict[Resource, str] | None = None
        since = time.monotonic()
        while time.monotonic() < deadline:
            events = read_events(self.ledgers)
            try:
                held = holders(events)
            except AssertionError:
                # The ledgers are read one after another while the workers
                # write them: a hand-over seen half. The final check is strict.
                time.sleep(0.05)
                continue
            if held != last:
                last, since = held, time.monotonic()
            elif (len(held) == len(self.resources) and set(held.values()) == expect
                  and not standbys(events) and time.monotonic() - since >= quiet_s):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.mode}: the group did not settle within {timeout_s}s")

    def run(self) -> dict[str, Any]:
        self.start_server()
        for slot in range(self.args.workers):
            self.go(slot, self.prepare(slot))
        # With warm-up, ten members joining one owner of everything settle
        # slowly (each join re-plans the standbys under way): not measured.
        self.wait_settled(quiet_s=1.0, timeout_s=300)
        rebalances0 = self.rebalances()
        t0 = time.time()
        for slot in range(self.args.workers):
            replacement = self.prepare(slot)  # interpreter start-up outside the gap
            old = self.stop(slot)
            self.go(slot, replacement)
            old.proc.wait(30)
            self.wait_settled()
        t1 = time.time()
        rebalances = self.rebalances() - rebalances0
        events = read_events(self.ledgers)
        holders(events)  # raises on double ownership
        gaps = sorted(unowned_gaps(events, t0, t1))
        return {"mode": self.mode, "rebalances": rebalances,
                "unowned_resource_seconds": unowned_seconds(events, self.resources, t0, t1),
                "cold_resource_seconds": cold_seconds(events, t0, t1),
                "moves": len(gaps), "median_gap_s": gaps[len(gaps) // 2] if gaps else 0.0,
                "drains": drain_times(self.ledgers),
                "wall_s": t1 - t0}

    def cleanup(self) -> None:
        for w in self.live.values():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.live.values():
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()


def _read_line(stream: IO[str] | None, pattern: str, timeout_s: float) -> str:
    assert stream is not None
    found: list[str] = []

    def read() -> None:
        for line in stream:
            m = re.match(pattern, line.strip())
            if m:
                found.append(m.group(1))
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    if not found:
        raise RuntimeError(f"no line matching {pattern!r} within {timeout_s}s")
    return found[0]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        return worker_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=10)
    p.add_argument("--resources", type=int, default=200)
    p.add_argument("--modes", nargs="+", choices=sorted(MODES),
                   default=["eager", "cooperative", "static", "drain"])
    p.add_argument("--warmup-ms", type=float, default=0.0,
                   help="per-resource work before a newly owned resource is served warm")
    p.add_argument("--session-ms", type=int, default=10_000)
    args = p.parse_args()
    results = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix="rolling-") as tmp:
            bench = Bench(mode, args, Path(tmp))
            try:
                results.append(bench.run())
            finally:
                bench.cleanup()
        r = results[-1]
        drains = sorted(took for took, _ in r["drains"])
        print(f"{mode:12s} rebalances={r['rebalances']:3d}  "
              f"unowned={r['unowned_resource_seconds']:9.3f} resource-s  "
              f"cold={r['cold_resource_seconds']:9.3f} resource-s  "
              f"moves={r['moves']:4d} median-unowned={1000 * r['median_gap_s']:6.1f} ms  "
              f"wall={r['wall_s']:6.2f} s"
              + (f"  drains: median {drains[len(drains) // 2]:.2f} s, max {drains[-1]:.2f} s, "
                 f"{sum(1 for _, ok in r['drains'] if not ok)} timed out" if drains else ""),
              flush=True)
    base = next((r for r in results if r["mode"] == "cooperative"), None)
    if base is not None:
        lost = base["unowned_resource_seconds"] + base["cold_resource_seconds"]
        for r in results:
            mine = r["unowned_resource_seconds"] + r["cold_resource_seconds"]
            if r is not base and mine > 0:
                print(f"cooperative / {r['mode']}: {lost / mine:.1f}x less unowned-or-cold "
                      "resource time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
