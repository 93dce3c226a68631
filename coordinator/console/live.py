"""Live updates of the console's pages: server-sent events of re-rendered fragments.

A page marks its live parts (``<div id="live-..." data-live>``). Its event
stream (``GET /console/events?page=...``) sends a fragment's HTML whenever it
changed, as one ``fragment`` event ``{"id", "digest", "html"}``; the page's
script swaps it in.

What a page shows is a :class:`Feed`, one per page (the overview, one group),
shared by every stream open on it. One task (:meth:`LiveStreams._tick`) brings
every watched feed up to date every :data:`TICK_S` seconds, and at once when a
stream needs a view nobody watched yet; a feed publishes a new version only
when something it shows changed, and renders each *view* (what one caller may
see, e.g. the groups its token grants) once per version, however many streams
show it. Feeds do their work in slices (:class:`Pace`) that give the event loop
a turn in between, so members' heartbeats are not held behind a page's
rendering. A change therefore shows within one tick plus the transfer, well
under the 2 s the console promises.

Bounds: at most ``max_streams`` streams are open at once (another one is
answered 503), and at most ``max_per_client`` from one client, a token's
name with ``--auth-tokens``, else the client's address (another one is
answered 429), so one viewer cannot take every place. The page then says live
updates are off. A stream ends when its client goes away (noticed within a
tick: the connection is gone), when its sign-in session ends, and when the
server shuts down (``on_shutdown`` sets :attr:`LiveStreams.stopping`; every
stream ends within one tick), so ``groupcoord serve`` still stops promptly on
SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiohttp import web

log = logging.getLogger("groupcoord.console")

#: seconds between two refreshes of the watched pages.
TICK_S = 0.5
#: an idle stream sends a comment this often, so proxies and the browser keep it.
KEEPALIVE_S = 15.0
#: the browser's reconnection delay after a dropped stream (EventSource ``retry``).
RETRY_MS = 2000
#: open event streams at most.
MAX_STREAMS = 32
#: open event streams of one client at most (a token, or an address without auth).
MAX_STREAMS_PER_CLIENT = 8
#: work a feed does between two turns it gives the event loop: a group id checked
#: against a grant counts 1, a row read or rendered :data:`ROW_COST`.
SLICE = 1024
ROW_COST = 16

Fragments = dict[str, str]
#: a view of a feed: what one caller may see of its page.
V = TypeVar("V", bound=Hashable)


def digest(html: str) -> str:
    """A short fingerprint of a fragment: the page carries it, the stream compares it."""
    return hashlib.blake2b(html.encode("utf-8"), digest_size=12).hexdigest()


def event(name: str, data: object) -> bytes:
    """One server-sent event; ``data`` as JSON on one line (JSON escapes newlines)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Published:
    """One fragment as every stream sends it: its digest and its encoded event."""

    digest: str
    event: bytes


def publish(fragments: Fragments) -> dict[str, Published]:
    """Digest and encode each fragment once, for every stream that sends it."""
    out = {}
    for fragment_id, html in fragments.items():
        mark = digest(html)
        out[fragment_id] = Published(mark, event("fragment", {"id": fragment_id,
                                                              "digest": mark, "html": html}))
    return out


