"""Both listeners of an in-process server, for tests (coordinator.http.listeners).

``serve_in_process(runtime, metrics, ...)`` starts the protocol and admin
listeners on free ports of 127.0.0.1 and yields a :class:`InProcess`, whose
``post``/``get``/``put``/``delete``/``request`` take a path, as aiohttp's
``TestClient`` does, and send it to the listener that serves it: a protocol
call (``POST /v1/<api>``) to the protocol listener, anything else to the
admin listener. ``url`` and ``admin_url`` name each for tests that mean one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from coordinator.auth import TokenStore
from coordinator.http.listeners import Listeners
from coordinator.metrics import Metrics
from coordinator.runtime.runtime import Runtime
from protocol.limits import DEFAULT_MAX_METADATA_BYTES
from protocol.messages import APIS

PROTOCOL_PATHS = frozenset(f"/v1/{api}" for api in APIS)


class InProcess:
    """A running server's two listeners and a client session for them."""

    def __init__(self, listeners: Listeners, url: str, admin_url: str, port: int,
                 admin_port: int, session: aiohttp.ClientSession) -> None:
        self.listeners = listeners
        self.url = url
        self.admin_url = admin_url
        #: the protocol listener's port (raw-socket tests).
        self.port = port
        self.admin_port = admin_port
        self.session = session

    def url_for(self, method: str, path: str) -> str:
        protocol = method.upper() == "POST" and path.partition("?")[0] in PROTOCOL_PATHS
        return (self.url if protocol else self.admin_url) + path

    # Plain methods returning aiohttp's request object, which is both awaitable
    # (``resp = await tc.get(...)``) and an async context manager (``async with
    # tc.get(...) as resp``), as aiohttp's TestClient methods are.
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.session.request(method, self.url_for(method, path), **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Any:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)


@asynccontextmanager
async def serve_in_process(runtime: Runtime, metrics: Metrics, *, max_body_bytes: int,
                           max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
                           tokens: TokenStore | None = None, timeout_s: float = 30.0,
                           admin_names: frozenset[str] = frozenset()
                           ) -> AsyncIterator[InProcess]:
    """Both listeners of ``runtime`` (started or not: the caller starts and stops it)."""
    listeners = Listeners(runtime, metrics, max_body_bytes=max_body_bytes,
                          max_metadata_bytes=max_metadata_bytes, tokens=tokens,
                          admin_names=admin_names)
    protocol, admin = await listeners.start("127.0.0.1", 0, "127.0.0.1", 0)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        yield InProcess(listeners, protocol.url, admin.url, protocol.port, admin.port, session)
    finally:
        await session.close()
        listeners.close()
        await listeners.stop(1.0)
