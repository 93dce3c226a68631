"""``groupcoord analyze``, ``groupcoord simulate`` and ``groupcoord journal export``.

Registered by coordinator/cli.py. Nothing heavy is imported here (no pyspark,
pyarrow or matplotlib): each command imports its job when it runs, so
``groupcoord --help`` stays fast and a coordinator host can export its journal
without Java.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from coordinator.core.storm import STORM_RULE
from pipeline.report import counted


def _spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=None,
                   help="Spark master URL (default: the one spark-submit set, else local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, repeatable (e.g. spark.driver.memory=4g)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (progress lines still go to stderr)")
    p.add_argument("--verbose", action="store_true",
                   help="also show Spark's own log lines (warnings and up; default: errors)")


#: What each command imports (the `pipeline` extra of pyproject.toml).
_NEEDS = {"analyze": ("pyspark", "pyarrow", "numpy", "pandas", "matplotlib", "tqdm"),
          "simulate": ("pyspark", "pyarrow", "pandas", "matplotlib", "tqdm"),
          "journal export": ("pyarrow",)}


def _missing_packages(command: str) -> str | None:
    """One line naming what the command needs and is not installed, or None."""
    import importlib
    missing = []
    for name in _NEEDS[command]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return None
    return (f"needs the pipeline's packages, missing {', '.join(missing)}: "
            "pip install 'groupcoord[pipeline]'")


def register(subparsers: Any) -> None:
    analyze = subparsers.add_parser(
        "analyze", help="rebalance journals -> Parquet tables and an HTML report (Spark)",
        description="Analyse rebalance journals: coordinator databases (SQLite files, "
                    "PostgreSQL URLs) and/or directories written by `groupcoord journal "
                    "export`. Writes Parquet tables and report.html to OUT "
                    "(docs/pipeline.md).")
    analyze.add_argument("inputs", nargs="+", metavar="INPUT",
                         help="a coordinator database (SQLite file, sqlite:///PATH or "
                              "postgresql://USER@HOST:PORT/DB), or an export directory")
    analyze.add_argument("-o", "--out", required=True, help="output directory")
    analyze.add_argument("--storm-window", type=float, default=STORM_RULE.window_ms / 1000,
                         metavar="SECONDS",
                         help="window of the rebalance-storm rule (default "
                              f"{STORM_RULE.window_ms // 1000}; the coordinator's "
                              "--health-window-ms)")
    analyze.add_argument("--storm-threshold", type=int, default=STORM_RULE.rebalances,
                         metavar="N",
                         help="rebalances within the window that make a storm (default "
                              f"{STORM_RULE.rebalances}, 0: never; the coordinator's "
                              "--health-storm-rebalances)")
    analyze.add_argument("--cooperative", action="append", default=[], metavar="PROTOCOL",
                         help="also treat this protocol (assignor) name as cooperative")
    analyze.add_argument("--top", type=int, default=20, help="worst groups in the report")
    _spark_options(analyze)
    analyze.set_defaults(func=_run_analyze)

    simulate = subparsers.add_parser(
        "simulate", help="sweep the assignors over group shapes and churn (Spark)",
        description="Run a sweep described by a TOML file (pipeline/sweeps/*.toml): every "
                    "cell is a pure simulation with the real assignors. Writes Parquet and "
                    "report.html to OUT.")
    simulate.add_argument("sweep", help="sweep TOML file (e.g. pipeline/sweeps/"
                                        "bench_scenarios.toml)")
    simulate.add_argument("-o", "--out", required=True, help="output directory")
    simulate.add_argument("--full", action="store_true",
                          help="full sizes (the TOML's [full] table) instead of the shrunk ones")
    simulate.add_argument("--limit", type=int, default=None,
                          help="run only the first N cells (a quick look)")
    _spark_options(simulate)
    simulate.set_defaults(func=_run_simulate)

    journal = subparsers.add_parser("journal", help="rebalance journal tools")
    jsub = journal.add_subparsers(dest="journal_command", metavar="COMMAND", required=True)
    export = jsub.add_parser(
        "export", help="coordinator database's journal -> Parquet (for `groupcoord analyze`)",
        description="Write the rebalance journal and generations of coordinator databases "
                    "(SQLite files or PostgreSQL URLs) as Parquet under OUT/journal and "
                    "OUT/generations. Needs no Java.")
    export.add_argument("databases", nargs="+", metavar="DB",
                        help="coordinator database: SQLite file, sqlite:///PATH or "
                             "postgresql://USER@HOST:PORT/DB (password: PGPASSWORD or "
                             "~/.pgpass rather than in the URL)")
    export.add_argument("-o", "--out", required=True, help="export directory (shared storage)")
    export.add_argument("--source", default=None,
                        help="name of the coordinator the rows come from (default: the file "
                             "name without extension, or the PostgreSQL database's name); "
                             "only with one DB")
    export.set_defaults(func=_run_export)


def _fail(command: str, message: str) -> int:
    print(f"groupcoord {command}: error: {message}", file=sys.stderr)
    return 2


def _run_analyze(args: argparse.Namespace) -> int:
    missing = _missing_packages("analyze")
    if missing:
        return _fail("analyze", missing)
    from pipeline.errors import PipelineError
    try:
        from pipeline.analyze import AnalyzeOptions, run_from_cli
        options = AnalyzeOptions(
            storm_window_ms=int(args.storm_window * 1000),
            storm_threshold=args.storm_threshold,
            cooperative=tuple(args.cooperative),
            top=args.top,
            progress=not args.no_progress,
        )
        result = run_from_cli(args.inputs, args.out, options, args.master, args.conf,
                              verbose=args.verbose)
    except PipelineError as exc:
        return _fail("analyze", str(exc))
    print(f"{counted(result.rebalances, 'rebalance')} of {counted(result.groups, 'group')} "
          f"analysed; report: {result.report}")
    return 0


def _run_simulate(args: argparse.Namespace) -> int:
    missing = _missing_packages("simulate")
    if missing:
        return _fail("simulate", missing)
    from pipeline.errors import PipelineError
    try:
        from pipeline.simulate import run_from_cli
        result = run_from_cli(args.sweep, args.out, full=args.full, limit=args.limit,
                              master=args.master, conf=args.conf,
                              progress=not args.no_progress, verbose=args.verbose)
    except PipelineError as exc:
        return _fail("simulate", str(exc))
    print(f"{counted(result.cells, 'cell')} simulated ({result.failed} failed); "
          f"report: {result.report}")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    missing = _missing_packages("journal export")
    if missing:
        return _fail("journal export", missing)
    from pipeline.errors import PipelineError
    from pipeline.sources import export, open_database
    if args.source is not None and len(args.databases) > 1:
        return _fail("journal export", "--source names one coordinator: give one DB with it")
    try:
        journals = [open_database(db, args.source) for db in args.databases]
        names = [j.source for j in journals]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PipelineError(f"two databases would both be source {dupes[0]!r}: export "
                                "them one at a time with --source NAME")
        for j in journals:
            res = export(j, args.out)
            print(f"{j.name}: {counted(res.journal_rows, 'journal row')}, "
                  f"{counted(res.generation_rows, 'generation')} -> {args.out} "
                  f"(source {j.source!r})")
    except PipelineError as exc:
        return _fail("journal export", str(exc))
    return 0
