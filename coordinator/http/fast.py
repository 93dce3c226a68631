"""The protocol listener: the six protocol calls on one strict HTTP/1.1 parser.

aiohttp's request machinery alone (parser wrapper, request and response
objects, router, stream reader, writer) costs more CPU than a heartbeat's
whole budget, so ``groupcoord serve`` listens for the workers with
:class:`FastServer`, an :class:`asyncio.Protocol` on llhttp (``httptools``)
that answers ``POST /v1/{join,sync,heartbeat,leave,commit,fetch}`` through
:class:`coordinator.http.calls.Calls`, and ``GET /v1/resources`` (the catalog
a leader reads before it assigns; JSON, as on the admin listener). While
the start-up check of the advertised URL runs, and only then, it also
answers ``GET /v1/self-check/{challenge}`` with an HMAC of the challenge
(:meth:`coordinator.http.listeners.Listeners.check_reaches_self`).

One parser, one set of limits, per byte stream (docs/operations.md, "Listeners"): nothing read here
is handed to another parser. Any other method or path is answered here, 404
(unknown path) or 405 (a protocol path with another method, ``Allow`` names
the right one), msgpack ``{error: INVALID_REQUEST, message}`` saying that
admin calls, ``/metrics``, ``/healthz`` and ``/readyz`` are on the admin
listener (:mod:`coordinator.http.listeners`); the connection stays open.

HTTP handled here (RFC 9112): keep-alive (HTTP/1.1 by default, HTTP/1.0 with
``Connection: keep-alive``), ``Content-Length`` and chunked bodies,
``Expect: 100-continue``, pipelining. Requests of one connection are answered
strictly in order: one is in flight at a time, the ones parsed behind it wait
in a queue (reading pauses when :data:`MAX_QUEUED` are waiting, or while the
client does not read its answers). ``Upgrade`` is ignored (RFC 9110 7.8) on a
request without a body and refused (400) on one with a body; the rest of the
read is parsed in a loop, never by recursion.

Refusals, each answered before the body is read where the head suffices, and
counted in ``groupcoord_http_refused_total{listener="protocol", reason}``;
none is logged above DEBUG, so no client can fill the log:

- a request the parser refuses (``malformed``), or one that gives a
  single-value field twice (``duplicate_header``: the fields of
  :data:`coordinator.http.headers.SINGLE_VALUE_FIELDS`, the same rule as the
  admin listener's): 400, connection closed;
- a head over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` fields, or a
  trailer section over :data:`MAX_HEAD_BYTES` (``head_too_large``): 431,
  closed. Only the bytes of the request's own head count;
- a body over ``--max-body-bytes``: 413 as soon as that is known, closed;
- a protocol call with a ``Content-Encoding`` other than ``identity``
  (``content_encoding``): 415, before authentication; nothing is ever
  decompressed on this listener;
- a request not whole within :data:`REQUEST_TIMEOUT_S` of its first byte
  (``timeout``): 408, closed.

Trailer fields of a chunked body are never taken as header fields (RFC 9110
6.5.1): they are counted against the limit and dropped. A client that
disconnects while its call is parked (a join, a sync, a long-poll heartbeat)
cancels the call's task, so the runtime tells the core (``Cancelled``). An
idle keep-alive connection is closed after :data:`KEEPALIVE_TIMEOUT_S`. TLS
is ``loop.create_server(ssl=...)``'s business, below this protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import hashlib
import hmac
import inspect
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Coroutine
from http import HTTPStatus
from typing import Any, cast

import httptools

from coordinator import auth
from coordinator.auth import TokenEntry
from coordinator.http.calls import Calls, Result, is_json
from coordinator.http.headers import SINGLE_VALUE_FIELDS, duplicate_message
from protocol import codec
from protocol.errors import ErrorCode
from protocol.messages import LISTENER_FIELD, PROTOCOL_LISTENER

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

#: where the admin calls, metrics and health checks are (the 404/405 answers say it).
ADMIN_HINT = ("admin calls (/v1/groups, PUT/DELETE /v1/resources), /metrics, /healthz "
              "and /readyz are served on the admin listener (--admin-port), not on this "
              "protocol listener")


def admin_hint(admin_port: int | None) -> str:
    """:data:`ADMIN_HINT`, with the admin listener's port once it is known."""
    if admin_port is None:
        return ADMIN_HINT
    return ADMIN_HINT.replace("(--admin-port)", f"(--admin-port, port {admin_port} here)")
