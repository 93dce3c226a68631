"""``groupcoord analyze``: rebalance journals -> Parquet tables + an HTML report.

The job (docs/pipeline.md):

1. load every input into one DataFrame of journal rows: coordinator databases
   on the driver (SQLite through ``sqlite3``, PostgreSQL through asyncpg) ->
   Arrow -> Spark (pipeline/sources.py), export directories straight from
   Parquet;
2. one pass over the journal rows, ``repartition(source, group_id)``, ends in
   a Spark Python data source writer (pipeline/task_tables.py): each task
   runs the sequential ownership accounting of whole groups and the storm
   counter (pipeline/facts.py, numpy) and their per-group and
   per-group-and-hour figures (pipeline/group_figures.py: exact percentiles
   in numpy, the definitions of pipeline/aggregates.py) and writes them as
   Parquet; the driver publishes ``rebalances/``, ``group_hours/`` and the
   per-group rows once every task has committed (Spark's commit protocol);
3. ``groups/``: the per-group rows with the generations joined on, worst
   first; ``fleet_hours/`` in Spark SQL over the tables as written;
4. the report's figures, from those tables where they hold them, and
   report.html (pipeline/analyze_report.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.core.storm import STORM_RULE, StormRule
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
    #: the rebalance-storm rule (coordinator/core/storm.py), the coordinator's
    #: STORM health by default: rebalances (0: never) within the window.
    storm_window_ms: int = STORM_RULE.window_ms
    storm_threshold: int = STORM_RULE.rebalances
    cooperative: tuple[str, ...] = ()
    top: int = 20
    progress: bool = True

    def __post_init__(self) -> None:
        if self.storm_window_ms < 1:
            raise PipelineError(f"storm window (--storm-window) must be above 0, not "
                                f"{self.storm_window_ms / 1000:g} s")
        if self.storm_threshold < 0:
            raise PipelineError(f"storm threshold (--storm-threshold) must be 0 (never) or "
                                f"more, not {self.storm_threshold}")

    @property
    def storm_rule(self) -> StormRule:
        return StormRule(self.storm_window_ms, self.storm_threshold)


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


def facts_rows(journal: Any, partitions: int) -> Any:
    """The journal columns the facts job reads (``facts.INPUT_COLUMNS``),
    ``repartition(partitions, source, group_id)``: each partition holds whole
    groups, in no order. Not ``groupBy(...)``: Spark sorts every row of a
    group-by's input, assignment bytes included, which cost more than the
    accounting itself (docs/bench-pipeline.md); the Python side orders a
    partition by its dictionary codes instead (``facts.partition_chunks``)."""
    from pyspark.sql import functions as F
    return journal.select(
        "source", "group_id",
        F.col("id").cast("long").alias("id"),
        F.col("generation_id").cast("long").alias("generation_id"),
        "protocol_type", "protocol_name", "reason",
        F.col("started_ms").cast("long").alias("started_ms"),
        F.col("ended_ms").cast("long").alias("ended_ms"),
        F.col("member_count").cast("long").alias("member_count"),
        F.coalesce(F.size("joined"), F.lit(0)).cast("long").alias("joined_count"),
        F.coalesce(F.size("left"), F.lit(0)).cast("long").alias("left_count"),
        "assignments").repartition(partitions, "source", "group_id")


def _columns(schema: Any) -> list[Any]:
    """The columns of ``schema``; a column never null in its table is written
    as such (as Spark's own count or coalesce would be; Spark reads every
    Parquet column back as nullable): coalesce with a literal says so."""
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
    from pipeline.group_figures import GROUPS_SCHEMA
    from pipeline.spark import progress
    from pipeline.task_tables import GROUP_FIGURES, write_tables
    opts = options or AnalyzeOptions()
    plan = inputs if isinstance(inputs, InputPlan) else plan_inputs(inputs)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = {name: out_dir / name for name in ("rebalances", "group_hours", "move_causes",
                                                "imbalance", "groups", "fleet_hours")}
    show = opts.progress
    with progress(spark, "analyze [1/4] reading journals, per-rebalance accounting, "
                  "per group and hour", show):
        journal = _load_journal(spark, plan)
        try:
            write_tables(spark, facts_rows(journal, facts_calls(spark, plan)), out_dir,
                         opts.cooperative, opts.storm_window_ms, opts.storm_rule.trips_at)
        except Exception as exc:
            raise _spark_input_error(exc, plan) from exc
    # The per-group figures of phase 1 are read by phase 2 only: removed
    # after it, and if anything fails before.
    figures = out_dir / GROUP_FIGURES
    try:
        rebalances = spark.read.parquet(str(tables["rebalances"]))
        generations = _load_generations(spark, plan)
        with progress(spark, "analyze [2/4] per group (with the generations), fleet-wide",
                      show):
            # A small table goes out as one file, in a useful order.
            per_group = spark.read.parquet(str(figures)).select(*_columns(GROUPS_SCHEMA))
            _write(agg.with_generations(per_group, generations)
                   .repartition(1).sortWithinPartitions(
                       F.desc("peak_window_rebalances"), F.desc("rebalances"), "source",
                       "group_id"), tables["groups"])
            hours = spark.read.parquet(str(tables["group_hours"]))
            # Kept for the report, with the FACT_COUNTS and REBALANCE_DURATIONS that
            # fleet_hours/ leaves out.
            fleet_df = agg.fleet_hours(rebalances, hours).repartition(1) \
                .sortWithinPartitions("hour_start_ms").cache()
            _write(fleet_df.select(*agg.fleet_columns()), tables["fleet_hours"])
    finally:
        shutil.rmtree(figures, ignore_errors=True)
    with progress(spark, "analyze [3/4] collecting figures for the report", show):
        fleet = [r.asDict() for r in fleet_df.collect()]
        fleet_df.unpersist()
        data = report_figures(
            fleet, rebalances, hours, spark.read.parquet(str(tables["groups"])), journal,
            top=opts.top, storm=opts.storm_rule,
            move_causes=spark.read.parquet(str(tables["move_causes"])),
            imbalance=spark.read.parquet(str(tables["imbalance"])),
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
