"""The admin listener's header rules and roles (coordinator.http.headers, coordinator.auth),
on both listeners as ``groupcoord serve`` wires them, over real sockets.

- a field that must be given once, given twice (``Authorization`` among them),
  is 400 and closes the connection, as on the protocol listener;
- without authentication, a ``Host`` that does not name the listener is 403
  (a DNS-rebinding page cannot drive the admin API through a browser);
  ``--admin-allowed-hosts`` adds names;
- ``GET /v1/coordinators`` and ``GET /v1/openapi.json`` need the viewer role:
  a member token gets 403 there, and still finds its coordinator with the
  ``find_coordinator`` call.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import msgpack
import pytest
from listeners_kit import InProcess, serve_in_process
from server_harness import StartServer

from coordinator.auth import TokenStore, hash_token
from coordinator.config import ConfigError, resolve
from coordinator.core import GroupCoordinator
from coordinator.core.config import CoreConfig
from coordinator.http.headers import SINGLE_VALUE_FIELDS
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage

MEMBER = secrets.token_urlsafe(32)
VIEWER = secrets.token_urlsafe(32)
ADMIN = secrets.token_urlsafe(32)

Serve = Callable[..., AbstractAsyncContextManager[InProcess]]


@pytest.fixture
def tokens(tmp_path: Path) -> TokenStore:
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in (
        {"name": "app", "hash": hash_token(MEMBER), "groups": ["orders-"]},
        {"name": "watcher", "hash": hash_token(VIEWER), "groups": ["*"], "role": "viewer"},
        {"name": "ops", "hash": hash_token(ADMIN), "groups": ["*"], "role": "admin"})))
    return TokenStore.load(path)


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """``async with serve(tokens=..., admin_names=...) as server``: both listeners
    of a real runtime on free ports of 127.0.0.1."""
    storage = await Storage.open(tmp_path / "a.db")
    metrics = Metrics()
    runtime = Runtime(GroupCoordinator(CoreConfig()), storage, WallClock(), metrics)
    await runtime.start()

    def start(**kwargs: object) -> AbstractAsyncContextManager[InProcess]:
        return serve_in_process(runtime, metrics, max_body_bytes=65536,  # type: ignore[arg-type]
                                **kwargs)
    yield start
    await runtime.stop()
    await storage.close()


async def exchange(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str],
                                                                      bytes, bool]:
    """Send one request on a fresh connection: (status, headers, body, closed by the
    server after the answer). An interim ``100 Continue`` is skipped."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"\r\n" + body)
        raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if raw_head.startswith(b"HTTP/1.1 100 "):
            raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        payload = await asyncio.wait_for(
            reader.readexactly(int(headers.get("content-length", "0"))), 10)
        try:
            closed = await asyncio.wait_for(reader.read(1), 5) == b""
        except TimeoutError:
            closed = False
        return status, headers, payload, closed
    finally:
        writer.close()


# ---------------------------------------------------------------- fields given twice


_TWICE = {"Content-Type": (b"application/json", b"text/plain"),
          "Content-Length": (b"0", b"0"),
          "Content-Encoding": (b"identity", b"identity"),
          "Transfer-Encoding": (b"chunked", b"chunked"),
          "Expect": (b"100-continue", b"100-continue"),
          "Host": (b"127.0.0.1", b"127.0.0.1")}


@pytest.mark.parametrize("field", SINGLE_VALUE_FIELDS)
async def test_a_single_value_field_given_twice_is_400_on_the_admin_listener(
        serve: Serve, tokens: TokenStore, field: str) -> None:
    """The same fields, the same answer as the protocol listener: no "first one wins"
    (a proxy in front may have checked the other one)."""
    async with serve(tokens=tokens) as server:
        # Two Authorization fields: the first an admin's, the second anything.
        values = _TWICE.get(field, (f"Bearer {ADMIN}".encode(), b"Bearer nobody"))
        head = b"GET /v1/groups HTTP/1.1\r\n"
        if field != "Host":
            head += b"Host: 127.0.0.1\r\n"
        if field != "Authorization":
            head += b"Authorization: Bearer %b\r\n" % ADMIN.encode()
        head += b"".join(b"%b: %b\r\n" % (field.encode(), v) for v in values)
        body = b"0\r\n\r\n" if field == "Transfer-Encoding" else b""
        status, _, payload, closed = await exchange(server.admin_port, head, body)
        assert status == 400, payload
        assert field.encode() in payload
        assert closed
        # One of each is answered, and the connection stays open.
        single = (b"GET /v1/groups HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Authorization: Bearer %b\r\n" % ADMIN.encode())
        status, _, _, closed = await exchange(server.admin_port, single)
        assert status == 200 and not closed


# ---------------------------------------------------------------- Host (auth off)


