"""``group_hours/`` and ``groups/`` rows of whole groups, in numpy.

The facts job's tasks (pipeline/task_tables.py) hold the facts of whole
groups, so their per-group and per-group-and-hour figures come from the
same rows, with no further Spark pass over ``rebalances/``: three Spark
aggregations with exact ``percentile`` (a sort-based aggregate once a task
sees more than a few keys) cost about as much as the ownership accounting
itself (docs/bench-pipeline.md). The
definitions are those of pipeline/aggregates.py (``group_hours``,
``groups`` without the generations, which Spark joins on); the tests check
these kernels against those Spark SQL queries on the same rows
(tests/pipeline/test_pipeline_group_figures.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.aggregates import HOUR_MS, PERCENTILES, REASONS, SUMMED

#: Columns of ``group_hours/``, as Spark's aggregation names them, and types.
#: Counts and ``coalesce``d sums are never null (``nullable=False``, as Spark
#: writes them).
GROUP_HOURS_SCHEMA = pa.schema(
    [("source", pa.string()), ("group_id", pa.string()), ("hour_start_ms", pa.int64()),
     pa.field("rebalances", pa.int64(), nullable=False),
     *(pa.field(c, pa.int64(), nullable=False) for c in SUMMED),
     ("follow_up_rebalances", pa.int64()),
     *((f"reason_{r}", pa.int64()) for r in (*REASONS, "other")),
     ("storm_rebalances", pa.int64()),
     *((f"duration_p{round(p * 100)}_ms", pa.float64()) for p in PERCENTILES),
     ("duration_max_ms", pa.int64())])

#: Columns of ``groups/`` before the generations are joined on: the
#: durations again without the initial joins (``rebalance_*``, null for a
#: group with nothing else), as the report's headline figures.
GROUPS_SCHEMA = pa.schema(
    [f for f in GROUP_HOURS_SCHEMA if f.name != "hour_start_ms"]
    + [*((f"rebalance_p{round(p * 100)}_ms", pa.float64()) for p in PERCENTILES),
       ("rebalance_max_ms", pa.int64())]
    + [pa.field(n, pa.int64()) for n in ("first_started_ms", "last_ended_ms",
                                         "peak_window_rebalances")]
    + [pa.field("protocol_name", pa.string()), pa.field("cooperative", pa.bool_()),
       pa.field("max_members", pa.int64()), pa.field("max_follow_ups", pa.int64())])


def _np(col: Any, fill: int = 0) -> np.ndarray:
    arr = pc.fill_null(col, fill) if col.null_count else col
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


def _valid(col: Any) -> np.ndarray:
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)


def _spark_major() -> int:
    try:
        import pyspark
    except ImportError:  # the kernels alone (tools): Spark 4's arithmetic
        return 4
    return int(pyspark.__version__.split(".")[0])


#: Spark 4 interpolates as ``v_lo + (pos - lo) * (v_hi - v_lo)``, Spark 3.5
#: as ``(hi - pos) * v_lo + (pos - lo) * v_hi``: the same number but for the
#: last bit now and then. The executors' Spark is the driver's.
SPARK_MAJOR = _spark_major()


def exact_percentiles(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                      p: float) -> np.ndarray:
    """Spark's exact ``percentile(col, p)`` of each segment ``values[starts[k]:
    starts[k] + counts[k]]`` (each sorted ascending, ``counts`` > 0): position
    ``(n - 1) * p``, the value there when it is whole or both neighbours are
    equal, else linearly interpolated with Spark's arithmetic
    (:data:`SPARK_MAJOR`), as a double."""
    pos = (counts - 1).astype(np.float64) * p
    lo = np.floor(pos)
    hi = np.ceil(pos)
    v_lo = values[starts + lo.astype(np.int64)].astype(np.float64)
    v_hi = values[starts + hi.astype(np.int64)].astype(np.float64)
    if SPARK_MAJOR >= 4:
        mixed = v_lo + (pos - lo) * (v_hi - v_lo)
    else:
        mixed = (hi - pos) * v_lo + (pos - lo) * v_hi
    out: np.ndarray = np.where((lo == hi) | (v_lo == v_hi), v_lo, mixed)
    return out


def _figures(facts: pa.Table, key: np.ndarray, threshold: int) -> tuple[
        np.ndarray, np.ndarray, dict[str, pa.Array]]:
    """The figures of ``_sums`` and ``_durations`` (pipeline/aggregates.py)
    per distinct ``key`` (rows of one key need not be contiguous). Returns
    the row order (by key, then duration), each key's first position in it,
    and the columns."""
    n = facts.num_rows
    duration = _np(facts["duration_ms"])
    order = np.lexsort((duration, key))
    k = key[order]
    new = np.ones(n, dtype=bool)
    new[1:] = k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, n))

    def total(values: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.add.reduceat(values[order], starts)
        return out

    cols: dict[str, pa.Array] = {"rebalances": pa.array(counts.astype(np.int64))}
    for c in SUMMED:
        cols[c] = pa.array(total(_np(facts[c])))
    follow = facts["is_follow_up"]
    known = total(_valid(follow).astype(np.int64))
    ups = total(_np(follow.cast(pa.int64())))
    cols["follow_up_rebalances"] = pa.array(ups, mask=known == 0)
    reason = facts["reason"]
    named = np.zeros(n, dtype=np.int64)
    for r in REASONS:
        is_r = np.asarray(pc.fill_null(pc.equal(reason, r), False)
                          .to_numpy(zero_copy_only=False), dtype=np.int64)
        named += is_r
        cols[f"reason_{r}"] = pa.array(total(is_r))
    cols["reason_other"] = pa.array(counts - total(named))
    storm = (_np(facts["window_count"]) >= threshold).astype(np.int64)
    cols["storm_rebalances"] = pa.array(total(storm))
    d = duration[order]
    for p in PERCENTILES:
        cols[f"duration_p{round(p * 100)}_ms"] = pa.array(
            exact_percentiles(d, starts, counts, p))
    cols["duration_max_ms"] = pa.array(d[starts + counts - 1])
    return order, starts, cols


def _rebalance_durations(facts: pa.Table, order: np.ndarray, starts: np.ndarray
                         ) -> dict[str, pa.Array]:
    """Duration percentiles and the longest per key without the initial joins
    (``rebalance_*``; null for a key with only initial joins), from the row
    order of ``_figures`` (by key, then duration) and each key's first
    position in it: leaving the initial joins out keeps each key's rows
    contiguous and sorted, so no second sort is needed."""
    initial = np.asarray(pc.fill_null(pc.equal(facts["reason"], "initial"), False)
                         .to_numpy(zero_copy_only=False), dtype=bool)
    proper = ~initial[order]
    counts = np.add.reduceat(proper.astype(np.int64), starts)
    none = counts == 0
    names = (*(f"rebalance_p{round(p * 100)}_ms" for p in PERCENTILES), "rebalance_max_ms")
    if none.all():
        return {n: pa.nulls(len(starts), pa.int64() if n.endswith("max_ms") else pa.float64())
                for n in names}
    d = _np(facts["duration_ms"])[order][proper]
    # A key without any gets a placeholder segment of one (masked below).
    begins = np.minimum(np.cumsum(counts) - counts, len(d) - 1)
    some = np.maximum(counts, 1)
    cols: dict[str, pa.Array] = {
        n: pa.array(exact_percentiles(d, begins, some, p), mask=none)
        for n, p in zip(names, PERCENTILES, strict=False)}
    cols["rebalance_max_ms"] = pa.array(d[begins + some - 1], mask=none)
    return cols


def _group_numbers(facts: pa.Table) -> np.ndarray:
    """A number per (source, group_id) of ``facts``."""
    both = pa.table({"s": facts["source"], "g": facts["group_id"]})
    keys = [np.asarray(pc.dictionary_encode(both[c]).combine_chunks().indices
                       .to_numpy(zero_copy_only=False), np.int64) for c in ("s", "g")]
    width = int(keys[1].max()) + 1 if len(keys[1]) else 1
    out: np.ndarray = keys[0] * width + keys[1]
    return out


def group_hour_rows(facts: pa.Table, threshold: int) -> pa.Table:
    """``group_hours/`` rows (:data:`GROUP_HOURS_SCHEMA`) of ``facts``
    (``rebalances/`` rows of whole groups), in no particular order."""
    if facts.num_rows == 0:
        return GROUP_HOURS_SCHEMA.empty_table()
    started = _np(facts["started_ms"])
    hour = started - np.mod(started, HOUR_MS)
    group = _group_numbers(facts)
    # (group, hour) as one sortable number: hours ranked within the facts.
    hours, hour_rank = np.unique(hour, return_inverse=True)
    key = group * len(hours) + hour_rank.reshape(-1)
    order, starts, cols = _figures(facts, key, threshold)
    first = pa.array(order[starts])
    cols = {"source": facts["source"].take(first), "group_id": facts["group_id"].take(first),
            "hour_start_ms": pa.array(hour[order[starts]]), **cols}
    return pa.table([cols[f.name] for f in GROUP_HOURS_SCHEMA], schema=GROUP_HOURS_SCHEMA)


def group_rows(facts: pa.Table, threshold: int) -> pa.Table:
    """``groups/`` rows (:data:`GROUPS_SCHEMA`: without the generations) of
    ``facts`` (``rebalances/`` rows of whole groups), in no particular order."""
    if facts.num_rows == 0:
        return GROUPS_SCHEMA.empty_table()
    group = _group_numbers(facts)
    order, starts, cols = _figures(facts, group, threshold)
    n = facts.num_rows

    def per_group(values: np.ndarray, ufunc: Any) -> np.ndarray:
        out: np.ndarray = ufunc.reduceat(values[order], starts)
        return out

    first = pa.array(order[starts])
    cols["source"] = facts["source"].take(first)
    cols["group_id"] = facts["group_id"].take(first)
    cols.update(_rebalance_durations(facts, order, starts))
    cols["first_started_ms"] = pa.array(per_group(_np(facts["started_ms"]), np.minimum))
    cols["last_ended_ms"] = pa.array(per_group(_np(facts["ended_ms"]), np.maximum))
    cols["peak_window_rebalances"] = pa.array(per_group(_np(facts["window_count"]),
                                                        np.maximum))
    # max_by(protocol_name, journal_id): the name on the group's last journal row.
    by_id = np.lexsort((_np(facts["journal_id"]), group))
    last = by_id[np.append(np.flatnonzero(group[by_id][1:] != group[by_id][:-1]), n - 1)]
    # Groups in by_id come in the same (ascending number) order as in ``order``.
    cols["protocol_name"] = facts["protocol_name"].take(pa.array(last))
    coop = np.asarray(pc.fill_null(facts["cooperative"], False)
                      .to_numpy(zero_copy_only=False), dtype=np.int64)
    coop_known = per_group(_valid(facts["cooperative"]).astype(np.int64), np.add)
    cols["cooperative"] = pa.array(per_group(coop, np.maximum) > 0, mask=coop_known == 0)
    members = facts["member_count"]
    cols["max_members"] = pa.array(
        per_group(_np(members, np.iinfo(np.int64).min), np.maximum),
        mask=per_group(_valid(members).astype(np.int64), np.add) == 0)
    ups = facts["follow_ups"]
    cols["max_follow_ups"] = pa.array(
        per_group(_np(ups, np.iinfo(np.int64).min), np.maximum),
        mask=per_group(_valid(ups).astype(np.int64), np.add) == 0)
    return pa.table([cols[f.name] for f in GROUPS_SCHEMA], schema=GROUPS_SCHEMA)
