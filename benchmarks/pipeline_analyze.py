"""Wall time of ``groupcoord analyze`` on local[1] and local[2] (docs/bench-pipeline.md).

Runs the real command line (a fresh JVM per run, as a user would) on an input
made by benchmarks/gen_journal.py and prints the wall times and the speed-up
from the second core.

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

from pipeline_cpu import run_measured


def run(inputs: list[str], master: str, out: Path, conf: list[str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "coordinator.cli", "analyze", *inputs, "-o", str(out),
           "--master", master]  # progress lines (not a terminal): the phase times
    for c in conf:
        cmd += ["--conf", c]
    proc, wall, cpu = run_measured(cmd)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"analyze on {master} failed ({proc.returncode})")
    # CPU seconds of the JVM, the driver and the Python workers: on a shared
    # machine (load average below) wall time alone says little.
    print(f"  {master}: {wall:.1f} s wall, {cpu:.1f} s CPU, load average "
          f"{os.getloadavg()[0]:.1f}   ({proc.stdout.strip()})", flush=True)
    for line in proc.stderr.splitlines():
        if "done in" in line:
            print(f"    {line.strip()}", flush=True)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="export directories and/or SQLite files")
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    times = {}
    print(f"groupcoord analyze {' '.join(args.inputs)}", flush=True)
    for master in args.masters.split(","):
        times[master] = run(args.inputs, master, work / master.replace("[", "").replace("]", ""),
                            args.conf)
    if "local[1]" in times and "local[2]" in times:
        print(f"  speed-up from the second core: {times['local[1]'] / times['local[2]']:.2f}x")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
