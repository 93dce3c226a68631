"""Run the deterministic group simulator (tests/sim) over many seeds.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_groups.py --seeds 2000 [--first 0]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_groups.py --seed 112 --trace

Each seed runs the real coordinator core and real member machines in one
thread on one simulated clock, with a configuration and a fault schedule
drawn from the seed, and checks the invariants of tests/sim/world.py after
every step. ``--seeds N [--first S]`` runs seeds S..S+N-1 (over ``--jobs``
processes), prints each failed seed's report (its configuration, the faults
that matter, the violations and the command that replays it), the totals and
the seeds per CPU-second, and exits 1 on any violation. Results are added up
chunk by chunk (at most 1,000 seeds each), so a run of a million seeds keeps
only its failed seeds in memory; ``--progress SECONDS`` prints the running
totals while it goes. ``--seed S`` runs one
seed; ``--trace`` prints its whole trace (byte-identical on every run).
``--profile plain`` draws the whole valid space without the runtime's own
faults and limits (a third of the seeds of the default profile draw them:
sim.server); ``--profile chaos`` draws the real-process chaos harness's
settings instead of the whole valid space; ``--profile cluster`` draws the whole valid space
with two or three coordinators sharing a simulated database (leases, epochs,
failover; tests/sim/cluster.py).

``--coverage`` measures which lines of the production code the simulator
drives the seeds run (coverage.py, a dev dependency): the runtime, its
asyncio shell and its machine (coordinator/runtime: runtime.py, machine.py,
effects.py, commits.py), the member, its asyncio shell and its machine
(client/member.py, client/member_state/*.py, and its router's
client/routing.py) and the partition host, its asyncio shell and its
machine (coordinator/cluster/host.py, host_machine.py, host_effects.py: run
by ``--profile cluster`` only). Each worker process records its own data,
combined at the end; it prints each file's line coverage and names those
under 80 %; ``--show-missing`` adds the lines not run.

``--compiled DIR`` runs the same seeds 1.6-1.9 times as fast on modules
compiled by mypyc: build them first, outside the source tree, with
``benchmarks/build_sim_mypyc.py`` (needs a C compiler and the Python
headers; a few minutes), which prints DIR (default build/sim-mypyc). The
traces are the same as interpreted (same hashes); a build older than its
sources is refused. The test suite and CI run interpreted.
"""

from __future__ import annotations

import argparse
import gc
import glob
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

if TYPE_CHECKING:
    import coverage
    from sim import SeedResult
# ``sim`` is imported where it is used: ``--compiled`` must install its
# import hook before the simulator's modules are first imported.


def _block(args: tuple[int, int, str]) -> list[SeedResult]:
    from sim import run_seed

    first, count, profile = args
    # What the imports left is long-lived: the collector need not walk it again
    # at every full collection (a quarter of a seed's CPU time otherwise).
    # No seed's trace depends on when garbage is collected.
    gc.collect()
    gc.freeze()
    out = []
    for seed in range(first, first + count):
        result = run_seed(seed, profile=profile)
        result.trace = []
        out.append(result)
    return out


@dataclass
class Totals:
    """What a run of seeds adds up to, without keeping every seed's result:
    a run of a million seeds holds only the failed ones."""
    seeds: int = 0
    first: int | None = None
    last: int | None = None
    cpu_s: float = 0.0
    events: int = 0
    reordered: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    converged: int = 0
    converged_max_ms: int = 0
    several: int = 0
    takeovers: int = 0
    refused_writes: int = 0
    violations: int = 0
    failed: list[SeedResult] = field(default_factory=list)

    def add(self, r: SeedResult) -> None:
        self.seeds += 1
        self.first = r.seed if self.first is None else min(self.first, r.seed)
        self.last = r.seed if self.last is None else max(self.last, r.seed)
        self.cpu_s += r.cpu_s
        self.events += r.events
        self.reordered += r.reordered
        self.faults.update(r.faults)
        if r.converged_after_ms is not None:
            self.converged += 1
            self.converged_max_ms = max(self.converged_max_ms, r.converged_after_ms)
        if r.coordinators > 1:
            self.several += 1
            self.takeovers += r.takeovers
            self.refused_writes += r.refused_writes
        if not r.ok:
            self.violations += len(r.violations)
            self.failed.append(r)

    def merge(self, other: Totals) -> None:
        self.seeds += other.seeds
        for seed in (other.first, other.last):
            if seed is not None:
                self.first = seed if self.first is None else min(self.first, seed)
                self.last = seed if self.last is None else max(self.last, seed)
        self.cpu_s += other.cpu_s
        self.events += other.events
        self.reordered += other.reordered
        self.faults.update(other.faults)
        self.converged += other.converged
        self.converged_max_ms = max(self.converged_max_ms, other.converged_max_ms)
        self.several += other.several
        self.takeovers += other.takeovers
        self.refused_writes += other.refused_writes
        self.violations += other.violations
        self.failed.extend(other.failed)

    @classmethod
    def of(cls, results: list[SeedResult]) -> Totals:
        totals = cls()
        for r in results:
            totals.add(r)
        return totals


