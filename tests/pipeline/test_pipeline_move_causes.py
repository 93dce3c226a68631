"""Moves by cause (``move_causes/``, docs/pipeline.md): from the ``why``
entries of the leader's assignments, ``unknown`` where a generation gives none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline_journal_builder import EAGER, HOUR, T0, Row, journal_rows, write_db

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.facts import input_table
from pipeline.ownership import cooperative_names
from pipeline.task_tables import partition_tables
from protocol.codec import encode

BAL = "balanced"

# "bal" (balanced, cooperative): the leader says why.
#   1 initial T0+0 ..          m1:b0..b3                 why m1: b0..b3 join (gains)
#   2 join    T0+1000 ..       m1:b0,b1 m2:-             why m1: b2,b3 join (losses)
#   3 rejoin  T0+1300 ..       m1:b0,b1 m2:b2,b3         why m2: b2,b3 join (gains)
#   4 rejoin  T0+HOUR ..       m1:b0 m2:b2,b3            why m1: b1 load (loss)
#   5 rejoin  T0+HOUR+200 ..   m1:b0 m2:b1,b2,b3         why m2: b1 load (gain)
#   6 metadata_change T0+HOUR+400  same owners, no why   (nothing moved)
WHY = [
    Row("bal", 1, "initial", T0, T0 + 100, {"m1": {"b": [0, 1, 2, 3]}}, protocol_name=BAL,
        why={"m1": [("b", i, "join") for i in range(4)]}),
    Row("bal", 2, "join", T0 + 1000, T0 + 1200, {"m1": {"b": [0, 1]}, "m2": {}},
        protocol_name=BAL, why={"m1": [("b", 2, "join"), ("b", 3, "join")]}),
    Row("bal", 3, "rejoin", T0 + 1300, T0 + 1400, {"m1": {"b": [0, 1]}, "m2": {"b": [2, 3]}},
        protocol_name=BAL, why={"m2": [("b", 2, "join"), ("b", 3, "join")]}),
    Row("bal", 4, "rejoin", T0 + HOUR, T0 + HOUR + 100, {"m1": {"b": [0]}, "m2": {"b": [2, 3]}},
        protocol_name=BAL, why={"m1": [("b", 1, "load")]}),
    Row("bal", 5, "rejoin", T0 + HOUR + 200, T0 + HOUR + 300,
        {"m1": {"b": [0]}, "m2": {"b": [1, 2, 3]}}, protocol_name=BAL,
        why={"m2": [("b", 1, "load")]}),
    Row("bal", 6, "metadata_change", T0 + HOUR + 400, T0 + HOUR + 450,
        {"m1": {"b": [0]}, "m2": {"b": [1, 2, 3]}}, protocol_name=BAL),
]

# "eager" (range, no why): rebalances.moved is 2 on rows 2 and 3 (hour T0)
# and on row 5 (hour T0+HOUR): all unknown.
EXPECTED = {
    ("bal", T0, "join"): 6,
    ("bal", T0 + HOUR, "load"): 1,
    ("eager", T0, "unknown"): 4,
    ("eager", T0 + HOUR, "unknown"): 2,
}


def _cells(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], int]:
    return {(r["group_id"], r["hour_start_ms"], r["cause"]): r["moves"] for r in rows}


def test_moves_are_counted_by_the_cause_of_the_gain() -> None:
    """The task's own function, without Spark: each move once, on its gain;
    a generation without why counts its moved resources as unknown."""
    assert cooperative_names()(BAL)   # the hand-worked figures assume it
    rows = journal_rows(WHY) + journal_rows(EAGER)
    tables = list(partition_tables(input_table(rows).to_batches(), (), 600_000, 3))
    got = [r for t in tables for r in t["move_causes"].to_pylist()]
    assert _cells(got) == EXPECTED
    assert {r["source"] for r in got} == {"db"}


def test_the_same_assignment_again_counts_no_cause_twice() -> None:
    """A generation whose assignments are byte for byte the previous one's
    (why included: a leader that synced without assigning hands them out
    again) moved nothing."""
    again = Row("bal", 7, "rejoin", T0 + 2 * HOUR, T0 + 2 * HOUR + 10, WHY[4].owned,
                protocol_name=BAL, why=WHY[4].why)
    rows = journal_rows([*WHY[:5], again])
    tables = list(partition_tables(input_table(rows).to_batches(), (), 600_000, 3))
    got = _cells([r for t in tables for r in t["move_causes"].to_pylist()])
    assert got == {("bal", T0, "join"): 6, ("bal", T0 + HOUR, "load"): 1}


def test_an_unreadable_why_gives_no_cause() -> None:
    """A generation whose why cannot be read (``why`` not a list) adds no
    cause; the others' counts stand."""
    bad = Row("bal", 7, "rejoin", T0 + 2 * HOUR, T0 + 2 * HOUR + 10, {},
              raw_assignments=encode({"m1": encode({"assigned": {"b": [0]}, "why": "x"})}))
    rows = journal_rows([*WHY, bad])
    tables = list(partition_tables(input_table(rows).to_batches(), (), 600_000, 3))
    got = _cells([r for t in tables for r in t["move_causes"].to_pylist()])
    assert got == {k: v for k, v in EXPECTED.items() if k[0] == "bal"}


def test_analyze_writes_moves_by_cause_and_reports_them(spark: Any, tmp_path: Path) -> None:
    db = write_db(tmp_path / "coord.db", WHY + EAGER)
    analyze(spark, [str(db)], tmp_path / "out", AnalyzeOptions(progress=False))
    table = spark.read.parquet(str(tmp_path / "out" / "move_causes"))
    assert [f.name for f in table.schema] == ["source", "group_id", "hour_start_ms", "cause",
                                              "moves"]
    assert _cells([r.asDict() for r in table.collect()]) == EXPECTED
    page = (tmp_path / "out" / "report.html").read_text()
    section = page.split("Moves by cause (per hour)")[1].split("<h2>")[0]
    assert [c in section for c in ("join", "load", "unknown")] == [True] * 3
    assert ">13<" in section   # all moves: 6 + 1 + 4 + 2
