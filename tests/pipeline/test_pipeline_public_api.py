"""The pipeline uses Spark's public API only: no py4j handles of PySpark's
internals (``df._jdf``, ``column._jc``, ``sc._jvm``, ``sc._jsc``), which
change between Spark versions without notice."""

from __future__ import annotations

import re
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
PRIVATE = re.compile(r"\._jdf\b|\._jc\b|\._jvm\b|_jsc\b|\._jgd\b|\._jsparkSession\b|"
                     r"queryExecution|pyspark\.sql\.pandas\.types|PythonEvalType")


def test_no_private_spark_api_in_the_pipeline() -> None:
    found = [f"{f.relative_to(PIPELINE.parent)}:{n}: {line.strip()}"
             for f in sorted(PIPELINE.rglob("*.py"))
             for n, line in enumerate(f.read_text().splitlines(), start=1)
             if PRIVATE.search(line)]
    assert found == []


def test_the_check_finds_what_it_looks_for() -> None:
    for line in ("DataFrame(df._jdf.mapInArrow(column._jc, False, None), s)",
                 "spark.sparkContext._jvm.org.apache", "sc._jsc.hadoopConfiguration()",
                 "journal._jdf.queryExecution().optimizedPlan()"):
        assert PRIVATE.search(line), line
