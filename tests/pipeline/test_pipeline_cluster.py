"""The pipeline on a real Spark standalone cluster (tests/pipeline/pipeline_standalone.py,
fixture ``standalone``: a master and one worker from the PySpark installation), run
as a user runs it: the ``groupcoord`` command line with ``--master
spark://127.0.0.1:PORT``, in a subprocess (one SparkContext per JVM: the
tests' own local[2] session lives in this one). Its tables must be the ones
the same inputs give on local[2]; the local run goes on while the cluster's
does (the wall time of the Spark tests' worker bounds the suite's)."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pipeline_journal_builder import COOP, EAGER, write_db
from pipeline_standalone import Standalone

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.simulate import CELL_FIGURES, CELL_KEYS, load_sweep, simulate_sweep

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "pipeline" / "sweeps"

#: Small executors (the worker has 1 GiB), few shuffle tasks (tiny journals).
CLUSTER_CONF = ("spark.executor.memory=512m", "spark.cores.max=2",
                "spark.sql.shuffle.partitions=2")  # small inputs: few tasks


@dataclass
class Running:
    """A command line ``start`` started; its output goes to files (a pipe
    nobody reads while the test goes on could fill and stop it)."""
    proc: subprocess.Popen[bytes]
    command: str
    out: Path
    err: Path


_runs = itertools.count()


def start(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Running:
    """The command line, started, with this worktree's code and this
    interpreter (the executors run ``PYSPARK_PYTHON``: here the interpreter
    that has the pipeline's packages, as on workers that have them installed)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
                **(env or {})}
    n = next(_runs)
    out, err = cwd / f"groupcoord-{n}.stdout", cwd / f"groupcoord-{n}.stderr"
    with out.open("wb") as out_file, err.open("wb") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", *args], cwd=cwd,
                                env=full_env, stdout=out_file, stderr=err_file)
    return Running(proc, args[0], out, err)


def finish(run: Running, check: bool = True,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Waits for a command line ``start`` started (killed past ``timeout``)."""
    try:
        run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(run)
        raise
    out, err = run.out.read_text(), run.err.read_text()
    if check and run.proc.returncode != 0:
        pytest.fail(f"groupcoord {run.command} failed ({run.proc.returncode}):\n{err[-4000:]}")
    return subprocess.CompletedProcess(run.proc.args, run.proc.returncode, out, err)


def stop(run: Running) -> None:
    """Ends a command line ``start`` started (the test failed before ``finish``)."""
    run.proc.kill()
    run.proc.wait()


def groupcoord(*args: str, cwd: Path, env: dict[str, str] | None = None,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    return finish(start(*args, cwd=cwd, env=env), check)


def on_cluster(standalone: Standalone) -> list[str]:
    return ["--master", standalone.url, *(x for c in CLUSTER_CONF for x in ("--conf", c))]


def table(path: Path, keys: tuple[str, ...], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        for c in drop:
            del r[c]
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    def eq(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9)
        return bool(x == y)
    return len(a) == len(b) and all(
        ra.keys() == rb.keys() and all(eq(ra[k], rb[k]) for k in ra)
        for ra, rb in zip(a, b, strict=True))


TABLES = {"rebalances": ("source", "group_id", "journal_id"),
          "group_hours": ("source", "group_id", "hour_start_ms"),
          "groups": ("source", "group_id"), "fleet_hours": ("hour_start_ms",)}


def test_export_and_analyze_on_the_cluster_give_the_local_tables(
        spark: Any, standalone: Standalone, tmp_path: Path) -> None:
    """Two coordinators: one exported with ``groupcoord journal export`` (no
    Spark), one given as its SQLite file; analysed together on the cluster
    and on local[2]."""
    a = write_db(tmp_path / "coord-a.db", EAGER, generations=[("eager", 5, True)])
    b = write_db(tmp_path / "coord-b.db", COOP + EAGER)
    groupcoord("journal", "export", str(a), "-o", str(tmp_path / "export"), cwd=tmp_path)
    inputs = [str(tmp_path / "export"), str(b)]
    args = ("--storm-window", "600", "--storm-threshold", "3")
    # The cluster's run and the local one at the same time (the test's wall time).
    running = start("analyze", *inputs, "-o", str(tmp_path / "cluster"), *args,
                    *on_cluster(standalone), "--no-progress", cwd=tmp_path)
    try:
        analyze(spark, inputs, tmp_path / "local",
                AnalyzeOptions(storm_window_ms=600_000, storm_threshold=3, progress=False))
    except BaseException:
        stop(running)
        raise
    proc = finish(running)
    assert "rebalances of 3 groups analysed" in proc.stdout
    for name, keys in TABLES.items():
        local = table(tmp_path / "local" / name, keys)
        assert local, name
        assert same(table(tmp_path / "cluster" / name, keys), local), name
    assert (tmp_path / "cluster" / "report.html").stat().st_size > 0


def test_simulate_on_the_cluster_gives_the_local_tables(
        spark: Any, standalone: Standalone, tmp_path: Path) -> None:
    sweep = SWEEPS / "tiny.toml"
    running = start("simulate", str(sweep), "-o", str(tmp_path / "cluster"), "--limit", "6",
                    *on_cluster(standalone), "--no-progress", cwd=tmp_path)
    try:
        simulate_sweep(spark, load_sweep(sweep), tmp_path / "local", progress=False, limit=6)
    except BaseException:
        stop(running)
        raise
    finish(running)
    keys = tuple(k for k, _ in CELL_KEYS)
    timing = tuple(k for k, _ in CELL_FIGURES if k.endswith("cpu_ms") or k in (
        "cpu_ms_total", "cpu_ms_max", "wall_ms"))  # measured, not simulated
    local = table(tmp_path / "local" / "cells", keys, timing)
    assert len(local) == 6
    assert same(table(tmp_path / "cluster" / "cells", keys, timing), local)
    ekeys = (*keys, "episode")
    assert same(table(tmp_path / "cluster" / "episodes", ekeys, ("cpu_ms",)),
                table(tmp_path / "local" / "episodes", ekeys, ("cpu_ms",)))


def test_executors_without_the_packages_are_named_in_one_line(
        standalone: Standalone, tmp_path: Path) -> None:
    """Workers whose python lacks pyarrow (a bare venv): analyze stops before
    the job with one line naming the host, the python and the module, not
    ``An exception was thrown from the Python worker``."""
    import venv
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    python = str(bare / "bin" / "python")
    db = write_db(tmp_path / "coord.db", EAGER)
    proc = groupcoord("analyze", str(db), "-o", str(tmp_path / "out"), *on_cluster(standalone),
                      "--no-progress", cwd=tmp_path, env={"PYSPARK_PYTHON": python},
                      check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "groupcoord analyze: error" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    line = errors[0]
    assert f"{python}: missing pyarrow, numpy, pandas, msgpack" in line, line
    assert "Python worker" not in proc.stderr
    assert not (tmp_path / "out" / "rebalances").exists()
