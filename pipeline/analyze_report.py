"""report.html of ``groupcoord analyze``: the fleet's rebalances at a glance.

``report_figures`` gathers what the report shows with a few small Spark
jobs, reusing the tables phase 2 wrote (``fleet_hours``, ``group_hours/``,
``groups/``) wherever they already hold the figure; ``render`` draws the
page on the driver from those figures only, never from the per-rebalance
table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.core.storm import StormRule
from pipeline.aggregates import (
    FACT_COUNTS,
    FLEET_SUMS,
    HOUR_MS,
    REASONS,
    REBALANCE_DURATIONS,
    _sums,
    attribution,
    bucket_width,
    durations,
    generations,
    histogram,
    is_initial,
    rebalance_durations,
)
from pipeline.report import (
    amount,
    cards,
    counted,
    empty,
    esc,
    figure,
    num,
    page,
    plural,
    png,
    seconds,
    table,
    utc,
)


@dataclass
class ReportData:
    totals: dict[str, Any]
    fleet_hours: list[dict[str, Any]]
    worst_groups: list[dict[str, Any]]
    heat: list[dict[str, Any]]
    histogram: list[tuple[int, int]]
    #: the rebalance-storm rule (coordinator/core/storm.py) the figures used
    storm: StormRule
    inputs: list[str] = field(default_factory=list)
    #: ``series`` (below): one row per bucket of ``bucket_ms`` with a rebalance
    series: list[dict[str, Any]] = field(default_factory=list)
    bucket_ms: int = HOUR_MS
    #: aggregates.attribution: the members whose joins and leaves started most
    starters: list[dict[str, Any]] = field(default_factory=list)
    #: aggregates.generations: the worst groups' rebalances in time order
    timelines: list[dict[str, Any]] = field(default_factory=list)
    #: :func:`cause_figures`: moves per (bucket of ``cause_bucket_ms``, cause)
    causes: list[dict[str, Any]] = field(default_factory=list)
    cause_bucket_ms: int = HOUR_MS
    #: :func:`imbalance_figures`: load imbalance per bucket of ``cause_bucket_ms``
    imbalance: list[dict[str, Any]] = field(default_factory=list)


#: Groups whose generation timeline the report draws (the worst ones).
TIMELINE_GROUPS = 5


# ---------------------------------------------------------------- the figures

#: Rows of the report's table of moves by cause, at most (wider buckets than
#: the trend's: ``move_causes/`` holds hours, and the table is read, not drawn).
CAUSE_ROWS = 24

#: The bucket widths of that table.
CAUSE_BUCKETS_MS = (HOUR_MS, 6 * HOUR_MS, 24 * HOUR_MS, 7 * 24 * HOUR_MS)


def cause_figures(move_causes: Any, first_ms: int, last_ms: int
                  ) -> tuple[list[dict[str, Any]], int]:
    """``move_causes/`` summed per (bucket, cause), the bucket the first of
    :data:`CAUSE_BUCKETS_MS` that gives at most :data:`CAUSE_ROWS` buckets
    over the journal's span; and that width."""
    from pyspark.sql import functions as F
    span = max(0, int(last_ms) - int(first_ms))
    width = next((w for w in CAUSE_BUCKETS_MS if span // w + 1 <= CAUSE_ROWS),
                 CAUSE_BUCKETS_MS[-1])
    bucket = (F.col("hour_start_ms") - F.pmod(F.col("hour_start_ms"), F.lit(width)))
    rows = move_causes.groupBy(bucket.alias("bucket_ms"), "cause") \
        .agg(F.sum("moves").alias("moves")).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: (r["bucket_ms"], r["cause"])), width


def imbalance_figures(imbalance: Any, width: int) -> list[dict[str, Any]]:
    """``imbalance/`` per bucket of ``width`` (the moves-by-cause table's):
    the generations with loads, the groups they belong to, the mean and the
    largest imbalance, and the group and generation of the largest."""
    from pyspark.sql import functions as F
    bucket = (F.col("started_ms") - F.pmod(F.col("started_ms"), F.lit(width)))
    worst = F.max_by(F.struct("source", "group_id", "generation_id"), F.col("imbalance"))
    rows = imbalance.groupBy(bucket.alias("bucket_ms")).agg(
        F.count(F.lit(1)).alias("generations"),
        F.count_distinct("source", "group_id").alias("groups"),
        F.avg("imbalance").alias("mean"), F.max("imbalance").alias("max"),
        worst.alias("worst")).collect()
    out = []
    for r in sorted(rows, key=lambda r: r["bucket_ms"]):
        d = r.asDict()
        w = d.pop("worst")
        d.update(source=w["source"], group_id=w["group_id"], generation_id=w["generation_id"])
        out.append(d)
    return out