async def test_without_auth_the_admin_listener_answers_only_to_its_own_names(
        serve: Serve) -> None:
    async with serve() as server:
        port = server.admin_port
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}",
                     f"localhost.attacker.example.:{port}", "127.0.0.1.nip.io"):
            for path in ("/v1/groups", "/console/", "/v1/coordinators"):
                async with server.session.get(server.admin_url + path,
                                              headers={"Host": host}) as resp:
                    assert resp.status == 403, (host, path)
                    doc = await resp.json()
                    assert host in doc["message"] and "--admin-allowed-hosts" in doc["message"]
            # Changing needs the same: nothing is deleted.
            async with server.session.put(server.admin_url + "/v1/resources/orders",
                                          json={"partitions": 4},
                                          headers={"Host": host}) as resp:
                assert resp.status == 403
        async with server.session.get(server.admin_url + "/v1/resources") as resp:
            assert (await resp.json())["resources"] == {}
        # Its own names: localhost and IP addresses, with any port (a tunnel or a
        # published container port), in any case; no Host at all (HTTP/1.0).
        for host in (f"localhost:{port}", "LOCALHOST", "localhost.:8000",
                     f"127.0.0.1:{port}", f"[::1]:{port}", "10.0.0.7:9081", "[fe80::1]"):
            async with server.session.get(server.admin_url + "/v1/groups",
                                          headers={"Host": host}) as resp:
                assert resp.status == 200, host
        status, _, _, _ = await exchange(port, b"GET /healthz HTTP/1.0\r\n")
        assert status == 200
        # The protocol listener's catalog read is not the admin listener's business.
        async with server.session.get(server.url + "/v1/resources",
                                      headers={"Host": "rebind.attacker.example"}) as resp:
            assert resp.status == 200
        assert server.listeners.calls.metrics.http_refused.labels(
            "admin", "host_not_allowed")._value.get() == 4 * 4


async def test_more_names_are_allowed_by_setting_and_tokens_need_no_names(
        serve: Serve, tokens: TokenStore) -> None:
    async with serve(admin_names=frozenset({"coord-admin.internal"})) as server:
        for host, status in (("coord-admin.internal:9081", 200), ("Coord-Admin.Internal", 200),
                             ("admin.internal", 403), ("coord-admin.internal.evil", 403)):
            async with server.session.get(server.admin_url + "/v1/groups",
                                          headers={"Host": host}) as resp:
                assert resp.status == status, host
    async with serve(admin_names=frozenset({"*"})) as server, server.session.get(
            server.admin_url + "/v1/groups", headers={"Host": "anything.example"}) as resp:
        assert resp.status == 200
    # With tokens a rebinding page has no token to send: any name, the token decides.
    async with serve(tokens=tokens) as server:
        for token, status in ((None, 401), (VIEWER, 200)):
            headers = {"Host": "groupcoord-admin.ops.svc"}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            async with server.session.get(server.admin_url + "/v1/groups",
                                          headers=headers) as resp:
                assert resp.status == status


def test_admin_allowed_hosts_reaches_the_real_server(start_server: StartServer,
                                                    tmp_path: Path) -> None:
    """The setting as a flag and as an environment variable; the names of --admin-host
    and of --advertised-url are allowed without it."""
    async def check(server_admin_url: str, expected: dict[str, int]) -> None:
        async with aiohttp.ClientSession() as session:
            for host, status in expected.items():
                async with session.get(server_admin_url + "/v1/groups",
                                       headers={"Host": host}) as resp:
                    assert resp.status == status, (host, await resp.text())

    server = start_server(admin_allowed_hosts="ops.example, coord-admin.internal",
                          admin_host="localhost")
    asyncio.run(check(server.admin_url, {"ops.example": 200, "coord-admin.internal:1": 200,
                                         "localhost": 200, "evil.example": 403}))
    server = start_server(db=tmp_path / "second.db",
                          env={"GROUPCOORD_ADMIN_ALLOWED_HOSTS": "ops.example"})
    asyncio.run(check(server.admin_url, {"ops.example": 200, "coord-admin.internal": 403}))


def test_admin_allowed_hosts_takes_names_only() -> None:
    config = resolve({"admin_allowed_hosts": " a.example,b-2.internal ,, *"}, {})
    assert config.admin_allowed_host_names == ("a.example", "b-2.internal", "*")
    for bad in ("http://a.example", "a.example:9081", "a example", "[::1]", "a/b"):
        with pytest.raises(ConfigError, match=r"admin_allowed_hosts.*not a host name"):
            resolve({"admin_allowed_hosts": bad}, {})


# ---------------------------------------------------------------- roles


async def test_the_coordinators_list_and_the_openapi_document_need_the_viewer_role(
        serve: Serve, tokens: TokenStore) -> None:
    async with serve(tokens=tokens) as server:
        for path in ("/v1/coordinators", "/v1/openapi.json"):
            async with server.get(path) as resp:
                assert resp.status == 401, path
            async with server.get(path, headers={"Authorization": f"Bearer {MEMBER}"}) as resp:
                assert resp.status == 403, path
                message = (await resp.json())["message"]
                assert "'app'" in message and "viewer or admin role" in message
            for token in (VIEWER, ADMIN):
                async with server.get(path, headers={"Authorization": f"Bearer {token}"}
                                      ) as resp:
                    assert resp.status == 200, (path, token)
        # What a member needs it still reads: its coordinator, and the catalog.
        member = {"Authorization": f"Bearer {MEMBER}"}
        async with server.post("/v1/find_coordinator",
                               data=msgpack.packb({"group_id": "orders-eu"}),
                               headers={**member, "Content-Type": "application/msgpack"}
                               ) as resp:
            assert resp.status == 200
            assert msgpack.unpackb(await resp.read())["error"] is None
        for base in (server.url, server.admin_url):
            async with server.session.get(base + "/v1/resources", headers=member) as resp:
                assert resp.status == 200
