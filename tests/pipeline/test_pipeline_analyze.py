"""`groupcoord analyze` end to end on the shared hand-made journal (pipeline_journal_builder).

The expected figures are worked out by hand from the rows listed there; Spark's
``percentile`` interpolates linearly between ranks, so p95 of [10, 50, 100, 300]
is 100 + 0.85 * 200 = 270.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_journal_builder import COOP, EAGER, HOUR, T0, write_db

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.sources import export, open_sqlite


@pytest.fixture(scope="module")
def result(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("analyze")
    db = write_db(d / "coord.db", EAGER + COOP,
                  generations=[("eager", 5, True), ("eager", 6, False)])
    # The same coordinator both as its SQLite file and as an export: each
    # journal row must count once.
    export(open_sqlite(db), d / "export")
    res = analyze(spark, [str(d / "export"), str(db)], d / "out",
                  AnalyzeOptions(storm_window_ms=600_000, storm_threshold=3, progress=False))

    def rows(name: str) -> list[dict[str, Any]]:
        return [r.asDict() for r in spark.read.parquet(str(d / "out" / name)).collect()]

    return {"res": res, "out": d / "out", "rows": rows,
            "schema": spark.read.parquet(str(d / "out" / "rebalances")).schema}


def test_every_journal_row_counts_once(result: dict[str, Any]) -> None:
    assert result["res"].rebalances == len(EAGER) + len(COOP)
    assert result["res"].groups == 2
    rebalances = result["rows"]("rebalances")
    assert sorted((r["group_id"], r["generation_id"]) for r in rebalances) == sorted(
        [("eager", g) for g in range(1, 6)] + [("coop", g) for g in range(1, 5)])


def test_integer_columns_stay_64_bit(result: dict[str, Any]) -> None:
    types = {f.name: f.dataType.simpleString() for f in result["schema"].fields}
    for name in ("journal_id", "generation_id", "started_ms", "ended_ms", "unavailable_ms",
                 "moved", "converged_ms"):
        assert types[name] == "bigint", name


def test_per_rebalance_figures(result: dict[str, Any]) -> None:
    by = {(r["group_id"], r["generation_id"]): r for r in result["rows"]("rebalances")}
    assert (by["eager", 2]["moved"], by["eager", 2]["unavailable_ms"]) == (2, 1200)
    assert (by["coop", 2]["moved"], by["coop", 2]["unavailable_ms"],
            by["coop", 2]["follow_ups"]) == (2, 800, 1)
    assert by["coop", 3]["is_follow_up"] is True
    assert by["eager", 1]["started_ms"] == T0


def test_group_hours(result: dict[str, Any]) -> None:
    gh = {(r["group_id"], r["hour_start_ms"]): r for r in result["rows"]("group_hours")}
    assert set(gh) == {("eager", T0), ("eager", T0 + HOUR), ("coop", T0)}
    e = gh["eager", T0]
    assert (e["rebalances"], e["joined"], e["left"], e["revoked"], e["moved"],
            e["unavailable_ms"]) == (4, 3, 1, 12, 4, 1440)
    assert (e["reason_initial"], e["reason_join"], e["reason_leave"],
            e["reason_metadata_change"], e["reason_session_expiry"], e["reason_other"]) == \
        (1, 1, 1, 1, 0, 0)
    # durations 100, 300, 50, 10
    assert e["duration_p50_ms"] == pytest.approx(75)
    assert e["duration_p95_ms"] == pytest.approx(270)
    assert e["duration_p99_ms"] == pytest.approx(294)
    assert e["duration_max_ms"] == 300
    e2 = gh["eager", T0 + HOUR]
    assert (e2["rebalances"], e2["reason_session_expiry"], e2["moved"], e2["unavailable_ms"],
            e2["duration_p99_ms"]) == (1, 1, 2, 2000, 500)
    c = gh["coop", T0]
    # durations 100, 200, 100, 100
    assert (c["rebalances"], c["moved"], c["unavailable_ms"], c["follow_up_rebalances"],
            c["reason_rejoin"]) == (4, 4, 1000, 1, 1)
    assert c["duration_p95_ms"] == pytest.approx(185)
    assert (e["storm_rebalances"], c["storm_rebalances"]) == (2, 2)


def test_task_tables_are_the_spark_sql_definitions(spark: Any, result: dict[str, Any],
                                                    tmp_path: Path) -> None:
    """``group_hours/`` and ``groups/`` come out of the facts task
    (pipeline/group_figures.py); they are what the Spark SQL definitions
    (pipeline/aggregates.py) over ``rebalances/`` write, rows and Parquet
    schema, nullability included; and so is ``window_count`` (a window
    function)."""
    import pyarrow.parquet as pq
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipeline import aggregates as agg
    from pipeline.analyze import _load_generations, plan_inputs
    out = result["out"]
    facts = spark.read.parquet(str(out / "rebalances"))
    window = Window.partitionBy("source", "group_id").orderBy("started_ms") \
        .rangeBetween(-(600_000 - 1), 0)
    generations = _load_generations(spark, plan_inputs([str(out.parent / "export")]))
    for name, want in (
            ("rebalances", facts.withColumn("window_count", F.count(F.lit(1)).over(window))),
            ("group_hours", agg.group_hours(facts, 3)),
            ("groups", agg.groups(facts, generations, 3))):
        want.write.parquet(str(tmp_path / name))
        got_t, want_t = pq.read_table(out / name), pq.read_table(tmp_path / name)
        assert got_t.schema == want_t.schema, name
        key = [(c, "ascending") for c in got_t.column_names if c not in
               ("cooperative", "is_follow_up", "assignment_error")]
        assert got_t.sort_by(key).equals(want_t.sort_by(key)), name


def test_groups_and_storms(result: dict[str, Any]) -> None:
    groups = result["rows"]("groups")
    assert [g["group_id"] for g in groups] == ["eager", "coop"]  # worst first (5 rebalances)
    e, c = groups
    # start times within 600 s: eager 1,2,3,4 then 1 (an hour later); coop 1,2,3,4
    assert (e["peak_window_rebalances"], e["storm_rebalances"]) == (4, 2)
    assert (c["peak_window_rebalances"], c["storm_rebalances"]) == (4, 2)
    assert (e["generations_formed"], e["generations_without_assignment"]) == (2, 1)
    assert c["generations_formed"] is None  # no generation rows for coop
    assert (e["protocol_name"], e["cooperative"], c["protocol_name"], c["cooperative"]) == \
        ("range", False, "cooperative-sticky", True)
    assert (e["moved"], e["unavailable_ms"], c["moved"], c["unavailable_ms"]) == \
        (6, 3440, 4, 1000)


def test_fleet_hours(result: dict[str, Any]) -> None:
    fleet = {r["hour_start_ms"]: r for r in result["rows"]("fleet_hours")}
    assert set(fleet) == {T0, T0 + HOUR}
    h0, h1 = fleet[T0], fleet[T0 + HOUR]
    assert (h0["rebalances"], h0["groups"], h0["storming_groups"], h0["moved"],
            h0["unavailable_ms"]) == (8, 2, 2, 8, 2440)
    assert (h1["rebalances"], h1["groups"], h1["storming_groups"]) == (1, 1, 0)


def test_report_is_one_self_contained_page(result: dict[str, Any]) -> None:
    page = (result["out"] / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 6
    assert "eager" in page and "coop" in page
    assert "Worst groups" in page
    assert "src=\"http" not in page  # nothing fetched from elsewhere


def test_out_holds_the_tables_and_the_report_only(result: dict[str, Any]) -> None:
    """No staging directory and no per-group figures of phase 1 are left behind."""
    assert sorted(p.name for p in result["out"].iterdir()) == \
        ["fleet_hours", "group_hours", "groups", "imbalance", "move_causes", "rebalances",
         "report.html"]


def test_a_failure_after_the_facts_job_leaves_no_figures_behind(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase 1 wrote its tables and the per-group figures; reading the
    generations then fails: the error reaches the caller and the figures,
    which only phase 2 reads, are removed."""
    import pipeline.analyze as analyze_module

    def unreadable(spark: Any, plan: Any) -> Any:
        raise RuntimeError("the generations could not be read")

    db = write_db(tmp_path / "coord.db", EAGER)
    monkeypatch.setattr(analyze_module, "_load_generations", unreadable)
    with pytest.raises(RuntimeError, match="generations could not be read"):
        analyze(spark, [str(db)], tmp_path / "out", AnalyzeOptions(progress=False))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["group_hours", "imbalance", "move_causes", "rebalances"]


