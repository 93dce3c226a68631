"""The protocol listener (coordinator.http.fast) over real sockets on 127.0.0.1.

Each test starts the server in-process (real runtime, core and SQLite, both
listeners as ``groupcoord serve`` wires them, coordinator.http.listeners) on
free ports and stops it. Raw sockets where the wire matters (pipelining,
chunked bodies, 100-continue, HTTP/1.0, malformed input); aiohttp's client
elsewhere.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import itertools
import json
import logging
import ssl
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import trustme

from coordinator import tls
from coordinator.auth import TokenEntry, TokenStore
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http.connection import MAX_HEAD_BYTES
from coordinator.http.fast import FastServer
from coordinator.http.listeners import Listeners
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage

MAX_BODY = 4096
MAX_METADATA = 1000
CT = b"Content-Type: application/msgpack\r\n"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def join_body(member_id: str = "", group: str = "g", meta: bytes = b"meta",
              **extra: Any) -> dict[str, Any]:
    body = {"group_id": group, "member_id": member_id, "protocol_type": "resources",
            "protocols": [["range", meta]], "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 10_000, "client_id": "lean"}
    body.update(extra)
    return body


def request(path: str, body: bytes = b"", *, method: str = "POST", version: str = "1.1",
            headers: bytes = CT) -> bytes:
    return (f"{method} {path} HTTP/{version}\r\nHost: x\r\n".encode() + headers
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


HEARTBEAT_UNKNOWN = pack({"group_id": "g", "member_id": "nobody", "generation_id": 1})


class Lean:
    """A running server: its runtime, protocol listener and the URLs of both listeners."""

    def __init__(self, runtime: Runtime, metrics: Metrics, listeners: Listeners, url: str,
                 admin_url: str, port: int, admin_port: int) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.fast: FastServer = listeners.protocol
        self.host = "127.0.0.1"
        self.port = port
        self.admin_port = admin_port
        self.url = url
        self.admin_url = admin_url

    async def open(self, ssl_context: ssl.SSLContext | None = None, *, admin: bool = False
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.admin_port if admin else self.port,
                                             ssl=ssl_context)

    def refused(self, listener: str, reason: str) -> float:
        """groupcoord_http_refused_total{listener, reason} so far."""
        value = self.metrics.registry.get_sample_value(
            "groupcoord_http_refused_total", {"listener": listener, "reason": reason})
        return value or 0.0


@asynccontextmanager
async def lean_server(tmp_path: Path, *, tokens: TokenStore | None = None,
                      ssl_context: ssl.SSLContext | None = None,
                      **fast_settings: float) -> AsyncIterator[Lean]:
    storage = await Storage.open(tmp_path / "lean.db")
    core = GroupCoordinator(CoreConfig(min_session_timeout_ms=100, initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    listeners = Listeners(runtime, metrics, max_body_bytes=MAX_BODY,
                          max_metadata_bytes=MAX_METADATA, tokens=tokens, **fast_settings)
    protocol, admin = await listeners.start("127.0.0.1", 0, "127.0.0.1", 0, ssl_context)
    await runtime.start()
    try:
        yield Lean(runtime, metrics, listeners, protocol.url, admin.url, protocol.port,
                   admin.port)
    finally:
        listeners.close()
        await runtime.stop()
        await listeners.stop(1.0)
        await storage.close()


@pytest.fixture
async def lean(tmp_path: Path) -> AsyncIterator[Lean]:
    async with lean_server(tmp_path) as server:
        yield server


async def read_response(reader: asyncio.StreamReader, timeout: float = 5.0
                        ) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-case names), body (Content-Length framed)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    return status, headers, body


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), timeout) == b""
    except ConnectionResetError:
        return True


async def post(http: aiohttp.ClientSession, url: str, api: str, body: Any,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with http.post(f"{url}/v1/{api}", data=pack(body),
                         headers={"Content-Type": "application/msgpack", **(headers or {})}
                         ) as resp:
        assert resp.content_type == "application/msgpack"
        return resp.status, unpack(await resp.read())


async def stable_member(http: aiohttp.ClientSession, url: str, group: str = "g"
                        ) -> tuple[str, int]:
    _, first = await post(http, url, "join", join_body(group=group))
    member = first["member_id"]
    _, joined = await post(http, url, "join", join_body(member, group=group))
    assert joined["error"] is None, joined
    _, synced = await post(http, url, "sync", {
        "group_id": group, "member_id": member, "generation_id": joined["generation_id"],
        "assignments": [{"member_id": member, "assignment": b"plan"}]})
    assert synced["error"] is None
    return member, joined["generation_id"]


# ---------------------------------------------------------------- HTTP/1.1 framing


async def test_keep_alive_serves_many_calls_on_one_connection(lean: Lean) -> None:
    reader, writer = await lean.open()
    for _ in range(50):
        writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN))
        status, headers, body = await read_response(reader)
        assert status == 200
        assert headers["content-type"] == "application/msgpack"
        assert "date" in headers and "connection" not in headers
        assert unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    assert len(lean.fast.connections) == 1
    writer.close()


async def test_http10_closes_unless_keep_alive_is_asked(lean: Lean) -> None:
    reader, writer = await lean.open()
    writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN, version="1.0"))
    status, headers, body = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    assert await closed_by_server(reader)
    writer.close()

    reader, writer = await lean.open()
    for _ in range(2):
        writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN, version="1.0",
                             headers=CT + b"Connection: keep-alive\r\n"))
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "keep-alive"
    writer.close()


async def test_chunked_body(lean: Lean) -> None:
    reader, writer = await lean.open()
    half = len(HEARTBEAT_UNKNOWN) // 2
    parts = (HEARTBEAT_UNKNOWN[:half], HEARTBEAT_UNKNOWN[half:])
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT
                 + b"Transfer-Encoding: chunked\r\n\r\n")
    for part in parts:
        writer.write(b"%x\r\n%b\r\n" % (len(part), part))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    writer.close()


async def test_expect_100_continue(lean: Lean) -> None:
    reader, writer = await lean.open()
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT + b"Expect: 100-continue\r\n"
                 + b"Content-Length: %d\r\n\r\n" % len(HEARTBEAT_UNKNOWN))
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(HEARTBEAT_UNKNOWN)
    status, _, body = await read_response(reader)
    assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    # Over the limit with Expect: refused at once, the body never asked for.
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT + b"Expect: 100-continue\r\n"
                 + b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    status, _, body = await read_response(reader)
    assert status == 413 and unpack(body)["error"] == "INVALID_REQUEST"
    assert await closed_by_server(reader)
    writer.close()


async def test_body_over_the_limit_is_413_without_reading_it(lean: Lean) -> None:
    reader, writer = await lean.open()
    # Only the head is sent: the answer must not wait for the 1 MB announced.
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT
                 + b"Content-Length: 1000000\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 413 and headers["connection"] == "close"
    assert unpack(body) == {"error": "INVALID_REQUEST",
                            "message": f"body of 1000000 bytes is over the limit of "
                                       f"{MAX_BODY} bytes"}
    assert await closed_by_server(reader)
    writer.close()

    reader, writer = await lean.open()
    writer.write(b"POST /v1/join HTTP/1.1\r\nHost: x\r\n" + CT
                 + b"Transfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):  # 3 x 2000 bytes > 4096, never terminated
        writer.write(b"%x\r\n%b\r\n" % (2000, b"\x00" * 2000))
    status, _, body = await read_response(reader)
    assert status == 413 and "over the limit" in unpack(body)["message"]
    assert await closed_by_server(reader)
    writer.close()
    assert lean.runtime.core.list_groups() == []


async def test_wrong_content_type_is_415_and_the_connection_stays(lean: Lean) -> None:
    reader, writer = await lean.open()
    writer.write(request("/v1/heartbeat", b'group_id=g',
                         headers=b"Content-Type: application/x-www-form-urlencoded\r\n"))
    status, _, body = await read_response(reader)
    assert status == 415 and unpack(body)["error"] == "INVALID_REQUEST"
    writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN,
                         headers=b"Content-Type: Application/MsgPack; charset=binary\r\n"))
    status, _, body = await read_response(reader)
    assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    writer.close()


async def test_bad_body_is_400_naming_the_field(lean: Lean) -> None:
    async with aiohttp.ClientSession() as http:
        status, doc = await post(http, lean.url, "heartbeat",
                                 {"group_id": "g", "member_id": "m", "generation_id": "one"})
        assert status == 400 and doc["error"] == "INVALID_REQUEST"
        assert doc["message"].startswith("generation_id:")
        status, doc = await post(http, lean.url, "join", join_body(protocols=[]))
        assert status == 400 and doc["message"].startswith("protocols:")
    assert lean.runtime.core.list_groups() == []


async def test_metadata_over_the_limit_is_400_and_changes_nothing(lean: Lean) -> None:
    core = lean.runtime.core
    async with aiohttp.ClientSession() as http:
        big = b"m" * (MAX_METADATA + 1)
        body = join_body(protocols=[["range", b"ok"], ["sticky", big]])
        status, doc = await post(http, lean.url, "join", body)
        assert status == 400
        assert doc == {"error": "INVALID_REQUEST",
                       "message": f"protocols[1].metadata: {MAX_METADATA + 1} bytes is over "
                                  f"--max-metadata-bytes ({MAX_METADATA})"}
        assert core.list_groups() == []
        # Exactly at the limit is fine.
        status, doc = await post(http, lean.url, "join", join_body(meta=b"m" * MAX_METADATA))
        assert status == 200 and doc["error"] == "MEMBER_ID_REQUIRED"

        # A leader whose plan gives one member too much: refused, group still waiting.
        member = doc["member_id"]
        _, joined = await post(http, lean.url, "join", join_body(member))
        assert joined["error"] is None
        sync = {"group_id": "g", "member_id": member, "generation_id": joined["generation_id"],
                "assignments": [{"member_id": member, "assignment": big}]}
        status, doc = await post(http, lean.url, "sync", sync)
        assert status == 400
        assert doc["message"] == (f"assignments[0].assignment: {MAX_METADATA + 1} bytes is "
                                  f"over --max-metadata-bytes ({MAX_METADATA})")
        view = core.describe_group("g")
        assert view is not None and view.state == "CompletingRebalance"
        sync["assignments"] = [{"member_id": member, "assignment": b"small"}]
        status, doc = await post(http, lean.url, "sync", sync)
        assert status == 200 and doc["error"] is None and doc["assignment"] == b"small"


# ---------------------------------------------------------------- order, shim, cancellation


async def test_pipelined_requests_are_answered_in_order(lean: Lean) -> None:
    async with aiohttp.ClientSession() as http:
        member, generation = await stable_member(http, lean.url)
    parked = pack({"group_id": "g", "member_id": member, "generation_id": generation,
                   "wait_ms": 300})
    reader, writer = await lean.open()
    # A long-poll heartbeat (answered after ~300 ms), then calls answered at once.
    writer.write(request("/v1/heartbeat", parked) + request("/v1/fetch", pack({"group_id": "g"}))
                 + request("/v1/heartbeat", b"\xc1") + request("/v1/heartbeat", HEARTBEAT_UNKNOWN)
                 + request("/healthz", method="GET", headers=b"")
                 + request("/v1/resources", method="GET", headers=b""))
    answers = [await read_response(reader) for _ in range(6)]
    assert [a[0] for a in answers] == [200, 200, 400, 200, 404, 200]
    assert unpack(answers[0][2]) == {"error": None, "resources_epoch": 0}
    assert "checkpoints" in unpack(answers[1][2])
    assert unpack(answers[2][2])["error"] == "INVALID_REQUEST"
    assert unpack(answers[3][2])["error"] == "UNKNOWN_MEMBER_ID"
    assert "admin listener" in unpack(answers[4][2])["message"]
    assert json.loads(answers[5][2]) == {"resources_epoch": 0, "resources": {}}
    writer.close()


async def test_admin_routes_are_served_on_the_admin_listener_only(lean: Lean) -> None:
    """One parser per byte stream. The protocol listener answers anything
    but a protocol call (or the catalog read) itself, 404/405 naming the admin
    listener, and the connection goes on; the admin listener serves the rest."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        member, generation = await stable_member(http, lean.url)
        beat = {"group_id": "g", "member_id": member, "generation_id": generation}
        for path, method, status in [("/v1/groups/g", "GET", 404), ("/v1/groups", "GET", 404),
                                     ("/v1/resources/orders", "PUT", 404),
                                     ("/metrics", "GET", 404), ("/healthz", "GET", 404),
                                     ("/readyz", "GET", 404), ("/nowhere", "POST", 404),
                                     ("/v1/heartbeat", "GET", 405),
                                     ("/v1/resources", "DELETE", 405)]:
            async with http.request(method, f"{lean.url}{path}", json={"partitions": 4}
                                    ) as resp:
                assert resp.status == status, (method, path)
                assert resp.content_type == "application/msgpack"
                doc = unpack(await resp.read())
                assert doc["error"] == "INVALID_REQUEST"
                assert (f"admin listener (--admin-port, port {lean.admin_port} here)"
                        in doc["message"]), doc
                assert doc["listener"] == "protocol"  # a client can tell the wrong port
                if status == 405:
                    assert resp.headers["Allow"] == ("POST" if "heartbeat" in path else "GET")
            status, answer = await post(http, lean.url, "heartbeat", beat)
            assert status == 200 and answer == {"error": None, "resources_epoch": 0}
        # One connection served it all (limit=1 and keep-alive).
        assert len(lean.fast.connections) == 1
        assert lean.refused("protocol", "not_found") == 7
        assert lean.refused("protocol", "method_not_allowed") == 2

        async with http.get(f"{lean.admin_url}/v1/groups/g") as resp:
            assert resp.status == 200
            assert (await resp.json())["members"][0]["member_id"] == member
        async with http.put(f"{lean.admin_url}/v1/resources/orders",
                            json={"partitions": 4}) as resp:
            assert resp.status == 200, await resp.text()
        for path in ("/healthz", "/readyz", "/metrics", "/v1/resources"):
            async with http.get(f"{lean.admin_url}{path}") as resp:
                assert resp.status == 200, path
        async with http.post(f"{lean.admin_url}/v1/heartbeat", data=pack(beat),
                             headers={"Content-Type": "application/msgpack"}) as resp:
            assert resp.status == 404
            refusal = await resp.json()
            assert "protocol listener" in refusal["message"] and refusal["listener"] == "admin"
        # The catalog a leader reads is on the protocol listener too.
        async with http.get(f"{lean.url}/v1/resources") as resp:
            assert resp.status == 200
            assert await resp.json() == {"resources_epoch": 1, "resources": {"orders": 4}}


