"""The long chaos runner: many seeds of tests/chaos/harness.py, then the totals.

    .venv/bin/python benchmarks/chaos.py --seeds 200 --jobs 3
    .venv/bin/python benchmarks/chaos.py --coordinators 3 --seeds 6

Each seed starts a real coordinator and worker processes on 127.0.0.1 behind
per-worker TCP fault proxies, plays its seeded fault schedule (worker
SIGKILL, SIGSTOP zombies, coordinator SIGKILL and restart on the same
database, latency, partitions, catalog changes, joins, leaves) and checks the
invariants of tests/chaos/ledger.py: exclusive ownership, convergence within
two session timeouts plus the rebalance timeout, acknowledged checkpoints
surviving every crash, zombie commits refused. It prints one line per seed
and the totals: schedules run, faults injected, violations found. The work
directories of seeds with violations are kept (``--out``) with every ledger
and log; the others are deleted unless ``--keep``.

``--coordinators N`` (N > 1) runs the several-coordinators mode instead
(harness.py's module docs; ``ChaosConfig.multi``): each seed on a throw-away
PostgreSQL of its own (``--pg-url`` to use one you run: then it is never
restarted), N coordinators on it, no fault proxies, and coordinator faults
(kill -9, SIGSTOP past the lease, SIGTERM and restart, PostgreSQL restart)
beside the worker faults. It prints, besides, how many groups rebalanced
while the faults ran and how many members lost their membership.

``--assignor NAME`` gives the cooperative group ("coop") that assignor
instead of cooperative-sticky. ``--assignor balanced`` also weighs the
catalog (weights 1 to 4, kept across catalog changes), gives the workers
capacities 1, 2 and 0.5 (by slot, cycled) and has them measure a load (1.5 x
the weight of each resource they own, each heartbeat interval) and rejoin
when it leaves their band, at most once per 2 s: the ledgers then check
balanced's hand-overs under the same faults.

``--drains`` adds the drain fault: a worker drains (``member.drain()`` on
SIGUSR1, or the admin route ``POST /v1/groups/{g}/members/{m}/drain`` naming
its member), exits once it owns nothing and is restarted later; one drain in
four has the draining worker SIGKILLed mid-drain, one in four another member
of its group (with warm-up, one warming a standby up, when one does within 3 s). The
ledgers then also check that a finished drain left its worker owning
nothing. ``--warmup`` (with ``--assignor balanced``) turns the assignor's
warm-up on (``warmup_timeout_ms`` ``--warmup-timeout-ms``) and has each
worker's ``on_standby`` take a drawn 0.2 to 1.5 s: the ledgers check that no
worker is given a standby it owns, and that no commit is sent for a
resource outside its sender's ownership (a standby is never acted on).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))

from harness import DRAIN_WEIGHTS, MULTI_WEIGHTS, ChaosConfig, SeedResult, run_seed, summary_line
from ledger import CheckResult


async def run_all(args: argparse.Namespace) -> list[SeedResult]:
    config = chaos_config(args)
    gate = asyncio.Semaphore(args.jobs)
    results: list[SeedResult] = []

    async def one(seed: int) -> None:
        async with gate:
            workdir = Path(args.out) / f"seed-{seed}"
            if workdir.exists():
                shutil.rmtree(workdir)
            try:
                result = await run_seed(seed, workdir, config, pg_url=args.pg_url)
            except Exception as exc:  # a harness failure is reported, not hidden
                print(f"seed {seed}: HARNESS ERROR {exc!r} (see {workdir})", flush=True)
                result = SeedResult(seed, [], Counter(), [f"harness error: {exc!r}"],
                                    CheckResult(), 0.0, workdir)
            results.append(result)
            print(summary_line(result), flush=True)
            for violation in result.violations[:10]:
                print(f"    VIOLATION {violation}", flush=True)
            if result.violations:
                print("    schedule:\n      " + "\n      ".join(result.schedule), flush=True)
                print("    notes: " + "; ".join(result.notes), flush=True)
            elif not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)

    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    # SIGTERM/SIGINT cancel the run, so every seed's processes are killed on the way out.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    tasks = [asyncio.create_task(one(s)) for s in range(args.start, args.start + args.seeds)]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        print("interrupted: stopping every seed's processes; partial results", flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # their cleanup kills the processes they started
    return sorted(results, key=lambda r: r.seed)


def chaos_config(args: argparse.Namespace) -> ChaosConfig:
    changes: dict[str, object] = {
        "fault_seconds": args.fault_seconds, "workers_per_group": args.workers_per_group,
        "groups": (("coop", args.assignor), ("eager", "range"))}
    if args.assignor == "balanced":
        changes.update(weighted_catalog=True, capacities=(1.0, 2.0, 0.5),
                       load_rejoin_interval_ms=2_000)
    if args.warmup:
        changes["warmup_timeout_ms"] = args.warmup_timeout_ms
    if args.drains:
        base = MULTI_WEIGHTS if args.coordinators > 1 else ChaosConfig().weights
        changes["weights"] = base + DRAIN_WEIGHTS
    if args.coordinators > 1:
        return ChaosConfig.multi(args.coordinators, **changes)
    return ChaosConfig(**changes)  # type: ignore[arg-type]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="how many seeds to run")
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--jobs", type=int, default=2, help="seeds run at once")
    p.add_argument("--fault-seconds", type=float, default=12.0)
    p.add_argument("--workers-per-group", type=int, default=3)
    p.add_argument("--assignor", default="cooperative-sticky",
                   help="the cooperative group's assignor (balanced: with weights, "
                        "capacities and measured loads)")
    p.add_argument("--coordinators", type=int, default=1,
                   help="1: one SQLite coordinator behind fault proxies (the default); "
                        "more: that many coordinators on PostgreSQL, coordinator faults")
    p.add_argument("--pg-url", default=None,
                   help="several coordinators: a PostgreSQL URL to use instead of a "
                        "throw-away server per seed (it is not restarted)")
    p.add_argument("--drains", action="store_true",
                   help="add the drain fault (SIGUSR1 or the admin route; some crashed into)")
    p.add_argument("--warmup", action="store_true",
                   help="with --assignor balanced: warm-up on, workers' on_standby take "
                        "0.2 to 1.5 s")
    p.add_argument("--warmup-timeout-ms", type=int, default=5_000,
                   help="--warmup: the assignor's warmup_timeout_ms")
    p.add_argument("--out", default="/tmp/groupcoord-chaos", help="work directories")
    p.add_argument("--keep", action="store_true", help="keep every seed's work directory")
    args = p.parse_args()
    if args.coordinators < 1:
        p.error(f"--coordinators must be at least 1, got {args.coordinators}")
    if args.warmup and args.assignor != "balanced":
        p.error("--warmup is the balanced assignor's (--assignor balanced)")
    if args.pg_url is not None and args.coordinators == 1:
        p.error("--pg-url is for several coordinators (--coordinators 2 or more)")
    config = chaos_config(args)
    started = time.monotonic()
    results = asyncio.run(run_all(args))
    faults: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
    violations = sum(len(r.violations) for r in results)
    bad = [r.seed for r in results if r.violations]
    zombies = sum(r.check.zombie_commits for r in results)
    refused = sum(r.check.zombie_commits_refused for r in results)
    print()
    print(f"schedules run:    {len(results)} (seeds {args.start}..{args.start + args.seeds - 1}, "
          f"{args.fault_seconds:g}s of faults each, {time.monotonic() - started:.0f}s total)")
    print(f"faults injected:  {sum(faults.values())} ("
          + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) + ")")
    print(f"reordered:        {sum(r.check.reordered_commits for r in results)} pairs of one "
          "worker's concurrent commits answered out of send order; "
          f"{sum(r.check.disturbances for r in results)} disturbances after convergence")
    print(f"commits acked:    {sum(r.check.commits_ok for r in results)}; zombie commits "
          f"{zombies}, refused {refused}; durability checks "
          f"{sum(r.check.durability_checks for r in results)}")
    converged = [r.check.convergence_s for r in results if r.check.convergence_s >= 0]
    if converged:
        print(f"convergence:      max {max(converged):.2f}s after the faults ended, bound "
              f"{config.convergence_s:.2f}s (2 session timeouts + rebalance timeout "
              "+ initial delay)")
    if args.coordinators > 1:
        moved = sum(len(r.rebalances) for r in results)
        print(f"rebalances:       {moved} journal rows while the faults ran "
              f"(worker faults rebalance; coordinator faults should not); "
              f"{sum(r.check.lost_events for r in results)} on_lost calls")
    if args.drains or args.warmup:
        checks = [r.check for r in results]
        print(f"drains:           {sum(c.drains for c in checks)} seen by their workers, "
              f"{sum(c.drains_done for c in checks)} handed everything over, "
              f"{sum(c.drains_timed_out for c in checks)} timed out (the others were "
              "killed or still ran at the end)")
        print(f"warm-ups:         {sum(c.standbys for c in checks)} on_standby calls, "
              f"{sum(c.warmups_done for c in checks)} ran to their end")
    print(f"violations found: {violations}" + (f" (seeds {bad})" if bad else ""))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