def test_empty_journal_gives_an_empty_report(spark: Any, tmp_path: Path) -> None:
    db = write_db(tmp_path / "empty.db", [])
    res = analyze(spark, [str(db)], tmp_path / "out", AnalyzeOptions(progress=False))
    assert (res.rebalances, res.groups) == (0, 0)
    assert "No rebalances" in res.report.read_text()
    assert spark.read.parquet(str(tmp_path / "out" / "rebalances")).count() == 0


def test_big_inputs_get_more_facts_calls(spark: Any, result: dict[str, Any], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of the facts function holds its groups' rows in memory: the job
    uses at least one bucket of groups per INPUT_BYTES_PER_TASK of input, two
    per core otherwise, and the figures do not depend on how many there are
    (the module's run, with the least, against one of the same inputs with
    at least three times as many)."""
    import pipeline.analyze as analyze_mod
    from pipeline.analyze import facts_calls, plan_inputs
    inputs = [str(result["out"].parent / "export"), str(result["out"].parent / "coord.db")]
    plan = plan_inputs(inputs)
    least = spark.sparkContext.defaultParallelism * 2
    assert facts_calls(spark, plan) == least
    opts = AnalyzeOptions(storm_window_ms=600_000, storm_threshold=3, progress=False)
    size = analyze_mod.input_bytes(plan)
    monkeypatch.setattr(analyze_mod, "INPUT_BYTES_PER_TASK", max(1, size // (least * 3)))
    assert facts_calls(spark, plan) >= least * 3
    res = analyze(spark, inputs, tmp_path / "many", opts)
    assert (res.rebalances, res.groups) == (len(EAGER) + len(COOP), 2)
    for table, key in (("rebalances", ("group_id", "journal_id")),
                       ("fleet_hours", ("hour_start_ms",)), ("groups", ("group_id",))):
        def rows(out: Path, table: str = table, key: tuple[str, ...] = key) -> list[Any]:
            got = [r.asDict() for r in spark.read.parquet(str(out / table)).collect()]
            return sorted(got, key=lambda r: tuple(r[k] for k in key))
        assert rows(tmp_path / "many") == rows(result["out"]), table


def test_storm_counter_counts_starts_in_the_window_whatever_the_journal_order(
        spark: Any, tmp_path: Path) -> None:
    """``window_count`` of a rebalance: rebalances of its group that started
    in ``(S - W, S]`` (a Spark window function), also when start times are
    out of journal order or equal; checked against a plain count."""
    import random

    from pipeline_journal_builder import Row
    rnd = random.Random(7)
    rows, t = [], T0
    for g in range(1, 40):
        t += rnd.choice([-3_000, 0, 1_000, 4_000, 9_999, 10_000, 20_000])
        rows.append(Row("g", g, "join", t, t + 5, {"m1": {"a": [0]}}))
    db = write_db(tmp_path / "coord.db", rows)
    analyze(spark, [str(db)], tmp_path / "out",
            AnalyzeOptions(storm_window_ms=10_000, storm_threshold=3, progress=False))
    got = {r["generation_id"]: r["window_count"]
           for r in spark.read.parquet(str(tmp_path / "out" / "rebalances")).collect()}
    starts = [r.started_ms for r in rows]
    want = {r.generation_id: sum(r.started_ms - 10_000 < s <= r.started_ms for s in starts)
            for r in rows}
    assert got == want
