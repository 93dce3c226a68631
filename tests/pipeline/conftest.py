"""One SparkSession for every pipeline test: local[2], no UI, bound to 127.0.0.1;
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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
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
