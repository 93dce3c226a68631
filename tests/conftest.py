"""Shared fixtures: free ports and the real ``groupcoord serve`` process.

``start_server`` (a fixture returning a factory) starts ``groupcoord serve
--host 127.0.0.1 --port 0 --db <file>`` with the given extra settings, waits
for its ``listening on http://HOST:PORT`` line and returns a
:class:`ServerProcess`; every process a test started is stopped when the
test ends (SIGKILL if still running). Small timeouts keep tests fast::

    async def test_x(start_server, tmp_path):
        server = start_server(tmp_path / "g.db", initial_rebalance_delay_ms=0)
        ... server.url ...
        assert server.terminate() == 0
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_harness import pg_url, postgres_server
from server_harness import FAST_SETTINGS, ServerProcess, StartServer

# One PostgreSQL per test session (per xdist worker) for every suite that needs one.
__all__ = ["pg_url", "postgres_server"]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """A factory: ``start_server(db=None, env=None, **settings) -> ServerProcess``."""
    started: list[ServerProcess] = []

    def start(db: Path | None = None, env: dict[str, str] | None = None,
              **settings: object) -> ServerProcess:
        server = ServerProcess(db or tmp_path / "groupcoord.db",
                               {**FAST_SETTINGS, **settings}, env)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.running():
            server.kill()
