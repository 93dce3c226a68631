"""The lean HTTP/1.1 path of the six protocol calls (issue 2, performance).

aiohttp's request machinery alone (parser wrapper, request and response
objects, router, stream reader, writer) costs more CPU than a heartbeat's
whole budget, so ``groupcoord serve`` listens with :class:`FastProtocol`, an
:class:`asyncio.Protocol` on llhttp (``httptools``) that answers
``POST /v1/{join,sync,heartbeat,leave,commit,fetch}`` itself, through the
same :class:`coordinator.http.calls.Calls` as the aiohttp handlers.

HTTP handled here (RFC 9112): keep-alive (HTTP/1.1 by default, HTTP/1.0 with
``Connection: keep-alive``), ``Content-Length`` and chunked bodies,
``Expect: 100-continue``, pipelining. Requests of one connection are answered
strictly in order: one is in flight at a time, the ones parsed behind it wait
in a queue (reading pauses when :data:`MAX_QUEUED` are waiting, or while the
client does not read its answers). A body over ``--max-body-bytes`` is
answered 413 as soon as that is known, without reading the rest, and the
connection is closed. A request the parser refuses is answered 400 and the
connection closed; bad input never gets a 5xx. A client that disconnects
while its call is parked (a join, a sync, a long-poll heartbeat) cancels the
call's task, so the runtime tells the core (``Cancelled``), as aiohttp's
``handler_cancellation`` does. An idle keep-alive connection is closed after
:data:`KEEPALIVE_TIMEOUT_S`; a request must arrive whole (head and body)
within :data:`REQUEST_TIMEOUT_S` of its first byte and its head must fit in
:data:`MAX_HEAD_BYTES` and :data:`MAX_HEADERS` fields (431 otherwise). TLS is
``loop.create_server(ssl=...)``'s business, below this protocol.

Everything else (admin JSON, ``/metrics``, ``/healthz``, ``/readyz``, another
method on ``/v1/*``, unknown paths, a protocol call with a
``Content-Encoding``) is served by the aiohttp app, unchanged: on the first
such request the connection switches to *shim* mode for the rest of its
life. This protocol keeps parsing; each complete request is re-serialised
(request line, its headers without the framing ones, then ``Connection``,
``Content-Length`` and the de-chunked body) and fed to an aiohttp
``RequestHandler`` of the app's ``web.Server``, attached to a thin wrapper of
the real transport. A request still in flight on the lean path is answered
before anything is fed to aiohttp, so answers stay in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import inspect
import logging
import ssl
import time
from collections import deque
from collections.abc import Coroutine
from http import HTTPStatus
from typing import Any, cast

import httptools
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from coordinator import auth
from coordinator.auth import TokenEntry
from coordinator.http.calls import Calls, Result

log = logging.getLogger("groupcoord.http")

#: seconds an idle keep-alive connection is kept (aiohttp's former default).
KEEPALIVE_TIMEOUT_S = 75.0
#: seconds from a request's first byte to its last (slow or stalled clients).
REQUEST_TIMEOUT_S = 30.0
#: largest request head (request line and header fields), bytes; over: 431.
MAX_HEAD_BYTES = 64 * 1024
#: most header fields in one request (aiohttp's default); over: 431.
MAX_HEADERS = 128
#: parsed requests waiting behind the one in flight before reading pauses.
MAX_QUEUED = 32
#: backlog of the listening socket: a 1,000-member group may connect at once.
BACKLOG = 1024
#: seconds a refused request's remaining bytes are read and dropped after the
#: answer, before closing: closing with unread input sends a TCP reset, which
#: can destroy the answer before the client reads it (RFC 9112 9.6).
LINGER_S = 2.0
#: ...or until this many bytes were dropped.
MAX_LINGER_BYTES = 4 * 1024 * 1024

_CALL, _SHIM, _REPLY = 0, 1, 2
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A request aiohttp's parser refuses (400, connection closed): fed to the
# aiohttp handler of a shim connection when this parser refused a request,
# so that the 400 goes out after the answers aiohttp still owes.
_MALFORMED = b"BAD\x00 / HTTP/1.1\r\n\r\n"
# Framing and hop-by-hop fields that re-serialising replaces (RFC 9110 7.6.1).
_DROPPED = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive",
                      b"upgrade", b"te", b"trailer"})
_MSGPACK = b"application/msgpack"


def _http_date() -> bytes:
    return email.utils.formatdate(usegmt=True).encode("ascii")


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("ascii")


_STATUS_LINES: dict[int, bytes] = {}


def response(status: int, body: bytes, date: bytes, *, content_type: bytes = _MSGPACK,
             close: bool = False, http10_keep_alive: bool = False, extra: bytes = b"") -> bytes:
    """One whole response: status line, headers, body (``extra``: more header lines)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = _status_line(status)
    if close:
        extra += b"Connection: close\r\n"
    elif http10_keep_alive:
        extra += b"Connection: keep-alive\r\n"
    return b"%bContent-Type: %b\r\nContent-Length: %d\r\nDate: %b\r\n%b\r\n%b" % (
        line, content_type, len(body), date, extra, body)