#: the production code the simulator drives (globs under the repository root).
COVERED = ("coordinator/runtime/runtime.py", "coordinator/runtime/machine.py",
           "coordinator/runtime/effects.py", "coordinator/runtime/commits.py",
           "client/member.py", "client/member_state/*.py", "client/routing.py",
           "coordinator/cluster/host.py", "coordinator/cluster/host_machine.py",
           "coordinator/cluster/host_effects.py")
#: the line coverage a file of COVERED is expected to reach.
COVERAGE_TARGET = 80.0

#: a worker's coverage measurement (``--coverage``), started before it imports
#: the simulator so that the modules' own top-level lines count.
_measuring: coverage.Coverage | None = None


def covered_files() -> list[Path]:
    return sorted(Path(f) for pattern in COVERED for f in glob.glob(str(ROOT / pattern)))


def _start_measuring(data_file: str) -> None:
    """A worker's initializer: its own data file (``data_suffix``: named after the
    process), combined by :func:`coverage_report`."""
    import coverage

    global _measuring
    _measuring = coverage.Coverage(data_file=data_file, data_suffix=True,
                                   include=[str(f) for f in covered_files()])
    _measuring.start()


def _block_totals(args: tuple[int, int, str]) -> Totals:
    totals = Totals.of(_block(args))
    if _measuring is not None:
        # Saved after every chunk: a pool's workers are ended without atexit.
        _measuring.stop()
        _measuring.save()
        _measuring.start()
    return totals


@dataclass(frozen=True)
class FileCoverage:
    path: str
    statements: int
    missing: tuple[int, ...]

    @property
    def percent(self) -> float:
        if not self.statements:
            return 100.0
        return 100.0 * (self.statements - len(self.missing)) / self.statements


def coverage_of(data_dir: str) -> list[FileCoverage]:
    """Combine the workers' data files in ``data_dir``; the line coverage of each
    file of COVERED (one never imported has every statement missing)."""
    import coverage

    cov = coverage.Coverage(data_file=os.path.join(data_dir, "data"),
                            include=[str(f) for f in covered_files()])
    cov.combine([data_dir], keep=False)
    cov.save()
    out = []
    for f in covered_files():
        _, statements, _, missing, _ = cov.analysis2(str(f))
        out.append(FileCoverage(str(f.relative_to(ROOT)), len(statements), tuple(missing)))
    return out


def _ranges(lines: tuple[int, ...]) -> str:
    parts: list[str] = []
    start = prev = None
    for n in lines:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = n
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def coverage_table(files: list[FileCoverage], show_missing: bool = False) -> str:
    width = max(len(f.path) for f in files)
    lines = [f"{'line coverage':<{width}}  stmts  miss   cover"]
    for f in files:
        mark = "  < 80 %" if f.percent < COVERAGE_TARGET else ""
        lines.append(f"{f.path:<{width}}  {f.statements:5}  {len(f.missing):4}  "
                     f"{f.percent:5.1f}%{mark}")
        if show_missing and f.missing:
            lines.append(f"    missing: {_ranges(f.missing)}")
    low = [f.path for f in files if f.percent < COVERAGE_TARGET]
    lines.append(f"under {COVERAGE_TARGET:.0f} %: " + (", ".join(low) if low else "none"))
    return "\n".join(lines)


