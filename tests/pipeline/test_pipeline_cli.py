"""The pipeline's command line as a user meets it: what to install when the
`pipeline` extra is missing, Spark's own log lines kept out of the way, the
driver on 127.0.0.1 for local masters."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pipeline_journal_builder import EAGER, write_db

from pipeline.spark import QUIET_LOG4J, session_settings

ROOT = Path(__file__).resolve().parents[2]

#: Runs the CLI with some top-level packages made unimportable, as on a
#: machine where `pip install groupcoord` went without the extra.
BLOCKING = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from coordinator.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_all([args], cwd)[0]


def run_all(commands: list[list[str]], cwd: Path,
            timeout: float = 600) -> list[subprocess.CompletedProcess[str]]:
    """Runs the commands at the same time (their output to files: a pipe that
    is not read while the other command runs could fill); each is killed
    past ``timeout``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    with contextlib.ExitStack() as files:
        outputs = [(files.enter_context(tempfile.TemporaryFile("w+")),
                    files.enter_context(tempfile.TemporaryFile("w+"))) for _ in commands]
        procs = [subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, text=True,
                                  stdout=out, stderr=err)
                 for args, (out, err) in zip(commands, outputs, strict=True)]
        try:
            for proc in procs:
                proc.wait(timeout=timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        done = []
        for args, proc, (out, err) in zip(commands, procs, outputs, strict=True):
            out.seek(0)
            err.seek(0)
            done.append(subprocess.CompletedProcess(args, proc.returncode, out.read(),
                                                    err.read()))
    return done


@pytest.mark.parametrize(("command", "blocked", "named"), [
    (["analyze", "{db}", "-o", "{out}"], "numpy,pyspark",
     "missing pyspark, numpy, pandas, matplotlib"),  # (pandas and matplotlib need numpy)
    (["simulate", str(ROOT / "pipeline" / "sweeps" / "tiny.toml"), "-o", "{out}"], "pyspark",
     "missing pyspark"),
    (["journal", "export", "{db}", "-o", "{out}"], "pyarrow", "missing pyarrow"),
])
def test_without_the_pipeline_extra_one_line_says_what_to_install(
        tmp_path: Path, command: list[str], blocked: str, named: str) -> None:
    db = write_db(tmp_path / "coord.db", EAGER)
    args = [a.format(db=db, out=tmp_path / "out") for a in command]
    proc = run(["-c", BLOCKING, blocked, *args], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    name = "journal export" if command[0] == "journal" else command[0]
    assert proc.stderr.splitlines() == [
        f"groupcoord {name}: error: needs the pipeline's packages, {named}: "
        "pip install 'groupcoord[pipeline]'"], proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.spark  # the command line starts Spark: with the other Spark tests (tests/conftest.py)
def test_spark_log_lines_are_quiet_unless_verbose(tmp_path: Path) -> None:
    db = write_db(tmp_path / "coord.db", EAGER)
    cli = ["-m", "coordinator.cli", "analyze", str(db), "--master", "local[1]",
           "--conf", "spark.sql.shuffle.partitions=1"]
    # Both at once (two JVMs of local[1]: the wall time of the Spark tests' worker).
    quiet, loud = run_all([[*cli, "-o", str(tmp_path / "quiet")],
                           [*cli, "-o", str(tmp_path / "loud"), "--verbose"]], tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    # The JVM's own notice about the vector module is printed by java before
    # any logging exists; everything else is our progress lines.
    lines = [ln for ln in quiet.stderr.splitlines()
             if not ln.startswith("WARNING: Using incubator modules")]
    assert lines and all(ln.lstrip().startswith("analyze [") for ln in lines), \
        quiet.stderr[-3000:]
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert any(not ln.lstrip().startswith(("analyze [", "WARNING: Using incubator"))
               for ln in loud.stderr.splitlines()), loud.stderr[-3000:]


def test_local_and_loopback_masters_bind_the_driver_to_127_0_0_1() -> None:
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    for master in ("local[2]", "local[*]", "spark://127.0.0.1:7077", "spark://localhost:7077"):
        settings = session_settings(master)
        assert loopback.items() <= settings.items(), master
    remote = session_settings("spark://head:7077")
    assert "spark.driver.host" not in remote and "spark.driver.bindAddress" not in remote
    # --conf wins; the quiet log configuration goes first, a user's -D after it.
    mine = session_settings("local[2]", ["spark.driver.host=10.0.0.5",
                                         "spark.driver.extraJavaOptions=-Dx=1"])
    assert mine["spark.driver.host"] == "10.0.0.5"
    assert mine["spark.driver.extraJavaOptions"] == \
        f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()} -Dx=1"
    assert QUIET_LOG4J.is_file()
    assert "spark.driver.extraJavaOptions" not in session_settings("local[2]", verbose=True)
