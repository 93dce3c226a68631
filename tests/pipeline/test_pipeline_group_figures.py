"""The numpy kernels of the facts task against plain Spark SQL on the same
rows: the storm counter (``facts.window_counts`` against a window function)
and the per-group and per-group-and-hour figures (pipeline/group_figures.py
against ``aggregates.group_hours`` and ``aggregates.groups``), on seeded
random facts with ties, nulls, unknown reasons and groups of two sources
that share a name."""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline import aggregates as agg
from pipeline.aggregates import HOUR_MS, REASONS
from pipeline.analyze import ddl
from pipeline.facts import facts_schema, window_counts
from pipeline.group_figures import (
    GROUP_HOURS_SCHEMA,
    GROUPS_SCHEMA,
    exact_percentiles,
    group_hour_rows,
    group_rows,
)
from pipeline.sources import GENERATIONS_SCHEMA

T0 = 1_700_000_000_000


def _figure(rnd: random.Random, unreadable: bool, hi: int) -> int | None:
    return None if unreadable else rnd.randint(0, hi)


def random_facts(rnd: random.Random, groups: int = 12, prefix: str = "") -> pa.Table:
    """``rebalances/`` rows of whole groups, in journal order per group; the
    sources' names start with ``prefix``."""
    rows: list[dict[str, Any]] = []
    for g in range(groups):
        source, group_id = prefix + rnd.choice(["a.db", "b.db"]), f"g{g % 7}"
        if any(r["source"] == source and r["group_id"] == group_id for r in rows):
            continue
        t = T0 + rnd.randint(0, 3 * HOUR_MS)
        for j in range(rnd.randint(1, 40)):
            t += rnd.choice([0, 0, 1_000, 60_000, 599_999, 600_000, 1_800_000, -5_000])
            unreadable = rnd.random() < 0.1
            fig = functools.partial(_figure, rnd, unreadable)
            duration = rnd.choice([0, 5, 5, 100, rnd.randint(0, 10_000), 3_000])
            rows.append({
                "source": source, "group_id": group_id, "journal_id": j + 1,
                "generation_id": j, "protocol_type": "resources",
                "protocol_name": rnd.choice(["range", "cooperative-sticky", None]),
                "cooperative": rnd.random() < 0.3,
                "reason": rnd.choice([*REASONS, "something-new", None]),
                "started_ms": t, "ended_ms": t + duration, "duration_ms": duration,
                "member_count": rnd.randint(0, 9), "joined": rnd.randint(0, 3),
                "left": rnd.randint(0, 3), "owned_before": fig(20),
                "owned_after": fig(20), "revoked": fig(5), "moved": fig(5),
                "first_assigned": fig(5), "unavailable_ms": fig(50_000),
                "unowned_at_end": fig(2),
                "is_follow_up": None if unreadable else rnd.random() < 0.3,
                "follow_ups": fig(3), "converged_ms": None if unreadable else t,
                "window_count": rnd.randint(1, 15), "assignment_error": unreadable})
    return pa.Table.from_pylist(rows, schema=facts_schema())


def _rows(table: Any, key: list[str]) -> list[dict[str, Any]]:
    rows = [r if isinstance(r, dict) else r.asDict() for r in table]
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in g:  # doubles bit for bit: the same arithmetic as Spark's
            assert g[k] == w[k] or (isinstance(g[k], float) and math.isnan(g[k])
                                    and math.isnan(w[k])), (k, g, w)


SEEDS = range(6)


def test_group_hours_and_groups_match_spark_sql(spark: Any) -> None:
    """Seeds 0-5, each seed's sources named apart (``s<seed>/``), in one
    table: one Spark job of each definition for all of them. The kernels
    match it on the whole table and on each seed's table alone."""
    per_seed = [random_facts(random.Random(seed), prefix=f"s{seed}/") for seed in SEEDS]
    facts = pa.concat_tables(per_seed)
    df = spark.createDataFrame(facts)
    threshold = 4
    hour_key = ["source", "group_id", "hour_start_ms"]
    want_hours = _rows(agg.group_hours(df, threshold).collect(), hour_key)
    assert [f.name for f in GROUP_HOURS_SCHEMA] == list(want_hours[0])
    _same(_rows(group_hour_rows(facts, threshold).to_pylist(), hour_key), want_hours)
    generations = spark.createDataFrame([], ddl(GENERATIONS_SCHEMA))
    want_groups = [{k: v for k, v in r.items() if not k.startswith("generations_")}
                   for r in _rows(agg.groups(df, generations, threshold).collect(),
                                  ["source", "group_id"])]
    assert [f.name for f in GROUPS_SCHEMA] == list(want_groups[0])
    _same(_rows(group_rows(facts, threshold).to_pylist(), ["source", "group_id"]), want_groups)
    for seed, table in zip(SEEDS, per_seed, strict=True):
        def of_seed(rows: list[dict[str, Any]], seed: int = seed) -> list[dict[str, Any]]:
            return [r for r in rows if r["source"].startswith(f"s{seed}/")]
        assert of_seed(want_hours) and of_seed(want_groups), seed
        _same(_rows(group_hour_rows(table, threshold).to_pylist(), hour_key),
              of_seed(want_hours))
        _same(_rows(group_rows(table, threshold).to_pylist(), ["source", "group_id"]),
              of_seed(want_groups))


