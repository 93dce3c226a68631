"""report.html of ``groupcoord analyze``: the fleet's rebalances at a glance.

Built on the driver from the small aggregates only (fleet per hour, the worst
groups, a duration histogram), never from the per-rebalance table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.aggregates import HOUR_MS, REASONS
from pipeline.report import cards, esc, figure, num, page, png, seconds, table, utc


@dataclass
class ReportData:
    totals: dict[str, Any]
    fleet_hours: list[dict[str, Any]]
    worst_groups: list[dict[str, Any]]
    heat: list[dict[str, Any]]
    histogram: list[tuple[int, int]]
    storm_window_ms: int
    storm_threshold: int
    inputs: list[str] = field(default_factory=list)


def _hours(rows: list[dict[str, Any]]) -> list[datetime]:
    return [datetime.fromtimestamp(r["hour_start_ms"] / 1000, tz=UTC) for r in rows]


def _hourly(fleet: list[dict[str, Any]], keys: Sequence[str]
            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every hour from the first to the last of ``fleet`` (hours without a
    rebalance are 0) as matplotlib date numbers, one more for the last
    hour's end, and the values of ``keys`` per hour."""
    import matplotlib.dates as mdates
    first = int(fleet[0]["hour_start_ms"]) // HOUR_MS
    n = int(fleet[-1]["hour_start_ms"]) // HOUR_MS - first + 1
    at = np.array([int(r["hour_start_ms"]) // HOUR_MS - first for r in fleet], dtype=np.int64)
    date2num: Callable[[datetime], float] = mdates.date2num  # untyped in matplotlib
    start = date2num(datetime.fromtimestamp(first * HOUR_MS / 1000, tz=UTC))
    edges = start + np.arange(n + 1) / 24
    values = {}
    for key in keys:
        v = np.zeros(n, dtype=np.float64)
        v[at] = [float(r[key] or 0) for r in fleet]
        values[key] = v
    return edges, values


def _steps(ax: Any, edges: np.ndarray, top: np.ndarray, bottom: np.ndarray | None = None,
           **style: Any) -> None:
    """One filled step area per series (hour by hour): a bar per hour was a
    matplotlib artist each, and most of the report's time."""
    ax.stairs(top, edges, baseline=bottom if bottom is not None else 0, fill=True, **style)
    ax.xaxis_date()


def _plot_reasons(fleet: list[dict[str, Any]]) -> str:
    fig, ax = figure()
    keys = [f"reason_{r}" for r in (*REASONS, "other")]
    edges, values = _hourly(fleet, keys)
    bottom = np.zeros(len(edges) - 1)
    for reason, key in zip((*REASONS, "other"), keys, strict=True):
        ys = values[key]
        if not ys.any():
            continue
        _steps(ax, edges, bottom + ys, bottom, label=reason.replace("_", " "))
        bottom = bottom + ys
    ax.set_ylabel("rebalances per hour")
    ax.set_ylim(0, max(float(bottom.max(initial=0)), 1) * 1.3)  # room for the legend
    ax.set_title("Rebalances per hour, by why they started (UTC)")
    ax.legend(fontsize=8, ncol=6, loc="upper left")
    fig.autofmt_xdate()
    return png(fig)


def _plot_durations(fleet: list[dict[str, Any]]) -> str:
    fig, ax = figure()
    x = _hours(fleet)
    for key, label, style in (("duration_p50_ms", "p50", "-"), ("duration_p95_ms", "p95", "-"),
                              ("duration_p99_ms", "p99", "--"), ("duration_max_ms", "max", ":")):
        ax.plot(x, [max(float(r[key] or 0) / 1000, 1e-3) for r in fleet], style, label=label,
                marker="." if len(x) < 50 else None)
    ax.set_yscale("log")
    ax.set_ylabel("rebalance duration (s)")
    ax.set_title("Rebalance duration per hour, fleet-wide")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    return png(fig)


def _plot_cost(fleet: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5), dpi=100, sharex=True)
    edges, values = _hourly(fleet, ("moved", "unavailable_ms"))
    _steps(ax1, edges, values["moved"], color="tab:orange")
    ax1.set_ylabel("resources moved")
    ax1.set_title("What rebalances cost per hour: resources moved, and resource-seconds unowned")
    _steps(ax2, edges, values["unavailable_ms"] / 1000, color="tab:red")
    ax2.set_ylabel("unowned resource-s")
    fig.autofmt_xdate()
    return png(fig)


def _plot_storms(fleet: list[dict[str, Any]], window_ms: int, threshold: int) -> str:
    fig, ax = figure()
    x = _hours(fleet)
    ax.plot(x, [int(r["groups"] or 0) for r in fleet], label="groups that rebalanced")
    ax.plot(x, [int(r["storming_groups"] or 0) for r in fleet], color="tab:red",
            label=f"groups in a storm (>= {threshold} rebalances in {seconds(window_ms)})")
    ax.set_ylabel("groups")
    ax.set_title("Trend: groups rebalancing, and groups in a rebalance storm, per hour")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    return png(fig)


def _plot_histogram(hist: list[tuple[int, int]]) -> str:
    fig, ax = figure()
    lo = [10 ** (b / 5) / 1000 for b, _ in hist]
    hi = [10 ** ((b + 1) / 5) / 1000 for b, _ in hist]
    ax.bar(lo, [c for _, c in hist], width=[h - low for low, h in zip(lo, hi, strict=True)],
           align="edge", edgecolor="white")
    ax.set_xscale("log")
    ax.set_xlabel("rebalance duration (s)")
    ax.set_ylabel("rebalances")
    ax.set_title("How long rebalances take (all groups)")
    return png(fig)


def _gname(g: dict[str, Any], many_sources: bool) -> str:
    return f"{g['source']}/{g['group_id']}" if many_sources else str(g["group_id"])


def _plot_worst(worst: list[dict[str, Any]], threshold: int, window_ms: int,
                many: bool) -> str:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.3 * len(worst) + 1)), dpi=100)
    names = [_gname(g, many) for g in worst][::-1]
    peaks = [int(g["peak_window_rebalances"] or 0) for g in worst][::-1]
    colors = ["tab:red" if p >= threshold else "tab:blue" for p in peaks]
    ax.barh(names, peaks, color=colors)
    ax.axvline(threshold, color="gray", linestyle="--", label=f"storm threshold ({threshold})")
    ax.set_xlabel(f"most rebalances within {seconds(window_ms)}")
    ax.set_title("Worst groups: rebalance storms")
    ax.legend(fontsize=8, loc="lower right")
    return png(fig)


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
    return png(fig)


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
    many = int(t.get("sources") or 0) > 1
    unavailable_s = int(t.get("unavailable_ms") or 0) / 1000
    body.append(cards([
        ("rebalances", num(n)),
        ("groups", num(int(t["groups"]))),
        ("coordinators", num(int(t["sources"]))),
        ("from", utc(t["first_started_ms"])), ("to", utc(t["last_ended_ms"])),
        ("duration p50", seconds(t["duration_p50_ms"])),
        ("duration p95", seconds(t["duration_p95_ms"])),
        ("duration p99", seconds(t["duration_p99_ms"])),
        ("longest", seconds(t["duration_max_ms"])),
        ("resources moved", num(int(t["moved"]))),
        ("unowned resource-seconds", num(unavailable_s)),
        ("cooperative follow-ups", num(int(t["follow_up_rebalances"] or 0))),
    ]))
    notes = []
    if int(t.get("unreadable") or 0):
        notes.append(f"{num(int(t['unreadable']))} rebalances have no ownership figures "
                     "(another protocol_type than \"resources\", or undecodable assignments: "
                     f"{num(int(t.get('assignment_errors') or 0))}).")
    if int(t.get("unowned_at_end") or 0):
        notes.append(f"{num(int(t['unowned_at_end']))} revoked resources were never owned "
                     "again in the journal; they count as unowned until the group's last "
                     "rebalance.")
    if notes:
        body.append("<p class='note'>" + " ".join(esc(x) for x in notes) + "</p>")

    fleet = data.fleet_hours
    body.append("<h2>Trend over time</h2>")
    body.append(_plot_reasons(fleet))
    body.append(_plot_storms(fleet, data.storm_window_ms, data.storm_threshold))
    body.append(_plot_durations(fleet))
    body.append(_plot_cost(fleet))
    body.append("<h2>Rebalance durations</h2>")
    body.append(_plot_histogram(data.histogram))

    reasons = [(r, int(t.get(f"reason_{r}") or 0)) for r in (*REASONS, "other")]
    body.append("<h2>Why rebalances started</h2>")
    body.append(table(["reason", "rebalances", "share"],
                      [[esc(r.replace("_", " ")), num(c), f"{100 * c / n:.1f}%"]
                       for r, c in sorted(reasons, key=lambda x: -x[1]) if c]))

    worst = data.worst_groups
    body.append(f"<h2>Worst groups (top {len(worst)})</h2>")
    body.append(f"<p class='note'>Ordered by the most rebalances started within any "
                f"{esc(seconds(data.storm_window_ms))}; a storm is "
                f"{data.storm_threshold} or more.</p>")
    body.append(_plot_worst(worst, data.storm_threshold, data.storm_window_ms, many))
    if data.heat:
        body.append(_plot_heat(data.heat, worst, many))
    body.append(table(
        ["group", "protocol", "rebalances", "peak in window", "storm rebalances", "p95",
         "max", "moved", "unowned res-s", "follow-ups", "gens w/o assignment"],
        [[esc(_gname(g, many)), esc(g["protocol_name"] or "-"), num(g["rebalances"]),
          num(g["peak_window_rebalances"]), num(g["storm_rebalances"]),
          seconds(g["duration_p95_ms"]), seconds(g["duration_max_ms"]), num(g["moved"]),
          num(int(g["unavailable_ms"] or 0) / 1000), num(g["follow_up_rebalances"]),
          num(g.get("generations_without_assignment"))] for g in worst], left=2))
    body.append("<h2>Tables</h2><p class='note'>Parquet beside this file: rebalances/ (one row "
                "per rebalance), group_hours/, groups/, fleet_hours/ (docs/pipeline.md).</p>")
    return page("groupcoord rebalance report", body)


def write_report(path: Path, data: ReportData) -> Path:
    path.write_text(render(data), encoding="utf-8")
    return path