def duration_figures(rebalances: Any) -> dict[str, Any]:
    """Exact duration percentiles and the longest over every rebalance
    (``duration_*``), over rebalances proper (``rebalance_*``, with
    ``rebalance_count``) and over the initial joins (``initial_*``, with
    ``initial_count``).

    Spark's own exact ``percentile``, over the distinct durations with how
    often each occurred as the frequency (a hash aggregate of longs first:
    thousands of rows where ``rebalances/`` has millions). Over the rows
    themselves, beside two ``count_distinct`` that expanded every row three
    times, it cost several times more (docs/bench-pipeline.md)."""
    from pyspark.sql import functions as F
    cells = rebalances.groupBy("duration_ms", is_initial().alias("initial")).count()
    figures = []
    for prefix, keep in (("duration", F.lit(True)), ("rebalance", ~F.col("initial")),
                         ("initial", F.col("initial"))):
        d = F.when(keep, F.col("duration_ms"))
        figures += durations(d, prefix, F.col("count"))
        if prefix != "duration":
            figures.append(F.sum(F.when(d.isNotNull(), F.col("count")))
                           .alias(f"{prefix}_count"))
    row: dict[str, Any] = cells.agg(*figures).collect()[0].asDict()
    return row


def totals(fleet: list[dict[str, Any]], groups: Any, durations: dict[str, Any]
           ) -> dict[str, Any]:
    """The report's headline figures: sums over the fleet's hours; groups,
    sources and span from ``groups/``; the ``durations`` of
    ``duration_figures``. A figure of no rebalance is 0."""
    from pyspark.sql import functions as F
    tot: dict[str, Any] = {c: sum(int(h[c] or 0) for h in fleet)
                           for c in (*FLEET_SUMS, *FACT_COUNTS)}
    span = groups.agg(F.count(F.lit(1)).alias("groups"),
                      F.count_distinct("source").alias("sources"),
                      F.sort_array(F.collect_set("source")).alias("source_names"),
                      F.min("first_started_ms").alias("first_started_ms"),
                      F.max("last_ended_ms").alias("last_ended_ms")).collect()[0].asDict()
    return tot | {k: (v if v is not None else 0) for k, v in (durations | span).items()}


def _bucket(column: str, width_ms: int) -> Any:
    from pyspark.sql import functions as F
    return (F.col(column) - F.pmod(column, F.lit(width_ms))).alias("bucket_ms")


