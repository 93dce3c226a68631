"""Wall time (and the peak memory of every process) of ``groupcoord analyze``
on local[1] and local[2], against a floor job (docs/bench-pipeline.md).

Runs the real command line (a fresh JVM per run, as a user would) on an input
made by benchmarks/gen_journal.py and prints the wall times, the cores each
run keeps busy, the speed-up from the second core (with the bound that
local[1]'s own core use sets), and analyze/floor per master. The floor is
plain Spark SQL over the same journal, in a fresh JVM with the same session
settings: per group-and-hour sums, the storm window (a window function),
exact duration percentiles per group-hour and per fleet hour, every table
written through the DataFrame writer; what analyze costs beyond it is the
per-group ownership accounting in Python.

    .venv/bin/python benchmarks/gen_journal.py --rows 10000000 --groups 10000 --out /tmp/j10m
    .venv/bin/python benchmarks/pipeline_analyze.py /tmp/j10m
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipeline_cpu import run_measured_peak


def run(cmd: list[str], label: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of ``cmd``."""
    proc, wall, cpu, peak = run_measured_peak(cmd)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"{label} failed ({proc.returncode})")
    # CPU seconds of the JVM, the driver and the Python workers: on a shared
    # machine (load average below) wall time alone says little.
    print(f"  {label}: {wall:.1f} s wall, {cpu:.1f} s CPU ({cpu / wall:.2f} cores busy), "
          f"peak memory {peak / 2**30:.2f} GiB (all processes), load average "
          f"{os.getloadavg()[0]:.1f}   ({proc.stdout.strip()})", flush=True)
    for line in proc.stderr.splitlines():
        if "done in" in line:
            print(f"    {line.strip()}", flush=True)
    return wall, cpu


def analyze(inputs: list[str], master: str, out: Path, conf: list[str]) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "coordinator.cli", "analyze", *inputs, "-o", str(out),
           "--master", master]  # progress lines (not a terminal): the phase times
    for c in conf:
        cmd += ["--conf", c]
    return run(cmd, f"analyze {master}")


def floor(inputs: list[str], master: str, out: Path, conf: list[str]) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--floor-job", str(out), "--masters", master, *inputs]
    for c in conf:
        cmd += ["--conf", c]
    return run(cmd, f"floor {master}")


def floor_job(inputs: list[str], out: Path, master: str, conf: list[str]) -> str:
    """The floor: the Spark SQL part of analyze without the Python accounting,
    with analyze's default storm rule."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from coordinator.core.storm import STORM_RULE
    window_ms, threshold = STORM_RULE.window_ms, STORM_RULE.trips_at
    from pipeline.aggregates import HOUR_MS, PERCENTILES
    from pipeline.analyze import _load_journal, plan_inputs
    from pipeline.spark import session
    plan = plan_inputs(inputs)
    spark = session("groupcoord floor", master, ["spark.sql.session.timeZone=UTC", *conf])
    try:
        journal = _load_journal(spark, plan)
        window = Window.partitionBy("source", "group_id").orderBy("started_ms") \
            .rangeBetween(-(window_ms - 1), 0)
        rows = journal.select(
            "source", "group_id", "id", "reason", "started_ms",
            (F.col("ended_ms") - F.col("started_ms")).alias("duration_ms"),
            (F.col("started_ms") - F.pmod("started_ms", F.lit(HOUR_MS))).alias("hour_start_ms"),
            F.coalesce(F.size("joined"), F.lit(0)).alias("joined"),
            F.coalesce(F.size("left"), F.lit(0)).alias("left"),
            "member_count").withColumn("window_count", F.count(F.lit(1)).over(window))
        rows.write.mode("overwrite").parquet(str(out / "rebalances"))
        facts = spark.read.parquet(str(out / "rebalances"))

        def stats() -> list[object]:
            pct = F.percentile("duration_ms", list(PERCENTILES))
            return [F.count(F.lit(1)).alias("rebalances"),
                    *(F.sum(c).alias(c) for c in ("joined", "left", "member_count")),
                    F.sum(F.when(F.col("window_count") >= threshold, 1).otherwise(0))
                    .alias("storm_rebalances"),
                    *(pct[i].alias(f"p{i}") for i in range(len(PERCENTILES))),
                    F.max("duration_ms").alias("duration_max_ms")]
        facts.groupBy("source", "group_id", "hour_start_ms").agg(*stats()) \
            .write.mode("overwrite").parquet(str(out / "group_hours"))
        facts.groupBy("hour_start_ms").agg(*stats()).repartition(1) \
            .write.mode("overwrite").parquet(str(out / "fleet_hours"))
        n = spark.read.parquet(str(out / "rebalances")).count()
    finally:
        spark.stop()
    return f"{n} rebalances"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="export directories and/or SQLite files")
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-floor", action="store_true", help="analyze only")
    ap.add_argument("--floor-job", metavar="OUT", help=argparse.SUPPRESS)  # the child run
    args = ap.parse_args()
    if args.floor_job:
        print(floor_job(args.inputs, Path(args.floor_job), args.masters, args.conf))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    times: dict[str, tuple[float, float]] = {}  # master -> (wall, CPU seconds)
    floors: dict[str, tuple[float, float]] = {}  # master -> (wall, CPU seconds)
    print(f"groupcoord analyze {' '.join(args.inputs)}", flush=True)
    for master in args.masters.split(","):
        name = master.replace("[", "").replace("]", "")
        times[master] = analyze(args.inputs, master, work / name, args.conf)
        if not args.no_floor:
            floors[master] = floor(args.inputs, master, work / f"floor-{name}", args.conf)
            print(f"  analyze/floor on {master}: {times[master][0] / floors[master][0]:.2f}",
                  flush=True)
    if "local[1]" in times and "local[2]" in times:
        (w1, c1), (w2, c2) = times["local[1]"], times["local[2]"]
        # local[1] runs one task at a time, but its JVM threads and its Python
        # worker run at once: it keeps more than one core busy, and two cores
        # can beat it by at most 2 / (its cores busy) at the same CPU seconds.
        # On a virtual machine whose two cores share the host's, the same work
        # can also cost more CPU seconds when both are busy.
        print(f"  speed-up from the second core (local[1]/local[2] wall): {w1 / w2:.2f}x "
              f"(at most {2 / (c1 / w1):.2f}x at local[1]'s CPU seconds: it keeps "
              f"{c1 / w1:.2f} cores busy; local[2] spent {c2 / c1:.2f}x its CPU seconds)")
        if "local[1]" in floors and "local[2]" in floors:
            # What this machine's second core gives plain Spark SQL over the
            # same journal, in the same run.
            (f1, fc1), (f2, fc2) = floors["local[1]"], floors["local[2]"]
            print(f"  the floor's speed-up from the second core: {f1 / f2:.2f}x "
                  f"(local[2] spent {fc2 / fc1:.2f}x local[1]'s CPU seconds)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
