"""``benchmarks/simulate_groups.py --coverage``: the line coverage of the production
step objects the simulator drives, measured in each worker process and combined."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from simulate_groups import ROOT, FileCoverage, coverage_table, covered_files


def test_the_table_names_each_file_its_cover_and_those_under_the_target() -> None:
    table = coverage_table([FileCoverage("a/machine.py", 10, (3, 4, 5, 9)),
                            FileCoverage("a/effects.py", 4, ())], show_missing=True)
    lines = table.splitlines()
    assert re.search(r"a/machine\.py\s+10\s+4\s+60\.0%\s+< 80 %", lines[1]), table
    assert lines[2].strip() == "missing: 3-5, 9"
    assert re.search(r"a/effects\.py\s+4\s+0\s+100\.0%$", lines[3]), table
    assert lines[-1] == "under 80 %: a/machine.py"


def test_the_covered_files_are_the_runtime_the_member_and_the_partition_host() -> None:
    names = {str(f.relative_to(ROOT)) for f in covered_files()}
    assert {"coordinator/runtime/runtime.py", "coordinator/runtime/machine.py",
            "coordinator/runtime/effects.py",
            "coordinator/runtime/commits.py", "client/member_state/driver.py",
            "client/member_state/machine.py", "coordinator/cluster/host_machine.py"} <= names
    assert "client/member.py" in names
    assert "coordinator/cluster/host.py" in names
    assert "client/routing.py" in names


def test_coverage_over_two_worker_processes_is_combined() -> None:
    """A few seeds on two spawned workers, each measuring from before it imports the
    simulator: every file listed, the machines measured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "simulate_groups.py"), "--seeds", "4",
         "--jobs", "2", "--coverage"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    cover = {m.group(1): float(m.group(2))
             for m in re.finditer(r"^(\S+\.py)\s+\d+\s+\d+\s+([\d.]+)%", out.stdout, re.M)}
    assert set(cover) == {str(f.relative_to(ROOT)) for f in covered_files()}, out.stdout
    assert cover["coordinator/runtime/machine.py"] > 30
    assert cover["coordinator/runtime/runtime.py"] > 30
    assert cover["client/member.py"] > 30
    assert cover["client/member_state/driver.py"] > 50
    assert cover["coordinator/runtime/effects.py"] == 100.0
    assert "under 80 %:" in out.stdout
    assert "violations found: 0" in out.stdout
