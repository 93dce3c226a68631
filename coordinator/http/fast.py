"""The protocol listener: the six protocol calls over :mod:`coordinator.http.connection`.

aiohttp's request machinery alone (parser wrapper, request and response
objects, router, stream reader, writer) costs more CPU than a heartbeat's
whole budget, so ``groupcoord serve`` listens for the workers with
:class:`FastServer`. Each connection is a :class:`FastProtocol`, a thin
:class:`asyncio.Protocol` that moves bytes between its transport and a sans-IO
:class:`~coordinator.http.connection.Connection` (the HTTP/1.1 of the
listener: parsing, limits, framing, pipelining order) and hands each request
to :meth:`FastServer.answer`. That answers ``POST
/v1/{join,sync,heartbeat,leave,commit,fetch,find_coordinator}`` through
:class:`coordinator.http.calls.Calls`, and ``GET /v1/resources`` (the catalog
a leader reads before it assigns; JSON, as on the admin listener). While the
start-up check of the advertised URL runs, and only then, it also answers
``GET /v1/self-check/{challenge}`` with an HMAC of the challenge
(:meth:`coordinator.http.listeners.Listeners.check_reaches_self`).

One parser, one set of limits, per byte stream (docs/operations.md, "Listeners"): nothing read here
is handed to another parser. Any other method or path is answered here, 404
(unknown path) or 405 (a protocol path with another method, ``Allow`` names
the right one), msgpack ``{error: INVALID_REQUEST, message}`` saying that
admin calls, ``/metrics``, ``/healthz`` and ``/readyz`` are on the admin
listener (:mod:`coordinator.http.listeners`); the connection stays open.

Requests of one connection are answered strictly in order: one is in flight
at a time, the ones parsed behind it wait in a queue (reading pauses when
:data:`MAX_QUEUED` are waiting, or while the client does not read its
answers). Most calls are answered at once (the runtime answers a heartbeat
within its apply step); one whose answer waits (a parked join, sync or
long-poll heartbeat, a commit waiting for its write, a large body decoded off
the loop) is a future, and the next request waits for it.

Refusals, counted in ``groupcoord_http_refused_total{listener="protocol",
reason}``; none is logged above DEBUG, so no client can fill the log:

- the connection's own (:mod:`coordinator.http.connection`): ``malformed`` and
  ``duplicate_header`` (400), ``head_too_large`` (431), all closing;
- a body over ``--max-body-bytes``: 413 as soon as that is known, closed;
- a protocol call with a ``Content-Encoding`` other than ``identity``
  (``content_encoding``): 415, before authentication; nothing is ever
  decompressed on this listener;
- a request not whole within :data:`REQUEST_TIMEOUT_S` of its first byte
  (``timeout``): 408, closed.

A refused request with ``Expect: 100-continue`` is answered at once and the
connection closed (the body is never asked for); one without is answered once
its body is read, keeping the connection. A client that disconnects while its
call is parked (a join, a sync, a long-poll heartbeat) cancels the call's
future, so the runtime tells the core (``Cancelled``). An idle keep-alive
connection is closed after :data:`KEEPALIVE_TIMEOUT_S`. TLS is
``loop.create_server(ssl=...)``'s business, below this protocol.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import hmac
import json
import logging
import ssl
import time
from collections import deque
from typing import cast

from coordinator import auth
from coordinator.auth import TokenEntry
from coordinator.http.calls import Calls, Result, is_json
from coordinator.http.connection import (
    JSON,
    MSGPACK,
    TEXT,
    BodyTooLarge,
    Connection,
    ContinueWanted,
    ProtocolError,
    Request,
)
from protocol import codec
from protocol.errors import ErrorCode
from protocol.messages import LISTENER_FIELD, PROTOCOL_LISTENER, Api

log = logging.getLogger("groupcoord.http")

#: seconds an idle keep-alive connection is kept (aiohttp's former default).
KEEPALIVE_TIMEOUT_S = 75.0
#: seconds from a request's first byte to its last (slow or stalled clients).
REQUEST_TIMEOUT_S = 30.0
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

#: an answer: (status, body, content type, more header lines).
Reply = tuple[int, bytes, bytes, bytes]
_UNAUTHORIZED = b"WWW-Authenticate: %b\r\n" % auth.WWW_AUTHENTICATE.encode()


def self_check_proof(key: bytes, challenge: bytes) -> bytes:
    """The answer to ``GET /v1/self-check/{challenge}``: the challenge's HMAC under
    the key of the running check (:attr:`FastServer.self_check_key`)."""
    return hmac.new(key, challenge, hashlib.sha256).hexdigest().encode("ascii")


def _http_date() -> bytes:
    return email.utils.formatdate(usegmt=True).encode("ascii")


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


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _as_json(request: Request) -> bool:
    """The call came in JSON: so do its answer and its refusals."""
    content_type = request.content_type
    return (content_type is not None and content_type != MSGPACK
            and is_json(content_type.decode("latin-1")))


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

    # ------------------------------------------------------------ answers

    def answer(self, request: Request, remote: str) -> Reply | asyncio.Future[Result]:
        """The answer to a whole request, or a future of a call's ``(status, body)``
        (its content type: :meth:`reply_type`)."""
        path = request.path
        api = self.paths.get(path)
        if api is None or request.method != b"POST":
            refusal = self._refuse_other(request.method, path, api, request, remote)
            if refusal is not None:
                return refusal
            if path == CATALOG_PATH:
                status, body = self.calls.catalog()
                return status, body, JSON, b""
            # The start-up check that the advertised URL reaches this process: the
            # proof needs the key, which never leaves it (_refuse_other let it through).
            key = self.self_check_key
            assert key is not None
            return 200, self_check_proof(key, path[len(SELF_CHECK_PREFIX):]), TEXT, b""
        as_json = _as_json(request)
        admitted = self._admit(api, request, as_json, remote)
        if isinstance(admitted, tuple):
            return admitted
        outcome = self.calls.call(api, request.body, as_json, remote, admitted,
                                  request.started)
        if not isinstance(outcome, tuple):
            return outcome
        status, body = outcome
        return status, body, JSON if as_json else MSGPACK, b""

    @staticmethod
    def reply_type(request: Request) -> bytes:
        """The content type of a call's answer: JSON for a call in JSON, else msgpack."""
        return JSON if _as_json(request) else MSGPACK

    def refusal(self, request: Request, remote: str) -> Reply | None:
        """What to refuse a request with, judged from its head alone, else ``None``:
        404/405 for what this listener does not serve, 415 for a coded body, 401
        without a valid token, 415/413 for a call's content type or length."""
        path = request.path
        api = self.paths.get(path)
        if api is None or request.method != b"POST":
            return self._refuse_other(request.method, path, api, request, remote)
        admitted = self._admit(api, request, _as_json(request), remote)
        return admitted if isinstance(admitted, tuple) else None

    def _admit(self, api: Api, request: Request, as_json: bool,
               remote: str) -> Reply | TokenEntry | None:
        """A call's refusal from its head (415 for a coded body, 401 without a valid
        token, 415/413 for its content type or length), else the caller's token
        entry (``None``: authentication off)."""
        calls = self.calls
        reply_type = JSON if as_json else MSGPACK
        encoding = request.content_encoding
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            # Before authentication and before the body: nothing is decompressed here.
            self.refused("content_encoding", remote, _shown(encoding))
            status, payload = calls.refuse(
                api, 415, f"Content-Encoding {_shown(encoding.strip())!r} is not accepted: "
                          f"send the body unencoded", request.started, as_json)
            return status, payload, reply_type, b""
        token = None
        if calls.tokens is not None:
            token = calls.authenticate(_text(request.authorization))
            if token is None:
                return (401, _error_json(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                         auth.UNAUTHORIZED_MESSAGE)
                        if as_json else auth.unauthorized_msgpack(), reply_type, _UNAUTHORIZED)
        refused = calls.early_refusal(api, _text(request.content_type),
                                      request.content_length, request.started)
        if refused is not None:
            return refused[0], refused[1], reply_type, b""
        return token

    def _refuse_other(self, method: bytes, path: bytes, api: Api | None, request: Request,
                      remote: str) -> Reply | None:
        """Anything but a protocol call: the catalog read and the self-check pass
        (``None``), else 404/405."""
        if path == CATALOG_PATH and method == b"GET":
            if (self.calls.tokens is not None
                    and self.calls.authenticate(_text(request.authorization)) is None):
                return (401, _error_json(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                         auth.UNAUTHORIZED_MESSAGE), JSON, _UNAUTHORIZED)
            return None
        if (self.self_check_key is not None and method == b"GET"
                and path.startswith(SELF_CHECK_PREFIX)):
            return None
        if api is not None or path == CATALOG_PATH:
            allowed = b"GET" if api is None else b"POST"
            message = (f"{_shown(method)} is not allowed on {_shown(path)}: use "
                       f"{allowed.decode()}; {admin_hint(self.admin_port)}")
            self.refused("method_not_allowed", remote, message)
            return 405, _error_msgpack(message), MSGPACK, b"Allow: %b\r\n" % allowed
        message = (f"no protocol call at {_shown(method)} {_shown(path)}: this listener "
                   f"serves POST /v1/{{{','.join(sorted(self.calls.apis))}}} and GET "
                   f"/v1/resources; {admin_hint(self.admin_port)}")
        self.refused("not_found", remote, message)
        return 404, _error_msgpack(message), MSGPACK, b""

    def too_large(self, event: BodyTooLarge, remote: str) -> Reply:
        """The answer to a body over the limit: what its head is refused with, else 413."""
        request = event.request
        refusal = self.refusal(request, remote)
        if refusal is not None:
            return refusal
        message = f"body is over the limit of {self.calls.max_body_bytes} bytes"
        api = self.paths.get(request.path)
        if api is not None:
            as_json = _as_json(request)
            status, payload = self.calls.refuse(api, 413, message, request.started, as_json)
            return status, payload, JSON if as_json else MSGPACK, b""
        return 413, _error_json(ErrorCode.INVALID_REQUEST, message), JSON, b""

    # ------------------------------------------------------------ listening

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
    """One client connection: bytes between its transport and its
    :class:`~coordinator.http.connection.Connection`, requests to
    :meth:`FastServer.answer`, in order (module docs)."""

    def __init__(self, server: FastServer) -> None:
        self._server = server
        self._loop = server.loop
        self._conn = Connection(server.calls.max_body_bytes)
        self._transport: asyncio.Transport | None = None
        self._remote = ""
        #: requests (and closing refusals) waiting behind the one in flight.
        self._queue: deque[Request | Reply] = deque()
        #: the call in flight: its future, and the request it answers.
        self._task: asyncio.Future[Result] | None = None
        self._in_flight: Request | None = None
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
        task = self._task
        if task is not None:
            # The client went away while its call was in flight (parked join,
            # sync or long-poll heartbeat): cancelling the call's future makes the
            # runtime send Cancelled to the core.
            self._task = self._in_flight = None
            task.cancel()

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
                  or self._conn.stopped) and not self._lingering
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
        self._conn.stop()
        self._update_reading()
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
        began = self._conn.request_began
        if began is not None:
            elapsed = time.perf_counter() - began
            if elapsed >= server.request_timeout_s:
                # A slow or stalled client: the request did not arrive in time.
                server.refused("timeout", self._remote, "request not received in time")
                if self._task is None and not self._queue:
                    transport.write(self._conn.send(408, b"request not received in time\n",
                                                    TEXT, server.date, close=True))
                    self._update_reading()
                    self._linger_close()
                else:
                    transport.close()
                return
            deadline = min(deadline, now + server.request_timeout_s - elapsed)
        elif self._task is None and not self._queue:
            if now - self._idle_since >= server.keepalive_timeout_s:
                transport.close()
                return
            deadline = min(deadline, self._idle_since + server.keepalive_timeout_s)
        self._timer = self._loop.call_at(deadline, self._on_timer)

    # ------------------------------------------------------------ bytes in

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn.stopped:
            if self._lingering and self._transport is not None:
                self._lingered += len(data)
                if self._lingered > MAX_LINGER_BYTES:
                    self._transport.close()
            return
        for event in conn.receive_data(data, time.perf_counter()):
            if type(event) is Request:
                if self._task is None and not self._queue:
                    self._run(event)  # nothing before it: answered now
                else:
                    self._enqueue(event)
            elif type(event) is ContinueWanted:
                self._continue(event)
            elif type(event) is BodyTooLarge:
                self._enqueue(self._server.too_large(event, self._remote))
            else:
                assert type(event) is ProtocolError
                self._server.refused(event.reason, self._remote, event.message)
                self._enqueue((event.status, event.message.encode("utf-8", "replace") + b"\n",
                               TEXT, b""))
        if conn.stopped:
            self._update_reading()

    def _continue(self, head: ContinueWanted) -> None:
        """``Expect: 100-continue``: ask for the body, or refuse at once and close."""
        if head.request.complete:
            return  # the body came without waiting: the Request follows
        refusal = self._server.refusal(head.request, self._remote)
        if refusal is None:
            interim = self._conn.accept(head)
            if interim:
                self._write(interim)
            return
        self._conn.reject(head)
        self._enqueue(refusal)

    # ------------------------------------------------------------ answers out, in order

    def _enqueue(self, item: Request | Reply) -> None:
        if self._task is None and not self._queue:
            self._run(item)
            return
        self._queue.append(item)
        if len(self._queue) >= MAX_QUEUED and not self._paused_queue:
            self._paused_queue = True
            self._update_reading()

    def _run(self, item: Request | Reply | None) -> None:
        """Answer ``item`` and whatever follows it, until a call has to wait."""
        queue = self._queue
        server = self._server
        conn = self._conn
        while item is not None:
            transport = self._transport
            if transport is None:
                return
            if type(item) is Request:
                answer = server.answer(item, self._remote)
                if not isinstance(answer, tuple):
                    self._task = answer
                    self._in_flight = item
                    answer.add_done_callback(self._answered)
                    return
                status, body, content_type, extra = answer
                transport.write(conn.send(status, body, content_type, server.date, extra))
                if conn.must_close:
                    transport.close()
                    return
            else:
                # A refusal the connection closes after (its body never read).
                status, body, content_type, extra = cast(Reply, item)
                transport.write(conn.send(status, body, content_type, server.date, extra,
                                          close=True))
                self._linger_close()
                return
            item = queue.popleft() if queue else None
            if self._paused_queue and len(queue) <= MAX_QUEUED // 2:
                self._paused_queue = False
                self._update_reading()
        self._drained()

    def _answered(self, future: asyncio.Future[Result]) -> None:
        """The call in flight has its answer: write it, go on with the queue."""
        request = self._in_flight
        if future is not self._task or request is None:
            return  # the connection is gone
        self._task = self._in_flight = None
        transport = self._transport
        if transport is None or future.cancelled():
            return
        status, body = future.result()
        transport.write(self._conn.send(status, body, self._server.reply_type(request),
                                        self._server.date))
        if self._conn.must_close:
            transport.close()
            return
        queue = self._queue
        self._run(queue.popleft() if queue else None)

    def _drained(self) -> None:
        """Nothing in flight or queued: idle clock, reading."""
        if self._closing and self._transport is not None:
            self._transport.close()
            return
        if self._conn.request_began is None:
            self._idle_since = self._loop.time()
        if self._paused_queue:
            self._paused_queue = False
            self._update_reading()

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
