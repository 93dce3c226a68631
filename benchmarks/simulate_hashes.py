"""Print each seed's trace hash and event count, one line per seed.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_hashes.py --seeds 2000 [--first 0] \
        [--profile cluster] [--compiled build/sim-mypyc] > hashes.txt

The simulator's determinism across a change: run it before and after and
``diff`` the two files (a change that only makes the simulator faster must
leave every line as it was; docs/bench-reliability.md, "Simulation"). The same
holds between the interpreted simulator and the one compiled by
``benchmarks/build_sim_mypyc.py`` (``--compiled DIR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, required=True, help="how many seeds to run")
    p.add_argument("--first", type=int, default=0, help="the first seed")
    p.add_argument("--profile", choices=("space", "chaos", "cluster"), default="space")
    p.add_argument("--traced", action="store_true",
                   help="keep the trace: the hash then covers every message too")
    p.add_argument("--compiled", type=Path, metavar="DIR",
                   help="run on the modules benchmarks/build_sim_mypyc.py compiled into DIR")
    args = p.parse_args()
    if args.seeds <= 0:
        p.error("--seeds must be positive")
    if args.compiled is not None:
        from sim_compiled import StaleBuildError, install

        try:
            install(args.compiled)
        except StaleBuildError as e:
            p.error(f"--compiled: {e}")
    from sim import run_seed

    for seed in range(args.first, args.first + args.seeds):
        r = run_seed(seed, keep_trace=args.traced, profile=args.profile)
        print(f"{seed} {r.trace_hash} {r.events} {len(r.violations)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
