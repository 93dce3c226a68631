"""``groupcoord analyze``: rebalance journals -> Parquet tables + an HTML report.

The job (docs/pipeline.md):

1. load every input into one DataFrame of journal rows: SQLite files through
   ``sqlite3`` -> Arrow -> Spark (pipeline/sources.py), export directories
   straight from Parquet;
2. per-rebalance facts: rows are partitioned by group (JVM only); one
   Python task per partition orders its rows by group and journal id and
   computes, in numpy, the facts of whole groups at a time
   (pipeline/facts.py: moved resources, unavailability, follow-ups, the
   storm counter) -> ``rebalances/``, and their exact per group-hour and per
   group aggregates (pipeline/aggregates.py) -> ``group_hours/`` and
   ``groups/``'s sums; it returns its duration counts and its groups' sums
   per hour;
3. what spans groups: ``groups/`` (Spark SQL: with the generations, worst
   first) and ``fleet_hours/`` (the tasks' hour sums added up; exact
   percentiles from the duration counts);
4. report.html from the small aggregates (pipeline/analyze_report.py).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.aggregates import FACT_COUNTS, FLEET_SUMS
from pipeline.errors import PipelineError
from pipeline.ownership import cooperative_names
from pipeline.sources import (
    GENERATIONS_SCHEMA,
    JOURNAL_SCHEMA,
    SqliteJournal,
    check_export_dir,
    open_sqlite,
    read_generations,
    read_journal,
    unique_sources,
)


@dataclass(frozen=True)
class AnalyzeOptions:
    storm_window_ms: int = 600_000
    storm_threshold: int = 10
    cooperative: tuple[str, ...] = ()
    top: int = 20
    progress: bool = True


@dataclass(frozen=True)
class InputPlan:
    """Checked inputs: SQLite files (opened) and export directories (their files)."""

    sqlite: tuple[SqliteJournal, ...] = ()
    journal_parquet: tuple[str, ...] = ()
    generations_parquet: tuple[str, ...] = ()


@dataclass
class AnalyzeResult:
    rebalances: int
    groups: int
    report: Path
    tables: dict[str, Path] = field(default_factory=dict)


def plan_inputs(inputs: Sequence[str | Path]) -> InputPlan:
    """Check every input before Spark starts; errors name the file."""
    if not inputs:
        raise PipelineError("no input: give coordinator SQLite files or export directories")
    files = [p for p in inputs if not _is_dir_input(p)]
    sources = dict(zip(map(str, files), unique_sources(files), strict=True))
    sqlite: list[SqliteJournal] = []
    jpq: list[str] = []
    gpq: list[str] = []
    for p in inputs:
        if "://" in str(p):  # shared storage Spark reads itself (hdfs://, s3a://, ...)
            jpq.append(f"{str(p).rstrip('/')}/journal")
            continue
        if _is_dir_input(p):
            j, g = check_export_dir(p)
            jpq.extend(str(f) for f in j)
            gpq.extend(str(f) for f in g)
        else:
            sqlite.append(open_sqlite(p, sources[str(p)]))
    return InputPlan(tuple(sqlite), tuple(jpq), tuple(gpq))


def _is_dir_input(p: str | Path) -> bool:
    return "://" in str(p) or Path(p).is_dir()


def run_from_cli(inputs: Sequence[str], out: str, options: AnalyzeOptions,
                 master: str | None, conf: Sequence[str]) -> AnalyzeResult:
    from pipeline.spark import session
    plan = plan_inputs(inputs)  # fail fast, before the JVM starts
    extra = ["spark.sql.session.timeZone=UTC", *conf]
    spark = session("groupcoord analyze", master, extra)
    try:
        return analyze(spark, plan, out, options)
    finally:
        spark.stop()


# ---------------------------------------------------------------- loading


def _arrow_to_spark(spark: Any, tables: Sequence[Any], schema: Any) -> Any:
    """Arrow tables (driver memory) as one DataFrame. Spark cannot take a table
    whose columns have no chunk at all, which is what an empty journal gives:
    such a table is sent as one empty batch."""
    import pyarrow as pa
    table = pa.concat_tables(list(tables)) if tables else schema.empty_table()
    if table.num_rows == 0:
        table = pa.Table.from_batches([pa.RecordBatch.from_pylist([], schema=schema)])
    return spark.createDataFrame(table)


def _read_parquet(spark: Any, files: Sequence[str], schema: Any) -> Any:
    """Export files. Local ones had their columns checked by plan_inputs:
    they are read with the schema given, and Spark starts no job to infer
    it. Shared storage (``scheme://``) is not checked beforehand: Spark
    infers its schema, so a missing column fails instead of reading as null."""
    from pyspark.sql.pandas.types import from_arrow_schema  # pyarrow only, despite the name
    if any("://" in f for f in files):
        return spark.read.parquet(*files)
    return spark.read.schema(from_arrow_schema(schema)).parquet(*files)


def _load_journal(spark: Any, plan: InputPlan) -> Any:
    frames = []
    if plan.sqlite:
        frames.append(_arrow_to_spark(spark, [read_journal(j) for j in plan.sqlite],
                                      JOURNAL_SCHEMA))
    if plan.journal_parquet:
        frames.append(_read_parquet(spark, plan.journal_parquet, JOURNAL_SCHEMA))
    if not frames:
        frames.append(_arrow_to_spark(spark, [], JOURNAL_SCHEMA))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other.select(*df.columns))
    return df


def _load_generations(spark: Any, plan: InputPlan) -> Any:
    frames = [_arrow_to_spark(spark, [read_generations(j) for j in plan.sqlite],
                              GENERATIONS_SCHEMA)]
    if plan.generations_parquet:
        frames.append(_read_parquet(spark, plan.generations_parquet, GENERATIONS_SCHEMA))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other.select(*df.columns))
    # One generation row per (source, group, generation), however often exported.
    return df.dropDuplicates(["source", "group_id", "generation_id"])


def _facts_task(window_ms: int, cooperative: tuple[str, ...], threshold: int,
                out_dirs: tuple[str, str, str], batches: Iterator[Any]) -> Iterator[Any]:
    """Runs on an executor (``mapInArrow``): the Arrow batches of one shuffle
    partition (every row of its groups, in no particular order) in; its part of
    ``rebalances/``, ``group_hours/`` and of the per-group table written with
    pyarrow; the partition's duration cells and hour sums (pipeline/aggregates.py
    ``task_result``) out.

    No row crosses between the JVM and Python other than as Arrow; the facts
    of whole groups at a time, in numpy (pipeline/facts.py,
    pipeline/aggregates.py), in chunks of whole groups ordered by the task
    (pipeline/facts.py ``partition_chunks``).
    """
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    from pipeline.aggregates import (
        aggregate,
        duration_cells,
        group_hours_schema,
        groups_schema,
        hour_sums,
        merge_cells,
        merge_hour_sums,
        task_result,
    )
    from pipeline.facts import facts_for_chunk, facts_schema, partition_chunks
    ctx = TaskContext.get()
    number = ctx.partitionId() if ctx is not None else 0
    is_coop = cooperative_names(cooperative)
    schemas = (facts_schema(), group_hours_schema(), groups_schema())
    writers: list[Any] = []
    cells: list[Any] = []
    sums: list[Any] = []
    try:
        for chunk in partition_chunks(batches):
            if not writers:  # only partitions with rows write files
                for out_dir, schema in zip(out_dirs, schemas, strict=True):
                    fs, base = pafs.FileSystem.from_uri(out_dir)
                    writers.append(pq.ParquetWriter(
                        f"{base.rstrip('/')}/part-{number:05d}.parquet", schema,
                        filesystem=fs, **_parquet_options(schema)))
            facts = facts_for_chunk(chunk, is_coop, window_ms)
            hours, groups = aggregate(facts, threshold)
            for writer, table in zip(writers, (facts, hours, groups), strict=True):
                writer.write_table(table)
            cells.append(duration_cells(facts))
            sums.append(hour_sums(hours, facts))
    finally:
        for writer in writers:
            writer.close()
    yield from task_result(merge_cells(cells), merge_hour_sums(sums)).to_batches(
        max_chunksize=1 << 20)


def _parquet_options(schema: Any) -> dict[str, Any]:
    """How the facts tasks write Parquet: dictionaries for the string columns
    only, delta encoding for the 64-bit integers, snappy. On 1M rebalances:
    0.39 CPU-s and 16 MB, against 1.06 CPU-s and 22 MB with pyarrow's
    defaults and zstd (a dictionary was tried on every column)."""
    import pyarrow as pa
    return {"compression": "snappy",
            "use_dictionary": [f.name for f in schema if pa.types.is_string(f.type)],
            "column_encoding": {f.name: "DELTA_BINARY_PACKED" for f in schema
                                if pa.types.is_int64(f.type)}}


def _uri(path: str | Path) -> str:
    text = str(path)
    return text if "://" in text else Path(text).absolute().as_uri()


def _map_in_arrow(df: Any, func: Any, schema: str) -> Any:
    """``df.mapInArrow(func, schema)`` without pandas.

    PySpark's ``DataFrame.mapInArrow`` builds its UDF with ``pandas_udf``,
    which insists on pandas being installed although an Arrow map never uses
    it (the Python worker's SQL_MAP_ARROW_ITER_UDF path is pyarrow only). The
    same UDF is built here directly, with the same evaluation type.
    """
    from pyspark.rdd import PythonEvalType
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import UserDefinedFunction
    udf = UserDefinedFunction(func, returnType=schema,
                              evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


#: Input bytes (Spark's estimate: the Parquet files' sizes) per facts task.
#: A task holds its partition in memory: for journals like the benchmark's,
#: about 16 times its share of zstd-compressed Parquet.
INPUT_BYTES_PER_TASK = 64 << 20


def _partitions(spark: Any, journal: Any) -> int:
    """Facts tasks: two per core, more when the input is big (memory)."""
    least = max(1, int(spark.sparkContext.defaultParallelism) * 2)
    try:
        size = int(str(journal._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # an estimate only: the default is still correct
        return least
    return max(least, -(-size // INPUT_BYTES_PER_TASK))


def write_rebalance_facts(spark: Any, journal: Any, options: AnalyzeOptions,
                          outs: tuple[str | Path, str | Path, str | Path]) -> tuple[Any, Any]:
    """Write ``rebalances`` (FACTS_FIELDS), ``group_hours`` and the per-group
    aggregates to the three directories ``outs``; returns the duration cells
    of all rebalances (an Arrow table, ``aggregates.cells_schema()``, one row
    per hour and duration) and the sums of ``group_hours`` per hour
    (``aggregates.hour_sums_schema()``).

    Spark shuffles each group into one partition (JVM only, no sort); one
    Python task per partition takes its rows straight from the shuffle as
    Arrow batches (``mapInArrow``), orders them by group and journal id
    (pipeline/facts.py ``partition_chunks``), computes the facts
    (pipeline/facts.py) and the per-group aggregates (pipeline/aggregates.py)
    and writes them with pyarrow.
    """
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from pipeline.aggregates import (
        group_hours_schema,
        groups_schema,
        split_task_results,
        task_result_schema,
    )
    from pipeline.facts import facts_schema
    rows = journal.select(
        "source", "group_id",
        F.col("id").cast("long").alias("id"),
        F.col("generation_id").cast("long").alias("generation_id"),
        "protocol_type", "protocol_name", "reason",
        F.col("started_ms").cast("long").alias("started_ms"),
        F.col("ended_ms").cast("long").alias("ended_ms"),
        F.col("member_count").cast("long").alias("member_count"),
        F.coalesce(F.size("joined"), F.lit(0)).cast("long").alias("joined_count"),
        F.coalesce(F.size("left"), F.lit(0)).cast("long").alias("left_count"),
        "assignments")
    parts = _partitions(spark, journal)
    out_uris = (_uri(outs[0]), _uri(outs[1]), _uri(outs[2]))
    for out_uri in out_uris:
        fs, base = pafs.FileSystem.from_uri(out_uri)
        fs.delete_dir_contents(base, missing_dir_ok=True)
        fs.create_dir(base, recursive=True)
    fn = functools.partial(_facts_task, options.storm_window_ms, options.cooperative,
                           options.storm_threshold, out_uris)
    # Not sorted by Spark: its sort copied every row's bytes (the assignments
    # are most of them) into sort pages, and cost more than ordering the rows
    # in the task.
    grouped = rows.repartition(parts, "source", "group_id")
    ddl = ", ".join(f"{f.name} long" for f in task_result_schema())
    cells, sums = split_task_results(_map_in_arrow(grouped, fn, ddl).toArrow())
    for out_uri, schema in zip(out_uris, (facts_schema(), group_hours_schema(),
                                          groups_schema()), strict=True):
        fs, base = pafs.FileSystem.from_uri(out_uri)
        if not fs.get_file_info(pafs.FileSelector(base)):
            # An empty journal: one empty file gives the table its columns.
            pq.write_table(schema.empty_table(), f"{base.rstrip('/')}/part-00000.parquet",
                           filesystem=fs)
    return cells, sums


# ---------------------------------------------------------------- aggregates
#
# group_hours/ and the per-group sums are written by the facts tasks (exact
# percentiles, pipeline/aggregates.py), and the tasks send the driver every
# rebalance's hour and duration as counts (duration cells) and their groups'
# sums per hour: fleet_hours/, the fleet-wide percentiles, the histogram and
# the totals come from those and from the small tables; rebalances/ is never
# read again.

_DURATIONS = ("duration_p50_ms", "duration_p95_ms", "duration_p99_ms", "duration_max_ms")


def fleet_schema() -> Any:
    import pyarrow as pa
    return pa.schema([("hour_start_ms", pa.int64()),
                      *((c, pa.int64()) for c in (*FLEET_SUMS, "groups", "storming_groups")),
                      *((c, pa.int64() if c == "duration_max_ms" else pa.float64())
                        for c in _DURATIONS)])


def fleet_hours(sums: Any, cells: Any) -> list[dict[str, Any]]:
    """One dict per hour over all groups, in time order: the tasks' sums of
    ``group_hours`` (``aggregates.hour_sums_schema()``, in time order),
    exact duration percentiles from the cells."""
    import numpy as np

    from pipeline.aggregates import cell_percentiles
    pct = cell_percentiles(*(np.asarray(cells[c].to_numpy(), dtype=np.int64)
                             for c in ("hour_start_ms", "duration_ms", "rebalances")))
    empty = dict.fromkeys(_DURATIONS)
    return [r | pct.get(int(r["hour_start_ms"]), empty) for r in sums.to_pylist()]


def write_table(rows: list[dict[str, Any]], schema: Any, out: str | Path) -> None:
    """A small table the driver computed, as one Parquet file in directory ``out``."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    fs, base = pafs.FileSystem.from_uri(_uri(out))
    fs.delete_dir_contents(base, missing_dir_ok=True)
    fs.create_dir(base, recursive=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema),
                   f"{base.rstrip('/')}/part-00000.parquet", filesystem=fs)


