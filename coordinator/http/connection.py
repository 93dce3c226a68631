"""One HTTP/1.1 server connection without I/O: bytes in; requests and refusals out.

:class:`Connection` is the protocol listener's HTTP (RFC 9112), in the shape of
h11: :meth:`Connection.receive_data` takes what was read from the socket and
returns the events it completed, in order; :meth:`Connection.send` takes the
answer to the oldest request not yet answered and returns the bytes to write.
It does no I/O, reads no clock (the caller passes the time) and knows nothing
of the protocol calls: which path is which call, authentication and the
answers are :mod:`coordinator.http.fast`'s business. One parser, llhttp
(``httptools``), with one set of limits per byte stream.

Events (:data:`Event`):

- :class:`Request`: a whole request, head and body (``Content-Length`` or
  chunked; trailer fields are counted against the head limit and dropped,
  never taken as header fields, RFC 9110 6.5.1);
- :class:`ContinueWanted`: the head of a request that says
  ``Expect: 100-continue``; the caller either accepts it
  (:meth:`Connection.accept`, which gives the ``100 Continue`` to write, now or
  after the answers owed before it) or refuses it
  (:meth:`Connection.reject`: the body is never asked for; the answer closes);
- :class:`BodyTooLarge`: a body over ``max_body_bytes``, known from
  ``Content-Length`` before any of it is read, or while a chunked one arrives;
- :class:`ProtocolError`: a request the parser refuses (400 ``malformed``),
  a single-value field given twice (400 ``duplicate_header``: the fields of
  :data:`coordinator.http.headers.SINGLE_VALUE_FIELDS`), a head over
  :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` fields or a trailer section
  over :data:`MAX_HEAD_BYTES` (431 ``head_too_large``; only the bytes of the
  request's own head count, however the reads cut it).

After a :class:`BodyTooLarge` or a :class:`ProtocolError` (and a rejected head)
the connection reads nothing more: its answer closes the connection. Every
request, refused or not, is answered in the order it came (pipelining);
:meth:`Connection.send` frames each answer for its request: ``Connection:
close`` when the request did not keep the connection alive (HTTP/1.1 keeps it
by default, HTTP/1.0 with ``Connection: keep-alive``, said back to it).
``Upgrade`` is ignored (RFC 9110 7.8) on a request without a body and refused
(400) on one with a body; the rest of the read is parsed in a loop, never by
recursion.
"""

from __future__ import annotations

import logging
from collections import deque
from http import HTTPStatus

import httptools

from coordinator.http.headers import SINGLE_VALUE_FIELDS, duplicate_message

log = logging.getLogger("groupcoord.http")

#: largest request head (request line and header fields), bytes; over: 431.
MAX_HEAD_BYTES = 64 * 1024
#: most header fields in one request (aiohttp's default); over: 431.
MAX_HEADERS = 128

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
MSGPACK = b"application/msgpack"
JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"

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


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("ascii")


_STATUS_LINES: dict[int, bytes] = {}


class Request:
    """A request's head (and, once it is whole, its body) as the connection read it.

    Header values are the raw bytes of the field (``None``: not given); ``path``
    is the request target without its query, the path of an absolute-form
    target (RFC 9112 3.2.2).
    """

    __slots__ = ("authorization", "body", "complete", "content_encoding", "content_length",
                 "content_type", "expect_continue", "http10", "keep_alive", "method", "path",
                 "started")

    def __init__(self, method: bytes, path: bytes, started: float) -> None:
        self.method = method
        self.path = path
        #: the time passed to :meth:`Connection.receive_data` with the end of the head.
        self.started = started
        self.content_type: bytes | None = None
        self.authorization: bytes | None = None
        self.content_encoding: bytes | None = None
        self.content_length: int | None = None
        self.expect_continue = False
        self.keep_alive = True
        self.http10 = False
        self.body = b""
        #: the body is whole (the request came as a :class:`Request` event).
        self.complete = False