async def test_a_disconnected_parked_heartbeat_is_forgotten(lean: Lean) -> None:
    core = lean.runtime.core
    async with aiohttp.ClientSession() as http:
        member, generation = await stable_member(http, lean.url)
    _, writer = await lean.open()
    writer.write(request("/v1/heartbeat", pack({"group_id": "g", "member_id": member,
                                                  "generation_id": generation,
                                                  "wait_ms": 5000})))
    for _ in range(200):
        if core.parked_request_count() == 1:
            break
        await asyncio.sleep(0.01)
    assert core.parked_request_count() == 1
    writer.close()
    for _ in range(200):
        if core.parked_request_count() == 0:
            break
        await asyncio.sleep(0.01)
    assert core.parked_request_count() == 0


async def test_a_disconnected_parked_join_is_forgotten(lean: Lean) -> None:
    async with aiohttp.ClientSession() as http:
        await stable_member(http, lean.url)
        _, newcomer = await post(http, lean.url, "join", join_body())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(post(http, lean.url, "join",
                                        join_body(newcomer["member_id"])), 0.3)
    for _ in range(200):
        if lean.runtime.core.parked_request_count() == 0:
            break
        await asyncio.sleep(0.01)
    assert lean.runtime.core.parked_request_count() == 0


# ---------------------------------------------------------------- bad input, slow clients


