"""``examples/worker.py`` as a process.

Pointed at a URL where nothing listens, it never gets an assignment; SIGTERM
or SIGINT must still stop it within a couple of seconds with status 0, and
its log must back off (not a line per retry) and name the URL once per line,
without the doubled ``join: join:``. Both signals run at the same time to
keep the wall time to one watch.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from client_harness import admin_put_resource
from server_harness import free_port

from client import GroupMember

pytestmark = pytest.mark.timeout(60)

WORKER = str(Path(__file__).resolve().parents[2] / "examples" / "worker.py")
WATCH_S = 5.0
START_WITHIN_S = 30.0  # a bound on a process start, not on anything under test
STOP_WITHIN_S = 2.5
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d (\d\d):(\d\d):(\d\d),(\d{3}) ")


def _seconds(line: str) -> float:
    m = _STAMP.match(line)
    assert m, line
    h, mi, s, ms = (int(g) for g in m.groups())
    return h * 3600 + mi * 60 + s + ms / 1000


class _Stderr(threading.Thread):
    """Collects a worker's stderr lines; ``retrying`` is set at its first report
    of an unreachable coordinator (its signal handlers are in place by then)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.lines: list[str] = []
        self.retrying = threading.Event()
        self.start()

    def run(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "cannot reach the coordinator" in line:
                self.retrying.set()


def test_worker_stops_on_a_signal_before_its_first_assignment() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = {sig: subprocess.Popen([sys.executable, WORKER, "--url", url, "--name", "w1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=env)
             for sig in (signal.SIGTERM, signal.SIGINT)}
    stderr = {sig: _Stderr(proc) for sig, proc in procs.items()}
    try:
        # The watch starts once both retry: the interpreter's start and the
        # imports are not timed (seconds on a loaded machine).
        for sig, reader in stderr.items():
            assert reader.retrying.wait(START_WITHIN_S), (sig.name, reader.lines)
        time.sleep(WATCH_S)  # retrying all along: nothing listens there
        sent = time.monotonic()
        for sig, proc in procs.items():
            assert proc.poll() is None, f"the worker exited by itself ({sig.name})"
            proc.send_signal(sig)
        outputs = {}
        for sig, proc in procs.items():
            proc.wait(timeout=STOP_WITHIN_S + 5)
            assert time.monotonic() - sent < STOP_WITHIN_S, f"{sig.name}: not prompt"
            stderr[sig].join(5)
            assert proc.returncode == 0, (sig.name, proc.returncode, stderr[sig].lines)
            outputs[sig] = stderr[sig].lines
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for sig, lines in outputs.items():
        assert not [ln for ln in lines if "Traceback" in ln], lines
        assert not [ln for ln in lines if "join: join:" in ln], lines
        reports = [ln for ln in lines if "cannot reach the coordinator" in ln]
        assert all(ln.count(url) == 1 for ln in reports), reports
        # ~15 attempts in the watch, reported at about 0, 1 and 3 s: the log backs off
        assert 2 <= len(reports) <= 4, reports
        gaps = [b - a for a, b in itertools.pairwise(map(_seconds, reports))]
        assert all(later > earlier for earlier, later in itertools.pairwise(gaps)), gaps
        assert any(f"{sig.name}: stopping" in ln for ln in lines), lines
        assert lines[-1].endswith("w1 stopped"), lines[-3:]


SLOW_WORKER = str(Path(__file__).resolve().parent / "slow_handover_worker.py")


async def test_sigint_during_a_slow_hand_over_keeps_every_final_commit(
        start_server: Any, tmp_path: Path) -> None:
    # The reported case, with real processes: the worker's on_revoked takes 4 s
    # and commits at its end; a new member starts a rebalance, and the worker
    # gets SIGINT while it revokes. The close's on_revoked follows the
    # rebalance's at once: 8 s of callbacks, longer than the 6 s session.
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "shards", 4)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REVOKE_S": "4"}
    proc = subprocess.Popen([sys.executable, SLOW_WORKER, "--url", server.url, "--name", "w1",
                             "--session-timeout-ms", "6000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    reader = _Stderr(proc)
    newcomer = GroupMember(server.url, "indexers", ["shards"], client_id="b",
                           session_timeout_ms=6_000)
    try:
        await _until(lambda: any("w1 owns shards[0], shards[1], shards[2], shards[3]" in line
                                 for line in reader.lines), START_WITHIN_S, reader)
        await asyncio.sleep(1.5)  # some progress on every resource (a tick is 0.1 s)
        newcomer.start()
        await _until(lambda: any("w1 revoking" in line for line in reader.lines), 20, reader)
        await asyncio.sleep(1)
        proc.send_signal(signal.SIGINT)
        status = await asyncio.to_thread(proc.wait, 30)
        await asyncio.to_thread(reader.join, 5)
        assert status == 0, reader.lines
        assert not [line for line in reader.lines if "Traceback" in line or "raised" in line]
        assert not [line for line in reader.lines
                    if "not stored" in line or "without its final checkpoint" in line]
        handed = {r for line in reader.lines if "w1 handed over" in line
                  for r in re.findall(r"shards\[(\d)\]", line)}
        assert handed == {"0", "1", "2", "3"}, reader.lines
        await _until(lambda: len(newcomer.assignment) == 4, 30, reader)
        checkpoints = await newcomer.fetch()
        assert set(checkpoints) == {("shards", i) for i in range(4)}
        assert all(isinstance(v, int) and v > 0 for v in checkpoints.values()), checkpoints
    finally:
        await newcomer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


async def _until(predicate: Any, timeout_s: float, reader: _Stderr) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, reader.lines
        await asyncio.sleep(0.05)
