"""The README's worker, run as written, against a real ``groupcoord serve``.

Its ``async with`` waits for the first assignment; the signal handlers the
README shows must stop it before then too: SIGTERM while its join waits for
the group (a long ``initial_rebalance_delay_ms`` keeps it waiting) ends the
process at once, quietly, with status 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from server_harness import StartServer, wait_until

pytestmark = pytest.mark.timeout(120)

README = Path(__file__).resolve().parents[2] / "README.md"
#: a bound on the process's exit after the signal (a leave is not even due: it never joined).
STOP_WITHIN_S = 5.0


def readme_worker() -> str:
    """The README's worker example: the Python block after "A worker embeds the client"."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index("A worker embeds the client"):]
    found = re.search(r"```python\n(.*?)```", after, re.S)
    assert found is not None
    return found.group(1)


def groups(admin_url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{admin_url}/v1/groups", timeout=10) as answer:
        doc: dict[str, list[dict[str, object]]] = json.loads(answer.read())
    return doc["groups"]


def test_the_readme_worker_stops_on_sigterm_before_its_first_assignment(
        start_server: StartServer, tmp_path: Path) -> None:
    server = start_server(initial_rebalance_delay_ms=60_000)
    code = readme_worker()
    assert "http://127.0.0.1:9080" in code
    script = tmp_path / "worker.py"
    script.write_text(code.replace("http://127.0.0.1:9080", server.url), encoding="utf-8")
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": root})
    try:
        # Its join is parked at the coordinator: the group exists, nobody is assigned.
        assert wait_until(lambda: any(g["group_id"] == "indexers"
                                      for g in groups(server.admin_url)), 30)
        assert proc.poll() is None
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert took < STOP_WITHIN_S, took
    assert "Traceback" not in err, err