@pytest.mark.parametrize("garbage", [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/heartbeat HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    b"POST /v1/heartbeat HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST /v1/heartbeat HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nab",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS hello
])
async def test_a_malformed_request_is_400_and_closed(lean: Lean, garbage: bytes) -> None:
    reader, writer = await lean.open()
    writer.write(garbage)
    status, headers, _ = await read_response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_malformed_after_a_parked_call_is_answered_after_it(lean: Lean) -> None:
    async with aiohttp.ClientSession() as http:
        member, generation = await stable_member(http, lean.url)
    reader, writer = await lean.open()
    writer.write(request("/v1/heartbeat", pack({"group_id": "g", "member_id": member,
                                                  "generation_id": generation,
                                                  "wait_ms": 200}))
                 + b"NOT HTTP\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 200 and unpack(body)["error"] is None
    status, _, _ = await read_response(reader)
    assert status == 400
    assert await closed_by_server(reader)
    writer.close()


async def test_malformed_after_a_refused_request_is_400_after_its_answer(lean: Lean) -> None:
    reader, writer = await lean.open()
    writer.write(request("/healthz", method="GET", headers=b"") + b"NOT HTTP\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 404 and "admin listener" in unpack(body)["message"]
    status, _, _ = await read_response(reader)
    assert status == 400
    assert await closed_by_server(reader)
    writer.close()


async def test_a_huge_head_is_431(lean: Lean) -> None:
    reader, writer = await lean.open()
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nX-Big: ")
    # One field that never ends: refused within the limit plus one read (256 KiB).
    for _ in range(100):
        writer.write(b"a" * 4096)
        await writer.drain()
    status, _, _ = await read_response(reader)
    assert status == 431
    reader, writer = await lean.open()
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\n"
                 + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n")
    status, _, _ = await read_response(reader)
    assert status == 431
    assert await closed_by_server(reader)
    writer.close()


async def test_slow_and_idle_clients_are_closed(tmp_path: Path) -> None:
    async with lean_server(tmp_path, request_timeout_s=0.3, keepalive_timeout_s=0.5) as lean:
        reader, writer = await lean.open()
        writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n")  # ...and nothing more
        status, _, _ = await read_response(reader)
        assert status == 408
        assert await closed_by_server(reader)
        writer.close()

        reader, writer = await lean.open()
        writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN))
        assert (await read_response(reader))[0] == 200
        assert await closed_by_server(reader, timeout=5)  # idle for 0.5 s
        writer.close()