CATALOG_PATH = b"/v1/resources"
#: ``GET`` + a challenge: answered only while the advertised-URL check runs (404 else).
SELF_CHECK_PREFIX = b"/v1/self-check/"

_CALL, _CATALOG, _REPLY = 0, 1, 2
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MSGPACK = b"application/msgpack"
_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"
# Fields a request may give once (coordinator.http.headers): a second one is 400.
# One bit each, to note which were seen in the head being read.
_SINGLE_FIELDS = {name.lower().encode("ascii"): 1 << i
                  for i, name in enumerate(SINGLE_VALUE_FIELDS)}
_FIELD_NAMES = {bit: name for name, bit in zip(SINGLE_VALUE_FIELDS, _SINGLE_FIELDS.values(),
                                               strict=True)}
_CONTENT_TYPE = _SINGLE_FIELDS[b"content-type"]
_CONTENT_LENGTH = _SINGLE_FIELDS[b"content-length"]
_AUTHORIZATION = _SINGLE_FIELDS[b"authorization"]
_EXPECT = _SINGLE_FIELDS[b"expect"]
_CONTENT_ENCODING = _SINGLE_FIELDS[b"content-encoding"]
_TRANSFER_ENCODING = _SINGLE_FIELDS[b"transfer-encoding"]


def self_check_proof(key: bytes, challenge: bytes) -> bytes:
    """The answer to ``GET /v1/self-check/{challenge}``: the challenge's HMAC under
    the key of the running check (:attr:`FastServer.self_check_key`)."""
    return hmac.new(key, challenge, hashlib.sha256).hexdigest().encode("ascii")


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


def _error_json(code: ErrorCode, message: str | None = None) -> bytes:
    doc = {"error": code.value} if message is None else {"error": code.value,
                                                          "message": message}
    return json.dumps(doc).encode("utf-8")


def _error_msgpack(message: str) -> bytes:
    """A refusal of this listener: it names itself (a client pointed at the wrong
    port can say so)."""
    return codec.encode({"error": ErrorCode.INVALID_REQUEST.value, "message": message,
                         LISTENER_FIELD: PROTOCOL_LISTENER})


def _shown(raw: bytes, limit: int = 80) -> str:
    """A method or path from the wire, safe to put in a message (and a log line)."""
    text = raw[:limit].decode("latin-1")
    return ascii(text + ("..." if len(raw) > limit else ""))[1:-1]


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

    __slots__ = ("api", "body", "close", "content_type", "http10", "json", "keep_alive",
                 "kind", "raw", "started", "token")

    def __init__(self, kind: int, *, api: str = "", body: bytes = b"",
                 content_type: str | None = None, token: TokenEntry | None = None,
                 keep_alive: bool = True, http10: bool = False, started: float = 0.0,
                 raw: bytes = b"", close: bool = False, json: bool = False) -> None:
        self.kind = kind
        self.api = api
        self.body = body
        self.content_type = content_type
        #: _CALL: answer in JSON (the call came in JSON; docs/protocol.md, "JSON on
        #: the protocol calls").
        self.json = json
        self.token = token
        self.keep_alive = keep_alive
        self.http10 = http10
        self.started = started
        #: _REPLY: the whole response.
        self.raw = raw
        #: _REPLY: close the connection once it is written.
        self.close = close


