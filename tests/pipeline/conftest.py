"""One SparkSession for every pipeline test, and one per run under pytest-xdist
(checked): local[2], no UI, bound to 127.0.0.1;
and, for the tests that ask for it, a Spark standalone cluster on 127.0.0.1
(the CLI runs against it in a subprocess: one SparkContext per JVM)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pipeline_standalone import Standalone, standalone_cluster

from pipeline.spark import java_problem


def _first_session_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under pytest-xdist, fail unless this worker is the first of the run to
    start the tests' SparkSession: tests/conftest.py gives every test that
    asks for this fixture (or ``standalone``, or is marked ``spark``) to one
    worker; a second session (a second JVM) means it did not."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    # Each worker's base temporary directory is <the run's>/popen-<worker>.
    claim = tmp_path_factory.getbasetemp().parent / "spark-session-worker"
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        fd = -1
    if fd < 0:
        pytest.fail(f"worker {worker} would start a second SparkSession in this run (worker "
                    f"{claim.read_text()} has one): the Spark tests were split between "
                    f"workers (tests/conftest.py, pytest_xdist_make_scheduler)", pytrace=False)
    with os.fdopen(fd, "w") as f:
        f.write(worker)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
    _first_session_of_the_run(tmp_path_factory)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("groupcoord-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# ---------------------------------------------------------------- a standalone cluster


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A master and one worker from the PySpark installation, started for the
    tests that ask for it, stopped at the end (pipeline_standalone.py)."""
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
    try:
        with standalone_cluster(tmp_path_factory.mktemp("standalone")) as cluster:
            yield cluster
    except RuntimeError as exc:
        pytest.fail(str(exc))
