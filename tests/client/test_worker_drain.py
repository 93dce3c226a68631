"""``examples/worker.py`` drains on SIGTERM: with another member in the group,
it hands every resource over (final commits stored), leaves and exits 0; the
other member ends owning everything, resuming from those commits."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from client_harness import admin_put_resource
from test_worker_example import WORKER, _Stderr

from client import GroupMember

pytestmark = pytest.mark.timeout(90)


async def test_sigterm_drains_the_worker_then_it_leaves(start_server: Any,
                                                        tmp_path: Path) -> None:
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "shards", 4)
    proc = subprocess.Popen([sys.executable, WORKER, "--url", server.url, "--name", "w1",
                             "--session-timeout-ms", "6000", "--drain-timeout-s", "20"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    reader = _Stderr(proc)
    other = GroupMember(server.url, "indexers", ["shards"], client_id="b",
                        session_timeout_ms=6_000)
    try:
        deadline = time.monotonic() + 30
        while not any("w1 owns shards[0]" in ln for ln in reader.lines):
            assert time.monotonic() < deadline, reader.lines
            await asyncio.sleep(0.05)
        await other.__aenter__()
        while len(other.assignment) != 2:
            assert time.monotonic() < deadline + 30, reader.lines
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # some progress on every resource (a tick is 0.1 s)
        proc.send_signal(signal.SIGTERM)
        status = await asyncio.to_thread(proc.wait, 30)
        await asyncio.to_thread(reader.join, 5)
        assert status == 0, reader.lines
        assert any("w1 drained: handed everything over" in ln for ln in reader.lines), \
            reader.lines
        assert not [ln for ln in reader.lines if "Traceback" in ln or "not stored" in ln]
        since = next(i for i, ln in enumerate(reader.lines) if "SIGTERM: stopping" in ln)
        handed = {r for ln in reader.lines[since:] if "w1 handed over" in ln
                  for r in re.findall(r"shards\[(\d)\]", ln)}
        assert len(handed) == 2, reader.lines
        while len(other.assignment) != 4:
            assert time.monotonic() < deadline + 60, reader.lines
            await asyncio.sleep(0.05)
        checkpoints = await other.fetch({("shards", int(i)) for i in handed})
        assert all(isinstance(v, int) and v > 0 for v in checkpoints.values()), checkpoints
    finally:
        await other.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