async def _resume(coro: Coroutine[Any, Any, Result], waiting_for: Any) -> Result:
    """Run a coroutine stepped by hand (``coro.send(None)`` gave ``waiting_for``) to
    its end inside the current task, as if the task had started it.

    It waits for what the coroutine waits for, then resumes it (which reads
    the future's result or exception itself). If this task is cancelled (the
    client went away), the cancellation is thrown into the coroutine, so
    :meth:`Runtime.call` sees it and tells the core (``Cancelled``).
    """
    while True:
        try:
            if waiting_for is None:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            else:
                # The future was yielded by the coroutine's own await, which marked
                # it "blocking"; a task clears that mark when it takes the future
                # over, and so must we before awaiting it here.
                waiting_for._asyncio_future_blocking = False
                await waiting_for
        except asyncio.CancelledError as cancelled:
            try:
                waiting_for = coro.throw(cancelled)
            except StopIteration as done:
                return cast(Result, done.value)
            continue
        except Exception:
            pass  # the coroutine reads the same exception from its future below
        try:
            waiting_for = coro.send(None)
        except StopIteration as done:
            return cast(Result, done.value)


def _cancel_if_suspended(coro: Coroutine[Any, Any, Result], _task: object) -> None:
    """A task cancelled before its first step never resumed ``coro``: cancel it now,
    so that :meth:`Runtime.call` tells the core (``Cancelled``) all the same."""
    if inspect.getcoroutinestate(coro) == inspect.CORO_SUSPENDED:
        with contextlib.suppress(asyncio.CancelledError, StopIteration):
            coro.throw(asyncio.CancelledError())


class _Stop(Exception):
    """Raised from a parser callback: stop parsing this connection."""


class _Pending:
    """One complete request waiting for its turn (or a prepared answer)."""

    __slots__ = ("api", "body", "close", "content_type", "http10", "keep_alive", "kind",
                 "raw", "started", "token")

    def __init__(self, kind: int, *, api: str = "", body: bytes = b"",
                 content_type: str | None = None, token: TokenEntry | None = None,
                 keep_alive: bool = True, http10: bool = False, started: float = 0.0,
                 raw: bytes = b"", close: bool = False) -> None:
        self.kind = kind
        self.api = api
        self.body = body
        self.content_type = content_type
        self.token = token
        self.keep_alive = keep_alive
        self.http10 = http10
        self.started = started
        #: _SHIM: the re-serialised request; _REPLY: the whole response.
        self.raw = raw
        #: _REPLY: close the connection once it is written.
        self.close = close


