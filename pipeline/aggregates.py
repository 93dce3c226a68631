"""Per group-hour and per group aggregates of the facts, in numpy (docs/pipeline.md).

A group's rows all live in one task (pipeline/analyze.py lays each group out in
one partition), so ``group_hours/`` and the per-group part of ``groups/`` are
computed there, next to the facts, with exact percentiles (linear
interpolation between ranks, as Spark's ``percentile``): an exact percentile
per group-hour in Spark cost more than everything else in the job. Only the
fleet-wide figures (over all groups) are aggregated by Spark.
"""

from __future__ import annotations

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