def groups_table(per_group: Any, generations: Any) -> Any:
    from pyspark.sql import functions as F
    gens = generations.groupBy("source", "group_id").agg(
        F.count(F.lit(1)).alias("generations_formed"),
        F.sum(F.when(F.col("has_assignments"), 0).otherwise(1)).cast("long")
        .alias("generations_without_assignment"))
    return per_group.join(gens, ["source", "group_id"], "left")


def totals(fleet: list[dict[str, Any]], cells: Any, groups: Any) -> dict[str, Any]:
    """The report's headline figures: sums over the fleet's hours (the
    tasks' hour sums), exact percentiles over all durations, spans of the
    groups."""
    import numpy as np
    from pyspark.sql import functions as F

    from pipeline.aggregates import cell_percentiles
    tot: dict[str, Any] = {c: sum(int(h[c] or 0) for h in fleet)
                           for c in (*FLEET_SUMS, *FACT_COUNTS)}
    count = np.asarray(cells["rebalances"].to_numpy(), dtype=np.int64)
    duration = np.asarray(cells["duration_ms"].to_numpy(), dtype=np.int64)
    order = np.argsort(duration, kind="stable")
    tot |= cell_percentiles(np.zeros(len(order), np.int64), duration[order],
                            count[order]).get(0, dict.fromkeys(_DURATIONS))
    g = groups.agg(F.count(F.lit(1)).alias("groups"),
                   F.countDistinct("source").alias("sources"),
                   F.min("first_started_ms").alias("first_started_ms"),
                   F.max("last_ended_ms").alias("last_ended_ms")).collect()[0].asDict()
    return {k: (v if v is not None else 0) for k, v in (tot | g).items()}