class Pace:
    """Gives the event loop a turn after every ``every`` units of a long piece of work."""

    def __init__(self, every: int = SLICE) -> None:
        self.every = every
        self._done = 0

    async def step(self, cost: int = 1) -> None:
        self._done += cost
        if self._done >= self.every:
            self._done = 0
            await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How many event streams may be open (``--console-max-streams``, and
    ``--console-max-streams-per-client``)."""

    max_streams: int = MAX_STREAMS
    max_per_client: int = MAX_STREAMS_PER_CLIENT


DEFAULT_LIMITS = StreamLimits()


class Feed(ABC, Generic[V]):
    """What one page shows, for every stream open on it.

    A *view* is what one caller may see of the page (a hashable key the feed
    understands, e.g. the caller's token entry). :meth:`refresh` brings the
    views that streams watch up to date; :attr:`version` moves, and
    :attr:`changed` fires, only when one of them changed.
    """

    def __init__(self) -> None:
        self.version = 0
        self.changed = asyncio.Event()
        #: set when a refresh failed: the streams end, the next page opens a new feed.
        self.failure: str | None = None
        self.watchers: Counter[V] = Counter()
        self._views: dict[V, dict[str, Published]] = {}

    def view(self, key: V) -> dict[str, Published] | None:
        """The fragments of view ``key``; ``None`` until it was first rendered."""
        return self._views.get(key)

    def notify(self) -> None:
        """Wake every stream on this feed (a new version, a failure, shutdown)."""
        self.changed.set()
        self.changed = asyncio.Event()

    async def refresh(self) -> None:
        """Bring every watched view up to date; a new version if any changed."""
        fresh = await self.render(set(self.watchers), set(self._views))
        if fresh is None:
            return
        for key in list(self._views):
            if key not in self.watchers:
                del self._views[key]
        moved = False
        for key, fragments in fresh.items():
            if key not in self.watchers:
                continue
            old = self._views.get(key)
            if old is None or {k: p.digest for k, p in old.items()} != \
                    {k: p.digest for k, p in fragments.items()}:
                self._views[key] = fragments
                moved = True
        if moved:
            self.version += 1
            self.notify()

    @abstractmethod
    async def render(self, watched: set[V], rendered: set[V]
                     ) -> dict[V, dict[str, Published]] | None:
        """The views of ``watched`` that changed or are not ``rendered`` yet (others may
        be left out); ``None``: nothing changed since the last call."""


class LiveStreams:
    """The open event streams of one console and the feeds they show."""

    def __init__(self, limits: StreamLimits = DEFAULT_LIMITS, tick_s: float = TICK_S) -> None:
        self.limits = limits
        self.tick_s = tick_s
        self.open = 0
        self.by_client: Counter[str] = Counter()
        self.stopping = asyncio.Event()
        self.feeds: dict[Hashable, Feed[Any]] = {}
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None

    async def stop(self, _app: web.Application | None = None) -> None:
        """End every stream (the console's ``on_shutdown``)."""
        self.stopping.set()
        self._wake.set()
        for feed in self.feeds.values():
            feed.notify()
        if self._ticker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    def refusal(self, client: str) -> web.HTTPException | None:
        """Why a new stream of ``client`` is refused, or ``None``."""
        if self.stopping.is_set():
            return web.HTTPServiceUnavailable(text="the server is shutting down")
        if self.by_client[client] >= self.limits.max_per_client:
            return web.HTTPTooManyRequests(
                text=f"too many live pages open by you (at most {self.limits.max_per_client} "
                     "per client); close one or reload later")
        if self.open >= self.limits.max_streams:
            return web.HTTPServiceUnavailable(
                text=f"too many live pages open (at most {self.limits.max_streams}); "
                     "close one or reload later")
        return None

    async def serve(self, request: web.Request, client: str, page: Hashable,
                    make_feed: Callable[[], Feed[V]], view: V,
                    still_allowed: Callable[[], str | None]) -> web.StreamResponse:
        """Stream the changed fragments of ``view`` of the feed ``page`` (made by
        ``make_feed`` if no stream shows it yet) until the client, the session
        (``still_allowed`` returns why it ended) or the server stops."""
        if (refused := self.refusal(client)) is not None:
            raise refused
        feed: Feed[V] | None = self.feeds.get(page)
        if feed is None:
            feed = self.feeds[page] = make_feed()
        self.open += 1
        self.by_client[client] += 1
        feed.watchers[view] += 1
        self._start_ticker()
        try:
            response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a buffering reverse proxy would hold events
            })
            try:
                await response.prepare(request)
                await response.write(f"retry: {RETRY_MS}\n\n".encode())
                await self._run(request, response, feed, view, still_allowed)
            except ConnectionResetError as exc:  # aiohttp's client errors derive from it
                log.debug("console: live stream of %s ended: the client went away (%s)",
                          client, exc)
            return response
        finally:
            self.open -= 1
            self.by_client[client] -= 1
            if not self.by_client[client]:
                del self.by_client[client]
            feed.watchers[view] -= 1
            if not feed.watchers[view]:
                del feed.watchers[view]
            if not feed.watchers and self.feeds.get(page) is feed:
                del self.feeds[page]

    async def _run(self, request: web.Request, response: web.StreamResponse, feed: Feed[V],
                   view: V, still_allowed: Callable[[], str | None]) -> None:
        sent: dict[str, str] = {}
        last_write = time.monotonic()
        while not self.stopping.is_set():
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("the connection is closed")
            ended = still_allowed() or feed.failure
            if ended is not None:
                await response.write(event("end", {"message": ended}))
                return
            changed = feed.changed  # before reading: a version published meanwhile wakes us
            for fragment_id, published in (feed.view(view) or {}).items():
                if sent.get(fragment_id) != published.digest:
                    await response.write(published.event)
                    sent[fragment_id] = published.digest
                    last_write = time.monotonic()
            if time.monotonic() - last_write >= KEEPALIVE_S:
                await response.write(b": keep-alive\n\n")
                last_write = time.monotonic()
            with contextlib.suppress(TimeoutError):
                # Woken by a new version; else once a tick, to notice a client gone.
                await asyncio.wait_for(changed.wait(), self.tick_s)
        await response.write(event("end", {"message": "The server is shutting down."}))

    def _start_ticker(self) -> None:
        self._wake.set()  # a new view is rendered now, not at the next tick
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """Refresh the watched feeds every tick, while any stream is open."""
        while self.feeds and not self.stopping.is_set():
            self._wake.clear()
            for page, feed in list(self.feeds.items()):
                if not feed.watchers or feed.failure is not None:
                    continue
                await asyncio.sleep(0)  # each feed's work in a turn of its own
                try:
                    await feed.refresh()
                except Exception as exc:
                    log.exception("console: the live page %r failed to update", page)
                    feed.failure = (f"Live updates of this page failed ({type(exc).__name__}); "
                                    "the server log says why.")
                    feed.notify()
                    if self.feeds.get(page) is feed:
                        del self.feeds[page]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_s)