def _chunks(first: int, count: int, profile: str, jobs: int,
            most: int) -> list[tuple[int, int, str]]:
    # Small chunks: a slow chunk does not idle a worker.
    step = max(1, min(most, -(-count // (jobs * 8))))
    return [(s, min(step, first + count - s), profile) for s in range(first, first + count, step)]


def run_many(first: int, count: int, profile: str = "space",
             jobs: int = 1) -> tuple[list[SeedResult], float]:
    """Seeds ``first..first+count-1``; returns the results and the wall seconds."""
    started = time.monotonic()
    if jobs <= 1:
        results = _block((first, count, profile))
    else:
        with ProcessPoolExecutor(jobs) as pool:
            results = [r for chunk in pool.map(_block, _chunks(first, count, profile, jobs,
                                                               count))
                       for r in chunk]
    return results, time.monotonic() - started


def run_totals(first: int, count: int, profile: str = "space", jobs: int = 1,
               progress_s: float | None = None,
               coverage_dir: str | None = None) -> tuple[Totals, float]:
    """The same seeds as ``run_many``, added up chunk by chunk (chunks of at
    most 1,000 seeds), for runs too long to keep every result; with
    ``progress_s``, a line of running totals at most that often; with
    ``coverage_dir``, each worker records its coverage data there."""
    from sim import report

    started = time.monotonic()
    totals = Totals()
    shown = started
    # Measuring: fresh worker processes (spawned, not forked from this one, which
    # imported the simulator already) that start measuring before they import it.
    pool = (ProcessPoolExecutor(jobs) if coverage_dir is None else
            ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                initializer=_start_measuring,
                                initargs=(os.path.join(coverage_dir, "data"),)))
    with pool:
        for part in pool.map(_block_totals, _chunks(first, count, profile, jobs, 1_000)):
            totals.merge(part)
            for r in part.failed:
                print(report(r), flush=True)
            now = time.monotonic()
            if progress_s is not None and now - shown >= progress_s:
                shown = now
                print(f"[{time.strftime('%H:%M:%S')}] {totals.seeds} of {count} seeds, "
                      f"{totals.seeds / max(totals.cpu_s, 1e-9):.1f} seeds per CPU-second, "
                      f"{totals.violations} violations, {now - started:.0f} s", flush=True)
    return totals, time.monotonic() - started


def summary(results: list[SeedResult] | Totals, wall_s: float) -> str:
    t = results if isinstance(results, Totals) else Totals.of(results)
    bad = [r.seed for r in t.failed]
    lines = [
        f"seeds run:        {t.seeds} ({t.first}..{t.last})" if t.seeds
        else "seeds run:        0",
        f"faults injected:  {sum(t.faults.values())} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(t.faults.items())) + ")",
        f"events:           {t.events}; reordered commits of one "
        f"process applied late: {t.reordered}",
        f"converged:        {t.converged} faulty seeds, "
        f"max {t.converged_max_ms} ms after the faults",
        f"speed:            {t.seeds / t.cpu_s:.1f} seeds per CPU-second "
        f"({t.cpu_s:.1f} CPU-s, {wall_s:.1f} s wall)" if t.cpu_s > 0 else "speed: -",
        f"violations found: {t.violations}" + (f" (seeds {bad[:50]})" if bad else ""),
    ]
    if t.several:
        lines.insert(-2, f"coordinators:     {t.several} seeds with several; the group's "
                         f"partition taken over {t.takeovers} times; "
                         f"{t.refused_writes} writes fenced or ended")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, help="how many seeds to run")
    p.add_argument("--first", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--trace", action="store_true", help="print the seed's whole trace")
    p.add_argument("--profile", choices=("space", "plain", "chaos", "cluster"),
                   default="space")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (the machine's other users permitting)")
    p.add_argument("--progress", type=float, metavar="SECONDS",
                   help="print running totals at most this often (long runs)")
    p.add_argument("--coverage", action="store_true",
                   help="measure and print the line coverage of the runtime's machine, the "
                        "member's and the partition host (coverage.py)")
    p.add_argument("--show-missing", action="store_true",
                   help="with --coverage: the lines not run, per file")
    p.add_argument("--compiled", type=Path, metavar="DIR",
                   help="run on the modules compiled by benchmarks/build_sim_mypyc.py into "
                        "DIR (same traces, 1.6-1.9 times as fast; not needed by the tests)")
    args = p.parse_args()
    if args.compiled is not None:
        from sim_compiled import StaleBuildError, install

        try:
            names = install(args.compiled)
        except StaleBuildError as e:
            p.error(f"--compiled: {e}")
        print(f"compiled:         {len(names)} modules from {args.compiled.resolve()}",
              flush=True)
    from sim import report, run_seed

    if args.compiled is not None:
        from sim_compiled import make_picklable

        make_picklable(names)  # results come back from --jobs workers pickled

    if args.seed is not None:
        result = run_seed(args.seed, keep_trace=args.trace, profile=args.profile)
        print(f"seed {args.seed}: config {result.config.describe()}")
        if args.trace:
            print("\n".join(result.trace))
        print(f"trace hash {result.trace_hash}; {result.events} events; "
              f"{result.cpu_s * 1000:.0f} ms CPU")
        if not result.ok:
            print(report(result))
            return 1
        print("no violation")
        return 0
    if args.seeds is None:
        p.error("give --seeds N (with --first S) or --seed S")
    if args.seeds <= 0 or args.jobs <= 0:
        p.error("--seeds and --jobs must be positive")
    if args.coverage and args.compiled is not None:
        p.error("--coverage measures the interpreted modules: not with --compiled")
    jobs = min(args.jobs, os.cpu_count() or 1)
    coverage_dir = tempfile.mkdtemp(prefix="simulate-coverage-") if args.coverage else None
    try:
        totals, wall = run_totals(args.first, args.seeds, args.profile, jobs, args.progress,
                                  coverage_dir)
        print(summary(totals, wall))
        if coverage_dir is not None:
            print(coverage_table(coverage_of(coverage_dir), args.show_missing))
    finally:
        if coverage_dir is not None:
            shutil.rmtree(coverage_dir, ignore_errors=True)
    return 0 if totals.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
