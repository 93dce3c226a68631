"""report.html of ``groupcoord simulate``: the assignors side by side.

Cells are averaged over seeds with Spark (``summary``), then plotted on the
driver: assignment time, balance, resources moved versus the minimum, rounds
to converge and unowned resource-seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.report import cards, esc, figure, num, page, plural, png, table

SUMMARY_KEYS = ("assignor", "group", "members", "resources", "subscription", "churn")


def summary(cells: Any) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F
    ok = F.col("error").isNull()
    return [r.asDict() for r in cells.groupBy(*SUMMARY_KEYS).agg(
        F.count(F.lit(1)).alias("cells"),
        F.sum(F.when(ok, 0).otherwise(1)).alias("failed"),
        F.avg(F.col("converged").cast("double")).alias("converged"),
        F.expr("percentile(initial_cpu_ms, 0.5)").alias("initial_cpu_ms_p50"),
        F.max("cpu_ms_max").alias("cpu_ms_max"),
        F.avg("final_balance").alias("final_balance"),
        F.sum("moved").alias("moved"),
        F.sum("min_moves").alias("min_moves"),
        F.avg("max_episode_rounds").alias("rounds"),
        F.avg("unavailable_ms").alias("unavailable_ms"),
        F.avg("episodes").alias("episodes"),
    ).orderBy(*SUMMARY_KEYS).collect()]


def _grouped_bars(rows: list[dict[str, Any]], xkey: str, value: str, title: str,
                  ylabel: str, log: bool = False) -> str:
    fig, ax = figure()
    xs = sorted({r[xkey] for r in rows}, key=lambda x: (str(x)))
    assignors = sorted({r["assignor"] for r in rows})
    width = 0.8 / max(1, len(assignors))
    for k, a in enumerate(assignors):
        vals = []
        for x in xs:
            got = [r[value] for r in rows if r[xkey] == x and r["assignor"] == a
                   and r[value] is not None]
            vals.append(sum(got) / len(got) if got else 0.0)
        ax.bar([i + k * width for i in range(len(xs))], vals, width=width, label=a)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(xs))], [str(x) for x in xs],
                  rotation=15, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")  # bars of 0 are simply not drawn
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png(fig)


def render(rows: list[dict[str, Any]], sweep: str) -> str:
    body: list[str] = []
    if not rows:
        body.append("<p>No cells.</p>")
        return page(f"groupcoord simulation: {sweep}", body)
    total = sum(int(r["cells"]) for r in rows)
    failed = sum(int(r["failed"] or 0) for r in rows)
    kinds = [(noun, len({r[key] for r in rows})) for noun, key in
             (("assignor", "assignor"), ("group", "group"), ("churn pattern", "churn"))]
    body.append(cards([(plural(total, "cell"), num(total)), ("failed", num(failed)),
                       *((plural(n, noun), num(n)) for noun, n in kinds)]))
    for r in rows:
        mm = int(r["min_moves"] or 0)
        r["moved_ratio"] = (int(r["moved"] or 0) / mm) if mm else None
        r["unavailable_s"] = float(r["unavailable_ms"] or 0) / 1000
        r["group_size"] = f"{r['group']} ({r['members']}m x {r['resources']}r)"
    churned = [r for r in rows if int(r["min_moves"] or 0) > 0]
    body.append("<h2>Assignment time</h2>")
    body.append(_grouped_bars(rows, "group_size", "initial_cpu_ms_p50",
                              "CPU time of the initial assignment (median over seeds)",
                              "ms (log)", log=True))
    body.append("<h2>Balance</h2>")
    body.append(_grouped_bars(rows, "group_size", "final_balance",
                              "Balance at the end: most minus fewest resources per member",
                              "resources"))
    if churned:
        body.append("<h2>Resources moved versus the minimum</h2>")
        body.append(_grouped_bars(churned, "churn", "moved_ratio",
                                  "Resources moved / fewest possible (1.0 = optimal)", "ratio"))
        body.append("<h2>Rounds to converge</h2>")
        body.append(_grouped_bars(churned, "churn", "rounds",
                                  "Rounds of the longest rebalance episode (mean over cells)",
                                  "rounds"))
        body.append("<h2>Unavailability</h2>")
        body.append(_grouped_bars(churned, "churn", "unavailable_s",
                                  "Resource-seconds without a live owner per cell (mean)",
                                  "resource-s (log)", log=True))
    body.append("<h2>All figures</h2>")
    body.append(table(
        ["assignor", "group", "subscription", "churn", "cells", "failed", "converged",
         "initial CPU p50", "max CPU/call", "balance", "moved", "min moves", "rounds",
         "unowned res-s"],
        [[esc(r["assignor"]), esc(r["group_size"]), esc(r["subscription"]), esc(r["churn"]),
          num(r["cells"]), num(r["failed"]), f"{100 * float(r['converged'] or 0):.0f}%",
          f"{float(r['initial_cpu_ms_p50'] or 0):.2f} ms", f"{float(r['cpu_ms_max'] or 0):.1f} ms",
          f"{float(r['final_balance'] or 0):.1f}", num(r["moved"]), num(r["min_moves"]),
          f"{float(r['rounds'] or 0):.1f}", f"{r['unavailable_s']:.1f}"] for r in rows],
        left=4))
    body.append("<p class='note'>Parquet beside this file: cells/ (one row per cell), "
                "episodes/ (one row per rebalance episode); docs/pipeline.md has the "
                "simulation model.</p>")
    return page(f"groupcoord simulation: {sweep}", body)


def write_report(spark: Any, cells: Any, path: Path, sweep: str) -> Path:
    path.write_text(render(summary(cells), sweep), encoding="utf-8")
    return path
