"""Starting the real ``groupcoord serve`` process from tests and benchmarks.

Importable by any test (``from server_harness import ServerProcess``); the
``start_server`` fixture in ``conftest.py`` wraps it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

#: the ``groupcoord`` script of the interpreter running the tests.
GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))
#: how long a server may take to print its listening line: a bound on a process
#: start, not on anything under test (several pytest-xdist workers share 2 cores).
READY_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"^listening on (https?)://([^:\s]+):(\d+)\s*$")
_ADMIN_LISTENING = re.compile(r"^admin listening on (https?://[^:\s]+:\d+)\s*$")

#: settings that keep a test's server fast unless the test says otherwise.
FAST_SETTINGS = {
    "initial_rebalance_delay_ms": 0,
    "min_session_timeout_ms": 100,
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One ``groupcoord serve`` child process.

    ``url`` is its protocol listener (the workers' calls), ``admin_url`` its
    admin listener (admin API, ``/metrics``, ``/healthz``, ``/readyz``); both
    on free ports unless the settings name them.
    """

    def __init__(self, db: Path, settings: dict[str, object], env: dict[str, str] | None = None,
                 timeout_s: float = READY_TIMEOUT_S) -> None:
        self.db = db
        args = [GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--db", str(db)]
        if "admin_port" not in settings:
            args += ["--admin-port", "0"]
        for name, value in settings.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        self.args = args
        self.stderr_lines: list[str] = []
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        # stderr is drained on a thread so a chatty server never blocks on a full pipe.
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        self.admin_url = ""
        self.scheme, self.host, self.port = self._wait_ready(timeout_s)
        self.url = f"{self.scheme}://{self.host}:{self.port}"

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def _wait_ready(self, timeout_s: float) -> tuple[str, str, int]:
        assert self.proc.stdout is not None
        found: list[tuple[str, str, int]] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                admin = _ADMIN_LISTENING.match(line)
                if admin:  # printed just before the protocol line
                    self.admin_url = admin.group(1)
                    continue
                m = _LISTENING.match(line)
                if m:
                    found.append((m.group(1), m.group(2), int(m.group(3))))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self.kill()
            raise RuntimeError(f"groupcoord serve did not get ready within {timeout_s}s "
                               f"(exit {self.proc.poll()}); stderr:\n"
                               + "\n".join(self.stderr_lines[-30:]))
        return found[0]

    @property
    def stderr(self) -> str:
        """What the server wrote to stderr so far; all of it once it has exited
        (the draining thread is waited for: its last lines may still be on the way)."""
        if self.proc.poll() is not None:
            self._stderr_thread.join(10)
        return "\n".join(self.stderr_lines)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to the database."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def running(self) -> bool:
        return self.proc.poll() is None


StartServer = Callable[..., ServerProcess]


def call(server: ServerProcess, api: str, body: dict[str, Any],
         timeout_s: float = 30.0) -> dict[str, Any]:
    """One protocol call (``POST /v1/{api}``, msgpack) to ``server``'s protocol
    listener; its decoded answer."""
    req = urllib.request.Request(f"{server.url}/v1/{api}", data=msgpack.packb(body),
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=timeout_s) as answer:
        doc: dict[str, Any] = msgpack.unpackb(answer.read())
    return doc


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0,
               interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; for processes outside the test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
