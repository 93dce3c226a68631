"""The protocol listener's HTTP/1.1 (coordinator.http.connection), bytes in and out.

No socket and no event loop: bytes are fed to a :class:`Connection` as a
transport would hand them over, cut wherever a test likes, and the events and
the answers' bytes are what a client relies on.
"""

from __future__ import annotations

from coordinator.http.connection import (
    CONTINUE,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MSGPACK,
    TEXT,
    BodyTooLarge,
    Connection,
    ContinueWanted,
    Event,
    ProtocolError,
    Request,
)

MAX_BODY = 1000
DATE = b"Sat, 28 Nov 2026 18:00:00 GMT"


def post(path: bytes = b"/v1/heartbeat", body: bytes = b"beat", *, version: bytes = b"1.1",
         headers: bytes = b"Content-Type: application/msgpack\r\n") -> bytes:
    return (b"POST %b HTTP/%b\r\nHost: x\r\n%bContent-Length: %d\r\n\r\n%b"
            % (path, version, headers, len(body), body))


def feed(conn: Connection, *reads: bytes, now: float = 1.0) -> list[Event]:
    events: list[Event] = []
    for data in reads:
        events += conn.receive_data(data, now)
    return events


def requests(events: list[Event]) -> list[Request]:
    assert all(type(e) is Request for e in events), events
    return [e for e in events if isinstance(e, Request)]


def answer(conn: Connection, body: bytes = b"ok", **kwargs: bool) -> bytes:
    return conn.send(200, body, MSGPACK, DATE, **kwargs)


def test_a_request_is_read_whole_with_the_fields_that_matter() -> None:
    conn = Connection(MAX_BODY)
    [request] = requests(feed(conn, post(
        b"/v1/join?x=1", b"\x81\xa1a\x01",
        headers=b"Content-Type: application/json\r\nAuthorization: Bearer t\r\n"
                b"Content-Encoding: identity\r\n"), now=7.5))
    assert (request.method, request.path, request.body) == (b"POST", b"/v1/join", b"\x81\xa1a\x01")
    assert request.content_type == b"application/json"
    assert request.authorization == b"Bearer t"
    assert request.content_encoding == b"identity"
    assert request.content_length == 4 and request.started == 7.5
    assert request.keep_alive and not request.http10 and request.complete
    assert conn.owed == 1 and conn.request_began is None


def test_pipelined_requests_come_out_in_order_and_are_answered_in_order() -> None:
    conn = Connection(MAX_BODY)
    got = requests(feed(conn, post(body=b"one") + post(b"/v1/fetch", b"two")
                        + post(b"/v1/leave", b"three")))
    assert [(r.path, r.body) for r in got] == [(b"/v1/heartbeat", b"one"),
                                               (b"/v1/fetch", b"two"),
                                               (b"/v1/leave", b"three")]
    assert conn.owed == 3
    first = answer(conn, b"first")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"\r\n\r\nfirst")
    assert b"Content-Length: 5\r\n" in first and b"Date: %b\r\n" % DATE in first
    assert b"Connection" not in first and not conn.must_close
    assert answer(conn, b"second").endswith(b"second") and conn.owed == 1


def test_partial_reads_byte_by_byte_make_one_request() -> None:
    conn = Connection(MAX_BODY)
    data = post(body=b"x" * 300) + post(body=b"y")
    events = feed(conn, *(data[i:i + 1] for i in range(len(data))))
    assert [r.body for r in requests(events)] == [b"x" * 300, b"y"]