def series(rebalances: Any, hours: Any, fleet: list[dict[str, Any]], width_ms: int,
           threshold: int, span_ms: int, parallelism: int) -> list[dict[str, Any]]:
    """The report's time series, one dict per bucket of ``width_ms`` that had a
    rebalance, in time order: the FLEET_SUMS (counts by reason, cost),
    ``groups`` rebalancing and ``storming_groups``, and ``rebalance_p50_ms``
    ... ``rebalance_max_ms``, ``rebalance_count`` without the initial joins.

    The sums and groups come from what phase 2 wrote: ``fleet_hours`` itself
    for hourly buckets, ``group_hours/`` summed per (bucket, group) and then
    per bucket for wider ones, ``rebalances/`` the same way for buckets under
    an hour (a group counts once per bucket; no ``count_distinct``, which
    expanded every row). The durations are exact percentiles per bucket over
    ``rebalances/``, hash-partitioned by bucket first so that each task
    aggregates a few buckets (Spark's ``percentile`` keeps a hash map per key
    and falls back to sorting its input past 128 keys in a task); hourly
    ones come with ``fleet`` (``aggregates.fleet_hours``) and need no pass."""
    from pyspark.sql import functions as F
    if width_ms == HOUR_MS:
        return [{"bucket_ms": int(h["hour_start_ms"]),
                 **{c: h[c] for c in (*FLEET_SUMS, "groups", "storming_groups",
                                      *REBALANCE_DURATIONS)}}
                for h in sorted(fleet, key=lambda h: int(h["hour_start_ms"]))]
    if width_ms % HOUR_MS == 0:
        per_group = hours.groupBy(_bucket("hour_start_ms", width_ms), "source", "group_id") \
            .agg(*(F.sum(c).alias(c) for c in FLEET_SUMS),
                 F.sum("storm_rebalances").alias("storm_rebalances"))
    else:
        per_group = rebalances.groupBy(_bucket("started_ms", width_ms), "source",
                                       "group_id").agg(*_sums(threshold))
    sums = [r.asDict() for r in per_group.groupBy("bucket_ms").agg(
        *(F.sum(c).cast("long").alias(c) for c in FLEET_SUMS),
        F.count(F.lit(1)).alias("groups"),
        F.sum(F.when(F.col("storm_rebalances") > 0, 1).otherwise(0)).cast("long")
        .alias("storming_groups")).collect()]
    buckets = span_ms // width_ms + 1
    durations = {int(r["bucket_ms"]): r.asDict() for r in rebalances.where(~is_initial())
                 .select(_bucket("started_ms", width_ms), "duration_ms")
                 .repartition(max(parallelism, -(-buckets // 32)), "bucket_ms")
                 .groupBy("bucket_ms").agg(*rebalance_durations(F.col("duration_ms")))
                 .collect()}
    none = dict.fromkeys(REBALANCE_DURATIONS) | {"rebalance_count": 0}
    out = []
    for row in sorted(sums, key=lambda r: int(r["bucket_ms"])):
        d = durations.get(int(row["bucket_ms"]), none)
        out.append(row | {k: d[k] for k in REBALANCE_DURATIONS})
    return out


def report_figures(fleet: list[dict[str, Any]], rebalances: Any, hours: Any, groups: Any,
                   journal: Any, *, top: int, storm: StormRule,
                   inputs: Sequence[str] = (), move_causes: Any = None,
                   imbalance: Any = None) -> ReportData:
    """Everything report.html shows, from the tables phase 2 wrote
    (``fleet`` is fleet_hours' rows with the FACT_COUNTS) and, for what no
    table holds, ``rebalances/`` and the journal (who joined and left);
    ``move_causes`` and ``imbalance`` are those tables (none: the report
    leaves their sections out)."""
    from pyspark.sql import functions as F
    tot = totals(fleet, groups, duration_figures(rebalances))
    worst = [r.asDict() for r in groups.orderBy(
        F.desc("peak_window_rebalances"), F.desc("rebalances"), "source", "group_id")
        .limit(top).collect()]
    keys = {(w["source"], w["group_id"]) for w in worst}
    heat: list[dict[str, Any]] = []
    if keys:
        # One scan that keeps the worst groups' names (a join with them
        # was two jobs); a name two coordinators share is told apart here.
        names = sorted({g for _, g in keys})
        heat = [r.asDict() for r in hours.where(F.col("group_id").isin(names))
                .select("source", "group_id", "hour_start_ms", "rebalances").collect()
                if (r["source"], r["group_id"]) in keys]
    width = bucket_width(tot["first_started_ms"], tot["last_ended_ms"])
    parallelism = int(rebalances.sparkSession.sparkContext.defaultParallelism)
    rows = series(rebalances, hours, fleet, width, storm.trips_at,
                  int(tot["last_ended_ms"]) - int(tot["first_started_ms"]), parallelism) \
        if tot["rebalances"] else []
    starters = attribution(journal, top)
    timelines = generations(rebalances, {(w["source"], w["group_id"])
                                         for w in worst[:TIMELINE_GROUPS]})
    causes, cause_width = cause_figures(move_causes, tot["first_started_ms"],
                                        tot["last_ended_ms"]) \
        if move_causes is not None and tot["rebalances"] else ([], HOUR_MS)
    loads = imbalance_figures(imbalance, cause_width) \
        if imbalance is not None and tot["rebalances"] else []
    return ReportData(
        totals=tot, fleet_hours=fleet, worst_groups=worst, heat=heat,
        histogram=histogram(rebalances), series=rows, bucket_ms=width, starters=starters,
        timelines=timelines, storm=storm, inputs=list(inputs), causes=causes,
        cause_bucket_ms=cause_width, imbalance=loads)


def bucket_name(width_ms: int) -> str:
    """``minute``, ``5 minutes``, ``hour``, ``day``, ... for a bucket width."""
    for unit, ms in (("week", 7 * 24 * HOUR_MS), ("day", 24 * HOUR_MS), ("hour", HOUR_MS),
                     ("minute", 60_000), ("second", 1000)):
        if width_ms % ms == 0:
            n = width_ms // ms
            return unit if n == 1 else f"{n} {unit}s"
    return f"{width_ms} ms"


def _grid(series: list[dict[str, Any]], width: int, keys: Sequence[str]
          ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every bucket from the first to the last of ``series`` (buckets without
    a rebalance are 0) as matplotlib date numbers, one more for the last
    bucket's end, and the values of ``keys`` per bucket."""
    import matplotlib.dates as mdates
    first = int(series[0]["bucket_ms"]) // width
    n = int(series[-1]["bucket_ms"]) // width - first + 1
    at = np.array([int(r["bucket_ms"]) // width - first for r in series], dtype=np.int64)
    date2num: Callable[[datetime], float] = mdates.date2num  # untyped in matplotlib
    start = date2num(datetime.fromtimestamp(first * width / 1000, tz=UTC))
    edges = start + np.arange(n + 1) * (width / 86_400_000)
    values = {}
    for key in keys:
        v = np.zeros(n, dtype=np.float64)
        v[at] = [float(r[key] or 0) for r in series]
        values[key] = v
    return edges, values


def _time_axis(ax: Any, edges: np.ndarray) -> None:
    """A date axis over exactly the journal's buckets, labelled to fit them."""
    import matplotlib.dates as mdates
    ax.set_xlim(float(edges[0]), float(edges[-1]))
    locator_of: Callable[..., Any] = mdates.AutoDateLocator  # untyped in matplotlib
    formatter_of: Callable[..., Any] = mdates.ConciseDateFormatter
    locator = locator_of(tz=UTC, minticks=3, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(formatter_of(locator, tz=UTC))


def _steps(ax: Any, edges: np.ndarray, top: np.ndarray, bottom: np.ndarray | None = None,
           **style: Any) -> None:
    """One filled step area per series (bucket by bucket): a bar per bucket
    was a matplotlib artist each, and most of the report's time."""
    ax.stairs(top, edges, baseline=bottom if bottom is not None else 0, fill=True, **style)


def _plot_reasons(series: list[dict[str, Any]], width: int) -> str:
    from pipeline.report import figure
    fig, ax = figure()
    keys = [f"reason_{r}" for r in (*REASONS, "other")]
    edges, values = _grid(series, width, keys)
    bottom = np.zeros(len(edges) - 1)
    for reason, key in zip((*REASONS, "other"), keys, strict=True):
        ys = values[key]
        if not ys.any():
            continue
        _steps(ax, edges, bottom + ys, bottom, label=reason.replace("_", " "))
        bottom = bottom + ys
    _time_axis(ax, edges)
    ax.set_ylabel(f"rebalances per {bucket_name(width)}")
    ax.set_ylim(0, max(float(bottom.max(initial=0)), 1) * 1.3)  # room for the legend
    ax.set_title(f"Rebalances per {bucket_name(width)}, by why they started (UTC)")
    ax.legend(fontsize=8, ncol=6, loc="upper left")
    return png(fig, "rebalances by reason", int(np.count_nonzero(bottom)))


def _plot_storms(series: list[dict[str, Any]], width: int, storm: StormRule) -> str:
    from pipeline.report import figure
    edges, values = _grid(series, width, ("groups", "storming_groups"))
    fig, ax = figure()
    ax.stairs(values["groups"], edges, label="groups that rebalanced")
    storms = values["storming_groups"]
    if storms.any():
        _steps(ax, edges, storms, color="tab:red", alpha=0.6,
               label=f"groups in a storm ({storm.describe()})")
    _time_axis(ax, edges)
    ax.set_ylim(0, max(float(values["groups"].max(initial=0)), 1) * 1.25)
    ax.set_ylabel("groups")
    ax.set_title(f"Groups rebalancing, and groups in a rebalance storm, per {bucket_name(width)}")
    ax.legend(fontsize=8, loc="upper left")
    out = png(fig, "groups rebalancing and storming", int(np.count_nonzero(values["groups"])))
    if not storms.any():
        out += empty(f"No storm: no group had {storm.describe()}." if storm.rebalances else
                     "No storm: storms are not counted (a storm threshold of 0).")
    return out


def _plot_durations(series: list[dict[str, Any]], width: int) -> str:
    from pipeline.report import figure
    if not any(r["rebalance_max_ms"] is not None for r in series):
        return empty("No rebalance other than initial joins: no duration to plot.")
    keys = ("rebalance_p50_ms", "rebalance_p95_ms", "rebalance_p99_ms", "rebalance_max_ms")
    edges, values = _grid(series, width, keys)
    present = np.zeros(len(edges) - 1, dtype=bool)
    first = int(series[0]["bucket_ms"]) // width
    for r in series:
        if r["rebalance_max_ms"] is not None:
            present[int(r["bucket_ms"]) // width - first] = True
    fig, ax = figure()
    for key, label in zip(keys, ("p50", "p95", "p99", "max"), strict=True):
        ys = np.where(present, np.maximum(values[key] / 1000, 1e-3), np.nan)
        ax.stairs(ys, edges, label=label, linestyle="--" if label == "max" else "-")
    _time_axis(ax, edges)
    ax.set_yscale("log")
    ax.set_ylabel("rebalance duration (s)")
    ax.set_title(f"Rebalance duration per {bucket_name(width)}, fleet-wide "
                 "(without the initial joins)")
    ax.legend(fontsize=8, loc="upper left")
    return png(fig, "rebalance durations", int(present.sum()))


def _plot_cost(series: list[dict[str, Any]], width: int) -> str:
    import matplotlib.pyplot as plt
    edges, values = _grid(series, width, ("moved", "unavailable_ms"))
    moved, unowned = values["moved"], values["unavailable_ms"] / 1000
    if not moved.any() and not unowned.any():
        return empty("No resource moved and none was unowned: nothing to plot.")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5), dpi=100, sharex=True)
    _steps(ax1, edges, moved, color="tab:orange")
    ax1.set_ylabel("resources moved")
    ax1.set_title(f"What rebalances cost per {bucket_name(width)}: resources moved, and "
                  f"resource-seconds unowned (total {amount(float(unowned.sum()))})")
    _steps(ax2, edges, unowned, color="tab:red")
    ax2.set_ylabel("unowned resource-s")
    ax2.set_ylim(0, max(float(unowned.max(initial=0)), 1e-3) * 1.1)
    _time_axis(ax2, edges)
    return png(fig, "cost of rebalances", int(np.count_nonzero(moved + unowned)))


def _plot_timelines(timelines: list[dict[str, Any]], worst: list[dict[str, Any]],
                    many: bool) -> str:
    import matplotlib.dates as mdates

    from pipeline.report import figure
    if not timelines:
        return empty("No group to draw a generation timeline for.")
    fig, ax = figure()
    date2num: Callable[[datetime], float] = mdates.date2num
    order = [(g["source"], g["group_id"]) for g in worst]
    lo = min(int(r["started_ms"]) for r in timelines)
    hi = max(int(r["started_ms"]) for r in timelines)
    pad = max((hi - lo) * 0.02, 1000)
    for key in order:
        rows = [r for r in timelines if (r["source"], r["group_id"]) == key]
        if not rows:
            continue
        x = [date2num(datetime.fromtimestamp(int(r["started_ms"]) / 1000, tz=UTC))
             for r in rows]
        ax.step(x, [int(r["generation_id"]) for r in rows], where="post", marker=".",
                markersize=3, label=_gname({"source": key[0], "group_id": key[1]}, many))
    edges = np.array([date2num(datetime.fromtimestamp((lo - pad) / 1000, tz=UTC)),
                      date2num(datetime.fromtimestamp((hi + pad) / 1000, tz=UTC))])
    _time_axis(ax, edges)
    ax.set_ylabel("generation")
    ax.set_title("Generation timeline of the worst groups (each step a rebalance)")
    ax.legend(fontsize=8, loc="upper left")
    return png(fig, "generation timelines", len(timelines))


def _plot_histogram(hist: list[tuple[int, int]]) -> str:
    fig, ax = figure()
    lo = [10 ** (b / 5) / 1000 for b, _ in hist]
    hi = [10 ** ((b + 1) / 5) / 1000 for b, _ in hist]
    ax.bar(lo, [c for _, c in hist], width=[h - low for low, h in zip(lo, hi, strict=True)],
           align="edge", edgecolor="white")
    ax.set_xscale("log")
    ax.set_xlabel("rebalance duration (s)")
    ax.set_ylabel("rebalances")
    ax.set_title("How long rebalances take (all groups, initial joins included)")
    return png(fig, "duration histogram", sum(1 for _, c in hist if c))


def _gname(g: dict[str, Any], many_sources: bool) -> str:
    return f"{g['source']}/{g['group_id']}" if many_sources else str(g["group_id"])


def _plot_worst(worst: list[dict[str, Any]], storm: StormRule, many: bool) -> str:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.3 * len(worst) + 1)), dpi=100)
    names = [_gname(g, many) for g in worst][::-1]
    peaks = [int(g["peak_window_rebalances"] or 0) for g in worst][::-1]
    colors = ["tab:red" if storm.is_storm(p) else "tab:blue" for p in peaks]
    ax.barh(names, peaks, color=colors)
    if storm.rebalances:
        ax.axvline(storm.rebalances, color="gray", linestyle="--",
                   label=f"storm threshold ({storm.rebalances})")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel(f"most rebalances within {seconds(storm.window_ms)}")
    ax.set_title("Worst groups: rebalance storms")
    return png(fig, "worst groups", sum(1 for p in peaks if p))


def _plot_heat(heat: list[dict[str, Any]], worst: list[dict[str, Any]], many: bool) -> str:
    import matplotlib.pyplot as plt
    seen = [h["hour_start_ms"] for h in heat]
    # every hour of the span, so that quiet hours show as gaps (at most ~3 months)
    hours = list(range(min(seen), max(seen) + HOUR_MS, HOUR_MS))
    if len(hours) > 24 * 92:
        hours = sorted(set(seen))
    col = {h: i for i, h in enumerate(hours)}
    order = [(g["source"], g["group_id"]) for g in worst]
    row = {k: i for i, k in enumerate(order)}
    grid = [[0] * len(hours) for _ in order]
    for h in heat:
        grid[row[(h["source"], h["group_id"])]][col[h["hour_start_ms"]]] = int(h["rebalances"])
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.3 * len(order) + 1.2)), dpi=100)
    im = ax.imshow(grid, aspect="auto", cmap="magma_r", interpolation="nearest")
    ax.set_yticks(range(len(order)), [_gname(g, many) for g in worst], fontsize=8)
    step = max(1, len(hours) // 12)
    ax.set_xticks(range(0, len(hours), step), [utc(hours[i]) for i in range(0, len(hours), step)],
                  rotation=30, ha="right", fontsize=8)
    fig.colorbar(im, ax=ax, label="rebalances in the hour")
    ax.set_title("Worst groups, hour by hour")
    return png(fig, "worst groups per hour", len(heat))


#: What the rebalance duration tiles are over.
REBALANCE = "initial joins left out"

#: Journals named in the tile; more are counted.
JOURNALS_NAMED = 4


def _journals(t: dict[str, Any]) -> str:
    """The tile's words under the journal count: their names, which prefix
    a group's name when there are several."""
    names = [str(x) for x in (t.get("source_names") or [])]
    shown = ", ".join(names[:JOURNALS_NAMED])
    if len(names) > JOURNALS_NAMED:
        shown += f" and {len(names) - JOURNALS_NAMED} more"
    return f"{shown} (groups below are journal/group)" if len(names) > 1 else shown


def render(data: ReportData) -> str:
    t = data.totals
    n = int(t.get("rebalances") or 0)
    body: list[str] = []
    if data.inputs:
        body.append("<p class='note'>inputs: " + esc(", ".join(data.inputs)) + "</p>")
    if n == 0:
        body.append("<h2>No rebalances</h2><p>The journals hold no completed rebalance, so "
                    "there is nothing to plot. The Parquet tables were written, empty.</p>")
        return page("groupcoord rebalance report", body)
    sources = int(t.get("sources") or 0)
    many = sources > 1
    unavailable_s = int(t.get("unavailable_ms") or 0) / 1000
    initial = int(t.get("initial_count") or 0)
    groups, moved = int(t["groups"]), int(t["moved"])
    follow_ups = int(t["follow_up_rebalances"] or 0)
    proper = int(t.get("rebalance_count") or 0)
    body.append(cards([
        (plural(n, "rebalance"), num(n), f"{counted(initial, 'initial join')} among them"),
        (plural(groups, "group"), num(groups)),
        (plural(sources, "journal"), num(sources), _journals(t)),
        ("from (UTC)", utc(t["first_started_ms"])), ("to (UTC)", utc(t["last_ended_ms"])),
    ]))
    body.append(cards([
        ("rebalance p50", seconds(t.get("rebalance_p50_ms")),
         f"of {counted(proper, 'rebalance')}, {REBALANCE}"),
        ("rebalance p95", seconds(t.get("rebalance_p95_ms")), REBALANCE),
        ("rebalance p99", seconds(t.get("rebalance_p99_ms")), REBALANCE),
        ("longest rebalance", seconds(t.get("rebalance_max_ms")), REBALANCE),
        ("initial join p95", seconds(t.get("initial_p95_ms")) if initial else "-",
         counted(initial, "initial join")),
        ("longest initial join", seconds(t.get("initial_max_ms")) if initial else "-",
         counted(initial, "initial join")),
    ]))
    body.append(cards([
        (plural(moved, "resource") + " moved", num(moved)),
        ("unowned " + plural(amount(unavailable_s), "resource-second"), amount(unavailable_s)),
        ("cooperative " + plural(follow_ups, "follow-up"), num(follow_ups)),
    ]))
    notes = ["A journal is what one input holds: a coordinator's SQLite file, a "
             "PostgreSQL database (every coordinator sharing it) or one source of an "
             "export directory.",
             "Every duration of a rebalance in this report, the tiles, the charts over "
             "time and the worst groups' table alike, leaves out the initial joins "
             "(reason \"initial\": the group's first members wait for the coordinator's "
             "initial-rebalance delay on purpose); the initial joins are counted apart, "
             "and the histogram below shows everything."]
    unreadable = int(t.get("unreadable") or 0)
    if unreadable:
        notes.append(f"{counted(unreadable, 'rebalance')} "
                     f"{'has' if unreadable == 1 else 'have'} no ownership figures "
                     "(another protocol_type than \"resources\", or undecodable assignments: "
                     f"{num(int(t.get('assignment_errors') or 0))}).")
    never = int(t.get("unowned_at_end") or 0)
    if never:
        notes.append(f"{counted(never, 'revoked resource')} "
                     f"{'was' if never == 1 else 'were'} never owned "
                     "again in the journal; they count as unowned until the group's last "
                     "rebalance.")
    body.append("<p class='note'>" + " ".join(esc(x) for x in notes) + "</p>")

    series, width = data.series, data.bucket_ms
    body.append(f"<h2>Trend over time (per {esc(bucket_name(width))})</h2>")
    if series:
        body.append(_plot_reasons(series, width))
        body.append(_plot_storms(series, width, data.storm))
        body.append(_plot_durations(series, width))
        body.append(_plot_cost(series, width))
    else:
        body.append(empty("No time series."))
    body.append("<h2>Rebalance durations</h2>")
    body.append(_plot_histogram(data.histogram))

    reasons = [(r, int(t.get(f"reason_{r}") or 0)) for r in (*REASONS, "other")]
    body.append("<h2>Why rebalances started</h2>")
    body.append(table(["reason", "rebalances", "share"],
                      [[esc(r.replace("_", " ")), num(c), f"{100 * c / n:.1f}%"]
                       for r, c in sorted(reasons, key=lambda x: -x[1]) if c]))
    body.append(_moves_by_cause(data.causes, data.cause_bucket_ms))
    body.append(_load_imbalance(data.imbalance, data.cause_bucket_ms, many))
    body.append("<h2>Who started them</h2>")
    if data.starters:
        kinds = ("join", "static_change", "leave", "session_expiry", "join_timeout",
                 "sync_timeout")
        body.append("<p class='note'>A join is started by the members that joined; a leave, "
                    "session expiry or join/sync timeout by the members that left. Other "
                    "reasons (rejoins, metadata changes, initial joins) are not "
                    "attributed.</p>")
        body.append(table(
            ["member", "group", "rebalances started", *(k.replace("_", " ") for k in kinds)],
            [[esc(m["member_id"]), esc(_gname(m, many)), num(m["rebalances"]),
              *(num(m[k]) for k in kinds)] for m in data.starters], left=2))
    else:
        body.append(empty("No rebalance was started by a member joining or leaving."))

    worst = data.worst_groups
    body.append(f"<h2>Worst groups (top {len(worst)} of {esc(counted(groups, 'group'))})</h2>")
    body.append(f"<p class='note'>Ordered by the most rebalances started within any "
                f"{esc(seconds(data.storm.window_ms))}; "
                + (f"a storm is {esc(data.storm.describe())}." if data.storm.rebalances else
                   "storms are not counted (a storm threshold of 0).") + "</p>")
    body.append(_plot_worst(worst, data.storm, many))
    if data.heat:
        body.append(_plot_heat(data.heat, worst, many))
    body.append(_plot_timelines(data.timelines, worst, many))
    body.append("<p class='note'>rebalance p95 and longest rebalance: without the initial "
                "joins, as the tiles at the top.</p>")
    body.append(table(
        ["group", "protocol", "rebalances", "peak in window", "storm rebalances",
         "rebalance p95", "longest rebalance", "moved", "unowned res-s", "follow-ups",
         "gens w/o assignment"],
        [[esc(_gname(g, many)), esc(g["protocol_name"] or "-"), num(g["rebalances"]),
          num(g["peak_window_rebalances"]), num(g["storm_rebalances"]),
          seconds(g["rebalance_p95_ms"]), seconds(g["rebalance_max_ms"]), num(g["moved"]),
          amount(int(g["unavailable_ms"] or 0) / 1000), num(g["follow_up_rebalances"]),
          num(g.get("generations_without_assignment"))] for g in worst], left=2))
    body.append("<h2>Tables</h2><p class='note'>Parquet beside this file: rebalances/ (one row "
                "per rebalance), group_hours/, move_causes/, imbalance/, groups/, "
                "fleet_hours/ "
                "(docs/pipeline.md).</p>")
    return page("groupcoord rebalance report", body)


def _moves_by_cause(rows: list[dict[str, Any]], width: int) -> str:
    """The moves per bucket and cause (``move_causes/``), a column per cause,
    the most frequent first."""
    head = f"<h2>Moves by cause (per {esc(bucket_name(width))})</h2>"
    if not rows:
        return head + empty("No resource moved.")
    total: dict[str, int] = {}
    cells: dict[int, dict[str, int]] = {}
    for r in rows:
        total[r["cause"]] = total.get(r["cause"], 0) + int(r["moves"])
        cells.setdefault(int(r["bucket_ms"]), {})[r["cause"]] = int(r["moves"])
    causes = sorted(total, key=lambda c: (-total[c], c))
    note = ("<p class='note'>A move counts once, in the generation where its new owner "
            "gains it, under the cause the leader's assignor gave (the assignment's "
            "\"why\"); \"unknown\": moves in generations whose assignments say no "
            "why (an assignor that does not give causes).</p>")
    return head + note + table(
        [f"{bucket_name(width)} from (UTC)", *causes, "all"],
        [[esc(utc(b)), *(num(c.get(k, 0)) for k in causes), num(sum(c.values()))]
         for b, c in sorted(cells.items())]
        + [["all", *(num(total[k]) for k in causes), num(sum(total.values()))]])


def _load_imbalance(rows: list[dict[str, Any]], width: int, many: bool) -> str:
    """The load imbalance per bucket (``imbalance/``)."""
    head = f"<h2>Load imbalance over time (per {esc(bucket_name(width))})</h2>"
    if not rows:
        return head + empty("No generation says what load its leader gave "
                            "(only a load-balancing assignor, balanced, does).")
    note = ("<p class='note'>A generation's imbalance is its busiest member's load over "
            "its fair share, as the leader's assignor weighed them (the assignment's "
            "\"load\"; 1.0: every member at its fair share). Generations of groups whose "
            "assignor gives no load are not counted.</p>")
    return head + note + table(
        [f"{bucket_name(width)} from (UTC)", "generations", "groups", "mean", "largest",
         "largest in"],
        [[esc(utc(r["bucket_ms"])), num(r["generations"]), num(r["groups"]),
          f"{r['mean']:.3f}", f"{r['max']:.3f}",
          esc(f"{_gname(r, many)} generation {r['generation_id']}")] for r in rows], left=1)


def write_report(path: Path, data: ReportData) -> Path:
    path.write_text(render(data), encoding="utf-8")
    return path
