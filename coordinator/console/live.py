"""Live updates of the console's pages: server-sent events of re-rendered fragments.

A page marks its live parts (``<div id="live-..." data-live>``). Its event
stream (``GET /console/events?page=...``) renders the same fragments on the
server every :data:`TICK_S` seconds and sends a fragment only when its HTML
changed, as one ``fragment`` event ``{"id", "digest", "html"}``; the page's
script swaps it in. A change therefore shows within one tick plus the
transfer, well under the 2 s the console promises.

Bounds: at most ``max_streams`` streams are open at once (another one is
answered 503 and the page says live updates are off); a stream ends when its
client goes away (the write fails, or aiohttp cancels the handler), when its
sign-in session ends, and when the server shuts down (``on_shutdown`` sets
:attr:`LiveStreams.stopping`; every stream ends within one tick), so
``groupcoord serve`` still stops promptly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger("groupcoord.console")

#: seconds between two renderings of a live page.
TICK_S = 0.5
#: an idle stream sends a comment this often, so proxies and the browser keep it.
KEEPALIVE_S = 15.0
#: the browser's reconnection delay after a dropped stream (EventSource ``retry``).
RETRY_MS = 2000
#: open event streams at most.
MAX_STREAMS = 32

Fragments = dict[str, str]
Render = Callable[[], Awaitable[Fragments]]


def digest(html: str) -> str:
    """A short fingerprint of a fragment: the page carries it, the stream compares it."""
    return hashlib.blake2b(html.encode("utf-8"), digest_size=12).hexdigest()


def event(name: str, data: object) -> bytes:
    """One server-sent event; ``data`` as JSON on one line (JSON escapes newlines)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class LiveStreams:
    """The open event streams of one console."""

    def __init__(self, max_streams: int = MAX_STREAMS, tick_s: float = TICK_S) -> None:
        self.max_streams = max_streams
        self.tick_s = tick_s
        self.open = 0
        self.stopping = asyncio.Event()

    async def stop(self, _app: web.Application | None = None) -> None:
        """End every stream (the console's ``on_shutdown``)."""
        self.stopping.set()

    async def serve(self, request: web.Request, render: Render,
                    still_allowed: Callable[[], str | None]) -> web.StreamResponse:
        """Stream ``render()``'s changed fragments until the client, the session
        (``still_allowed`` returns why it ended) or the server stops."""
        if self.stopping.is_set():
            raise web.HTTPServiceUnavailable(text="the server is shutting down")
        if self.open >= self.max_streams:
            raise web.HTTPServiceUnavailable(
                text=f"too many live pages open (at most {self.max_streams}); "
                     "close one or reload later")
        self.open += 1
        try:
            response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a buffering reverse proxy would hold events
            })
            await response.prepare(request)
            await response.write(f"retry: {RETRY_MS}\n\n".encode())
            await self._run(response, render, still_allowed)
            return response
        finally:
            # Also when the client went away: a failed write (ConnectionResetError)
            # or aiohttp cancelling the handler.
            self.open -= 1

    async def _run(self, response: web.StreamResponse, render: Render,
                   still_allowed: Callable[[], str | None]) -> None:
        sent: dict[str, str] = {}
        last_write = time.monotonic()
        while not self.stopping.is_set():
            ended = still_allowed()
            if ended is not None:
                await response.write(event("end", {"message": ended}))
                return
            for fragment_id, html in (await render()).items():
                mark = digest(html)
                if sent.get(fragment_id) != mark:
                    await response.write(event("fragment", {"id": fragment_id, "digest": mark,
                                                            "html": html}))
                    sent[fragment_id] = mark
                    last_write = time.monotonic()
            if time.monotonic() - last_write >= KEEPALIVE_S:
                await response.write(b": keep-alive\n\n")
                last_write = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.tick_s)
        with contextlib.suppress(ConnectionResetError):
            await response.write(event("end", {"message": "The server is shutting down."}))
