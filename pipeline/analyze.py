"""``groupcoord analyze``: rebalance journals -> Parquet tables + an HTML report.

The job (docs/pipeline.md):

1. load every input into one DataFrame of journal rows: coordinator databases
   on the driver (SQLite through ``sqlite3``, PostgreSQL through asyncpg) ->
   Arrow -> Spark (pipeline/sources.py), export directories straight from
   Parquet;
2. per-rebalance facts: ``repartition(source, group_id).mapInArrow`` runs
   the sequential ownership accounting of whole groups and the storm
   counter in Python (pipeline/facts.py, numpy); written by Spark ->
   ``rebalances/``;
3. ``group_hours/`` and ``groups/`` (with the generations, worst first):
   ``rebalances/`` as written, its figure columns repartitioned by group
   again, through ``mapInArrow`` of pipeline/group_figures.py (exact
   percentiles in numpy, the definitions of pipeline/aggregates.py);
   ``fleet_hours/`` in Spark SQL over those tables;
4. the report's figures, from those tables where they hold them, and
   report.html (pipeline/analyze_report.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.sources import (
    GENERATIONS_SCHEMA,
    JOURNAL_SCHEMA,
    Journal,
    check_export_dir,
    is_database_input,
    open_database,
    read_generations,
    read_journal,
    unique_names,
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
    """Checked inputs: coordinator databases (opened: SQLite files, PostgreSQL URLs)
    and export directories (their files)."""

    databases: tuple[Journal, ...] = ()
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
        raise PipelineError("no input: give coordinator databases (SQLite files, "
                            "postgresql:// URLs) or export directories")
    databases: list[Journal] = []
    jpq: list[str] = []
    gpq: list[str] = []
    for p in inputs:
        if is_database_input(p):
            databases.append(open_database(p))
        elif "://" in str(p):  # shared storage Spark reads itself (hdfs://, s3a://, ...)
            jpq.append(f"{str(p).rstrip('/')}/journal")
        elif Path(p).is_dir():
            j, g = check_export_dir(p)
            jpq.extend(str(f) for f in j)
            gpq.extend(str(f) for f in g)
        else:
            databases.append(open_database(p))
    return InputPlan(tuple(unique_names(databases)), tuple(jpq), tuple(gpq))


def run_from_cli(inputs: Sequence[str], out: str, options: AnalyzeOptions,
                 master: str | None, conf: Sequence[str], verbose: bool = False
                 ) -> AnalyzeResult:
    from pipeline.spark import ANALYZE_MODULES, check_executors, session
    plan = plan_inputs(inputs)  # fail fast, before the JVM starts
    extra = ["spark.sql.session.timeZone=UTC", *conf]
    spark = session("groupcoord analyze", master, extra, verbose)
    try:
        if not spark.sparkContext.master.startswith("local"):
            check_executors(spark, ANALYZE_MODULES)
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
    if any("://" in f for f in files):
        return spark.read.parquet(*files)
    return spark.read.schema(ddl(schema)).parquet(*files)


def _load_journal(spark: Any, plan: InputPlan) -> Any:
    frames = []
    if plan.databases:
        frames.append(_arrow_to_spark(spark, [read_journal(j) for j in plan.databases],
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
    frames = [_arrow_to_spark(spark, [read_generations(j) for j in plan.databases],
                              GENERATIONS_SCHEMA)]
    if plan.generations_parquet:
        frames.append(_read_parquet(spark, plan.generations_parquet, GENERATIONS_SCHEMA))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other.select(*df.columns))
    # One generation row per (source, group, generation), however often exported.
    return df.dropDuplicates(["source", "group_id", "generation_id"])


def _uri(path: str | Path) -> str:
    text = str(path)
    return text if "://" in text else Path(text).absolute().as_uri()


#: Input bytes (the input files' sizes) per facts call: a call holds its
#: groups' rows in memory, about 16 times their share of zstd-compressed
#: Parquet for journals like the benchmark's.
INPUT_BYTES_PER_TASK = 64 << 20


def input_bytes(plan: InputPlan) -> int:
    """The size of the inputs on disk (SQLite files, PostgreSQL journal tables and
    export files; shared storage is asked through pyarrow's file systems)."""
    import pyarrow.fs as pafs
    total = sum(j.size_bytes for j in plan.databases)
    for f in plan.journal_parquet:
        if "://" not in f:
            total += Path(f).stat().st_size
            continue
        try:
            fs, base = pafs.FileSystem.from_uri(f)
            infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True,
                                                       recursive=True))
            total += sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
        except Exception:  # an estimate only: the default is still correct
            pass
    return total