class ContinueWanted:
    """The head of a request that waits for ``100 Continue`` before its body."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class BodyTooLarge:
    """A body over the limit (``length``: as announced, or as read so far)."""

    __slots__ = ("length", "request")

    def __init__(self, request: Request, length: int) -> None:
        self.request = request
        self.length = length


class ProtocolError:
    """Input that is not an acceptable HTTP/1.1 request; answer ``status`` and close.

    ``reason`` is the fixed label to count it by (``malformed``,
    ``duplicate_header``, ``head_too_large``); ``message`` says what was wrong.
    """

    __slots__ = ("message", "reason", "status")

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message


Event = Request | ContinueWanted | BodyTooLarge | ProtocolError


class _Stop(Exception):
    """Raised from a parser callback: stop parsing this connection."""


class Connection:
    """One client connection's HTTP/1.1 state (module docs)."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._events: list[Event] = []
        self._now = 0.0
        #: no more parsing: the last answer owed closes the connection.
        self.stopped = False
        #: the answer just framed by :meth:`send` closes the connection.
        self.must_close = False
        #: a request that does not keep the connection alive was read: it is the last.
        self._last = False
        #: (keep-alive, HTTP/1.0) of each request given out and not yet answered.
        self._owed: deque[tuple[bool, bool]] = deque()
        #: an accepted head whose ``100 Continue`` waits for the answers before it.
        self._continue_owed: Request | None = None
        #: the time passed with the first byte of the request being read; ``None``
        #: between requests (for the caller's request timeout).
        self.request_began: float | None = None
        # -- the request being read
        self._request: Request | None = None
        self._url = b""
        self._seen = 0
        self._fields = 0
        self._body: list[bytes] = []
        self._body_len = 0
        self._in_head = False
        #: requests begun on this connection.
        self._messages = 0
        #: bytes of the URL and of the complete header fields of this request's head.
        self._field_bytes = 0
        #: bytes of the trailer fields of this request (chunked bodies).
        self._trailer_bytes = 0
        #: bytes of whole reads inside this request that completed nothing the
        #: parser reports (a field longer than a read): buffered by the parser.
        self._partial = 0
        # the head's fields until the head is complete
        self._content_type: bytes | None = None
        self._authorization: bytes | None = None
        self._content_length: int | None = None
        self._encoding: bytes | None = None
        self._expect = False

    @property
    def owed(self) -> int:
        """Requests and refusals given out and not yet answered by :meth:`send`."""
        return len(self._owed)

    # ------------------------------------------------------------ bytes in

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Parse ``data`` (read at ``now``); the events it completed, in order.

        Nothing once :attr:`stopped`, or after a request that closes the connection:
        the caller drops what follows.
        """
        if self.stopped or self._last:
            return []
        self._now = now
        events: list[Event] = []
        self._events = events
        # What the parser reported so far: a read that adds to none of it, inside
        # a request, is held by the parser (one field, or a trailer, longer than a read).
        inside = self.request_began is not None
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
                if self.stopped or offset >= len(view):
                    return events
                view = memoryview(view)[offset:]
                continue
            except httptools.HttpParserCallbackError:
                if not (self.stopped or self._last):  # not our _Stop: a bug in a callback
                    log.exception("HTTP parser callback failed")
                    self._error(400, "malformed", "request could not be handled")
                return events
            except httptools.HttpParserError as exc:
                self._error(400, "malformed", f"malformed request: {exc}")
                return events
            break
        if self.request_began is None or self.stopped or self._last:
            return events
        if (inside and messages == self._messages
                and reported == self._field_bytes + self._body_len + self._trailer_bytes):
            self._partial += len(data)
        else:
            self._partial = 0
        held = (self._field_bytes if self._in_head else self._trailer_bytes) + self._partial
        if held > MAX_HEAD_BYTES:
            self._too_large_head()
        return events

    # ------------------------------------------------------------ answers out

    def send(self, status: int, body: bytes, content_type: bytes, date: bytes,
             extra: bytes = b"", close: bool = False) -> bytes:
        """The bytes of the answer to the oldest request not yet answered (with
        ``close``, or when that request did not keep the connection alive, the
        answer closes it: :attr:`must_close`). A ``100 Continue`` owed to an
        accepted head follows the last answer before it."""
        owed = self._owed
        keep_alive, http10 = owed.popleft() if owed else (False, False)
        line = _STATUS_LINES.get(status)
        if line is None:
            line = _STATUS_LINES[status] = _status_line(status)
        if close or not keep_alive:
            extra += b"Connection: close\r\n"
            self.must_close = True
            self.stop()
        elif http10:
            extra += b"Connection: keep-alive\r\n"
        data = b"%bContent-Type: %b\r\nContent-Length: %d\r\nDate: %b\r\n%b\r\n%b" % (
            line, content_type, len(body), date, extra, body)
        if owed or self._continue_owed is None or self.must_close:
            return data
        self._continue_owed = None
        return data + CONTINUE

    def accept(self, head: ContinueWanted) -> bytes:
        """Accept a head that waits for ``100 Continue``: the bytes to write now (the
        interim answer, or nothing when answers before it are owed, or the body is
        here already)."""
        request = head.request
        if request.complete or self.stopped:
            return b""
        if self._owed:
            self._continue_owed = request
            return b""
        return CONTINUE

    def reject(self, head: ContinueWanted) -> None:
        """Refuse a head that waits for ``100 Continue``: its body is never asked for;
        the answer the caller sends for it (in turn, by :meth:`send`) closes."""
        if head.request.complete:
            return  # its body came anyway: its Request is the one to answer
        if not self.stopped:
            self.stop()
            self._owed.append((False, False))

    # ------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._messages += 1
        self._request = None
        self._url = b""
        self._content_type = None
        self._authorization = None
        self._content_length = None
        self._encoding = None
        self._expect = False
        self._seen = 0
        self._fields = 0
        self._body = []
        self._body_len = 0
        self.request_began = self._now
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
                self._too_large_head()
                raise _Stop
            return
        self._field_bytes += size
        self._fields += 1
        if self._fields > MAX_HEADERS or self._field_bytes > MAX_HEAD_BYTES:
            self._too_large_head()
            raise _Stop
        bit = _SINGLE_FIELDS.get(name.lower())
        if bit is None:
            return
        if self._seen & bit:
            self._error(400, "duplicate_header", duplicate_message(_FIELD_NAMES[bit]))
            raise _Stop
        self._seen |= bit
        if bit == _CONTENT_TYPE:
            self._content_type = value
        elif bit == _CONTENT_LENGTH:
            # llhttp has checked it is digits.
            try:
                self._content_length = int(value)
            except ValueError:
                self._error(400, "malformed", "Content-Length is not a number")
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
        length = self._content_length
        if parser.should_upgrade() and (self._seen & _TRANSFER_ENCODING or length):
            # llhttp hands the body of an Upgrade request to the "new protocol";
            # no client of ours sends one, so refuse it rather than misread it.
            self._error(400, "malformed", "Upgrade on a request with a body is not supported")
            raise _Stop
        url = self._url
        path = url.partition(b"?")[0] if b"?" in url else url
        if path.startswith((b"http://", b"https://")):
            # The absolute form (RFC 9112 3.2.2): its path is what counts.
            path = b"/" + [*path.split(b"/", 3), b""][3]
        self._request = request = Request(parser.get_method(), path, self._now)
        request.content_type = self._content_type
        request.authorization = self._authorization
        request.content_encoding = self._encoding
        request.content_length = length
        request.expect_continue = self._expect
        request.keep_alive = parser.should_keep_alive()
        request.http10 = parser.get_http_version() == "1.0"
        if length is not None and length > self.max_body_bytes:
            self._too_large_body(request, length)
            raise _Stop
        if self._expect:
            self._events.append(ContinueWanted(request))

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self.max_body_bytes:
            request = self._request
            assert request is not None
            self._too_large_body(request, self._body_len)
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        self._request = None
        self.request_began = None
        self._in_head = False
        body = self._body
        if body:
            request.body = body[0] if len(body) == 1 else b"".join(body)
            self._body = []
        request.complete = True
        if self._continue_owed is request:
            self._continue_owed = None
        self._owed.append((request.keep_alive, request.http10))
        self._events.append(request)
        if not request.keep_alive:
            self._last = True  # its answer closes: nothing after it is read
            raise _Stop

    # ------------------------------------------------------------ refusals

    def stop(self) -> None:
        """Read no more requests (a refusal that closes, a shutdown): what follows is
        dropped."""
        self.stopped = True
        self.request_began = None
        self._continue_owed = None

    def _error(self, status: int, reason: str, message: str) -> None:
        if self.stopped:
            return
        self.stop()
        self._owed.append((False, False))
        self._events.append(ProtocolError(status, reason, message))

    def _too_large_head(self) -> None:
        self._error(431, "head_too_large", f"request head or trailer section over "
                                           f"{MAX_HEAD_BYTES} bytes or {MAX_HEADERS} fields")

    def _too_large_body(self, request: Request, length: int) -> None:
        if self.stopped:
            return
        self.stop()
        self._owed.append((False, False))
        self._events.append(BodyTooLarge(request, length))
