"""Per group-hour and per group aggregates of the facts, in numpy (docs/pipeline.md).

A group's rows all live in one task (pipeline/analyze.py lays each group out in
one partition), so ``group_hours/`` and the per-group part of ``groups/`` are
computed there, next to the facts, with exact percentiles (linear
interpolation between ranks, as Spark's ``percentile``): an exact percentile
per group-hour in Spark cost more than everything else in the job. Only the
fleet-wide figures (over all groups) are aggregated by Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HOUR_MS = 3_600_000

#: Known reasons get a column each (coordinator/core/records.py
#: REBALANCE_REASONS); anything else is counted in ``reason_other``.
REASONS: tuple[str, ...] = (
    "initial", "join", "rejoin", "metadata_change", "leave", "session_expiry", "join_timeout",
    "sync_timeout", "restart", "static_change",
)

_SUMMED = ("joined", "left", "revoked", "moved", "unavailable_ms", "unowned_at_end")
PERCENTILES = (0.5, 0.95, 0.99)


def _sums_schema() -> list[tuple[str, pa.DataType]]:
    return ([("rebalances", pa.int64())] + [(c, pa.int64()) for c in _SUMMED]
            + [("follow_up_rebalances", pa.int64())]
            + [(f"reason_{r}", pa.int64()) for r in (*REASONS, "other")]
            + [("duration_max_ms", pa.int64()), ("duration_p50_ms", pa.float64()),
               ("duration_p95_ms", pa.float64()), ("duration_p99_ms", pa.float64())])


def group_hours_schema() -> pa.Schema:
    return pa.schema([("source", pa.string()), ("group_id", pa.string()),
                      ("hour_start_ms", pa.int64()), *_sums_schema(),
                      ("storm_rebalances", pa.int64())])


def groups_schema() -> pa.Schema:
    return pa.schema([("source", pa.string()), ("group_id", pa.string()), *_sums_schema(),
                      ("first_started_ms", pa.int64()), ("last_ended_ms", pa.int64()),
                      ("peak_window_rebalances", pa.int64()), ("storm_rebalances", pa.int64()),
                      ("protocol_name", pa.string()), ("cooperative", pa.bool_()),
                      ("max_members", pa.int64()), ("max_follow_ups", pa.int64())])


def _col(t: pa.Table, name: str) -> np.ndarray:
    c = t[name]
    out: np.ndarray = np.asarray((pc.fill_null(c, 0) if c.null_count else c)
                                 .to_numpy(zero_copy_only=False), dtype=np.int64)
    return out


def _valid(t: pa.Table, name: str) -> np.ndarray:
    out: np.ndarray = np.asarray(pc.is_valid(t[name]).to_numpy(zero_copy_only=False),
                                 dtype=bool)
    return out


def _by_key(t: pa.Table, key: np.ndarray, threshold: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Sums, reason counts and exact duration percentiles per distinct ``key``
    (rows are reordered by key, then duration). Returns the first row of each
    key (in the reordered rows' original numbering) and the columns."""
    duration = _col(t, "duration_ms")
    order = np.lexsort((duration, key))
    k = key[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[starts, len(k)])
    cols: dict[str, Any] = {"rebalances": counts}
    for c in _SUMMED:
        cols[c] = np.add.reduceat(_col(t, c)[order], starts)
    readable = _valid(t, "is_follow_up")[order]
    follow = pc.fill_null(t["is_follow_up"], False).to_numpy(zero_copy_only=False)
    fu = np.add.reduceat(np.asarray(follow, dtype=np.int64)[order], starts)
    cols["follow_up_rebalances"] = pa.array(fu, mask=np.add.reduceat(readable, starts) == 0)
    code = np.asarray(pc.fill_null(pc.index_in(t["reason"], value_set=pa.array(REASONS)),
                                   len(REASONS)).to_numpy(zero_copy_only=False))[order]
    for i, r in enumerate((*REASONS, "other")):
        cols[f"reason_{r}"] = np.add.reduceat((code == i).astype(np.int64), starts)
    d = duration[order]
    cols["duration_max_ms"] = d[starts + counts - 1]
    for p in PERCENTILES:
        pos = (counts - 1) * p
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts - 1)
        frac = pos - lo
        a, b = d[starts + lo].astype(np.float64), d[starts + hi].astype(np.float64)
        cols[f"duration_p{round(p * 100)}_ms"] = a + (b - a) * frac
    window = _col(t, "window_count")[order]
    cols["storm_rebalances"] = np.add.reduceat((window >= threshold).astype(np.int64), starts)
    cols["_peak"] = np.maximum.reduceat(window, starts)
    return order[starts], cols | {"_order": order, "_starts": starts}


