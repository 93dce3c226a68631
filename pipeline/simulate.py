"""``groupcoord simulate``: a sweep of assignor simulations, distributed with Spark.

A sweep TOML file (see pipeline/sweeps/*.toml and docs/pipeline.md) lists the
axes; every combination assignor x group x subscription x churn x seed is one
*cell*, simulated by pipeline/simcell.py on an executor. Outputs under OUT:
``cells/`` (one row per cell), ``episodes/`` (one row per rebalance episode)
and report.html (pipeline/simulate_report.py).
"""

from __future__ import annotations

import itertools
import tomllib
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

CELL_KEYS: tuple[tuple[str, str], ...] = (
    ("sweep", "string"), ("assignor", "string"), ("group", "string"), ("members", "long"),
    ("sets", "long"), ("partitions", "long"), ("resources", "long"),
    ("subscription", "string"), ("churn", "string"), ("seed", "long"),
)
CELL_FIGURES: tuple[tuple[str, str], ...] = (
    ("initial_rounds", "long"), ("initial_cpu_ms", "double"), ("initial_balance", "long"),
    ("episodes", "long"), ("rounds", "long"), ("max_episode_rounds", "long"),
    ("moved", "long"), ("min_moves", "long"), ("unavailable_ms", "long"),
    ("final_balance", "long"), ("unassigned_at_end", "long"), ("assign_calls", "long"),
    ("cpu_ms_total", "double"), ("cpu_ms_max", "double"), ("valid", "boolean"),
    ("converged", "boolean"), ("error", "string"), ("wall_ms", "double"),
)
EPISODE_FIGURES: tuple[tuple[str, str], ...] = (
    ("episode", "long"), ("triggers", "string"), ("start_ms", "long"), ("end_ms", "long"),
    ("rounds", "long"), ("cpu_ms", "double"), ("moved", "long"), ("min_moves", "long"),
    ("balance_after", "long"), ("unavailable_ms", "long"),
)


@dataclass(frozen=True)
class Sweep:
    name: str
    cells: list[dict[str, Any]]


def _ddl(fields: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"`{n}` {t}" for n, t in fields)


def _req(table: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise PipelineError(f"{where}: missing key {key!r}")
    return table[key]


def load_sweep(path: str | Path, full: bool = False) -> Sweep:
    """Parse a sweep file into cells; errors name the file and the key.

    With ``full``, the file's ``[full]`` table replaces top-level keys (the
    shipped bench sweep shrinks its groups by default).
    """
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PipelineError(f"{p}: no such file") from exc
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PipelineError(f"{p}: not a valid TOML sweep: {exc}") from exc
    if full:
        doc = {**doc, **doc.get("full", {})}
    from client.assignors import ASSIGNOR_NAMES
    name = str(doc.get("name", p.stem))
    assignors = doc.get("assignors", "all")
    if assignors == "all":
        assignors = list(ASSIGNOR_NAMES)
    unknown = [a for a in assignors if a not in ASSIGNOR_NAMES]
    if unknown:
        raise PipelineError(f"{p}: unknown assignor(s) {', '.join(unknown)} "
                            f"(known: {', '.join(ASSIGNOR_NAMES)})")
    seeds = [int(s) for s in doc.get("seeds", [1])]
    groups = _req(doc, "groups", str(p))
    shapes = {str(_req(s, "name", f"{p}: [[subscriptions]]")): s
              for s in doc.get("subscriptions", [{"name": "uniform", "kind": "uniform"}])}
    churns = doc.get("churn", [{"name": "fresh", "events": []}])
    settings = {
        "round_ms": int(doc.get("round_ms", 200)),
        "session_timeout_ms": int(doc.get("session_timeout_ms", 10_000)),
        "max_rounds": int(doc.get("max_rounds", 10)),
        "assignor_settings": dict(doc.get("assignor_settings", {})),
    }
    cells: list[dict[str, Any]] = []
    for g in groups:
        where = f"{p}: [[groups]] {g.get('name', '?')}"
        gname = str(_req(g, "name", where))
        members, nsets, parts = (int(_req(g, k, where)) for k in ("members", "sets",
                                                                  "partitions"))
        if members < 1 or nsets < 1 or parts < 0:
            raise PipelineError(f"{where}: members and sets must be >= 1, partitions >= 0")
        allowed = g.get("subscriptions", list(shapes))
        for s in allowed:
            if s not in shapes:
                raise PipelineError(f"{where}: unknown subscription shape {s!r}")
            if shapes[s].get("kind", "uniform") not in ("uniform", "random"):
                raise PipelineError(f"{p}: subscription {s!r}: kind must be uniform or random")
        for assignor, sub, churn, seed in itertools.product(assignors, allowed, churns, seeds):
            cname = str(_req(churn, "name", f"{p}: [[churn]]"))
            for ev in churn.get("events", []):
                if ev.get("kind") not in ("join", "leave", "crash", "restart"):
                    raise PipelineError(f"{p}: churn {cname!r}: event kind must be join, "
                                        f"leave, crash or restart, not {ev.get('kind')!r}")
            cells.append({
                "sweep": name, "assignor": assignor, "group": gname, "members": members,
                "sets": nsets, "partitions": parts, "resources": nsets * parts,
                "subscription": sub, "shape": dict(shapes[sub]), "churn": cname,
                "events": [dict(e) for e in churn.get("events", [])],
                "seed": seed,
                **settings,
            })
    if not cells:
        raise PipelineError(f"{p}: the sweep has no cells")
    return Sweep(name, cells)


def run_cell(cell: Mapping[str, Any]) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Simulate one cell: (cell row, episode rows). Never raises: a failing
    assignor is reported in the row's ``error``."""
    import time

    from client.assignors import get_assignor
    from pipeline.simcell import churn_timeline, names, simulate, subscriptions_for
    keys = tuple(cell[k] for k, _ in CELL_KEYS)
    start = time.perf_counter()
    try:
        assignor = get_assignor(cell["assignor"],
                                **cell["assignor_settings"].get(cell["assignor"], {}))
        members = names("member", int(cell["members"]))
        sets = names("set", int(cell["sets"]))
        catalog = dict.fromkeys(sets, int(cell["partitions"]))
        # A shape may pin its own seed (the benchmark's scenario e uses 615);
        # the cell's seed still picks who leaves, crashes or restarts.
        sub_seed = int(cell["shape"].get("seed", cell["seed"]))
        subs = subscriptions_for(members, sets, cell["shape"], sub_seed)
        timeline = churn_timeline(members, cell["events"], int(cell["seed"]),
                                  int(cell["session_timeout_ms"]), 0)
        # A joiner subscribes like a member of the same shape would.
        joiner = subscriptions_for(["joiner"], sets, cell["shape"], sub_seed + 1)
        res = simulate(assignor, catalog, subs, timeline, joiner["joiner"],
                       int(cell["round_ms"]), int(cell["max_rounds"]))
    except Exception as exc:
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        wall = (time.perf_counter() - start) * 1000
        row = (*keys, None, None, None, None, None, None, None, None, None, None, None, None,
               None, None, False, False, tb[:500], wall)
        return row, []
    eps = res.episodes
    row = (*keys, res.initial_rounds, res.initial_cpu_ms, res.initial_balance, len(eps),
           sum(e.rounds for e in eps), max((e.rounds for e in eps), default=0),
           sum(e.moved for e in eps), sum(e.min_moves for e in eps),
           sum(e.unavailable_ms for e in eps), res.final_balance, res.unassigned_at_end,
           res.assign_calls, res.cpu_ms_total, res.cpu_ms_max, res.valid, res.converged,
           res.invalid_reason, (time.perf_counter() - start) * 1000)
    erows = [(*keys, n, "+".join(e.triggers), e.start_ms, e.end_ms, e.rounds, e.cpu_ms,
              e.moved, e.min_moves, e.balance_after, e.unavailable_ms)
             for n, e in enumerate(eps)]
    return row, erows


def _run_partition(cells: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, tuple[Any, ...]]]:
    for cell in cells:
        row, erows = run_cell(cell)
        yield "cell", row
        for e in erows:
            yield "episode", e