class FastServer:
    """What every connection of the protocol listener shares; its protocol factory."""

    def __init__(self, calls: Calls, *, keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.calls = calls
        self.keepalive_timeout_s = keepalive_timeout_s
        self.request_timeout_s = request_timeout_s
        self.paths = {f"/v1/{api}".encode("ascii"): api for api in calls.apis}
        self.connections: set[FastProtocol] = set()
        #: the ``Date`` header value, refreshed every second by :meth:`_tick`.
        self.date = _http_date()
        self.loop = asyncio.get_running_loop()
        self._refused = calls.metrics.http_refused
        self._listener: asyncio.AbstractServer | None = None
        #: the admin listener's port, once bound (the 404/405 answers name it).
        self.admin_port: int | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self.shutting_down = False
        #: while the advertised-URL check of this process runs (:mod:`coordinator.http.
        #: listeners`), the key that proves an answer came from here; else ``None``.
        self.self_check_key: bytes | None = None

    def __call__(self) -> FastProtocol:
        return FastProtocol(self)

    def _tick(self) -> None:
        self.date = _http_date()
        self._ticker = self.loop.call_at(float(int(self.loop.time()) + 1), self._tick)

    def refused(self, reason: str, remote: str, detail: str) -> None:
        """Count a refusal (a fixed set of reasons) and say it at DEBUG only."""
        self._refused.labels("protocol", reason).inc()
        log.debug("protocol listener: refused a request from %s (%s): %s", remote, reason,
                  detail)

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
        """Stop accepting; close idle connections, answer what is in flight, then close;
        anything still open after ``timeout_s`` is aborted."""
        self.shutting_down = True
        self.close_listener()
        for conn in list(self.connections):
            conn.begin_shutdown()
        deadline = self.loop.time() + timeout_s
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()

    async def finish(self) -> None:
        """After :meth:`shutdown`: abort what is left and release the listener."""
        for conn in list(self.connections):
            conn.abort()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()


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
        self._content_type: bytes | None = None
        self._authorization: bytes | None = None
        self._content_length: int | None = None
        self._encoding: bytes | None = None
        self._expect = False
        #: _SINGLE_FIELDS bits of the fields seen in this head.
        self._seen = 0
        self._fields = 0
        #: _CALL or _CATALOG once the head is read and routed.
        self._route = _REPLY
        self._api = ""
        #: the call being read came in JSON: so do its answer and its refusals.
        self._json = False
        self._token: TokenEntry | None = None
        #: a refused request whose body is read and dropped: (status, body, type, headers).
        self._refusal: tuple[int, bytes, bytes, bytes] | None = None
        self._body: list[bytes] = []
        self._body_len = 0
        self._keep_alive = True
        self._http10 = False
        self._started = 0.0
        #: loop time of the current request's first byte; None between requests.
        self._begun: float | None = None
        self._in_head = False
        # -- what the parser holds for the request being read (the limits)
        #: requests begun on this connection.
        self._messages = 0
        #: bytes of the URL and of the complete header fields of this request's head.
        self._field_bytes = 0
        #: bytes of the trailer fields of this request (chunked bodies).
        self._trailer_bytes = 0
        #: bytes of whole reads inside this request that completed nothing the
        #: parser reports (a field longer than a read): buffered by the parser.
        self._partial = 0
        # -- the connection
        self._queue: deque[_Pending] = deque()
        self._task: asyncio.Task[None] | None = None
        self._continue_owed = False
        #: no more parsing (a refusal that closes, a parse error, shutdown).
        self._stopped = False
        #: close once the answers owed are written.
        self._closing = False
        #: the last answer is written and our side shut: input is read and dropped.
        self._lingering = False
        self._lingered = 0
        self._paused_queue = False
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

    def pause_writing(self) -> None:
        # The client does not read its answers: stop taking new requests.
        self._paused_write = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_write = False
        self._update_reading()

    def eof_received(self) -> bool | None:
        return None  # close our side too, like aiohttp

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        paused = (self._paused_queue or self._paused_write
                  or self._stopped) and not self._lingering
        if paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def begin_shutdown(self) -> None:
        """Server shutdown: no new requests; close once the answers owed are written."""
        if self._transport is None:
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
                server.refused("timeout", self._remote, "request not received in time")
                if self._task is None and not self._queue:
                    transport.write(response(408, b"request not received in time\n",
                                             server.date, content_type=_TEXT, close=True))
                    self._stop()
                    self._linger_close()
                else:
                    transport.close()
                return
            deadline = min(deadline, self._begun + server.request_timeout_s)
        elif self._task is None and not self._queue:
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
        # What the parser reported so far: a read that adds to none of it, inside
        # a request, is held by the parser (one field, or a trailer, longer than a read).
        inside = self._begun is not None
        messages = self._messages
        reported = self._field_bytes + self._body_len + self._trailer_bytes
        view: bytes | memoryview = data
        while True:
            try:
                self._parser.feed_data(view)
            except httptools.HttpParserUpgrade as upgrade:
                # RFC 9110 7.8: a server may ignore Upgrade. The parser stopped after
                # the (bodiless) request; parse the rest as HTTP/1.1, in this loop:
                # one turn per Upgrade request, however many one read holds.
                offset = int(upgrade.args[0])
                if self._stopped or offset >= len(view):
                    return
                view = memoryview(view)[offset:]
                continue
            except httptools.HttpParserCallbackError:
                if not self._stopped:  # not our _Stop: a bug in a callback
                    log.exception("HTTP parser callback failed")
                    self._bad_request("malformed", "request could not be handled")
                return
            except httptools.HttpParserError as exc:
                self._bad_request("malformed", f"malformed request: {exc}")
                return
            break
        if self._begun is None or self._stopped:
            return
        if (inside and messages == self._messages
                and reported == self._field_bytes + self._body_len + self._trailer_bytes):
            self._partial += len(data)
        else:
            self._partial = 0
        held = (self._field_bytes if self._in_head else self._trailer_bytes) + self._partial
        if held > MAX_HEAD_BYTES:
            self._refuse_head()

    def on_message_begin(self) -> None:
        self._messages += 1
        self._url = b""
        self._content_type = None
        self._authorization = None
        self._content_length = None
        self._encoding = None
        self._expect = False
        self._seen = 0
        self._fields = 0
        self._route = _REPLY
        self._api = ""
        self._token = None
        self._refusal = None
        self._body = []
        self._body_len = 0
        self._begun = self._loop.time()
        self._in_head = True
        self._field_bytes = 0
        self._trailer_bytes = 0
        self._partial = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._field_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 3  # at least "name:value\r\n"
        if not self._in_head:
            # A trailer field (chunked body, RFC 9110 6.5): never a header of the
            # request; bounded like a head, then dropped.
            self._trailer_bytes += size
            if self._trailer_bytes > MAX_HEAD_BYTES:
                self._refuse_head()
                raise _Stop
            return
        self._field_bytes += size
        self._fields += 1
        if self._fields > MAX_HEADERS or self._field_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
            raise _Stop
        bit = _SINGLE_FIELDS.get(name.lower())
        if bit is None:
            return
        if self._seen & bit:
            self._bad_request("duplicate_header", duplicate_message(_FIELD_NAMES[bit]))
            raise _Stop
        self._seen |= bit
        if bit == _CONTENT_TYPE:
            self._content_type = value
        elif bit == _CONTENT_LENGTH:
            # llhttp has checked it is digits.
            try:
                self._content_length = int(value)
            except ValueError:
                self._bad_request("malformed", "Content-Length is not a number")
                raise _Stop from None
        elif bit == _AUTHORIZATION:
            self._authorization = value
        elif bit == _EXPECT:
            self._expect = value.strip().lower() == b"100-continue"
        elif bit == _CONTENT_ENCODING:
            self._encoding = value

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._in_head = False
        self._keep_alive = parser.should_keep_alive()
        self._http10 = parser.get_http_version() == "1.0"
        if parser.should_upgrade() and (self._seen & _TRANSFER_ENCODING
                                        or self._content_length):
            # llhttp hands the body of an Upgrade request to the "new protocol";
            # no client of ours sends one, so refuse it rather than misread it.
            self._bad_request("malformed", "Upgrade on a request with a body is not supported")
            raise _Stop
        url = self._url
        path = url.partition(b"?")[0] if b"?" in url else url
        api = self._paths.get(path)
        if api is None or parser.get_method() != b"POST":
            self._route_other(parser.get_method(), path, api)
            return
        self._api = api
        self._route = _CALL
        self._started = started = time.perf_counter()
        calls = self._calls
        content_type = self._content_type
        self._json = as_json = (content_type is not None and content_type != _MSGPACK
                                and is_json(content_type.decode("latin-1")))
        reply_type = _JSON if as_json else _MSGPACK
        encoding = self._encoding
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            # Before authentication and before the body: nothing is decompressed here.
            self._server.refused("content_encoding", self._remote, _shown(encoding))
            status, payload = calls.refuse(
                api, 415, f"Content-Encoding {_shown(encoding.strip())!r} is not accepted: "
                          f"send the body unencoded", started, as_json)
            self._refuse(status, payload, reply_type)
            return
        if self._auth_on:
            authorization = self._authorization
            self._token = calls.authenticate(
                None if authorization is None else authorization.decode("latin-1"))
            if self._token is None:
                self._refuse(401, _error_json(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                              auth.UNAUTHORIZED_MESSAGE)
                             if as_json else auth.unauthorized_msgpack(), reply_type,
                             extra=b"WWW-Authenticate: %b\r\n" % auth.WWW_AUTHENTICATE.encode())
                return
        refusal = calls.early_refusal(
            api, None if content_type is None else content_type.decode("latin-1"),
            self._content_length, started)
        if refusal is not None:
            self._refuse(*refusal, reply_type)
            return
        if self._expect:
            self._continue()

    def _route_other(self, method: bytes, path: bytes, api: str | None) -> None:
        """Anything but a protocol call: the catalog read, or 404/405."""
        if path.startswith((b"http://", b"https://")):
            # The absolute form (RFC 9112 3.2.2): its path is what counts.
            path = b"/" + [*path.split(b"/", 3), b""][3]
            api = self._paths.get(path)
            if api is not None and method == b"POST":
                self._url = path
                self.on_headers_complete()  # route it again, now by its path
                return
        if path == CATALOG_PATH and method == b"GET":
            self._route = _CATALOG
            if self._auth_on:
                authorization = self._authorization
                self._token = self._calls.authenticate(
                    None if authorization is None else authorization.decode("latin-1"))
                if self._token is None:
                    self._refuse(401, _error_json(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                                  auth.UNAUTHORIZED_MESSAGE), _JSON,
                                 b"WWW-Authenticate: %b\r\n" % auth.WWW_AUTHENTICATE.encode())
                    return
            if self._expect:
                self._continue()
            return
        key = self._server.self_check_key
        if key is not None and method == b"GET" and path.startswith(SELF_CHECK_PREFIX):
            # The start-up check that the advertised URL reaches this process: the
            # proof needs the key, which never leaves it. Answered after the (empty)
            # body, as a refusal is, keeping the connection.
            proof = self_check_proof(key, path[len(SELF_CHECK_PREFIX):])
            self._refusal = (200, proof, _TEXT, b"")
            return
        if api is not None or path == CATALOG_PATH:
            allowed = b"GET" if api is None else b"POST"
            message = (f"{_shown(method)} is not allowed on {_shown(path)}: use "
                       f"{allowed.decode()}; {admin_hint(self._server.admin_port)}")
            self._server.refused("method_not_allowed", self._remote, message)
            self._refuse(405, _error_msgpack(message), extra=b"Allow: %b\r\n" % allowed)
            return
        message = (f"no protocol call at {_shown(method)} {_shown(path)}: this listener "
                   f"serves POST /v1/{{{','.join(sorted(self._calls.apis))}}} and GET "
                   f"/v1/resources; {admin_hint(self._server.admin_port)}")
        self._server.refused("not_found", self._remote, message)
        self._refuse(404, _error_msgpack(message))

    def _continue(self) -> None:
        if self._task is None and not self._queue:
            self._write(_CONTINUE)
        else:
            self._continue_owed = True

    def _refuse(self, status: int, payload: bytes, content_type: bytes = _MSGPACK,
                extra: bytes = b"") -> None:
        """Refuse the request whose head was just read: at once and close (its body
        may be large, or not sent at all after ``Expect``), else after its body is
        read and dropped, keeping the connection."""
        length = self._content_length
        if self._expect or status == 413 or (length is not None and length > self._max_body):
            self._reply_and_stop(status, payload, content_type, extra)
            raise _Stop
        self._refusal = (status, payload, content_type, extra)

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self._max_body:
            refusal = self._refusal
            message = f"body is over the limit of {self._max_body} bytes"
            if refusal is not None:
                self._reply_and_stop(*refusal)
            elif self._route == _CALL:
                status, payload = self._calls.refuse(self._api, 413, message, self._started,
                                                     self._json)
                self._reply_and_stop(status, payload, _JSON if self._json else _MSGPACK)
            else:
                self._reply_and_stop(413, _error_json(ErrorCode.INVALID_REQUEST, message),
                                     _JSON)
            raise _Stop
        if self._route == _CALL and self._refusal is None:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._begun = None
        self._in_head = False
        self._continue_owed = False
        refusal = self._refusal
        if refusal is not None:
            status, payload, reply_type, extra = refusal
            close = not self._keep_alive
            self._enqueue(_Pending(_REPLY, raw=response(
                status, payload, self._server.date, content_type=reply_type, close=close,
                http10_keep_alive=self._http10 and not close, extra=extra), close=close))
        elif self._route == _CALL:
            content_type = self._content_type
            body = b"".join(self._body) if self._body else b""
            self._body = []
            self._enqueue(_Pending(
                _CALL, api=self._api, body=body, token=self._token,
                content_type=None if content_type is None else content_type.decode("latin-1"),
                keep_alive=self._keep_alive, http10=self._http10, started=self._started,
                json=self._json))
        elif self._route == _CATALOG:
            self._enqueue(_Pending(_CATALOG, token=self._token, keep_alive=self._keep_alive,
                                   http10=self._http10))

    # ------------------------------------------------------------ refusals

    def _stop(self) -> None:
        self._stopped = True
        self._begun = None
        self._update_reading()

    def _reply_and_stop(self, status: int, payload: bytes, content_type: bytes = _MSGPACK,
                        extra: bytes = b"") -> None:
        self._enqueue(_Pending(_REPLY, raw=response(status, payload, self._server.date,
                                                    content_type=content_type, close=True,
                                                    extra=extra), close=True))
        self._stop()

    def _bad_request(self, reason: str, message: str) -> None:
        if self._stopped:
            return
        self._server.refused(reason, self._remote, message)
        self._reply_and_stop(400, message.encode("utf-8", "replace") + b"\n", _TEXT)

    def _refuse_head(self) -> None:
        if self._stopped:
            return
        message = (f"request head or trailer section over {MAX_HEAD_BYTES} bytes or "
                   f"{MAX_HEADERS} fields")
        self._server.refused("head_too_large", self._remote, message)
        self._reply_and_stop(431, message.encode("ascii") + b"\n", _TEXT)

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
            elif kind == _CATALOG:
                if not self._catalog(item):
                    return
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
            return self._answer(item, done.value, _JSON if item.json else _MSGPACK)
        self._task = task = self._loop.create_task(self._finish(item, coro, waiting_for))
        task.add_done_callback(functools.partial(_cancel_if_suspended, coro))
        return False

    def _catalog(self, item: _Pending) -> bool:
        status, payload = self._calls.catalog()
        return self._answer(item, (status, payload), _JSON)

    async def _finish(self, item: _Pending, coro: Coroutine[Any, Any, Result],
                      waiting_for: Any) -> None:
        result = await _resume(coro, waiting_for)
        self._task = None
        if self._answer(item, result, _JSON if item.json else _MSGPACK):
            queue = self._queue
            self._run(queue.popleft() if queue else None)

    def _answer(self, item: _Pending, result: Result, content_type: bytes = _MSGPACK) -> bool:
        transport = self._transport
        if transport is None:
            return False
        status, payload = result
        close = not item.keep_alive
        transport.write(response(status, payload, self._server.date, content_type=content_type,
                                 close=close, http10_keep_alive=item.http10 and not close))
        if close:
            transport.close()
            return False
        return True

    def _linger_close(self) -> None:
        """Close after a refusal: shut our side, drop the client's input a while, close."""
        transport = self._transport
        if transport is None:
            return
        if self._lingering or not transport.can_write_eof():
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
