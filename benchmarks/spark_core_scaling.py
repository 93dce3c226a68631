"""What a second core gives plain Spark jobs on this machine (docs/bench-pipeline.md).

The reference for the speed-up that benchmarks/pipeline_analyze.py prints:
each job runs on local[1] and on local[2] (a fresh JVM per master, warmed up
by one smaller run first) and the script prints the wall times, the CPU
seconds of the process tree and the speed-up:

* ``codegen``: ``sum(hash(id, id * 7))`` over ``spark.range``, 8 partitions:
  generated code on the CPU, hardly any memory traffic;
* ``scan``: ``sum(hash(assignments, group_id, members))`` over a journal's
  Parquet files: Parquet decoding, as every pipeline job starts with, in
  ``2 x cores`` input splits.

    .venv/bin/python benchmarks/spark_core_scaling.py /tmp/j10m
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pipeline_cpu import run_measured

JOBS = ("codegen", "scan")


def child(master: str, journal: str) -> dict[str, float]:
    """Runs in its own process: the wall seconds of each job on ``master``."""
    from pipeline.spark import session
    cores = int(master.removeprefix("local[").removesuffix("]"))
    spark = session("groupcoord core scaling", master,
                    [f"spark.sql.files.minPartitionNum={2 * cores}"])
    try:
        out: dict[str, float] = {}
        scan = spark.read.parquet(f"{journal.rstrip('/')}/journal")
        codegen = "sum(hash(id, id * 7))"
        spark.range(0, 10**8, numPartitions=8).selectExpr(codegen).collect()  # warm-up
        started = time.perf_counter()
        spark.range(0, 2 * 10**9, numPartitions=8).selectExpr(codegen).collect()
        out["codegen"] = time.perf_counter() - started
        scan.selectExpr("sum(hash(group_id))").collect()  # warm-up
        started = time.perf_counter()
        scan.selectExpr("sum(hash(assignments, group_id, members))").collect()
        out["scan"] = time.perf_counter() - started
        return out
    finally:
        spark.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("journal", help="an export directory (benchmarks/gen_journal.py)")
    ap.add_argument("--child", metavar="MASTER", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.journal)))
        return 0
    walls: dict[str, dict[str, float]] = {}
    for master in ("local[1]", "local[2]"):
        proc, wall, cpu = run_measured([sys.executable, __file__, args.journal,
                                        "--child", master])
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"{master} failed ({proc.returncode})")
        walls[master] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  {master}: " + ", ".join(f"{j} {walls[master][j]:.1f} s" for j in JOBS)
              + f"; the whole process {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    for job in JOBS:
        print(f"  {job}: speed-up from the second core "
              f"{walls['local[1]'][job] / walls['local[2]'][job]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
