"""The report's figures (pipeline/analyze_report.py ``report_figures``) against
plain Spark SQL over ``rebalances/``: the same numbers, to the bit.

``report_figures`` takes them from the tables phase 2 wrote (fleet_hours,
group_hours/, groups/), counts a bucket's groups after a per-(bucket,
group) aggregation and computes the exact percentiles over (duration,
count) pairs. The reference here is the direct way: ``count_distinct`` of
the groups and Spark's ``percentile`` over the rows, per bucket of every
width the report uses (below an hour, an hour, several hours, a day).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pipeline_journal_builder import HOUR, T0, Row, write_db

from coordinator.core.storm import StormRule
from pipeline import aggregates as agg
from pipeline.analyze import AnalyzeOptions, _load_journal, analyze, plan_inputs
from pipeline.analyze_report import report_figures, series

MINUTE = 60_000
THRESHOLD = 3
REASONS = ("join", "leave", "session_expiry", "metadata_change", "rejoin", "mystery")


def random_journal(seed: int) -> list[Row]:
    """Seven groups over three days: an initial join each (a second one for
    g0, re-formed), then rebalances at random gaps, some in bursts (storms at
    a threshold of 3 in 10 minutes), durations from a small set (repeats) and
    a wide range, a reason the report does not know."""
    rng = random.Random(seed)
    rows: list[Row] = []
    for g in range(7):
        gid = f"g{g}"
        t = T0 + rng.randrange(0, 6 * HOUR)
        gen = 1
        rows.append(Row(gid, gen, "initial", t, t + rng.choice((3000, 3000, 2500)),
                        {"m1": {"t": [0, 1]}}, joined=("m1",)))
        while t < T0 + 72 * HOUR:
            t += rng.choice((rng.randrange(MINUTE, 4 * HOUR), rng.randrange(1000, 90_000)))
            gen += 1
            reason = "initial" if (g == 0 and gen == 12) else rng.choice(REASONS)
            duration = rng.choice((50, 120, 120, 300, rng.randrange(1, 40_000)))
            owned = {"m1": {"t": [0]}, "m2": {"t": [1]}} if gen % 2 else {"m1": {"t": [0, 1]}}
            rows.append(Row(gid, gen, reason, t, t + duration, owned,
                            joined=("m2",) if gen % 2 else (),
                            left=() if gen % 2 else ("m2",)))
    return rows


@pytest.fixture(scope="module")
def tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("figures")
    db = write_db(d / "coord.db", random_journal(15))
    analyze(spark, [str(db)], d / "out", AnalyzeOptions(
        storm_window_ms=600_000, storm_threshold=THRESHOLD, progress=False))
    rebalances = spark.read.parquet(str(d / "out" / "rebalances"))
    hours = spark.read.parquet(str(d / "out" / "group_hours"))
    fleet = [r.asDict() for r in agg.fleet_hours(rebalances, hours).collect()]
    return {"spark": spark, "db": db, "rebalances": rebalances, "hours": hours,
            "groups": spark.read.parquet(str(d / "out" / "groups")), "fleet": fleet}


def reference_series(rebalances: Any, width: int) -> list[dict[str, Any]]:
    """Per bucket, straight from the rows (the way the report computed it
    before): count_distinct of the groups, percentiles over the rows."""
    from pyspark.sql import functions as F
    start = (F.col("started_ms") - F.pmod("started_ms", F.lit(width))).alias("bucket_ms")
    key = F.concat_ws("\u0000", "source", "group_id")
    initial = F.coalesce(F.col("reason") == "initial", F.lit(False))
    d = F.when(~initial, F.col("duration_ms"))
    pct = F.percentile(d, list(agg.PERCENTILES))
    rows = rebalances.groupBy(start).agg(
        *agg._sums(THRESHOLD, storms=False),
        F.count_distinct(key).alias("groups"),
        F.count_distinct(F.when(F.col("window_count") >= THRESHOLD, key))
        .alias("storming_groups"),
        *(pct[i].alias(f"rebalance_p{round(p * 100)}_ms")
          for i, p in enumerate(agg.PERCENTILES)),
        F.max(d).alias("rebalance_max_ms"), F.count(d).alias("rebalance_count"),
    ).orderBy("bucket_ms").collect()
    return [r.asDict() for r in rows]


def reference_totals(rebalances: Any) -> dict[str, Any]:
    """The headline durations, groups, sources and span straight from the
    rows: percentiles over every row, count_distinct (no figure is 0)."""
    from pyspark.sql import functions as F
    initial = F.coalesce(F.col("reason") == "initial", F.lit(False))
    figures = []
    for prefix, keep in (("duration", F.lit(True)), ("rebalance", ~initial),
                         ("initial", initial)):
        d = F.when(keep, F.col("duration_ms"))
        pct = F.percentile(d, list(agg.PERCENTILES))
        figures += [*(pct[i].alias(f"{prefix}_p{round(p * 100)}_ms")
                      for i, p in enumerate(agg.PERCENTILES)), F.max(d).alias(f"{prefix}_max_ms")]
        if prefix != "duration":
            figures.append(F.count(d).alias(f"{prefix}_count"))
    row = rebalances.agg(
        *figures, F.count_distinct("source", "group_id").alias("groups"),
        F.count_distinct("source").alias("sources"),
        F.min("started_ms").alias("first_started_ms"),
        F.max("ended_ms").alias("last_ended_ms")).collect()[0]
    return {k: (v if v is not None else 0) for k, v in row.asDict().items()}


@pytest.mark.parametrize("width", [MINUTE, 15 * MINUTE, HOUR, 6 * HOUR, 24 * HOUR])
def test_series_equals_plain_spark_sql_over_the_rows(tables: dict[str, Any],
                                                     width: int) -> None:
    got = series(tables["rebalances"], tables["hours"], tables["fleet"], width, THRESHOLD,
                 span_ms=80 * HOUR, parallelism=2)
    want = reference_series(tables["rebalances"], width)
    assert len(want) > 3
    assert any(r["storming_groups"] for r in want) and any(r["groups"] > 1 for r in want)
    # buckets with only an initial join (no rebalance duration) below an hour
    assert any(r["rebalance_count"] == 0 for r in want) or width >= HOUR
    assert got == want


def test_totals_equal_plain_spark_sql_over_the_rows(tables: dict[str, Any]) -> None:
    rebalances = tables["rebalances"]
    journal = _load_journal(tables["spark"], plan_inputs([str(tables["db"])]))
    got = report_figures(tables["fleet"], rebalances, tables["hours"], tables["groups"],
                         journal, top=5, storm=StormRule(600_000, THRESHOLD))
    want = reference_totals(rebalances)
    for key, value in want.items():
        assert got.totals[key] == value, key
        assert type(got.totals[key]) is type(value), key
    assert got.totals["initial_count"] == 8 and got.totals["rebalance_count"] > 100
    width = agg.bucket_width(want["first_started_ms"], want["last_ended_ms"])
    assert got.bucket_ms == width == 15 * MINUTE
    assert got.series == reference_series(rebalances, width)
