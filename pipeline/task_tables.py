"""The facts job's output: ``rebalances/``, ``group_hours/``, ``move_causes/``,
``imbalance/`` and the per-group figures from one pass, written through Spark's commit protocol.

The per-group accounting runs in Python over whole groups (pipeline/facts.py),
and the per-group and per-group-and-hour figures come from the same rows
(pipeline/group_figures.py). Handing 10M rows of facts back to the JVM for
Spark's Parquet writer, and reading them again for the figures, cost as much
as the rest of the job (docs/bench-pipeline.md). So the job ends in a Spark
**Python data source writer** (``pyspark.sql.datasource.DataSourceArrowWriter``,
Spark's public API for writers in Python): ``journal.repartition(N, source,
group_id).write.format(FORMAT).mode("overwrite").options(...).save()``. Each
task gets the journal rows of whole groups as Arrow record batches, computes
their tables and writes one Parquet file per table (pyarrow) into the job's
staging directory; the driver publishes them when every task succeeded.

The guarantees of Spark's writer, with Spark's DataSource V2 commit protocol
doing the part only Spark can:

* a task attempt writes files of its own (a fresh name per attempt) under
  ``<out>/_staging-<job>/``, never into a table; its commit message lists them;
* Spark's output commit coordinator lets one attempt per partition commit and
  hands :meth:`TablesWriter.commit` exactly those messages, only once every
  partition has committed: files of failed, retried or speculative attempts
  are in no message and are never published;
* ``commit`` moves the listed files into new table directories inside the
  staging directory, writes ``_SUCCESS`` into each, and only then replaces the
  old tables, one directory rename each; the staging directory goes last;
* :meth:`TablesWriter.abort` (a task failed for good) removes the staging
  directory and leaves the old tables as they were.

Like Spark's file writer, this needs ``<out>`` on a file system that the
executors and the driver both see (one machine, or a shared mount).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from pipeline.facts import facts_for_chunk, facts_schema, partition_chunks
from pipeline.group_figures import GROUP_HOURS_SCHEMA, GROUPS_SCHEMA, group_hour_rows, group_rows
from pipeline.imbalance import IMBALANCE_SCHEMA, imbalance_rows
from pipeline.move_causes import MOVE_CAUSES_SCHEMA, move_cause_rows
from pipeline.ownership import cooperative_names

#: The name the data source is registered under.
FORMAT = "groupcoord_analyze_tables"

#: The directory in ``<out>`` holding the per-group figures until ``analyze``
#: has joined the generations on and written ``groups/`` (then removed).
GROUP_FIGURES = "_group_figures"


def table_schemas() -> dict[str, pa.Schema]:
    """The tables the facts job writes, by directory name in ``<out>``."""
    return {"rebalances": facts_schema(), "group_hours": GROUP_HOURS_SCHEMA,
            "move_causes": MOVE_CAUSES_SCHEMA, "imbalance": IMBALANCE_SCHEMA,
            GROUP_FIGURES: GROUPS_SCHEMA}


def partition_tables(batches: Iterable[pa.RecordBatch], cooperative: Sequence[str],
                     window_ms: int, threshold: int) -> Iterator[dict[str, pa.Table]]:
    """The tables (:func:`table_schemas`) of the journal rows of one partition
    (``facts.INPUT_COLUMNS``; whole groups, rows in any order), chunk of
    whole groups by chunk."""
    is_coop = cooperative_names(tuple(cooperative))
    for chunk in partition_chunks(batches):
        facts = facts_for_chunk(chunk, is_coop, window_ms)
        yield {"rebalances": facts, "group_hours": group_hour_rows(facts, threshold),
               "move_causes": move_cause_rows(chunk, facts),
               "imbalance": imbalance_rows(chunk),
               GROUP_FIGURES: group_rows(facts, threshold)}


@dataclass
class TaskFiles(WriterCommitMessage):
    """A task attempt's commit message, which Spark carries to the driver: the
    staged file of each table it wrote (a table the partition had no rows
    for is left out)."""

    files: dict[str, str] = field(default_factory=dict)


def writer_options(out: Path, cooperative: Sequence[str], window_ms: int,
                   threshold: int) -> dict[str, str]:
    """The options of one job's writer (:class:`TablesWriter`), a fresh job id
    among them."""
    return {"path": str(out.absolute()), "job": uuid.uuid4().hex,
            "cooperative": json.dumps(list(cooperative)), "window_ms": str(window_ms),
            "threshold": str(threshold)}


class TablesWriter(DataSourceArrowWriter):
    """The writer of one job (:func:`writer_options`). Its commit always
    replaces the tables: the job writes them whole."""

    def __init__(self, options: dict[str, str]) -> None:
        self.out = Path(options["path"])
        self.staging = self.out / f"_staging-{options['job']}"
        self.cooperative: list[str] = json.loads(options["cooperative"])
        self.window_ms = int(options["window_ms"])
        self.threshold = int(options["threshold"])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskFiles:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        name = f"part-{part:05d}-{uuid.uuid4().hex}.parquet"  # fresh per attempt
        message = TaskFiles()
        writers: dict[str, pq.ParquetWriter] = {}
        schemas = table_schemas()
        try:
            for tables in partition_tables(iterator, self.cooperative, self.window_ms,
                                           self.threshold):
                for table, rows in tables.items():
                    if rows.num_rows == 0:
                        continue
                    if table not in writers:
                        path = self.staging / "attempts" / table / name
                        path.parent.mkdir(parents=True, exist_ok=True)
                        writers[table] = pq.ParquetWriter(str(path), schemas[table])
                        message.files[table] = str(path)
                    writers[table].write_table(rows)
        finally:
            for w in writers.values():
                w.close()
        return message

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        got = [m for m in messages if m is not None]
        wrong = {type(m).__name__ for m in got if not isinstance(m, TaskFiles)}
        if wrong:
            raise TypeError(f"commit messages of {FORMAT} must be TaskFiles, not {wrong}")
        publish(self.out, self.staging, [m for m in got if isinstance(m, TaskFiles)])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def publish(out: Path, staging: Path, messages: Sequence[TaskFiles]) -> None:
    """Make the files named in ``messages`` (one per partition: the attempts
    Spark let commit) the tables of ``out``: each table is assembled in
    ``staging/tables/<table>`` (an empty file with the schema when no task
    had rows for it, as Spark's writer leaves one), then replaces
    ``out/<table>`` by a rename; ``staging`` is removed last."""
    ready = staging / "tables"
    for table, schema in table_schemas().items():
        target = ready / table
        target.mkdir(parents=True, exist_ok=True)
        files = [m.files[table] for m in messages if table in m.files]
        for f in files:
            os.replace(f, target / Path(f).name)
        if not files:
            pq.write_table(schema.empty_table(), target / "part-00000-empty.parquet")
        (target / "_SUCCESS").touch()
    for table in table_schemas():
        final = out / table
        if final.exists():
            shutil.rmtree(final)
        os.replace(ready / table, final)
    shutil.rmtree(staging, ignore_errors=True)


class TablesSource(DataSource):
    """The data source ``analyze`` registers (:data:`FORMAT`); write-only."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: Any, overwrite: bool) -> TablesWriter:
        return TablesWriter(dict(self.options))


def write_tables(spark: Any, journal_rows: Any, out: Path, cooperative: Sequence[str],
                 window_ms: int, threshold: int) -> None:
    """Run the facts job: ``journal_rows`` (``facts.INPUT_COLUMNS``, partitioned
    by group) -> the tables of :func:`table_schemas` in ``out``."""
    spark.dataSource.register(TablesSource)
    journal_rows.write.format(FORMAT).mode("overwrite").options(
        **writer_options(out, cooperative, window_ms, threshold)).save()
