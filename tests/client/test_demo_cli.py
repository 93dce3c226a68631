"""``groupcoord demo`` runs start to end, prints ownership changes, and
leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))


def test_demo_settles_after_join_and_kill() -> None:
    proc = subprocess.run(
        [GROUPCOORD, "demo", "--workers", "2", "--partitions", "6",
         "--session-timeout-ms", "1000", "--timeout", "60"],
        capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "coordinator listening on http://127.0.0.1:" in out
    assert "== settled:" in out
    assert "== adding w3" in out
    assert "== kill -9 w1" in out
    # the final table: the two survivors share all six resources
    final = out.split("== kill -9 w1")[1].split("== stopping")[0]
    rows = [line.split(":", 1)[1] for line in final.splitlines()
            if line.startswith("    w")]
    held = sorted(int(i) for row in rows for i in row.strip(" []").split())
    assert held == list(range(6))
    # every process the demo started is gone (their pids were printed)
    pids = [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in out.splitlines()
            if "(pid " in line]
    assert len(pids) == 3
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"pid {pid} still runs"


def _is_zombie(pid: int) -> bool:
    try:
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