class FastServer:
    """What every connection of one listener shares; the listener's protocol factory."""

    def __init__(self, app: web.Application, runner: web.AppRunner, calls: Calls, *,
                 keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.app = app
        self.runner = runner
        self.calls = calls
        self.keepalive_timeout_s = keepalive_timeout_s
        self.request_timeout_s = request_timeout_s
        self.paths = {f"/v1/{api}".encode("ascii"): api for api in calls.apis}
        self.connections: set[FastProtocol] = set()
        #: the ``Date`` header value, refreshed every second by :meth:`_tick`.
        self.date = _http_date()
        self.loop = asyncio.get_running_loop()
        self._listener: asyncio.AbstractServer | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self.shutting_down = False

    def __call__(self) -> FastProtocol:
        return FastProtocol(self)

    def _tick(self) -> None:
        self.date = _http_date()
        self._ticker = self.loop.call_at(float(int(self.loop.time()) + 1), self._tick)

    def web_server(self) -> web.Server:
        server = self.runner.server
        if server is None:
            raise RuntimeError("the aiohttp runner is not set up")
        return server

    async def start(self, host: str, port: int,
                    ssl_context: ssl.SSLContext | None = None) -> tuple[str, int]:
        """Listen; returns the bound address (``port`` 0 picks a free one)."""
        self._listener = await self.loop.create_server(
            self, host, port, ssl=ssl_context, backlog=BACKLOG, reuse_address=True)
        self._tick()
        sockname = self._listener.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    def close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting; close idle connections, answer what is in flight, then close.

        Connections in shim mode are left to ``runner.cleanup()`` (aiohttp
        closes its own handlers); anything still open after ``timeout_s`` is
        aborted.
        """
        self.shutting_down = True
        self.close_listener()
        for conn in list(self.connections):
            conn.begin_shutdown()
        deadline = self.loop.time() + timeout_s
        while (any(not c.shim_mode for c in self.connections)
               and self.loop.time() < deadline):
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if not conn.shim_mode:
                conn.abort()

    async def finish(self) -> None:
        """After ``runner.cleanup()``: abort what is left and release the listener."""
        for conn in list(self.connections):
            conn.abort()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()


class _ShimTransport(asyncio.Transport):
    """The real transport as an aiohttp ``RequestHandler`` of a shim connection sees it."""

    def __init__(self, transport: asyncio.Transport, owner: FastProtocol) -> None:
        super().__init__()
        self._transport = transport
        self._owner = owner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._owner.pause_for_shim(True)

    def resume_reading(self) -> None:
        self._owner.pause_for_shim(False)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self._transport.write_eof()


class FastProtocol(asyncio.Protocol):
    """One client connection (module docs)."""

    def __init__(self, server: FastServer) -> None:
        self._server = server
        self._calls = server.calls
        self._loop = server.loop
        self._paths = server.paths
        self._max_body = server.calls.max_body_bytes
        self._auth_on = server.calls.tokens is not None
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._remote = ""
        # -- the request being read
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._content_type: bytes | None = None
        self._authorization: bytes | None = None
        self._content_length: int | None = None
        self._encoded = False
        self._expect = False
        self._api: str | None = None
        self._token: TokenEntry | None = None
        self._refusal: Result | None = None
        self._www_authenticate = False
        self._body: list[bytes] = []
        self._body_len = 0
        self._keep_alive = True
        self._http10 = False
        self._started = 0.0
        #: loop time of the current request's first byte; None between requests.
        self._begun: float | None = None
        self._in_head = False
        #: head bytes seen in whole reads made while the head was incomplete.
        self._head_bytes = 0
        #: bytes of the request line's URL and the completed header fields.
        self._field_bytes = 0
        # -- the connection
        self._queue: deque[_Pending] = deque()
        self._task: asyncio.Task[None] | None = None
        self._continue_owed = False
        self.shim_mode = False
        self._shim: RequestHandler | None = None
        #: no more parsing (a refusal that closes, a parse error, shutdown).
        self._stopped = False
        #: close once the answers owed are written.
        self._closing = False
        #: the last answer is written and our side shut: input is read and dropped.
        self._lingering = False
        self._lingered = 0
        self._paused_queue = False
        self._paused_shim = False
        self._paused_write = False
        self._reading_paused = False
        self._idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._server.connections.add(self)
        now = self._loop.time()
        self._idle_since = now
        self._timer = self._loop.call_at(now + min(self._server.request_timeout_s,
                                                   self._server.keepalive_timeout_s),
                                         self._on_timer)
        if self._server.shutting_down:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
        if self._task is not None:
            # The client went away while its call was in flight (parked join,
            # sync or long-poll heartbeat): cancelling the task makes the
            # runtime send Cancelled to the core, as aiohttp's
            # handler_cancellation does.
            self._task.cancel()
            self._task = None
        if self._shim is not None:
            self._shim.connection_lost(exc)

    def pause_writing(self) -> None:
        # The client does not read its answers: stop taking new requests.
        self._paused_write = True
        self._update_reading()
        if self._shim is not None:
            self._shim.pause_writing()

    def resume_writing(self) -> None:
        self._paused_write = False
        self._update_reading()
        if self._shim is not None:
            self._shim.resume_writing()

    def eof_received(self) -> bool | None:
        if self._shim is not None:
            self._shim.eof_received()
        return None  # close our side too, like aiohttp

    def pause_for_shim(self, paused: bool) -> None:
        self._paused_shim = paused
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        paused = (self._paused_queue or self._paused_shim or self._paused_write
                  or self._stopped) and not self._lingering
        if paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def begin_shutdown(self) -> None:
        """Server shutdown: no new requests; close once the answers owed are written."""
        if self.shim_mode or self._transport is None:
            return
        self._stop()
        if self._task is None and not self._queue:
            self._transport.close()
        else:
            self._closing = True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _on_timer(self) -> None:
        now = self._loop.time()
        server = self._server
        transport = self._transport
        if transport is None:
            return
        deadline = now + server.request_timeout_s
        if self._begun is not None:
            if now - self._begun >= server.request_timeout_s:
                # A slow or stalled client: the request did not arrive in time.
                if self._task is None and not self._queue and not self.shim_mode:
                    transport.write(response(408, b"request not received in time\n",
                                             server.date, content_type=b"text/plain",
                                             close=True))
                    self._stop()
                    self._linger_close()
                else:
                    transport.close()
                return
            deadline = min(deadline, self._begun + server.request_timeout_s)
        elif not self.shim_mode and self._task is None and not self._queue:
            if now - self._idle_since >= server.keepalive_timeout_s:
                transport.close()
                return
            deadline = min(deadline, self._idle_since + server.keepalive_timeout_s)
        self._timer = self._loop.call_at(deadline, self._on_timer)

    # ------------------------------------------------------------ parsing

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            if self._lingering and self._transport is not None:
                self._lingered += len(data)
                if self._lingered > MAX_LINGER_BYTES:
                    self._transport.close()
            return
        was_in_head = self._in_head
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # RFC 9110 7.8: a server may ignore Upgrade. The parser stopped after
            # the (bodiless) request; go on parsing the rest as HTTP/1.1.
            offset = int(upgrade.args[0])
            if offset < len(data):
                self.data_received(data[offset:])
            return
        except httptools.HttpParserCallbackError:
            if not self._stopped:  # not our _Stop: a bug in a callback
                log.exception("HTTP parser callback failed")
                self._bad_request("request could not be handled")
            return
        except httptools.HttpParserError as exc:
            self._bad_request(f"malformed request: {exc}")
            return
        if self._in_head:
            # Bytes buffered for an incomplete head: bounded (slow loris, huge fields).
            if was_in_head:
                self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES or self._field_bytes > MAX_HEAD_BYTES:
                self._refuse_head()

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._content_type = None
        self._authorization = None
        self._content_length = None
        self._encoded = False
        self._expect = False
        self._api = None
        self._token = None
        self._refusal = None
        self._www_authenticate = False
        self._body = []
        self._body_len = 0
        self._begun = self._loop.time()
        self._in_head = True
        self._head_bytes = 0
        self._field_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._field_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        headers.append((name, value))
        self._field_bytes += len(name) + len(value) + 4
        if len(headers) > MAX_HEADERS or self._field_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
            raise _Stop
        lower = name.lower()
        if lower == b"content-type":
            self._content_type = value
        elif lower == b"content-length":
            # llhttp has checked it is digits and not repeated differently.
            try:
                self._content_length = int(value)
            except ValueError:
                self._bad_request("Content-Length is not a number")
                raise _Stop from None
        elif lower == b"authorization":
            self._authorization = value
        elif lower == b"expect":
            self._expect = value.strip().lower() == b"100-continue"
        elif lower == b"content-encoding":
            self._encoded = value.strip().lower() not in (b"", b"identity")

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._in_head = False
        self._keep_alive = parser.should_keep_alive()
        self._http10 = parser.get_http_version() == "1.0"
        chunked = self._content_length is None and any(
            n.lower() == b"transfer-encoding" for n, _ in self._headers)
        if parser.should_upgrade() and (chunked or self._content_length):
            # llhttp hands the body of an Upgrade request to the "new protocol";
            # no client of ours sends one, so refuse it rather than misread it.
            self._bad_request("Upgrade on a request with a body is not supported")
            raise _Stop
        url = self._url
        path = url.partition(b"?")[0] if b"?" in url else url
        api = None
        if not self.shim_mode and not self._encoded and parser.get_method() == b"POST":
            api = self._paths.get(path)
        if api is None:
            self.shim_mode = True
        else:
            self._api = api
            self._started = started = time.perf_counter()
            calls = self._calls
            refusal: Result | None = None
            if self._auth_on:
                authorization = self._authorization
                self._token = calls.authenticate(
                    None if authorization is None else authorization.decode("latin-1"))
                if self._token is None:
                    refusal = 401, auth.unauthorized_msgpack()
                    self._www_authenticate = True
            if refusal is None:
                content_type = self._content_type
                refusal = calls.early_refusal(
                    api, None if content_type is None else content_type.decode("latin-1"),
                    self._content_length, started)
            if refusal is not None:
                length = self._content_length
                if self._expect or refusal[0] == 413 or (length is not None
                                                         and length > self._max_body):
                    # Answer now, without reading the body, and close (RFC 9110
                    # 10.1.1: the client may not send the body at all).
                    self._reply_and_stop(refusal)
                    raise _Stop
                self._refusal = refusal  # read and drop the body, then answer
                return
        if self._expect:
            if self._task is None and not self._queue:
                self._write(_CONTINUE)
            else:
                self._continue_owed = True

    def on_body(self, body: bytes) -> None:
        if self._refusal is not None:
            return
        self._body_len += len(body)
        if self._body_len > self._max_body:
            if self._api is not None:
                self._reply_and_stop(self._calls.refuse(
                    self._api, 413, f"body is over the limit of {self._max_body} bytes",
                    self._started))
            else:
                # aiohttp answers 413 for its routes when it sees the body over
                # the limit; it gets one byte more than the limit, then the end.
                self._body.append(body)
                data = b"".join(self._body)[:self._max_body + 1]
                self._enqueue(_Pending(_SHIM, raw=self._reserialise(data, close=True)))
                self._stop()
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._begun = None
        self._continue_owed = False
        body = b"".join(self._body) if self._body else b""
        self._body = []
        if self._api is None:
            self._enqueue(_Pending(_SHIM, raw=self._reserialise(body,
                                                                close=not self._keep_alive)))
        elif self._refusal is not None:
            status, payload = self._refusal
            extra = (b"WWW-Authenticate: %b\r\n" % auth.WWW_AUTHENTICATE.encode()
                     if self._www_authenticate else b"")
            close = not self._keep_alive
            self._enqueue(_Pending(_REPLY, raw=response(
                status, payload, self._server.date, close=close,
                http10_keep_alive=self._http10 and not close, extra=extra), close=close))
        else:
            content_type = self._content_type
            self._enqueue(_Pending(
                _CALL, api=self._api, body=body, token=self._token,
                content_type=None if content_type is None else content_type.decode("latin-1"),
                keep_alive=self._keep_alive, http10=self._http10, started=self._started))

    def _reserialise(self, body: bytes, *, close: bool) -> bytes:
        parser = self._parser
        out = [b"%b %b HTTP/%b\r\n" % (parser.get_method(), self._url,
                                        parser.get_http_version().encode("ascii"))]
        for name, value in self._headers:
            lower = name.lower()
            if lower in _DROPPED or (lower == b"expect" and self._expect):
                continue
            out.append(b"%b: %b\r\n" % (name, value))
        out.append(b"Connection: close\r\n" if close else b"Connection: keep-alive\r\n")
        out.append(b"Content-Length: %d\r\n\r\n" % len(body))
        out.append(body)
        return b"".join(out)

    # ------------------------------------------------------------ refusals

    def _stop(self) -> None:
        self._stopped = True
        self._begun = None
        self._update_reading()

    def _reply_and_stop(self, result: Result) -> None:
        status, payload = result
        extra = (b"WWW-Authenticate: %b\r\n" % auth.WWW_AUTHENTICATE.encode()
                 if self._www_authenticate else b"")
        self._enqueue(_Pending(_REPLY, raw=response(status, payload, self._server.date,
                                                    close=True, extra=extra), close=True))
        self._stop()

    def _bad_request(self, message: str) -> None:
        if self._stopped:
            return
        if self.shim_mode:
            self._enqueue(_Pending(_SHIM, raw=_MALFORMED))
        else:
            self._enqueue(_Pending(_REPLY, close=True, raw=response(
                400, message.encode("utf-8", "replace") + b"\n", self._server.date,
                content_type=b"text/plain; charset=utf-8", close=True)))
        self._stop()

    def _refuse_head(self) -> None:
        if self.shim_mode:
            self._bad_request("request head too large")
        else:
            self._enqueue(_Pending(_REPLY, close=True, raw=response(
                431, b"request head over %d bytes or %d fields\n" % (MAX_HEAD_BYTES,
                                                                      MAX_HEADERS),
                self._server.date, content_type=b"text/plain", close=True)))
            self._stop()

    # ------------------------------------------------------------ answering in order

    def _enqueue(self, item: _Pending) -> None:
        if self._task is None and not self._queue:
            self._run(item)
            return
        self._queue.append(item)
        if len(self._queue) >= MAX_QUEUED and not self._paused_queue:
            self._paused_queue = True
            self._update_reading()

    def _run(self, item: _Pending | None) -> None:
        """Answer ``item`` and whatever follows it, until a call has to wait."""
        queue = self._queue
        while item is not None:
            if self._transport is None:
                return
            kind = item.kind
            if kind == _CALL:
                if not self._call(item):
                    return
            elif kind == _SHIM:
                self._feed_shim(item.raw)
            else:
                self._write(item.raw)
                if item.close:
                    self._linger_close()
                    return
            item = queue.popleft() if queue else None
            if self._paused_queue and len(queue) <= MAX_QUEUED // 2:
                self._paused_queue = False
                self._update_reading()
        self._drained()

    def _drained(self) -> None:
        """Nothing in flight or queued: owed 100 Continue, idle clock, reading."""
        if self._closing and self._transport is not None:
            self._transport.close()
            return
        if self._continue_owed:
            self._continue_owed = False
            self._write(_CONTINUE)
        if self._begun is None:
            self._idle_since = self._loop.time()
        if self._paused_queue:
            self._paused_queue = False
            self._update_reading()

    def _call(self, item: _Pending) -> bool:
        """Answer a call; ``True`` if it was answered at once and the connection goes on.

        Most calls (a heartbeat, a fetch) are answered without waiting: the
        runtime resolves their future before it is awaited. So the call's
        coroutine is stepped by hand first; only if it waits (a parked join,
        sync or long-poll heartbeat, a commit waiting for its write) does it
        continue in a task (:func:`_resume`). That saves a task and a loop
        pass per call, about 5-10 us of CPU here.
        """
        coro = self._calls.call(item.api, item.body, item.content_type, self._remote,
                                item.token, item.started)
        try:
            waiting_for = coro.send(None)
        except StopIteration as done:
            return self._answer(item, done.value)
        self._task = task = self._loop.create_task(self._finish(item, coro, waiting_for))
        task.add_done_callback(functools.partial(_cancel_if_suspended, coro))
        return False

    async def _finish(self, item: _Pending, coro: Coroutine[Any, Any, Result],
                      waiting_for: Any) -> None:
        result = await _resume(coro, waiting_for)
        self._task = None
        if self._answer(item, result):
            queue = self._queue
            self._run(queue.popleft() if queue else None)

    def _answer(self, item: _Pending, result: Result) -> bool:
        transport = self._transport
        if transport is None:
            return False
        status, payload = result
        close = not item.keep_alive
        transport.write(response(status, payload, self._server.date, close=close,
                                 http10_keep_alive=item.http10 and not close))
        if close:
            transport.close()
            return False
        return True

    def _linger_close(self) -> None:
        """Close after a refusal: shut our side, drop the client's input a while, close."""
        transport = self._transport
        if transport is None:
            return
        if self._lingering or not transport.can_write_eof() or self._shim is not None:
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        self._update_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(LINGER_S, transport.close)

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def _feed_shim(self, raw: bytes) -> None:
        if self._shim is None:
            assert self._transport is not None
            handler = self._server.web_server()()
            self._shim = handler
            handler.connection_made(_ShimTransport(self._transport, self))
        self._shim.data_received(raw)

