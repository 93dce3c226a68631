"""The report's figures computed from the duration cells (one pass over
``rebalances/``) and from ``group_hours/`` and ``groups/`` are those of the
plain queries over every rebalance (the reference below: what analyze ran
before, one pass each)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline import aggregates as agg
from pipeline.aggregates import HOUR_MS, PERCENTILES, REASONS
from pipeline.facts import facts_schema

T0 = 1_700_000_000_000 - 1_700_000_000_000 % (24 * HOUR_MS)


def _rebalances(seed: int, span_ms: int) -> list[dict[str, Any]]:
    """Seeded facts rows: repeated durations, initial joins, unknown and null
    reasons, unreadable rows (null figures), storms, two sources sharing a
    group name."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for k in range(400):
        source, group = rnd.choice(["c1", "c2"]), rnd.choice(["g1", "g2", "g3", "g4"])
        start = T0 + rnd.randrange(span_ms)
        duration = rnd.choice([0, 5, 5, 40, 250, 3000, rnd.randrange(10_000)])
        unreadable = rnd.random() < 0.1
        figure = None if unreadable else rnd.randrange(5)
        rows.append({
            "source": source, "group_id": group, "journal_id": k, "generation_id": k,
            "protocol_type": "consumer", "protocol_name": rnd.choice(["range", "coop"]),
            "cooperative": rnd.random() < 0.5,
            "reason": rnd.choice([*REASONS, "initial", "initial", "odd", None]),
            "started_ms": start, "ended_ms": start + duration, "duration_ms": duration,
            "member_count": 3, "joined": rnd.randrange(2), "left": rnd.randrange(2),
            "owned_before": figure, "owned_after": figure, "revoked": figure,
            "moved": figure, "first_assigned": figure,
            "unavailable_ms": None if unreadable else rnd.randrange(1000),
            "unowned_at_end": figure,
            "is_follow_up": None if unreadable else rnd.random() < 0.2,
            "follow_ups": figure, "converged_ms": start + duration,
            "window_count": rnd.randrange(1, 6), "assignment_error": rnd.random() < 0.05})
    return rows


# ---------------------------------------------------------------- the reference


def _ref_overall(r: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F
    row = r.agg(*agg._durations(), *agg.duration_split(),
                F.count_distinct("source", "group_id").alias("groups"),
                F.count_distinct("source").alias("sources"),
                F.min("started_ms").alias("first_started_ms"),
                F.max("ended_ms").alias("last_ended_ms")).collect()[0]
    return {k: (v if v is not None else 0) for k, v in row.asDict().items()}


def _ref_histogram(r: Any) -> list[tuple[int, int]]:
    from pyspark.sql import functions as F
    b = F.floor(F.log10(F.greatest(F.col("duration_ms"), F.lit(1)).cast("double")) * 5)
    return [(int(x["b"]), int(x["count"]))
            for x in r.groupBy(b.cast("long").alias("b")).count().orderBy("b").collect()]


def _ref_series(r: Any, width: int, threshold: int) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F
    start = (F.col("started_ms") - F.pmod("started_ms", F.lit(width))).alias("bucket_ms")
    key = F.concat_ws("\u0000", "source", "group_id")
    storm = F.when(F.col("window_count") >= threshold, key)
    return [x.asDict() for x in r.groupBy(start).agg(
        *agg._sums(threshold, storms=False),
        F.count_distinct(key).alias("groups"),
        F.count_distinct(storm).alias("storming_groups"),
        *agg.duration_split()).orderBy("bucket_ms").collect()]


def _ref_fleet(r: Any, hours: Any) -> dict[int, dict[str, Any]]:
    from pyspark.sql import functions as F
    sums = hours.groupBy("hour_start_ms").agg(
        *(F.sum(c).cast("long").alias(c) for c in agg.FLEET_SUMS),
        F.count(F.lit(1)).alias("groups"),
        F.sum(F.when(F.col("storm_rebalances") > 0, 1).otherwise(0)).cast("long")
        .alias("storming_groups"))
    pct = F.percentile(F.col("duration_ms"), list(PERCENTILES))
    per_hour = r.groupBy(agg.hour_start()).agg(
        *(pct[i].alias(f"duration_p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)),
        F.max("duration_ms").alias("duration_max_ms"),
        F.sum(F.col("assignment_error").cast("long")).alias("assignment_errors"),
        F.sum(F.when(F.col("revoked").isNull(), 1).otherwise(0)).cast("long")
        .alias("unreadable"),
        F.sum(F.col("cooperative").cast("long")).alias("cooperative_rebalances"))
    return {x["hour_start_ms"]: x.asDict()
            for x in sums.join(per_hour, "hour_start_ms").collect()}


# ---------------------------------------------------------------- the test


@pytest.mark.parametrize(("seed", "span_ms"), [(1, 20 * 60_000), (2, 30 * HOUR_MS),
                                               (3, 40 * 24 * HOUR_MS)])
def test_figures_from_the_cells_are_those_of_every_rebalance(
        spark: Any, seed: int, span_ms: int) -> None:
    import pyarrow as pa
    threshold = 3
    r = spark.createDataFrame(pa.Table.from_pylist(_rebalances(seed, span_ms),
                                                   schema=facts_schema())).cache()
    hours = agg.group_hours(r, threshold).cache()
    generations = r.select("source", "group_id", "cooperative").limit(0) \
        .withColumnRenamed("cooperative", "has_assignments")
    groups = agg.groups(r, generations, threshold).cache()
    first, last = agg.span(groups)
    ref = _ref_overall(r)
    assert (first, last) == (ref["first_started_ms"], ref["last_ended_ms"])
    width = agg.bucket_width(first, last)
    for w in sorted({width, 60_000, HOUR_MS, 24 * HOUR_MS}):
        cells = agg.duration_cells(r, w).cache()
        assert agg.overall(cells, groups) == ref
        assert agg.histogram(cells) == _ref_histogram(r)
        assert agg.series(r, hours, cells, w, threshold) == _ref_series(r, w, threshold)
        fleet = {x["hour_start_ms"]: x.asDict() for x in agg.fleet_hours(hours, cells).collect()}
        assert fleet == _ref_fleet(r, hours)
        cells.unpersist()
