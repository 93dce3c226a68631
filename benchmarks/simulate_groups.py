"""Run the deterministic group simulator (tests/sim) over many seeds.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_groups.py --seeds 2000 [--first 0]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_groups.py --seed 112 --trace

Each seed runs the real coordinator core and real member machines in one
thread on one simulated clock, with a configuration and a fault schedule
drawn from the seed, and checks the invariants of tests/sim/world.py after
every step. ``--seeds N [--first S]`` runs seeds S..S+N-1 (over ``--jobs``
processes), prints each failed seed's report (its configuration, the faults
that matter, the violations and the command that replays it), the totals and
the seeds per CPU-second, and exits 1 on any violation. ``--seed S`` runs one
seed; ``--trace`` prints its whole trace (byte-identical on every run).
``--profile chaos`` draws the real-process chaos harness's settings instead
of the whole valid space; ``--profile cluster`` draws the whole valid space
with two or three coordinators sharing a simulated database (leases, epochs,
failover; tests/sim/cluster.py).

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
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

if TYPE_CHECKING:
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


def run_many(first: int, count: int, profile: str = "space",
             jobs: int = 1) -> tuple[list[SeedResult], float]:
    """Seeds ``first..first+count-1``; returns the results and the wall seconds."""
    started = time.monotonic()
    if jobs <= 1:
        results = _block((first, count, profile))
    else:
        step = -(-count // (jobs * 8))  # small chunks: a slow chunk does not idle a worker
        chunks = [(s, min(step, first + count - s), profile)
                  for s in range(first, first + count, step)]
        with ProcessPoolExecutor(jobs) as pool:
            results = [r for chunk in pool.map(_block, chunks) for r in chunk]
    return results, time.monotonic() - started


def summary(results: list[SeedResult], wall_s: float) -> str:
    cpu = sum(r.cpu_s for r in results)
    faults: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
    bad = [r.seed for r in results if not r.ok]
    converged = [r.converged_after_ms for r in results if r.converged_after_ms is not None]
    lines = [
        f"seeds run:        {len(results)} ({results[0].seed}..{results[-1].seed})"
        if results else "seeds run:        0",
        f"faults injected:  {sum(faults.values())} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) + ")",
        f"events:           {sum(r.events for r in results)}; reordered commits of one "
        f"process applied late: {sum(r.reordered for r in results)}",
        f"converged:        {len(converged)} faulty seeds, "
        f"max {max(converged, default=0)} ms after the faults",
        f"speed:            {len(results) / cpu:.1f} seeds per CPU-second "
        f"({cpu:.1f} CPU-s, {wall_s:.1f} s wall)" if cpu > 0 else "speed: -",
        f"violations found: {sum(len(r.violations) for r in results)}"
        + (f" (seeds {bad[:50]})" if bad else ""),
    ]
    several = [r for r in results if r.coordinators > 1]
    if several:
        lines.insert(-2, f"coordinators:     {len(several)} seeds with several; the group's "
                         f"partition taken over {sum(r.takeovers for r in several)} times; "
                         f"{sum(r.refused_writes for r in several)} writes fenced or ended")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, help="how many seeds to run")
    p.add_argument("--first", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--trace", action="store_true", help="print the seed's whole trace")
    p.add_argument("--profile", choices=("space", "chaos", "cluster"), default="space")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (the machine's other users permitting)")
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
    jobs = min(args.jobs, os.cpu_count() or 1)
    results, wall = run_many(args.first, args.seeds, args.profile, jobs)
    for result in results:
        if not result.ok:
            print(report(result), flush=True)
    print(summary(results, wall))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
