"""Wall time of a 1,000-cell ``groupcoord simulate`` sweep on local[1] and local[2].

The sweep (written to a temporary TOML file): 5 assignors x 4 group sizes x
5 churn patterns x 10 seeds = 1,000 cells, small groups (6-40 members, up to
400 resources) so that the figure measures the distribution of many cells,
not one long assignor call. docs/bench-pipeline.md has the figures.

    .venv/bin/python benchmarks/pipeline_simulate.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipeline_cpu import run_measured

SWEEP = """
name = "bench_1000"
assignors = "all"
seeds = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
round_ms = 200
session_timeout_ms = 10000
max_rounds = 10

[assignor_settings.incremental-cooperative]
scheduled_rebalance_max_delay_ms = 30000

[[groups]]
name = "s"
members = 6
sets = 2
partitions = 12

[[groups]]
name = "m"
members = 12
sets = 4
partitions = 24

[[groups]]
name = "l"
members = 24
sets = 8
partitions = 25

[[groups]]
name = "xl"
members = 40
sets = 10
partitions = 40

[[churn]]
name = "fresh"
events = []

[[churn]]
name = "one_leaves"
events = [{ kind = "leave", pick = "middle" }]

[[churn]]
name = "two_join"
events = [{ kind = "join", count = 2, gap_ms = 60000 }]

[[churn]]
name = "one_crashes"
events = [{ kind = "crash" }]

[[churn]]
name = "rolling_restart_3"
events = [{ kind = "restart", count = 3, gap_ms = 30000, restart_ms = 5000 }]
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masters", default="local[1],local[2]")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-simulate-"))
    sweep = work / "bench_1000.toml"
    sweep.write_text(SWEEP)
    times = {}
    for master in args.masters.split(","):
        out = work / master.replace("[", "").replace("]", "")
        proc, wall, cpu = run_measured([sys.executable, "-m", "coordinator.cli", "simulate",
                                        str(sweep), "-o", str(out), "--master", master])
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"simulate on {master} failed ({proc.returncode})")
        times[master] = wall
        print(f"  {master}: {wall:.1f} s wall, {cpu:.1f} s CPU, load average "
              f"{os.getloadavg()[0]:.1f}   ({proc.stdout.strip()})", flush=True)
    if "local[1]" in times and "local[2]" in times:
        print(f"  speed-up from the second core: {times['local[1]'] / times['local[2]']:.2f}x")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