def aggregate(facts: pa.Table, threshold: int) -> tuple[pa.Table, pa.Table]:
    """``group_hours`` rows and the per-group rows of ``groups`` (without the
    generations columns) of whole groups' facts, in journal order per group."""
    if facts.num_rows == 0:
        return group_hours_schema().empty_table(), groups_schema().empty_table()
    new_group = np.zeros(facts.num_rows, dtype=bool)
    new_group[0] = True
    for name in ("source", "group_id"):
        c = facts[name].combine_chunks()
        if len(c) > 1:
            new_group[1:] |= np.asarray(pc.fill_null(pc.not_equal(
                c.slice(1), c.slice(0, len(c) - 1)), True).to_numpy(zero_copy_only=False))
    group = np.cumsum(new_group) - 1
    started = _col(facts, "started_ms")
    hour = started - np.mod(started, HOUR_MS)

    # group_hours: key = (group, hour)
    _, hour_rank = np.unique(hour, return_inverse=True)
    first, cols = _by_key(facts, (group << 32) | hour_rank, threshold)
    idx = pa.array(first)
    gh: dict[str, Any] = {"source": facts["source"].take(idx),
                          "group_id": facts["group_id"].take(idx),
                          "hour_start_ms": hour[first]}
    schema = group_hours_schema()
    gh |= {f.name: cols[f.name] for f in schema if f.name not in gh}
    hours = pa.table([pa.array(gh[f.name], f.type) if not isinstance(gh[f.name], pa.Array)
                      and not isinstance(gh[f.name], pa.ChunkedArray) else gh[f.name]
                      for f in schema], schema=schema)

    # groups: key = group
    first, cols = _by_key(facts, group, threshold)
    order, starts = cols["_order"], cols["_starts"]
    last_row = np.flatnonzero(np.r_[group[1:] != group[:-1], True])  # journal order: latest
    ended = _col(facts, "ended_ms")
    coop = np.asarray(pc.fill_null(facts["cooperative"], False)
                      .to_numpy(zero_copy_only=False), dtype=np.int64)
    fu_valid = _valid(facts, "follow_ups")
    fu = _col(facts, "follow_ups")
    gs = {"source": facts["source"].take(pa.array(first)),
          "group_id": facts["group_id"].take(pa.array(first)),
          "first_started_ms": np.minimum.reduceat(started[order], starts),
          "last_ended_ms": np.maximum.reduceat(ended[order], starts),
          "peak_window_rebalances": cols["_peak"],
          "protocol_name": facts["protocol_name"].take(pa.array(last_row)),
          "cooperative": np.maximum.reduceat(coop[order], starts) > 0,
          "max_members": np.maximum.reduceat(_col(facts, "member_count")[order], starts),
          "max_follow_ups": pa.array(np.maximum.reduceat(np.where(fu_valid, fu, -1)[order],
                                                         starts),
                                     mask=np.add.reduceat(fu_valid[order], starts) == 0)}
    gschema = groups_schema()
    gs |= {f.name: cols[f.name] for f in gschema if f.name not in gs}
    groups = pa.table([gs[f.name] if isinstance(gs[f.name], (pa.Array, pa.ChunkedArray))
                       else pa.array(gs[f.name], f.type) for f in gschema], schema=gschema)
    return hours, groups


# ---------------------------------------------------------------- fleet-wide durations
#
# Fleet-wide percentiles need every duration of an hour, over all groups. The
# facts tasks send them to the driver compressed: one row per distinct
# (hour, duration_ms) with how many rebalances had it ("cells"), summed per
# task. Durations are whole milliseconds and repeat a lot (2M rebalances of
# the benchmark journal have 470k distinct (hour, duration) pairs), and exact
# percentiles follow from the counts: no second pass over rebalances/ and no
# approximation.


def cells_schema() -> pa.Schema:
    return pa.schema([("hour_start_ms", pa.int64()), ("duration_ms", pa.int64()),
                      ("rebalances", pa.int64())])


def _sum_cells(hour: np.ndarray, duration: np.ndarray, count: np.ndarray) -> pa.Table:
    schema = cells_schema()
    if len(hour) == 0:
        return schema.empty_table()
    order = np.lexsort((duration, hour))
    h, d = hour[order], duration[order]
    starts = np.flatnonzero(np.r_[True, (h[1:] != h[:-1]) | (d[1:] != d[:-1])])
    return pa.table([h[starts], d[starts], np.add.reduceat(count[order], starts)],
                    schema=schema)


