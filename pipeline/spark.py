"""Starting Spark for the pipeline's commands: Java check, session, progress.

``local[*]`` is the default; under ``spark-submit --master URL`` (or with
``--master URL``) the same jobs run on a cluster: the session takes the
submitted master, and groupcoord's own packages are shipped to the executors
as a zip; the executors need the pipeline's dependencies, which
:func:`check_executors` checks first (docs/pipeline.md, "On a cluster").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

MIN_JAVA = 17
_PACKAGES = ("pipeline", "protocol", "client", "coordinator")


def _java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.exists() else None
    return shutil.which("java")


def java_problem() -> str | None:
    """What is wrong with the Java that Spark would use, or ``None`` if it is fine."""
    java = _java_binary()
    install = "install Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)"
    if java is None:
        where = (f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
                 if os.environ.get("JAVA_HOME") else "no `java` on PATH and JAVA_HOME is unset")
        return f"Spark needs Java {MIN_JAVA}+, but {where}: {install}"
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Spark needs Java {MIN_JAVA}+, but `{java} -version` failed ({exc}): {install}"
    text = proc.stderr + proc.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return f"Spark needs Java {MIN_JAVA}+, but `{java} -version` says {text.strip()[:120]!r}"
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_x" is Java 8
        major = int(match.group(2))
    if major < MIN_JAVA:
        return f"Spark needs Java {MIN_JAVA}+, but {java} is Java {major}: {install}"
    return None


def _package_zip() -> str:
    """groupcoord's packages as one zip for ``addPyFile`` (cluster runs only)."""
    root = Path(__file__).resolve().parent.parent
    fd, name = tempfile.mkstemp(prefix="groupcoord-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in _PACKAGES:
            for f in (root / pkg).rglob("*.py"):
                zf.write(f, f.relative_to(root).as_posix())
    return name


#: Spark's own log lines on the driver: errors only, to stderr (``--verbose``:
#: Spark's default, warnings and up). Shipped next to this module.
QUIET_LOG4J = Path(__file__).resolve().parent / "log4j2-quiet.properties"


def session_settings(master: str, conf: Sequence[str] = (), verbose: bool = False
                     ) -> dict[str, str]:
    """The Spark settings of a CLI run on ``master``: ``--conf KEY=VALUE``
    items win over the defaults chosen here."""
    settings: dict[str, str] = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"--conf {item!r}: expected KEY=VALUE")
        settings[key] = value
    # The command prints its own progress lines.
    out = {"spark.ui.showConsoleProgress": "false"}
    if not verbose:
        # Before the JVM logs anything; a -D of the user's own comes later and wins.
        opts = f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
        user = settings.pop("spark.driver.extraJavaOptions", "")
        out["spark.driver.extraJavaOptions"] = f"{opts} {user}".strip()
    local = master.startswith("local")
    if local or _loopback_master(master):
        # Nothing outside this machine takes part: listen on the loopback
        # interface only (not on the address the host name resolves to).
        out |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    if local:
        # Spark's web UI costs ~1 s of start-up; `--conf spark.ui.enabled=true`
        # brings it back.
        out |= {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}
    return out | settings


def session(app: str, master: str | None = None, conf: Sequence[str] = (),
            verbose: bool = False) -> Any:
    """A SparkSession for a CLI run (tests build their own shared one)."""
    problem = java_problem()
    if problem is not None:
        raise PipelineError(problem)
    try:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise PipelineError("pyspark is not installed: pip install 'groupcoord[pipeline]'") \
            from exc
    submitted = SparkConf().get("spark.master")  # set by spark-submit
    chosen = master or submitted or "local[*]"
    settings = session_settings(chosen, conf, verbose)
    local = chosen.startswith("local")
    if local:
        # Workers must run this interpreter (it has the pipeline's packages),
        # not whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).master(chosen)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: say so, not a py4j trace
        raise PipelineError(f"Spark did not start (master {chosen}): {exc}") from exc
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    if not local:
        spark.sparkContext.addPyFile(_package_zip())
    return spark


def _loopback_master(master: str) -> bool:
    """A ``spark://`` master on this machine's loopback interface."""
    hosts = master.removeprefix("spark://").split(",")
    return master.startswith("spark://") and all(
        h.rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]") for h in hosts)


