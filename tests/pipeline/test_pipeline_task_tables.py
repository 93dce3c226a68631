"""The facts job's writer (pipeline/task_tables.py): what a task computes from
the journal rows of whole groups, and the commit protocol that publishes
only the files of the attempts Spark let commit."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_journal_builder import COOP, EAGER, journal_rows
from test_pipeline_facts import _random_journal
from test_pipeline_imbalance import LOADS

import pipeline.task_tables as tt
from pipeline.facts import facts_for_chunk, input_table
from pipeline.group_figures import group_hour_rows, group_rows
from pipeline.imbalance import imbalance_rows
from pipeline.ownership import cooperative_names

WINDOW_MS, THRESHOLD = 10_000, 2


def _sorted(table: pa.Table, key: list[str]) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: tuple(r[k] for k in key))


def _journal() -> pa.Table:
    rnd = random.Random(3)
    rows = journal_rows(EAGER + COOP + LOADS)
    for g in range(6):
        rows += [replace(r, group_id=f"r{g}") for r in journal_rows(_random_journal(rnd))]
    return input_table(sorted(rows, key=lambda r: (r.source, r.group_id, r.journal_id)))


@pytest.mark.parametrize("chunk_rows", [1, 7, 262_144])
def test_a_task_gives_the_kernels_tables_of_its_groups(
        monkeypatch: pytest.MonkeyPatch, chunk_rows: int) -> None:
    """partition_tables: the journal rows of whole groups, in any order over
    several batches, in; per chunk of whole groups (of any size) the facts
    and the kernels' group-hour and group rows of those facts out: together,
    the tables of the whole input."""
    chunks = tt.partition_chunks
    monkeypatch.setattr(tt, "partition_chunks", lambda b: chunks(b, rows=chunk_rows))
    journal = _journal()
    shuffled = journal.take(pa.array(np.random.default_rng(5).permutation(journal.num_rows)))
    got = list(tt.partition_tables(shuffled.to_batches(max_chunksize=5), (), WINDOW_MS,
                                   THRESHOLD))
    if chunk_rows == 1:
        assert len(got) > 1
    tables = {name: pa.concat_tables([t[name] for t in got]) for name in tt.table_schemas()}
    for name, schema in tt.table_schemas().items():
        assert tables[name].schema == schema, name
    facts = facts_for_chunk(journal, cooperative_names(()), WINDOW_MS)
    assert _sorted(tables["rebalances"], ["source", "group_id", "journal_id"]) == \
        _sorted(facts, ["source", "group_id", "journal_id"])
    key = ["source", "group_id", "hour_start_ms"]
    assert _sorted(tables["group_hours"], key) == _sorted(group_hour_rows(facts, THRESHOLD), key)
    assert _sorted(tables[tt.GROUP_FIGURES], key[:2]) == \
        _sorted(group_rows(facts, THRESHOLD), key[:2])
    key = ["source", "group_id", "generation_id"]
    assert _sorted(tables["imbalance"], key) == _sorted(imbalance_rows(journal), key)
    assert tables["imbalance"].num_rows == 3
    assert list(tt.partition_tables(iter([]), (), WINDOW_MS, THRESHOLD)) == []


def _writer(out: Path) -> tt.TablesWriter:
    return tt.TablesWriter(tt.writer_options(out, (), WINDOW_MS, THRESHOLD))


def _read(out: Path, table: str) -> pa.Table:
    return pq.read_table(out / table)


def test_commit_publishes_only_the_committed_attempts(tmp_path: Path) -> None:
    """Two attempts of one partition (a retried or speculative task) each
    write their own files; Spark hands commit the message of the one it let
    commit: only its files become the tables, the other attempt's are gone
    with the staging directory, and every table has its _SUCCESS."""
    journal = _journal()
    writer = _writer(tmp_path)
    first = writer.write(iter(journal.to_batches()))
    second = writer.write(iter(journal.to_batches()))
    assert first.files.keys() == set(tt.table_schemas())
    assert first.files["rebalances"] != second.files["rebalances"]
    assert all(Path(f).exists() for f in (*first.files.values(), *second.files.values()))
    assert not (tmp_path / "rebalances").exists()  # nothing published before commit
    writer.commit([second])
    for table in tt.table_schemas():
        names = sorted(p.name for p in (tmp_path / table).iterdir())
        assert names == sorted(["_SUCCESS", Path(second.files[table]).name]), table
    assert _read(tmp_path, "rebalances").num_rows == journal.num_rows
    assert not writer.staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(tt.table_schemas())


def test_commit_replaces_old_tables_and_writes_empty_ones(tmp_path: Path) -> None:
    """Overwrite: an earlier run's files are gone after commit. A table no
    task had rows for is one empty file with its schema (as Spark's writer
    leaves), so that the next phase can read it."""
    journal = _journal()
    old = _writer(tmp_path)
    old.commit([old.write(iter(journal.to_batches()))])
    old_files = {p.name for p in (tmp_path / "rebalances").glob("*.parquet")}
    new = _writer(tmp_path)
    new.commit([new.write(iter([])), None])
    for table, schema in tt.table_schemas().items():
        t = _read(tmp_path, table)
        assert t.num_rows == 0 and t.schema == schema, table
    assert {p.name for p in (tmp_path / "rebalances").glob("*.parquet")} == \
        {"part-00000-empty.parquet"} != old_files


def test_abort_leaves_the_old_tables(tmp_path: Path) -> None:
    journal = _journal()
    old = _writer(tmp_path)
    old.commit([old.write(iter(journal.to_batches()))])
    failed = _writer(tmp_path)
    message = failed.write(iter(journal.to_batches()[:1]))
    failed.abort([message, None])
    assert not failed.staging.exists()
    assert _read(tmp_path, "rebalances").num_rows == journal.num_rows


def test_a_failed_job_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    """Through Spark: a task that fails after writing its files fails the
    job (local mode does not retry); Spark calls abort, and the tables of
    the earlier run are still there, whole, with no staging directory."""
    from pipeline.analyze import facts_rows

    table = _journal()
    no_members = pa.array([[]] * table.num_rows, pa.list_(pa.string()))
    journal = spark.createDataFrame(table.drop_columns(["joined_count", "left_count"])
                                    .append_column("joined", no_members)
                                    .append_column("left", no_members))
    rows = facts_rows(journal, 2)
    tt.write_tables(spark, rows, tmp_path, (), WINDOW_MS, THRESHOLD)
    def files() -> dict[str, set[str]]:
        return {t: {p.name for p in (tmp_path / t).iterdir()} for t in tt.table_schemas()}

    before = files()
    assert _read(tmp_path, "rebalances").num_rows == table.num_rows

    class FailingWriter(tt.TablesWriter):
        def write(self, iterator: Any) -> tt.TaskFiles:
            from pyspark import TaskContext
            message = super().write(iterator)
            ctx = TaskContext.get()
            if ctx is not None and ctx.partitionId() == 1:
                raise RuntimeError("the task fails after writing its files")
            return message

    class FailingSource(tt.TablesSource):
        @classmethod
        def name(cls) -> str:
            return "groupcoord_failing_tables"

        def writer(self, schema: Any, overwrite: bool) -> tt.TablesWriter:
            return FailingWriter(dict(self.options))

    spark.dataSource.register(FailingSource)
    with pytest.raises(Exception, match="the task fails after writing its files"):
        rows.write.format("groupcoord_failing_tables").mode("overwrite").options(
            **tt.writer_options(tmp_path, (), WINDOW_MS, THRESHOLD)).save()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(tt.table_schemas())
    assert files() == before  # the earlier run's files, not the failed job's