def duration_cells(facts: pa.Table) -> pa.Table:
    """``cells_schema()`` rows of some facts: the rebalances per distinct
    (UTC hour of ``started_ms``, ``duration_ms``)."""
    started = _col(facts, "started_ms")
    return _sum_cells(started - np.mod(started, HOUR_MS), _col(facts, "duration_ms"),
                      np.ones(facts.num_rows, np.int64))


def merge_cells(tables: Sequence[pa.Table]) -> pa.Table:
    """Cells of several tasks as one table, one row per (hour, duration)."""
    t = pa.concat_tables([x.cast(cells_schema()) for x in tables]) if tables \
        else cells_schema().empty_table()
    return _sum_cells(_col(t, "hour_start_ms"), _col(t, "duration_ms"), _col(t, "rebalances"))


def cell_percentiles(key: np.ndarray, duration: np.ndarray, count: np.ndarray
                     ) -> dict[int, dict[str, float | int]]:
    """Exact duration percentiles per ``key`` from (key, duration, count)
    rows sorted by key then duration (Spark's ``percentile``: linear
    interpolation at position ``p x (n - 1)``) and the maximum."""
    out: dict[int, dict[str, float | int]] = {}
    if len(key) == 0:
        return out
    cum = np.cumsum(count)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)]
    base = np.r_[0, cum][starts]                  # rebalances before each key
    n = cum[ends - 1] - base

    def at(rank: np.ndarray) -> np.ndarray:      # the duration of 0-based rank in the key
        found: np.ndarray = duration[np.searchsorted(cum, base + rank, side="right")]
        return found.astype(np.float64)

    figures: dict[str, np.ndarray] = {"duration_max_ms": duration[ends - 1]}
    for p in PERCENTILES:
        pos = (n - 1) * p
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        a, b = at(lo), at(hi)
        figures[f"duration_p{round(p * 100)}_ms"] = a + (b - a) * (pos - lo)
    for i, k in enumerate(key[starts].tolist()):
        out[int(k)] = {name: (int(v[i]) if name == "duration_max_ms" else float(v[i]))
                       for name, v in figures.items()}
    return out


def cell_histogram(cells: pa.Table) -> list[tuple[int, int]]:
    """(bucket, rebalances): bucket b holds durations in [10^(b/5), 10^((b+1)/5)) ms
    (durations under 1 ms in bucket 0)."""
    d = np.maximum(_col(cells, "duration_ms"), 1)
    bucket = np.floor(np.log10(d.astype(np.float64)) * 5).astype(np.int64)
    counts = _col(cells, "rebalances")
    found, inverse = np.unique(bucket, return_inverse=True)
    sums = np.bincount(inverse, weights=counts, minlength=len(found))
    return [(int(b), int(c)) for b, c in zip(found.tolist(), sums.tolist(), strict=True)]


# ---------------------------------------------------------------- fleet-wide sums
#
# fleet_hours/ sums group_hours/ per hour over all groups. A group lives in
# one task, so each task sums its own groups' hours and the driver adds the
# tasks' sums up (no Spark job over group_hours/). Nulls as Spark's ``sum``:
# skipped, and null only where every value of the hour is.

#: The group_hours columns fleet_hours sums, in fleet_hours' order.
FLEET_SUMS: tuple[str, ...] = ("rebalances", *_SUMMED, "follow_up_rebalances",
                               *(f"reason_{r}" for r in (*REASONS, "other")))

#: Counted per hour from the facts (for the report's totals, not in fleet_hours/).
FACT_COUNTS: tuple[str, ...] = ("assignment_errors", "unreadable", "cooperative_rebalances")


def hour_sums_schema() -> pa.Schema:
    """Per hour: the FLEET_SUMS, the group-hours (``groups``), those with a
    storm rebalance (``storming_groups``) and the FACT_COUNTS: rebalances
    with an ``assignment_error``, without ownership figures, cooperative."""
    return pa.schema([("hour_start_ms", pa.int64()),
                      *((c, pa.int64()) for c in (*FLEET_SUMS, "groups", "storming_groups",
                                                  *FACT_COUNTS))])


def _sum_by_hour(t: pa.Table) -> pa.Table:
    schema = hour_sums_schema()
    if t.num_rows == 0:
        return schema.empty_table()
    names = schema.names[1:]
    out = t.group_by("hour_start_ms").aggregate([(c, "sum") for c in names])
    out = out.rename_columns([n.removesuffix("_sum") for n in out.column_names])
    return out.select(schema.names).cast(schema).sort_by("hour_start_ms")