# ---------------------------------------------------------------- the job


def analyze(spark: Any, inputs: InputPlan | Sequence[str | Path], out: str | Path,
            options: AnalyzeOptions | None = None) -> AnalyzeResult:
    """Run the whole analysis with ``spark``; returns where things were written."""
    from pyspark.sql import functions as F

    from pipeline.aggregates import cell_histogram
    from pipeline.analyze_report import ReportData, write_report
    from pipeline.spark import progress
    opts = options or AnalyzeOptions()
    plan = inputs if isinstance(inputs, InputPlan) else plan_inputs(inputs)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = {name: out_dir / name for name in ("rebalances", "group_hours", "groups",
                                                "fleet_hours")}
    show = opts.progress
    per_group = out_dir / "groups_by_task"
    with progress(spark, "analyze [1/4] reading journals, per-rebalance accounting, "
                  "per group and hour", show):
        journal = _load_journal(spark, plan)
        try:
            cells, sums = write_rebalance_facts(spark, journal, opts, (
                tables["rebalances"], tables["group_hours"], per_group))
        except Exception as exc:
            raise _spark_input_error(exc, plan) from exc
    hours = spark.read.parquet(str(tables["group_hours"]))
    generations = _load_generations(spark, plan)
    with progress(spark, "analyze [2/4] aggregating per group and fleet-wide", show):
        # Small tables go out as one file, in a useful order (no global sort job).
        groups_table(spark.read.parquet(str(per_group)), generations).coalesce(1) \
            .sortWithinPartitions(F.desc("peak_window_rebalances"), F.desc("rebalances"),
                                  "source", "group_id") \
            .write.mode("overwrite").parquet(str(tables["groups"]))
        fleet = fleet_hours(sums, cells)
        write_table(fleet, fleet_schema(), tables["fleet_hours"])
        shutil.rmtree(per_group, ignore_errors=True)
    with progress(spark, "analyze [3/4] collecting figures for the report", show):
        groups = spark.read.parquet(str(tables["groups"]))
        tot = totals(fleet, cells, groups)
        worst = [r.asDict() for r in groups.orderBy(
            F.desc("peak_window_rebalances"), F.desc("rebalances"), "source", "group_id")
            .limit(opts.top).collect()]
        keys = {(w["source"], w["group_id"]) for w in worst}
        heat: list[dict[str, Any]] = []
        if keys:
            # One scan that keeps the worst groups' names (a join with them
            # was two jobs); a name two coordinators share is told apart here.
            names = sorted({g for _, g in keys})
            heat = [r.asDict() for r in hours.where(F.col("group_id").isin(names))
                    .select("source", "group_id", "hour_start_ms", "rebalances").collect()
                    if (r["source"], r["group_id"]) in keys]
        hist = cell_histogram(cells)
    with progress(spark, "analyze [4/4] writing report.html", show):
        report = write_report(out_dir / "report.html", ReportData(
            totals=tot, fleet_hours=fleet, worst_groups=worst, heat=heat, histogram=hist,
            storm_window_ms=opts.storm_window_ms, storm_threshold=opts.storm_threshold,
            inputs=[str(j.path) for j in plan.sqlite] + sorted(
                {str(Path(p).parent.parent) for p in plan.journal_parquet})))
    return AnalyzeResult(int(tot["rebalances"]), int(tot["groups"]), report, tables)


def _spark_input_error(exc: Exception, plan: InputPlan) -> Exception:
    """A Spark failure while reading inputs, as a PipelineError naming the files."""
    if isinstance(exc, PipelineError):
        return exc
    text = str(exc)
    for f in plan.journal_parquet:
        if f in text:
            return PipelineError(f"{f}: could not be read: {text.splitlines()[0][:300]}")
    return PipelineError(f"reading the journals failed: {text.splitlines()[0][:300]}")