def test_the_task_schemas_are_what_spark_writes(spark: Any) -> None:
    """The kernels' column types are those of the Spark SQL definitions."""
    facts = random_facts(random.Random(1))
    df = spark.createDataFrame(facts)
    generations = spark.createDataFrame([], ddl(GENERATIONS_SCHEMA))
    assert spark.createDataFrame(group_hour_rows(facts, 3)).schema.simpleString() \
        == agg.group_hours(df, 3).schema.simpleString()
    groups = agg.groups(df, generations, 3).drop("generations_formed",
                                                  "generations_without_assignment")
    assert spark.createDataFrame(group_rows(facts, 3)).schema.simpleString() \
        == groups.schema.simpleString()


def test_exact_percentiles_match_spark_on_ties_and_odd_counts(spark: Any) -> None:
    rnd = random.Random(3)
    segments = [sorted(rnd.choice([1, 2, 2, 7, 10**9, rnd.randint(0, 10**12)])
                       for _ in range(rnd.randint(1, 30))) for _ in range(60)]
    values = np.array([v for s in segments for v in s], np.int64)
    counts = np.array([len(s) for s in segments], np.int64)
    starts = np.cumsum(counts) - counts
    rows = [(k, v) for k, s in enumerate(segments) for v in s]
    df = spark.createDataFrame(rows, "k long, v long")
    from pyspark.sql import functions as F
    ps = (0.5, 0.95, 0.99, 0.0, 1.0, 0.3)  # one job: a column per p
    spark_rows = df.groupBy("k").agg(*(F.percentile("v", p).alias(f"p{i}")
                                       for i, p in enumerate(ps))).orderBy("k").collect()
    assert len(spark_rows) == len(segments)
    for i, p in enumerate(ps):
        want = [r[f"p{i}"] for r in spark_rows]
        assert exact_percentiles(values, starts, counts, p).tolist() == want, p


def test_window_counts_match_a_spark_window_function(spark: Any) -> None:
    """Windows of 1 ms, 10 s and 10 min, each on rows of its own (seeded by
    the window), all in one Spark job: a case column apart, a window column
    per width."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    cases: dict[int, list[tuple[int, int, int]]] = {}
    for window_ms in (1, 10_000, 600_000):
        rnd = random.Random(window_ms)
        rows, t = [], T0
        for i in range(400):
            t += rnd.choice([-3_000, 0, 0, 1, 1_000, 4_000, 9_999, 10_000, 20_000, 599_999])
            rows.append((i, rnd.randint(0, 5), t))
        cases[window_ms] = rows
    df = spark.createDataFrame([(w, *r) for w, rows in cases.items() for r in rows],
                               "w long, i long, g long, s long")
    for w in cases:
        window = Window.partitionBy("w", "g").orderBy("s").rangeBetween(-(w - 1), 0)
        df = df.withColumn(f"c{w}", F.count(F.lit(1)).over(window))
    spark_rows = df.orderBy("w", "i").collect()
    for window_ms, rows in cases.items():
        want = [r[f"c{window_ms}"] for r in spark_rows if r["w"] == window_ms]
        assert len(want) == len(rows), window_ms
        got = window_counts(np.array([g for _, g, _ in rows]),
                            np.array([s for _, _, s in rows]), window_ms)
        assert got.tolist() == want, window_ms
        plain = [sum(1 for _, h, u in rows if h == g and s - window_ms < u <= s)
                 for _, g, s in rows]
        assert want == plain, window_ms


def test_groups_with_only_initial_joins_have_no_rebalance_durations() -> None:
    """``rebalance_*`` leave the initial joins out: null for a group that
    only formed, whether or not another group in the same facts rebalanced."""
    facts = random_facts(random.Random(5))
    initial_only = facts.set_column(facts.schema.get_field_index("reason"), "reason",
                                    pa.array(["initial"] * facts.num_rows))
    for row in group_rows(initial_only, 3).to_pylist():
        assert [row[f"rebalance_{k}_ms"] for k in ("p50", "p95", "p99", "max")] == [None] * 4
        assert row["duration_max_ms"] is not None
    rows = group_rows(facts, 3).to_pylist()
    assert any(r["rebalance_max_ms"] is not None for r in rows)
    for r in rows:
        if r["rebalance_max_ms"] is not None:
            assert r["rebalance_max_ms"] <= r["duration_max_ms"]
