"""Scale-out: heartbeats over 2 coordinator processes on PostgreSQL against 1.

In one run, three set-ups are started side by side, each holding the same
10,000 members in 1,000 groups (10 members a group, formed by the join flow of
``server_heartbeat.py``: join, rejoin with the member id, sync), every group
formed at its owner as ``find_coordinator`` names it:

- ``sqlite-1``: one ``groupcoord serve`` on SQLite (the reference, today's shape);
- ``pg-1``: one coordinator on PostgreSQL (it owns all partitions);
- ``pg-2``: two coordinators on PostgreSQL sharing the partitions (32 + 32 of 64).

Then heartbeats are driven by wrk (``wrk_heartbeat.lua``, raw HTTP, each member
in turn, one wrk per coordinator with the bodies of the groups it owns, the
same total number of connections), in rounds that alternate the set-ups so
all see the same background load:

- ``sqlite-1`` and ``pg-1``: the server pinned to CPU 0, wrk to CPU 1;
- ``pg-2 one core``: both coordinators pinned to CPU 0, wrk to CPU 1: the same
  cores for the same roles as ``pg-1``, so the server CPU per heartbeat is
  compared on equal terms (the target: within 10 % of ``pg-1``'s);
- ``pg-2 two cores``: one coordinator on each CPU, the wrks free to run on
  either: the aggregate heartbeats/s of two processes;
- ``pg-1 free``: one coordinator and its wrk free to run on either CPU (what
  one process makes of the same two cores, as the two-core run's baseline).

Server CPU per heartbeat is the coordinators' utime + stime (``/proc/PID/stat``)
over the run divided by the heartbeats answered; PostgreSQL's CPU over the same
run (the postmaster and its children: lease renewals, as heartbeats write
nothing) and the load generator's (wrk, from ``getrusage`` of the children)
are printed beside it.

A run during which a coordinator dropped a partition (a "dropped" line in its
log: its lease ran out, so its groups moved or reloaded) or over 0.1 % of the
answers were errors is not the steady state measured: it is left out of the
figures, and counted.

How the aggregate is bounded here: with 2 cores the load generator takes its
share, so two coordinators plus wrk can at most reach
``2 / (server CPU + wrk CPU per heartbeat)``, against ``1 / server CPU`` for
one coordinator on its own core; the script prints that bound and, from the
CPU per heartbeat, what ``k`` coordinators on ``k`` cores of their own would
do (``k / server CPU``: no heartbeat touches the database).

    .venv/bin/python benchmarks/cluster_scaleout.py --members 10000 --groups 1000 \
        --duration 5 --repeat 3

Where PostgreSQL shares the cores the run saturates (one small machine), a
database stall can outlast the default 5 s lease and every run of the
two-core set-up is left out: ``--lease-ms 15000`` (docs/benchmarks.md,
"Several coordinators on PostgreSQL").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster_common import (
    Cluster,
    PostgresServer,
    cpu_seconds,
    find_owner,
    new_database,
    postgres_cpu_seconds,
    set_affinity,
    start_postgres,
)
from _server_common import GROUPCOORD, BenchMember, Server, client_session, form_group, post

HERE = Path(__file__).resolve().parent
SESSION_MS = 600_000
_RESULT = re.compile(r"RESULT (.*)")
_MOVED = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE")


@dataclass
class Setup:
    name: str
    servers: list[Server]
    urls: list[str]
    #: owner URL -> the members of the groups it owns.
    members: dict[str, list[BenchMember]] = field(default_factory=dict)
    bodies: dict[str, str] = field(default_factory=dict)
    #: groups formed again because their partition moved or reloaded meanwhile.
    retries: int = 0


@dataclass
class Run:
    requests: int
    failures: int
    seconds: float
    server_cpu: float
    wrk_cpu: float
    pg_cpu: float
    p99_ms: float
    wait_s: float  # seconds the servers waited for a CPU (other tenants' time)
    #: the slowest of the probe's small write transactions on PostgreSQL meanwhile (s).
    pg_write_max_s: float = 0.0

    @property
    def ok(self) -> int:
        return self.requests - self.failures

    @property
    def rate(self) -> float:
        """Heartbeats answered without error, per second."""
        return self.ok / self.seconds

    def per(self, cpu: float) -> float:
        """CPU microseconds per heartbeat answered without error."""
        return cpu * 1e6 / max(1, self.ok)


async def form_groups(setup: Setup, groups: int, group_size: int, parallel: int) -> None:
    names = [f"scale-{i:05d}" for i in range(groups)]
    async with client_session() as http:
        owners = dict(zip(names, await asyncio.gather(
            *(find_owner(http, setup.urls, g) for g in names)), strict=True))
        async def form(g: str) -> tuple[str, list[BenchMember]]:
            name = g
            for attempt in range(5):
                try:
                    return owners[name], await form_group(http, owners[name], name, group_size,
                                                          SESSION_MS)
                except RuntimeError as exc:
                    if not any(code in str(exc) for code in _MOVED) or attempt == 4:
                        raise
                # The partition moved or reloads (a lease ran out): a group of another
                # name (this one may hold members that joined), at its owner.
                setup.retries += 1
                await asyncio.sleep(0.5)
                name = f"{g}-again{attempt + 1}"
                owners[name] = await find_owner(http, setup.urls, name)
            raise AssertionError("unreachable")

        for start in range(0, len(names), parallel):
            batch = names[start:start + parallel]
            for owner, members in await asyncio.gather(*(form(g) for g in batch)):
                setup.members.setdefault(owner, []).extend(members)
        # Every member heartbeats fine at its owner before the measured runs.
        for url, members in setup.members.items():
            for m in members[:: max(1, len(members) // 20)]:
                answer = await post(http, url, "heartbeat", m.heartbeat_body())
                assert answer["error"] is None, (setup.name, answer)


def write_bodies(members: list[BenchMember], path: str) -> None:
    with open(path, "wb") as fh:
        for m in members:
            body = msgpack.packb(m.heartbeat_body(), use_bin_type=True)
            fh.write(struct.pack(">H", len(body)) + body)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sched_wait(pid: int) -> float:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (FileNotFoundError, IndexError):
            continue
    return total / 1e9


class WriteProbe:
    """Times a one-row write transaction on PostgreSQL (psql over the unix socket,
    process start included) every 0.5 s in a thread, as a lease renewal is one: a
    stall of the database or of the machine shows as a slow probe."""

    def __init__(self, pg: PostgresServer) -> None:
        self._pg = pg
        self._stop = threading.Event()
        self.slowest = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            t = time.perf_counter()
            self._pg.psql("INSERT INTO bench_probe VALUES (now())", "groupcoord")
            self.slowest = max(self.slowest, time.perf_counter() - t)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(30)
        return self.slowest


def drive(setup: Setup, pg: PostgresServer | None, args: argparse.Namespace,
          wrk_cpu: int | None) -> Run:
    """One wrk per coordinator of the set-up, all at once, the connections split."""
    connections = max(1, args.connections // len(setup.servers))
    procs = []
    pids = [s.proc.pid for s in setup.servers]
    cpu0 = sum(cpu_seconds(p) for p in pids)
    wait0 = sum(sched_wait(p) for p in pids)
    pg0 = postgres_cpu_seconds(pg) if pg is not None else 0.0
    kids0 = children_cpu()
    started = time.perf_counter()
    for url, bodies in setup.bodies.items():
        cmd = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{args.duration}s",
               "--timeout", "5s", "-s", str(HERE / "wrk_heartbeat.lua"), url]
        if wrk_cpu is not None:
            cmd = ["taskset", "-c", str(wrk_cpu), *cmd]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env={**os.environ, "GROUPCOORD_BODIES": bodies}))
    probe = WriteProbe(pg) if pg is not None else None
    outs = [p.communicate(timeout=args.duration + 60) for p in procs]
    stall = probe.stop() if probe is not None else 0.0
    elapsed = time.perf_counter() - started
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    wait = sum(sched_wait(p) for p in pids) - wait0
    pg_cpu = (postgres_cpu_seconds(pg) - pg0) if pg is not None else 0.0
    wrk = children_cpu() - kids0
    requests = failures = 0
    duration = 0.0
    p99 = 0.0
    for out, err in outs:
        m = _RESULT.search(out)
        if m is None:
            raise RuntimeError(f"wrk printed no RESULT line:\n{out}\n{err}")
        r = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        requests += r["requests"]
        failures += r["failures"] + r["socket_errors"]
        duration = max(duration, r["duration_us"] / 1e6)
        p99 = max(p99, r["p99_us"] / 1000)
    return Run(requests, failures, min(duration, elapsed) or elapsed, cpu, wrk, pg_cpu, p99,
               wait, stall)


async def error_tally(setup: Setup, sample: int = 500) -> dict[str, int]:
    """The answers a sample of the set-up's members get to a heartbeat now."""
    tally: dict[str, int] = {}
    async with client_session() as http:
        for url, members in setup.members.items():
            for m in members[:: max(1, len(members) // sample)]:
                try:
                    answer = await post(http, url, "heartbeat", m.heartbeat_body())
                    key = str(answer["error"])
                except Exception as exc:
                    key = type(exc).__name__
                tally[key] = tally.get(key, 0) + 1
    return tally


def line(label: str, runs: list[Run]) -> str:
    med = statistics.median
    rates = [r.rate for r in runs]
    cpu = [r.per(r.server_cpu) for r in runs]
    return (f"{label:<22} {med(rates):>8,.0f} heartbeats/s ({min(rates):,.0f}-{max(rates):,.0f})"
            f"  p99 {med(r.p99_ms for r in runs):6.1f} ms"
            f"  server CPU {med(cpu):5.1f} us/heartbeat ({min(cpu):.1f}-{max(cpu):.1f})"
            f"  wrk {med(r.per(r.wrk_cpu) for r in runs):4.1f} us"
            f"  PostgreSQL {med(r.per(r.pg_cpu) for r in runs):4.1f} us"
            f"  servers waited for a CPU {med(r.wait_s for r in runs):.1f} s/run"
            f"  slowest PostgreSQL write probe {max(r.pg_write_max_s for r in runs):.2f} s"
            f"  failed answers {sum(r.failures for r in runs):,} of "
            f"{sum(r.requests for r in runs):,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--parallel-groups", type=int, default=100)
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds over the set-ups")
    parser.add_argument("--connections", type=int, default=64,
                        help="in total, split between a set-up's coordinators")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--lease-ms", type=int, default=5_000)
    parser.add_argument("--keep-logs", help="copy the coordinators' logs to this directory")
    args = parser.parse_args()
    if args.members % args.groups:
        parser.error("--members must be a multiple of --groups")
    group_size = args.members // args.groups
    cores = os.cpu_count() or 1

    print(f"# {time.strftime('%Y-%m-%d %H:%M')} UTC  {args.members:,} members in "
          f"{args.groups:,} groups per set-up; wrk -t1, {args.connections} connections per "
          f"set-up, {args.duration} s x {args.repeat} rounds; {cores} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    pg = start_postgres()
    setups: list[Setup] = []
    clusters: list[Cluster] = []
    sqlite: Server | None = None
    tmp = tempfile.TemporaryDirectory(prefix="groupcoord-scaleout-")
    try:
        print(f"# PostgreSQL {pg.psql('SHOW server_version').strip()}, throw-away cluster on "
              f"127.0.0.1; --lease-ms {args.lease_ms} --partitions {args.partitions}",
              flush=True)
        sqlite = Server([GROUPCOORD, "serve", "--host",
                         "127.0.0.1", "--port", "0", "--admin-port", "0",
                         "--db", os.path.join(tmp.name, "s.db"), "--log-level", "WARNING",
                         "--initial-rebalance-delay-ms", "500",
                         "--min-session-timeout-ms", "1000"])
        setups.append(Setup("sqlite-1", [sqlite], [sqlite.url]))
        pg.psql("CREATE TABLE bench_probe (at timestamptz)", "groupcoord")
        for name, n in (("pg-1", 1), ("pg-2", 2)):
            log_dir = Path(tmp.name) / name
            log_dir.mkdir()
            cluster = Cluster(new_database(pg, name.replace("-", "_")), n,
                              lease_ms=args.lease_ms, partitions=args.partitions,
                              log_dir=log_dir,
                              extra=["--initial-rebalance-delay-ms", "500",
                                     "--min-session-timeout-ms", "1000"])
            clusters.append(cluster)
            cluster.start_all()
            cluster.wait_balanced()
            setups.append(Setup(name, cluster.live(), list(cluster.urls)))
        for setup in setups:
            t0 = time.perf_counter()
            asyncio.run(form_groups(setup, args.groups, group_size, args.parallel_groups))
            split = ", ".join(f"{len(m):,}" for m in setup.members.values())
            print(f"# {setup.name}: {args.groups:,} groups formed in "
                  f"{time.perf_counter() - t0:.1f} s (members per coordinator: {split}; groups "
                  f"formed again after their partition moved: {setup.retries})",
                  flush=True)
            for i, (url, members) in enumerate(setup.members.items()):
                path = os.path.join(tmp.name, f"{setup.name}-{i}.bin")
                write_bodies(members, path)
                setup.bodies[url] = path

        runs: dict[str, list[Run]] = {}
        invalid: dict[str, list[Run]] = {}

        def measure(label: str, setup: Setup, pins: list[set[int] | None],
                    wrk_cpu: int | None) -> None:
            for server, cpus in zip(setup.servers, pins, strict=True):
                set_affinity(server.proc.pid, cpus)
            drops = [sum(c.log_lines("dropped").values()) for c in clusters]
            run = drive(setup, pg if setup.name != "sqlite-1" else None, args, wrk_cpu)
            moved = [sum(c.log_lines("dropped").values()) for c in clusters] != drops
            if run.failures > run.requests // 1000 or moved:
                # Partitions moved or members were refused: not the steady state measured.
                invalid.setdefault(label, []).append(run)
            else:
                runs.setdefault(label, []).append(run)
            if run.failures or moved:
                print(f"# {label}: {run.failures:,} of {run.requests:,} answers were errors "
                      f"(slowest PostgreSQL write probe {run.pg_write_max_s:.2f} s); "
                      f"a sample of members now gets: {asyncio.run(error_tally(setup))}; "
                      f"partitions dropped so far (coordinator log lines): "
                      f"{[c.log_lines('dropped') for c in clusters]}", flush=True)

        by_name = {s.name: s for s in setups}
        two = cores >= 2
        for _ in range(args.repeat):
            measure("sqlite-1", by_name["sqlite-1"], [{0}], 1 if two else None)
            measure("pg-1", by_name["pg-1"], [{0}], 1 if two else None)
            measure("pg-2 one core", by_name["pg-2"], [{0}, {0}], 1 if two else None)
            measure("pg-2 two cores", by_name["pg-2"], [{0}, {1 if two else 0}], None)
            measure("pg-1 free", by_name["pg-1"], [None], None)
        for label, rs in invalid.items():
            print(f"# {label}: {len(rs)} run(s) left out of the figures: partitions were "
                  f"dropped (see the coordinators' logs) or over 0.1 % of the answers were "
                  f"errors", flush=True)
        if any(label not in runs for label in ("sqlite-1", "pg-1", "pg-1 free",
                                                "pg-2 one core", "pg-2 two cores")):
            print("# no valid run of some set-up: no comparison", flush=True)
            return 1
        for label, rs in runs.items():
            print(line(label, rs), flush=True)

        med = statistics.median

        def cpu_of(label: str) -> float:
            return med(r.per(r.server_cpu) for r in runs[label])

        pg1, pg2_one, pg2_two, lite = (cpu_of("pg-1"), cpu_of("pg-2 one core"),
                                       cpu_of("pg-2 two cores"), cpu_of("sqlite-1"))
        ratios = [b.per(b.server_cpu) / a.per(a.server_cpu)
                  for a, b in zip(runs["pg-1"], runs["pg-2 one core"], strict=False)]
        print(f"server CPU per heartbeat, 2 processes / 1 (same cores, same run): "
              f"{pg2_one / pg1:.3f} (rounds: {', '.join(f'{x:.3f}' for x in ratios)}); "
              f"target <= 1.10: {'met' if pg2_one / pg1 <= 1.10 else 'NOT met'}")
        free = cpu_of("pg-1 free")
        print(f"server CPU per heartbeat, 2 processes on 2 cores / 1 free on 2 cores: "
              f"{pg2_two / free:.3f}; pg-1 / sqlite-1 (one process each, pinned): "
              f"{pg1 / lite:.3f}")
        agg = [b.rate / a.rate for a, b in zip(runs["pg-1"], runs["pg-2 two cores"],
                                               strict=False)]
        wrk_us = med(r.per(r.wrk_cpu) for r in runs["pg-2 two cores"])
        bound = 2 * pg1 / (pg2_two + wrk_us)
        agg_free = [b.rate / a.rate for a, b in zip(runs["pg-1 free"], runs["pg-2 two cores"],
                                                    strict=False)]
        print(f"aggregate heartbeats/s, 2 processes on 2 cores / 1 process on its own core: "
              f"{med(agg):.2f} (rounds: {', '.join(f'{x:.2f}' for x in agg)}); / 1 process "
              f"free on the 2 cores: {med(agg_free):.2f} "
              f"(rounds: {', '.join(f'{x:.2f}' for x in agg_free)})")
        print(f"bound on this machine: 2 cores shared by both coordinators and wrk "
              f"({wrk_us:.1f} us of wrk per heartbeat) allow at most "
              f"2 / ({pg2_two:.1f} + {wrk_us:.1f}) us = {2e6 / (pg2_two + wrk_us):,.0f}/s, "
              f"a ratio of at most {bound:.2f} against one coordinator on a core of its own "
              f"({1e6 / pg1:,.0f}/s at {pg1:.1f} us), and less by whatever the machine's "
              f"other tenants take (the servers waited for a CPU "
              f"{med(r.wait_s for r in runs['pg-2 two cores']):.1f} s per "
              f"{args.duration} s run)")
        for k in (2, 4, 8):
            print(f"projection: {k} coordinators on {k} cores of their own (load generators "
                  f"elsewhere): {k * 1e6 / pg2_two:,.0f} heartbeats/s ({k}x one at "
                  f"{pg2_two:.1f} us each; PostgreSQL's share is the leases, "
                  f"{med(r.per(r.pg_cpu) for r in runs['pg-2 two cores']):.1f} us/heartbeat "
                  f"here)")
        for name, cluster in zip(("pg-1", "pg-2"), clusters, strict=True):
            print(f"# {name}: coordinator log lines 'dropped' {cluster.log_lines('dropped')}, "
                  f"'lease round failed' {cluster.log_lines('lease round failed')}")
    finally:
        try:
            for cluster in clusters:
                cluster.stop()
            if sqlite is not None:
                sqlite.stop()
            if args.keep_logs:
                shutil.copytree(tmp.name, args.keep_logs, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.bin", "*.db*"))
        finally:
            pg.remove()
            tmp.cleanup()
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