# ---------------------------------------------------------------- TLS, authentication


async def test_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    with open(tmp_path / "cert.pem", "wb") as out:
        for blob in cert.cert_chain_pems:
            out.write(blob.bytes())
    server_ctx = tls.server_ssl_context(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with lean_server(tmp_path, ssl_context=server_ctx) as lean:
        reader, writer = await lean.open(client_ctx)
        writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN)
                     + request("/v1/resources", method="GET", headers=b"")
                     + request("/v1/heartbeat", HEARTBEAT_UNKNOWN))
        answers = [await read_response(reader) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert unpack(answers[2][2])["error"] == "UNKNOWN_MEMBER_ID"
        writer.close()
        assert lean.admin_url.startswith("https://")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as http:
            status, doc = await post(http, lean.url, "join", join_body())
            assert status == 200 and doc["error"] == "MEMBER_ID_REQUIRED"
            # TLS applies to the admin listener too.
            async with http.get(f"{lean.admin_url}/readyz") as resp:
                assert resp.status == 200


async def test_auth_through_the_lean_path(tmp_path: Path) -> None:
    def entry(name: str, token: str, prefixes: tuple[str, ...]) -> TokenEntry:
        return TokenEntry(name, hashlib.sha256(token.encode()).digest(), prefixes, False)

    alice, bob = "a" * 40, "b" * 40
    tokens = TokenStore([entry("alice", alice, ("orders-",)), entry("bob", bob, ("users-",))])
    async with lean_server(tmp_path, tokens=tokens) as lean, aiohttp.ClientSession() as http:
        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        async with http.post(f"{lean.url}/v1/join", data=pack(join_body(group="orders-eu")),
                             headers={"Content-Type": "application/msgpack"}) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == 'Bearer realm="groupcoord"'
            assert unpack(await resp.read())["error"] == "GROUP_AUTHORIZATION_FAILED"
        status, doc = await post(http, lean.url, "join", join_body(group="orders-eu"),
                                 bearer("c" * 40))
        assert status == 401
        status, doc = await post(http, lean.url, "join", join_body(group="orders-eu"),
                                 bearer(bob))
        assert status == 403 and doc == {
            "error": "GROUP_AUTHORIZATION_FAILED",
            "message": "token 'bob' is not granted group 'orders-eu'"}
        status, doc = await post(http, lean.url, "join", join_body(group="orders-eu"),
                                 bearer(alice))
        assert status == 200 and doc["error"] == "MEMBER_ID_REQUIRED"
        minted = doc["member_id"]
        # A member id minted for alice is unknown to anyone else.
        status, doc = await post(http, lean.url, "heartbeat",
                                 {"group_id": "users-x", "member_id": minted,
                                  "generation_id": 1}, bearer(bob))
        assert status == 200 and doc["error"] == "UNKNOWN_MEMBER_ID"
        # The catalog read on the protocol listener: any valid token (no admin flag).
        async with http.get(f"{lean.url}/v1/resources") as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == 'Bearer realm="groupcoord"'
            assert (await resp.json())["error"] == "GROUP_AUTHORIZATION_FAILED"
        async with http.get(f"{lean.url}/v1/resources", headers=bearer(bob)) as resp:
            assert resp.status == 200
        # On the admin listener, health stays open; admin needs a token.
        async with http.get(f"{lean.admin_url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{lean.admin_url}/v1/groups") as resp:
            assert resp.status == 401


async def test_shutdown_answers_parked_calls_and_closes(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http:
        async with lean_server(tmp_path) as lean:
            member, generation = await stable_member(http, lean.url)
            parked = lean.runtime.core.parked_request_count
            task = asyncio.ensure_future(post(http, lean.url, "heartbeat", {
                "group_id": "g", "member_id": member, "generation_id": generation,
                "wait_ms": 5000}))
            for _ in range(200):
                if parked() == 1:
                    break
                await asyncio.sleep(0.01)
            assert parked() == 1
            connections = lean.fast.connections
        # Leaving the block stopped the server: the parked call was answered first.
        status, doc = await asyncio.wait_for(task, 5)
        assert status == 200 and doc["error"] == "COORDINATOR_NOT_AVAILABLE"
        assert not connections


# ---------------------------------------------------------------- one strict parser


def _bearer_entry(name: str, token: str) -> TokenEntry:
    return TokenEntry(name, hashlib.sha256(token.encode()).digest(), ("",), False)


async def test_a_content_encoded_call_is_415_and_never_decompressed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip body, no token: 415 before authentication, before the
    body is read, and no decompressor is ever reached (on either listener)."""
    decompressed: list[str] = []
    real_decompressobj, real_decompress = zlib.decompressobj, zlib.decompress

    def spy_obj(*args: Any, **kwargs: Any) -> Any:
        decompressed.append("decompressobj")
        return real_decompressobj(*args, **kwargs)

    def spy(*args: Any, **kwargs: Any) -> Any:
        decompressed.append("decompress")
        return real_decompress(*args, **kwargs)

    monkeypatch.setattr(zlib, "decompressobj", spy_obj)
    monkeypatch.setattr(zlib, "decompress", spy)
    token = "t" * 40
    bomb = gzip.compress(b"\0" * (1024 * 1024))  # 1 KiB on the wire, 1 MiB inflated
    assert len(bomb) < MAX_BODY
    async with lean_server(tmp_path, tokens=TokenStore([_bearer_entry("t", token)])) as lean:
        reader, writer = await lean.open()
        for encoding in (b"gzip", b"deflate", b"br", b"GZIP, identity"):
            writer.write(request("/v1/heartbeat", bomb,
                                 headers=CT + b"Content-Encoding: %b\r\n" % encoding))
            status, headers, body = await read_response(reader)
            assert status == 415, encoding
            doc = unpack(body)
            assert doc["error"] == "INVALID_REQUEST" and "Content-Encoding" in doc["message"]
            assert "connection" not in headers  # the connection goes on
        writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN,
                             headers=CT + b"Authorization: Bearer %b\r\n" % token.encode()))
        status, _, body = await read_response(reader)
        assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
        writer.close()
        # identity is no encoding.
        async with aiohttp.ClientSession() as http:
            status, doc = await post(http, lean.url, "heartbeat",
                                     {"group_id": "g", "member_id": "m", "generation_id": 1},
                                     {"Content-Encoding": "identity",
                                      "Authorization": f"Bearer {token}"})
            assert status == 200 and doc["error"] == "UNKNOWN_MEMBER_ID"
            # The admin listener refuses a coded body before reading it, token or not.
            async with http.put(f"{lean.admin_url}/v1/resources/orders", data=bomb,
                                headers={"Content-Type": "application/json",
                                         "Content-Encoding": "gzip"}) as resp:
                assert resp.status == 415
                assert "Content-Encoding" in (await resp.json())["message"]
        assert lean.refused("protocol", "content_encoding") == 4
        assert lean.refused("admin", "content_encoding") == 1
    assert decompressed == []


async def test_pipelined_upgrade_requests_do_not_recurse(
        lean: Lean, caplog: pytest.LogCaptureFixture) -> None:
    """1,500 pipelined Upgrade requests in one send (~90 KB) are
    parsed in a loop and all answered, with nothing logged."""
    upgrade = (b"GET /v1/resources HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
               b"Upgrade: h2c\r\n\r\n")
    reader, writer = await lean.open()
    writer.write(upgrade * 1500 + request("/v1/heartbeat", HEARTBEAT_UNKNOWN))
    for _ in range(1500):
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["resources_epoch"] == 0
    status, _, body = await read_response(reader)
    assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID"
    writer.close()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_malformed_input_is_never_logged_above_debug(
        lean: Lean, caplog: pytest.LogCaptureFixture) -> None:
    """Malformed requests, oversize heads and broken bodies, on both
    listeners, are answered (400/404/413/415/431) and counted, never logged above
    DEBUG: the log does not grow with what a client sends."""
    caplog.set_level(logging.DEBUG)
    big = b"X-Big: " + b"a" * 20_000 + b"\r\n"  # over aiohttp's 8 KiB, under 64 KiB
    huge = b"X-Huge: " + b"a" * 70_000 + b"\r\n"
    gzipped = b"Content-Encoding: gzip\r\n"
    broken_chunks = b"Transfer-Encoding: chunked\r\n\r\n5\r\nab"
    protocol_cases = [
        request("/healthz", method="GET", headers=b"") + b"NOT HTTP\r\n\r\n",
        request("/v1/heartbeat", HEARTBEAT_UNKNOWN, headers=CT + huge),
        request("/v1/heartbeat", b"\x1f\x8b broken gzip", headers=CT + gzipped),
        b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT + broken_chunks + b"zz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
    ]
    admin_cases = [
        b"NOT HTTP\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n",
        b"PUT /v1/resources/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + gzipped + b"Content-Length: 10\r\n\r\n\x1f\x8b broken",
        b"PUT /v1/resources/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + broken_chunks + b"zz\r\n",
    ]
    for _ in range(10):
        for admin, cases in ((False, protocol_cases), (True, admin_cases)):
            for payload in cases:
                reader, writer = await lean.open(admin=admin)
                writer.write(payload)
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert answer[8:11] in (b" 40", b" 41", b" 43"), (admin, payload[:40], answer)
                writer.close()
    # A request line and a field between 8 and 64 KiB are fine on the protocol listener.
    reader, writer = await lean.open()
    writer.write(request("/v1/heartbeat?" + "q" * 20_000, HEARTBEAT_UNKNOWN, headers=CT + big))
    assert (await read_response(reader))[0] == 200
    writer.close()
    loud = [r for r in caplog.records if r.levelno > logging.DEBUG
            and r.name.startswith(("groupcoord.http", "aiohttp", "asyncio"))]
    assert loud == [], [(r.name, r.levelname, r.getMessage()[:100]) for r in loud]
    assert all(r.exc_info is None for r in caplog.records if r.levelno > logging.DEBUG)
    assert lean.refused("protocol", "malformed") == 30
    assert lean.refused("protocol", "head_too_large") == 10
    assert lean.refused("protocol", "content_encoding") == 10
    assert lean.refused("admin", "malformed") + lean.refused("admin", "head_too_large") >= 30


@pytest.mark.parametrize("field", [b"Authorization", b"Content-Type", b"Content-Length",
                                   b"Content-Encoding", b"Transfer-Encoding", b"Host",
                                   b"Expect"])
async def test_a_single_value_field_given_twice_is_400(lean: Lean, field: bytes) -> None:
    """No "first or last one wins": a second copy is a 400."""
    values = {b"Content-Type": (b"application/msgpack", b"application/json"),
              b"Content-Length": (b"%d" % len(HEARTBEAT_UNKNOWN),) * 2,
              b"Content-Encoding": (b"identity", b"identity"),
              b"Transfer-Encoding": (b"chunked", b"chunked"),
              b"Expect": (b"100-continue", b"100-continue")}.get(field, (b"a", b"b"))
    head = b"POST /v1/heartbeat HTTP/1.1\r\n"
    if field != b"Host":
        head += b"Host: x\r\n"
    if field != b"Content-Type":
        head += CT
    head += b"".join(b"%b: %b\r\n" % (field, v) for v in values)
    if field not in (b"Content-Length", b"Transfer-Encoding"):
        head += b"Content-Length: %d\r\n" % len(HEARTBEAT_UNKNOWN)
    reader, writer = await lean.open()
    writer.write(head + b"\r\n" + HEARTBEAT_UNKNOWN)
    status, headers, _ = await read_response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_trailer_fields_never_become_headers(lean: Lean) -> None:
    """A trailer Content-Type (or any trailer) is not a header field."""
    reader, writer = await lean.open()
    for trailer in (b"Content-Type: application/json\r\n",
                    b"Content-Encoding: gzip\r\nContent-Type: text/plain\r\n",
                    b"Authorization: Bearer x\r\nAuthorization: Bearer y\r\n"):
        writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT
                     + b"Transfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%b\r\n0\r\n%b\r\n" % (len(HEARTBEAT_UNKNOWN), HEARTBEAT_UNKNOWN,
                                                    trailer))
        status, _, body = await read_response(reader)
        assert status == 200 and unpack(body)["error"] == "UNKNOWN_MEMBER_ID", trailer
    # A trailer section is bounded like a head.
    writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n" + CT
                 + b"Transfer-Encoding: chunked\r\n\r\n"
                 + b"%x\r\n%b\r\n0\r\n" % (len(HEARTBEAT_UNKNOWN), HEARTBEAT_UNKNOWN)
                 + b"X-Trailer: " + b"t" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n")
    status, _, _ = await read_response(reader)
    assert status == 431
    writer.close()


async def test_valid_pipelined_heads_are_never_431(lean: Lean) -> None:
    """Only the bytes of a request's own head count against the
    limit. 702 small pipelined heartbeats, sent in reads that start and end inside
    heads, are all answered 200."""
    beats = b"".join(request("/v1/heartbeat", HEARTBEAT_UNKNOWN,
                             headers=CT + b"X-Pad: %b\r\n" % (b"p" * 200)) for _ in range(702))
    one = len(beats) // 702
    # Sent in parts of over 64 KiB (each read whole, most likely) that start and
    # end inside a head: cut 30 bytes into the heads of requests 0, 250, 500, 701.
    cuts = [0, 30, 250 * one + 30, 500 * one + 30, 701 * one + 30, len(beats)]
    assert all(b - a > MAX_HEAD_BYTES for a, b in itertools.pairwise(cuts[1:-1]))
    reader, writer = await lean.open()
    for start, end in itertools.pairwise(cuts):
        writer.write(beats[start:end])
        await writer.drain()
        await asyncio.sleep(0.1)
    statuses = [(await read_response(reader))[0] for _ in range(702)]
    assert statuses == [200] * 702
    writer.close()
    # A head over the limit still is 431, however it arrives: here the read after
    # the one that began it (what one read holds, the parser holds anyway).
    reader, writer = await lean.open()
    writer.write(request("/v1/heartbeat", HEARTBEAT_UNKNOWN) * 3
                 + b"POST /v1/heartbeat HTTP/1.1\r\nX-Big: " + b"b" * 1000)
    await writer.drain()
    await asyncio.sleep(0.1)
    for _ in range(MAX_HEAD_BYTES // 8192 + 1):
        writer.write(b"b" * 8192)
        await writer.drain()
        await asyncio.sleep(0.01)
    assert [(await read_response(reader))[0] for _ in range(4)] == [200, 200, 200, 431]
    writer.close()
