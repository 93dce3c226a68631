"""Load imbalance over time (``imbalance/``, docs/pipeline.md): from the
``load`` the leader's assignor gives each member (``[load, ideal]``), the
busiest member's load over its fair share, per generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_journal_builder import EAGER, HOUR, T0, Row, journal_rows, write_db

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.facts import input_table
from pipeline.task_tables import partition_tables
from protocol.codec import encode

BAL = "balanced"

# "bal" (balanced): the leader says what load each member got.
#   1 initial T0+0          m1 3.0 of 2.0, m2 1.0 of 2.0   imbalance 1.5, spread 0.5
#   2 rejoin  T0+1000       m1 2.1 of 2.0, m2 1.9 of 2.0   1.05, 0.95
#   3 metadata_change       no load                        no row
#   4 rejoin  T0+HOUR       both 2.0 of 2.0                1.0, 1.0 (busiest: m2, by name)
OWNED = {"m1": {"b": [0, 1]}, "m2": {"b": [2, 3]}}
LOADS = [
    Row("bal", 1, "initial", T0, T0 + 100, OWNED, protocol_name=BAL,
        load={"m1": (3.0, 2.0), "m2": (1.0, 2.0)}),
    Row("bal", 2, "rejoin", T0 + 1000, T0 + 1100, OWNED, protocol_name=BAL,
        load={"m1": (2.1, 2.0), "m2": (1.9, 2.0)}),
    Row("bal", 3, "metadata_change", T0 + 2000, T0 + 2100, OWNED, protocol_name=BAL),
    Row("bal", 4, "rejoin", T0 + HOUR, T0 + HOUR + 100, OWNED, protocol_name=BAL,
        load={"m1": (2.0, 2.0), "m2": (2.0, 2.0)}),
]
EXPECTED = [("bal", 1, T0, 2, 1.5, 0.5, "m1"), ("bal", 2, T0 + 1000, 2, 1.05, 0.95, "m1"),
            ("bal", 4, T0 + HOUR, 2, 1.0, 1.0, "m2")]


def _rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["group_id"], r["generation_id"], r["started_ms"], r["members"],
                   pytest.approx(r["imbalance"]), pytest.approx(r["spread"]), r["busiest"])
                  for r in rows)


def test_each_generation_with_loads_gives_its_busiest_member_over_its_share() -> None:
    """The task's own function, without Spark: a row per generation whose
    assignments carry ``load``; none for the others (no load, another assignor)."""
    rows = journal_rows(LOADS) + journal_rows(EAGER)
    tables = list(partition_tables(input_table(rows).to_batches(), (), 600_000, 3))
    got = [r for t in tables for r in t["imbalance"].to_pylist()]
    assert _rows(got) == EXPECTED
    assert {r["source"] for r in got} == {"db"}


def test_an_unreadable_load_gives_no_row_and_a_zero_share_is_left_out() -> None:
    bad = Row("bal", 5, "rejoin", T0 + 2 * HOUR, T0 + 2 * HOUR + 10, {},
              raw_assignments=encode({"m1": encode({"assigned": {"b": [0]}, "load": "x"})}))
    idle = Row("bal", 6, "rejoin", T0 + 3 * HOUR, T0 + 3 * HOUR + 10, OWNED,
               protocol_name=BAL, load={"m1": (0.0, 0.0), "m2": (0.0, 0.0)})
    rows = journal_rows([*LOADS, bad, idle])
    tables = list(partition_tables(input_table(rows).to_batches(), (), 600_000, 3))
    assert _rows([r for t in tables for r in t["imbalance"].to_pylist()]) == EXPECTED


def test_analyze_writes_the_imbalance_and_reports_it_over_time(spark: Any,
                                                               tmp_path: Path) -> None:
    db = write_db(tmp_path / "coord.db", LOADS + EAGER)
    analyze(spark, [str(db)], tmp_path / "out", AnalyzeOptions(progress=False))
    table = spark.read.parquet(str(tmp_path / "out" / "imbalance"))
    assert [f.name for f in table.schema] == ["source", "group_id", "generation_id",
                                              "started_ms", "members", "imbalance", "spread",
                                              "busiest"]
    assert _rows([r.asDict() for r in table.collect()]) == EXPECTED
    page = (tmp_path / "out" / "report.html").read_text()
    section = page.split("Load imbalance over time (per hour)")[1].split("<h2>")[0]
    # hour T0: 2 generations, mean (1.5 + 1.05) / 2, largest 1.5 in generation 1;
    # hour T0 + 1 h: 1 generation at 1.0.
    assert "1.275" in section and "1.500" in section and "bal generation 1" in section
    assert "1.000" in section and "bal generation 4" in section