def hour_sums(hours: pa.Table, facts: pa.Table) -> pa.Table:
    """``hour_sums_schema()`` of some whole groups: their ``group_hours``
    rows and their facts."""
    schema = hour_sums_schema()
    storm = _col(hours, "storm_rebalances") > 0
    from_hours = {"hour_start_ms": hours["hour_start_ms"], "groups": np.ones(len(storm), np.int64),
                  "storming_groups": storm.astype(np.int64)} | {c: hours[c] for c in FLEET_SUMS}
    started = _col(facts, "started_ms")
    from_facts = {
        "hour_start_ms": started - np.mod(started, HOUR_MS),
        "assignment_errors": np.asarray(pc.fill_null(facts["assignment_error"], False)
                                        .to_numpy(zero_copy_only=False), dtype=np.int64),
        "unreadable": (~_valid(facts, "revoked")).astype(np.int64),
        "cooperative_rebalances": np.asarray(pc.fill_null(facts["cooperative"], False)
                                             .to_numpy(zero_copy_only=False), dtype=np.int64)}

    def table(cols: dict[str, Any], n: int) -> pa.Table:
        # A column the part does not have is null: skipped by the sums.
        return pa.table([cols[f.name] if f.name in cols else pa.nulls(n, f.type)
                         for f in schema], schema=schema)
    return _sum_by_hour(pa.concat_tables([table(from_hours, hours.num_rows),
                                          table(from_facts, facts.num_rows)]))


def merge_hour_sums(tables: Sequence[pa.Table]) -> pa.Table:
    """Several tasks' hour sums as one table, one row per hour, in time order."""
    schema = hour_sums_schema()
    return _sum_by_hour(pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
                        if tables else schema.empty_table())


# ---------------------------------------------------------------- a task's result

#: ``kind`` of a task result row: a duration cell, or one value of an hour's sums.
CELL, HOUR = 0, 1


def task_result_schema() -> pa.Schema:
    """What a facts task returns to the driver, as one narrow table
    (``mapInArrow`` has one output schema, and every row goes through the
    JVM): its duration cells, ``kind`` CELL with ``key`` the duration and
    ``value`` the rebalances; and its hour sums, one row per hour and
    column, ``kind`` HOUR with ``key`` the column's position among
    ``hour_sums_schema()``'s sums and ``value`` the sum (null as there)."""
    return pa.schema([("kind", pa.int64()), ("hour_start_ms", pa.int64()),
                      ("key", pa.int64()), ("value", pa.int64())])


def task_result(cells: pa.Table, sums: pa.Table) -> pa.Table:
    schema = task_result_schema()
    names = hour_sums_schema().names[1:]
    hours = _col(sums, "hour_start_ms")
    part_cells = pa.table([np.full(cells.num_rows, CELL, np.int64), cells["hour_start_ms"],
                           cells["duration_ms"], cells["rebalances"]], schema=schema)
    part_sums = pa.table([
        np.full(len(hours) * len(names), HOUR, np.int64), np.tile(hours, len(names)),
        np.repeat(np.arange(len(names), dtype=np.int64), len(hours)),
        pa.concat_arrays([sums[c].combine_chunks() for c in names])], schema=schema)
    return pa.concat_tables([part_cells, part_sums])


def split_task_results(t: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Tasks' results as (cells, hour sums), each merged over the tasks."""
    kind = _col(t, "kind")
    c = t.filter(pa.array(kind == CELL))
    cells = merge_cells([pa.table([c["hour_start_ms"], c["key"], c["value"]],
                                  schema=cells_schema())])
    schema = hour_sums_schema()
    names = schema.names[1:]
    s = t.filter(pa.array(kind == HOUR))
    if s.num_rows == 0:
        return cells, schema.empty_table()
    # Summed over the tasks per (hour, column); every hour has every column.
    agg = s.group_by(["key", "hour_start_ms"]).aggregate([("value", "sum")]) \
        .sort_by([("key", "ascending"), ("hour_start_ms", "ascending")])
    hours = agg["hour_start_ms"].slice(0, agg.num_rows // len(names))
    if agg.num_rows != len(hours) * len(names):
        raise ValueError("a task returned an hour without all its sums")
    values = agg["value_sum"]
    return cells, pa.table([hours, *(values.slice(k * len(hours), len(hours))
                                     for k in range(len(names)))], schema=schema)