def test_a_chunked_body_is_joined_and_its_trailers_are_not_headers() -> None:
    conn = Connection(MAX_BODY)
    head = (b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    [request] = requests(feed(conn, head, b"3\r\nabc\r\n", b"2\r\nde\r\n",
                              b"0\r\nContent-Type: text/plain\r\nAuthorization: x\r\n\r\n"))
    assert request.body == b"abcde"
    assert request.content_type == b"application/msgpack" and request.authorization is None
    # A trailer section is bounded like a head.
    events = feed(conn, head, b"1\r\na\r\n0\r\nX-T: " + b"t" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n")
    [error] = events
    assert isinstance(error, ProtocolError)
    assert (error.status, error.reason) == (431, "head_too_large")


def test_a_body_over_the_limit_is_known_from_its_head_and_nothing_more_is_read() -> None:
    conn = Connection(MAX_BODY)
    [too_large] = feed(conn, b"POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
    assert isinstance(too_large, BodyTooLarge)
    assert too_large.length == 5000 and too_large.request.path == b"/v1/join"
    assert conn.stopped and feed(conn, b"x" * 5000 + post()) == []
    data = conn.send(413, b"too large", MSGPACK, DATE)
    assert data.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"Connection: close\r\n" in data and conn.must_close


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives() -> None:
    conn = Connection(MAX_BODY)
    events = feed(conn, b"POST /v1/commit HTTP/1.1\r\nHost: x\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n",
                  *(b"%x\r\n%b\r\n" % (400, b"c" * 400) for _ in range(3)))
    [too_large] = events
    assert isinstance(too_large, BodyTooLarge) and too_large.length == 1200
    assert conn.stopped


def test_a_head_over_the_limit_is_431_however_the_reads_cut_it() -> None:
    for reads in ([post(headers=b"X-Big: " + b"b" * MAX_HEAD_BYTES + b"\r\n")],
                  # one field longer than any read: the parser holds it
                  [b"POST /v1/heartbeat HTTP/1.1\r\nX-Big: "]
                  + [b"b" * 8192] * (MAX_HEAD_BYTES // 8192 + 1),
                  [post(headers=b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS)))]):
        conn = Connection(MAX_BODY)
        events = feed(conn, *reads)
        assert len(events) == 1 and isinstance(events[0], ProtocolError), events
        assert (events[0].status, events[0].reason) == (431, "head_too_large")
        assert conn.stopped and conn.owed == 1


def test_only_a_requests_own_head_counts_against_the_limit() -> None:
    """Many small pipelined heads, read in pieces over the limit that start and end
    inside heads: all whole requests."""
    one = post(headers=b"Content-Type: application/msgpack\r\nX-Pad: %b\r\n" % (b"p" * 200))
    data = one * 700
    cut = 30
    reads = [data[:cut], data[cut:cut + 300 * len(one)], data[cut + 300 * len(one):]]
    assert all(len(r) > MAX_HEAD_BYTES for r in reads[1:])
    conn = Connection(MAX_BODY)
    assert len(requests(feed(conn, *reads))) == 700


def test_a_single_value_field_given_twice_is_400_naming_it() -> None:
    conn = Connection(MAX_BODY)
    events = feed(conn, post() + post(headers=b"Content-Type: application/msgpack\r\n"
                                              b"content-type: application/json\r\n") + post())
    first, error = events
    assert isinstance(first, Request)
    assert isinstance(error, ProtocolError)
    assert (error.status, error.reason) == (400, "duplicate_header")
    assert "Content-Type" in error.message
    # The refusal is owed after the request before it, and closes.
    assert conn.owed == 2
    assert b"Connection" not in answer(conn)
    refused = conn.send(400, error.message.encode(), TEXT, DATE)
    assert refused.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Connection: close\r\n" in refused and conn.must_close


def test_malformed_input_is_400_and_stops_the_connection() -> None:
    conn = Connection(MAX_BODY)
    [error] = feed(conn, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)
    assert isinstance(error, ProtocolError) and (error.status, error.reason) == (400,
                                                                                  "malformed")
    assert feed(conn, post()) == []


def test_keep_alive_and_close() -> None:
    # HTTP/1.0 closes unless it asks to be kept alive (and is told so).
    conn = Connection(MAX_BODY)
    requests(feed(conn, post(version=b"1.0")))
    data = answer(conn)
    assert b"Connection: close\r\n" in data and conn.must_close and conn.stopped
    conn = Connection(MAX_BODY)
    got = requests(feed(conn, post(version=b"1.0", headers=b"Connection: keep-alive\r\n") * 2))
    assert [r.http10 for r in got] == [True, True]
    assert b"Connection: keep-alive\r\n" in answer(conn) and not conn.must_close
    # HTTP/1.1 keeps it unless asked to close; what follows a close is not read.
    conn = Connection(MAX_BODY)
    got = requests(feed(conn, post(headers=b"Connection: close\r\n") + post()))
    assert [r.keep_alive for r in got] == [False]
    assert b"Connection: close\r\n" in answer(conn) and conn.must_close
    # An answer the caller closes.
    conn = Connection(MAX_BODY)
    requests(feed(conn, post()))
    assert b"Connection: close\r\n" in answer(conn, close=True) and conn.must_close


def test_expect_100_continue_is_asked_for_in_turn() -> None:
    conn = Connection(MAX_BODY)
    head = (b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: 4\r\n\r\n")
    [wanted] = feed(conn, head)
    assert isinstance(wanted, ContinueWanted) and wanted.request.expect_continue
    assert conn.accept(wanted) == CONTINUE
    [request] = requests(feed(conn, b"beat"))
    assert request is wanted.request and request.body == b"beat"
    answer(conn)
    # Behind a request not answered yet: the 100 follows that answer.
    first, wanted = feed(conn, post() + head)
    assert isinstance(first, Request) and isinstance(wanted, ContinueWanted)
    assert conn.accept(wanted) == b""
    assert answer(conn).endswith(b"ok" + CONTINUE)
    # The body came without waiting: no 100 at all.
    conn = Connection(MAX_BODY)
    wanted, request = feed(conn, head + b"beat")
    assert isinstance(wanted, ContinueWanted) and isinstance(request, Request)
    assert conn.accept(wanted) == b"" and not answer(conn).endswith(CONTINUE)


def test_a_rejected_head_is_answered_in_turn_and_closes() -> None:
    conn = Connection(MAX_BODY)
    _first, wanted = feed(conn, post() + b"POST /v1/join HTTP/1.1\r\nExpect: 100-continue\r\n"
                                         b"Content-Length: 500\r\n\r\n")
    assert isinstance(wanted, ContinueWanted)
    conn.reject(wanted)
    assert conn.stopped and conn.owed == 2
    assert b"Connection" not in answer(conn)
    refused = conn.send(401, b"no", MSGPACK, DATE)
    assert refused.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b"Connection: close\r\n" in refused and conn.must_close


def test_upgrade_is_ignored_without_a_body_and_refused_with_one() -> None:
    conn = Connection(MAX_BODY)
    upgrade = (b"GET /v1/resources HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
               b"Upgrade: h2c\r\n\r\n")
    got = requests(feed(conn, upgrade * 500 + post()))
    assert [r.method for r in got] == [b"GET"] * 500 + [b"POST"]
    conn = Connection(MAX_BODY)
    [error] = feed(conn, b"POST /v1/join HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                         b"Upgrade: h2c\r\nContent-Length: 3\r\n\r\nabc")
    assert isinstance(error, ProtocolError) and error.status == 400


def test_an_absolute_form_target_is_read_by_its_path() -> None:
    conn = Connection(MAX_BODY)
    [request] = requests(feed(conn, post(b"http://coordinator:8080/v1/sync?q=1")))
    assert request.path == b"/v1/sync"


def test_the_time_a_request_began_is_kept_until_it_is_whole() -> None:
    conn = Connection(MAX_BODY)
    assert conn.request_began is None
    data = post()
    assert feed(conn, data[:10], now=3.0) == []
    assert conn.request_began == 3.0
    [request] = requests(feed(conn, data[10:], now=4.0))
    assert request.started == 4.0 and conn.request_began is None