def facts_calls(spark: Any, plan: InputPlan) -> int:
    """How many partitions (calls of the facts function, each with the rows
    of whole groups): two per core, more when the input is big (each call
    holds its rows)."""
    least = max(1, int(spark.sparkContext.defaultParallelism) * 2)
    return max(least, -(-input_bytes(plan) // INPUT_BYTES_PER_TASK))


def facts_task(journal: Any, options: AnalyzeOptions, partitions: int) -> Any:
    """The ``rebalances/`` rows (``facts.facts_schema()``) of ``journal``.

    The ownership accounting is sequential per group and runs in Python:
    ``repartition(partitions, source, group_id)`` puts the rows of whole
    groups in each partition and ``mapInArrow`` hands a partition's record
    batches to pipeline/facts.py, which orders them by group and journal id
    and turns them into facts with numpy. Not ``groupBy(...).applyInArrow``:
    Spark sorts every row of a group-by's input, assignment bytes included,
    which cost more than the accounting itself (docs/bench-pipeline.md);
    the Python side orders a partition by its dictionary codes instead.
    The storm counter is counted there too (``facts.window_counts``, the
    same count as a window function over the group ordered by start, which
    would shuffle and sort the facts a second time).
    """
    from pyspark.sql import functions as F

    from pipeline.facts import facts_of_partition, facts_schema
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
    facts = rows.repartition(partitions, "source", "group_id").mapInArrow(
        facts_of_partition(options.cooperative, options.storm_window_ms),
        ddl(facts_schema()))
    return facts.select(*_columns(facts_schema()))


def figures_task(rebalances: Any, threshold: int, partitions: int) -> Any:
    """The ``group_hours/`` and ``groups/`` rows (without the generations) of
    ``rebalances/`` as written, in one DataFrame (``group_figures.
    figures_schema()``: :func:`split_figures` takes them apart).

    ``repartition(partitions, source, group_id)`` of the columns the figures
    need, then ``mapInArrow`` of pipeline/group_figures.py: sums, reason
    counts and exact percentiles of whole groups in numpy (three Spark
    aggregations with exact ``percentile`` cost about as much as the
    accounting). Not in the facts task itself: its output would then be
    needed three times, and caching the facts cost more than this second,
    narrow pass (docs/bench-pipeline.md)."""
    from pipeline.group_figures import FIGURE_INPUTS, figures_of_partition, figures_schema
    return rebalances.select(*FIGURE_INPUTS).repartition(partitions, "source", "group_id") \
        .mapInArrow(figures_of_partition(threshold), ddl(figures_schema()))


def split_figures(figures: Any) -> tuple[Any, Any]:
    """(``group_hours/`` rows, per-group rows without the generations) of
    :func:`figures_task`'s output."""
    from pyspark.sql import functions as F

    from pipeline.group_figures import GROUP_HOURS_SCHEMA, GROUPS_SCHEMA
    hours = figures.where(~F.col("is_group")).select(*_columns(GROUP_HOURS_SCHEMA))
    per_group = figures.where(F.col("is_group")).select(*_columns(GROUPS_SCHEMA))
    return hours, per_group


def _columns(schema: Any) -> list[Any]:
    """The columns of ``schema``; a column never null in its table is written
    as such (as Spark's own count or coalesce would be): coalesce with a
    literal says so."""
    from pyspark.sql import functions as F
    return [F.col(f.name) if f.nullable else F.coalesce(F.col(f.name), F.lit(0)).alias(f.name)
            for f in schema]


def ddl(schema: Any) -> str:
    """An Arrow schema of the pipeline's own tables as a Spark DDL string
    (``name type, ...``): the public way to give Spark a schema."""
    return ", ".join(f"`{f.name}` {_ddl_type(f.type)}" for f in schema)


def _ddl_type(t: Any) -> str:
    import pyarrow as pa
    simple = {pa.int64(): "bigint", pa.int32(): "int", pa.bool_(): "boolean",
              pa.string(): "string", pa.binary(): "binary", pa.float64(): "double"}
    if t in simple:
        return simple[t]
    if pa.types.is_list(t):
        return f"array<{_ddl_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"`{f.name}`: {_ddl_type(f.type)}" for f in t) + ">"
    raise TypeError(f"no Spark DDL for Arrow type {t}")


def _write(df: Any, out: Path) -> None:
    df.write.mode("overwrite").parquet(str(out))


# ---------------------------------------------------------------- the job


def analyze(spark: Any, inputs: InputPlan | Sequence[str | Path], out: str | Path,
            options: AnalyzeOptions | None = None) -> AnalyzeResult:
    """Run the whole analysis with ``spark``; returns where things were written."""
    from pyspark.sql import functions as F

    from pipeline import aggregates as agg
    from pipeline.analyze_report import report_figures, write_report
    from pipeline.spark import progress
    opts = options or AnalyzeOptions()
    plan = inputs if isinstance(inputs, InputPlan) else plan_inputs(inputs)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = {name: out_dir / name for name in ("rebalances", "group_hours", "groups",
                                                "fleet_hours")}
    show = opts.progress
    with progress(spark, "analyze [1/4] reading journals, per-rebalance accounting", show):
        journal = _load_journal(spark, plan)
        calls = facts_calls(spark, plan)
        try:
            _write(facts_task(journal, opts, calls), tables["rebalances"])
        except Exception as exc:
            raise _spark_input_error(exc, plan) from exc
    rebalances = spark.read.parquet(str(tables["rebalances"]))
    generations = _load_generations(spark, plan)
    with progress(spark, "analyze [2/4] aggregating per group and hour, per group, "
                  "fleet-wide", show):
        # Written twice (group_hours/, groups/): cached, a few rows per group.
        figures = figures_task(rebalances, opts.storm_threshold, calls).persist()
        hour_rows, group_rows = split_figures(figures)
        _write(hour_rows, tables["group_hours"])
        # Small tables go out as one file, in a useful order (repartition, not
        # coalesce: that would run the aggregation itself in one task).
        _write(agg.with_generations(group_rows, generations).repartition(1)
               .sortWithinPartitions(F.desc("peak_window_rebalances"), F.desc("rebalances"),
                                     "source", "group_id"), tables["groups"])
        figures.unpersist()
        hours = spark.read.parquet(str(tables["group_hours"]))
        # Kept for the report, with the FACT_COUNTS and REBALANCE_DURATIONS that
        # fleet_hours/ leaves out.
        fleet_df = agg.fleet_hours(rebalances, hours).repartition(1) \
            .sortWithinPartitions("hour_start_ms").cache()
        _write(fleet_df.select(*agg.fleet_columns()), tables["fleet_hours"])
    with progress(spark, "analyze [3/4] collecting figures for the report", show):
        fleet = [r.asDict() for r in fleet_df.collect()]
        fleet_df.unpersist()
        data = report_figures(
            fleet, rebalances, hours, spark.read.parquet(str(tables["groups"])), journal,
            top=opts.top, storm_window_ms=opts.storm_window_ms,
            storm_threshold=opts.storm_threshold,
            inputs=[j.name for j in plan.databases] + sorted(
                {str(Path(p).parent.parent) for p in plan.journal_parquet}))
    with progress(spark, "analyze [4/4] writing report.html", show):
        report = write_report(out_dir / "report.html", data)
    tot = data.totals
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
