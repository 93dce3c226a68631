"""A Spark standalone cluster for the tests (tests/pipeline/conftest.py
``standalone``): a master and one worker started with ``bin/spark-class``
from the PySpark installation (SPARK_HOME = pyspark's package directory),
on 127.0.0.1 with free ports, bounded to 2 cores and 1 GiB."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Standalone:
    """A Spark standalone master and one worker on 127.0.0.1."""

    url: str           # spark://127.0.0.1:PORT
    web_port: int      # the master's web UI (its /json/ says which workers are alive)
    spark_home: Path
    logs: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _alive_workers(web_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=2) as r:
            state = json.load(r)
    except OSError:
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):  # the worker first (it would try to reconnect)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)  # its own session: spark-class and its JVM
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@contextmanager
def standalone_cluster(logs: Path, ready_s: float = 120) -> Iterator[Standalone]:
    """Start the master and the worker, wait until the master lists the
    worker as alive, stop both on exit. Raises RuntimeError (with the logs'
    tails) when they do not come up."""
    import pyspark
    home = Path(pyspark.__file__).resolve().parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / "work"),
           "SPARK_NO_DAEMONIZE": "1",
           # No REST submission server: it listens on the fixed port 6066.
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    port, web = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in (
                ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(web)]),
                ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                            "--port", str(_free_port()), "--webui-port", str(_free_port()),
                            "--cores", "2", "--memory", "1g",
                            "--work-dir", str(logs / "work"), url])):
            with (logs / f"{name}.log").open("wb") as out:
                procs.append(subprocess.Popen(
                    [str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + ready_s
        while _alive_workers(web) < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tail = "".join((logs / f"{n}.log").read_text()[-2000:]
                               for n in ("master", "worker"))
                raise RuntimeError(f"the standalone cluster did not come up:\n{tail}")
            time.sleep(0.5)
        yield Standalone(url, web, home, logs)
    finally:
        _stop(procs)