#: What the executors of ``analyze`` import: Arrow, numpy, pandas (PySpark's
#: Arrow UDFs), msgpack and groupcoord's own packages (the shipped zip): the
#: facts job's writer, which imports the rest of what its tasks run.
ANALYZE_MODULES = ("pyarrow", "numpy", "pandas", "msgpack", "pipeline.task_tables")
#: What the executors of ``simulate`` import.
SIMULATE_MODULES = ("msgpack", "pipeline.simcell", "client.assignors")


def probe_imports(modules: Sequence[str]) -> tuple[str, str, tuple[str, ...]]:
    """Runs on an executor: (host, python executable, what of ``modules``
    does not import: the missing module's name, or ``module (error)``)."""
    import importlib
    import socket
    missing: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or a module failing as it loads
            what = (exc.name if isinstance(exc, ModuleNotFoundError) and exc.name
                    else f"{name} ({type(exc).__name__}: {exc})")
            if what not in missing:
                missing.append(what)
    return socket.gethostname(), sys.executable, tuple(missing)


_LOST_TASK = re.compile(r"Lost task \S+ in stage \S+ \(TID \d+\) \((\S+) executor")
_PYTHON_ERROR = re.compile(
    r"(ModuleNotFoundError: No module named '[^']+'|ImportError: [^\n]+|"
    r"Cannot run program \"[^\"]+\"[^\n]*)")


def check_executors(spark: Any, modules: Sequence[str]) -> None:
    """A tiny job (two tasks per core) importing ``modules`` on the executors;
    a PipelineError saying in one line what is missing where (host, python
    executable, module) instead of the failure of the first real task."""
    sc = spark.sparkContext
    slots = max(1, int(sc.defaultParallelism) * 2)
    names = tuple(modules)
    try:
        found = sc.parallelize(range(slots), slots) \
            .map(lambda _: probe_imports(names)).distinct().collect()
    except Exception as exc:
        # The probe itself could not run (no such python, or pyspark's worker
        # or groupcoord's packages do not import): read Spark's message.
        text = str(exc)
        what = _PYTHON_ERROR.search(text)
        host = _LOST_TASK.search(text)
        python = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get(
            "spark.pyspark.python", "python3")
        raise PipelineError(
            f"the executors cannot run the pipeline: on {host.group(1) if host else '?'} "
            f"{python}: {what.group(1) if what else text.splitlines()[0][:300]}"
            f"{_REMEDY}") from exc
    bad = sorted((h, py, miss) for h, py, miss in found if miss)
    if bad:
        where = "; ".join(f"on {h} {py}: missing {', '.join(m)}" for h, py, m in bad)
        raise PipelineError(f"the executors cannot run the pipeline: {where}{_REMEDY}")


_REMEDY = (" (install groupcoord[pipeline] for that python, or ship an environment: "
           "docs/pipeline.md, \"On a cluster\")")


@contextmanager
def progress(spark: Any, label: str, enabled: bool = True) -> Iterator[None]:
    """A progress line for one phase of a job: a tqdm bar over the Spark tasks
    that ran during the block, then ``label: done in N s`` on stderr."""
    start = time.monotonic()
    stop = threading.Event()
    thread: threading.Thread | None = None
    if enabled:
        print(f"{label} ...", file=sys.stderr, flush=True)
        thread = threading.Thread(target=_poll, args=(spark, label, stop), daemon=True)
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        if enabled:
            print(f"{label}: done in {time.monotonic() - start:.1f} s", file=sys.stderr,
                  flush=True)


def _poll(spark: Any, label: str, stop: threading.Event) -> None:
    """A tqdm bar on a terminal; elsewhere (CI logs, files) a line every 15 s."""
    from tqdm import tqdm
    tracker = spark.sparkContext.statusTracker()
    seen: dict[int, tuple[int, int]] = {}
    bar: Any = None
    tty = sys.stderr.isatty()
    last_line = time.monotonic()
    try:
        while not stop.wait(0.5):
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    seen[sid] = (info.numTasks, info.numCompletedTasks)
            if not seen:
                continue
            total = sum(t for t, _ in seen.values())
            done = sum(d for _, d in seen.values())
            if not tty:
                if time.monotonic() - last_line >= 15:
                    last_line = time.monotonic()
                    print(f"  {label}: {done}/{total} tasks", file=sys.stderr, flush=True)
                continue
            if bar is None:
                bar = tqdm(total=total, desc=f"  {label}", unit="task", file=sys.stderr,
                           leave=False, dynamic_ncols=True)
            bar.total = total
            bar.n = done
            bar.refresh()
    except Exception:  # progress is best effort: the job's outcome is what counts
        pass
    finally:
        if bar is not None:
            bar.close()