def _cost(cell: Mapping[str, Any]) -> float:
    events = sum(max(1, int(e.get("count", 1))) if int(e.get("count", 1)) >= 0
                 else int(cell["members"]) for e in cell["events"])
    return float(cell["members"] + cell["resources"]) * (1 + events)


@dataclass
class SimulateResult:
    cells: int
    failed: int
    report: Path
    tables: dict[str, Path]


def simulate_sweep(spark: Any, sweep: Sweep, out: str | Path, progress: bool = True,
                   limit: int | None = None) -> SimulateResult:
    from pipeline.simulate_report import write_report
    from pipeline.spark import progress as phase
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = sweep.cells[:limit] if limit else sweep.cells
    # Deal the cells out like cards, biggest first, so that every slice gets
    # its share of the long ones (parallelize cuts the list into runs).
    by_cost = sorted(cells, key=_cost, reverse=True)
    slices = max(1, min(len(by_cost), spark.sparkContext.defaultParallelism * 4))
    ordered = [by_cost[i] for k in range(slices) for i in range(k, len(by_cost), slices)]
    tables = {"cells": out_dir / "cells", "episodes": out_dir / "episodes"}
    with phase(spark, f"simulate [1/2] {len(ordered)} cells", progress):
        rdd = spark.sparkContext.parallelize(ordered, slices) \
            .mapPartitions(_run_partition).cache()
        # Run the slices now, in parallel: the writes below go to one file
        # each (coalesce(1)), and a coalesce would otherwise pull every
        # slice into that one task, one after the other.
        rdd.count()
        cell_rows = rdd.filter(lambda kv: kv[0] == "cell").map(lambda kv: kv[1])
        ep_rows = rdd.filter(lambda kv: kv[0] == "episode").map(lambda kv: kv[1])
        spark.createDataFrame(cell_rows, _ddl(CELL_KEYS + CELL_FIGURES), verifySchema=False) \
            .coalesce(1).write.mode("overwrite").parquet(str(tables["cells"]))
        spark.createDataFrame(ep_rows, _ddl(CELL_KEYS + EPISODE_FIGURES), verifySchema=False) \
            .coalesce(1).write.mode("overwrite").parquet(str(tables["episodes"]))
        rdd.unpersist()
    with phase(spark, "simulate [2/2] writing report.html", progress):
        df = spark.read.parquet(str(tables["cells"]))
        failed = df.filter("error IS NOT NULL").count()  # crashed, or an invalid assignment
        report = write_report(spark, df, out_dir / "report.html", sweep.name)
    return SimulateResult(len(ordered), failed, report, tables)


def run_from_cli(sweep_path: str, out: str, full: bool, limit: int | None, master: str | None,
                 conf: Sequence[str], progress: bool, verbose: bool = False) -> SimulateResult:
    from pipeline.spark import SIMULATE_MODULES, check_executors, session
    sweep = load_sweep(sweep_path, full=full)  # fail fast, before the JVM starts
    spark = session("groupcoord simulate", master, ["spark.sql.session.timeZone=UTC", *conf],
                    verbose)
    try:
        if not spark.sparkContext.master.startswith("local"):
            check_executors(spark, SIMULATE_MODULES)
        return simulate_sweep(spark, sweep, out, progress=progress, limit=limit)
    finally:
        spark.stop()
