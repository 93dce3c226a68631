"""Several coordinators, the member's side, over real HTTP.

A real coordinator (the runtime, core and both HTTP listeners in this
process) and, in front of it, small real aiohttp servers standing for the
coordinators of a cluster: each answers ``find_coordinator`` with the owner
the test names, answers ``NOT_COORDINATOR`` (only ``error`` and ``url``, as
docs/protocol.md, "Several coordinators sharing groups",
says) or ``COORDINATOR_LOAD_IN_PROGRESS`` when it is not
the owner, and forwards the calls it owns to the real coordinator, byte for
byte. Stopping one refuses its connections (a killed coordinator). Real
time, sessions of 3 s: the smoke tests of the HTTP transport and router
(connections refused and reset, the not-served answers as bytes); the
routing logic, timing-exact, is in test_member_routing.py (virtual time),
including the one-URL load balancer case.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from client_harness import Ledger, MemoryStore
from listeners_kit import InProcess, serve_in_process
from server_harness import StartServer

from client.blocking import BlockingGroupMember
from client.errors import NotCoordinatorError
from client.member import GroupMember
from client.transport import AiohttpTransport
from coordinator.core import CoreConfig, GroupCoordinator
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from protocol.codec import CONTENT_TYPE, decode, encode
from protocol.errors import ErrorCode
from protocol.messages import JoinRequest

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 3_000
SHARDS = 8


@pytest.fixture
async def server() -> AsyncIterator[InProcess]:
    metrics = Metrics()
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0)),
                      MemoryStore(), WallClock(), metrics)
    await runtime.start()
    async with serve_in_process(runtime, metrics, max_body_bytes=1 << 20) as tc:
        async with tc.put("/v1/resources/shards", json={"partitions": SHARDS}) as resp:
            assert resp.status in (200, 201, 204), await resp.text()
        yield tc
    await runtime.stop()


class Fronts:
    """Stand-ins for a cluster's coordinators in front of one real coordinator."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.owner: str | None = None
        #: url -> "redirect" (NOT_COORDINATOR when not the owner) or "loading"
        self.modes: dict[str, str] = {}
        self.calls: list[tuple[float, str, str]] = []
        self.runners: dict[str, web.AppRunner] = {}
        self.session = aiohttp.ClientSession()

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/{api}", self._handle)
        app.router.add_get("/v1/resources", self._handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.runners[url] = runner
        self.modes[url] = "redirect"
        return url

    async def kill(self, url: str) -> None:
        await self.runners.pop(url).cleanup()

    async def close(self) -> None:
        for runner in self.runners.values():
            await runner.cleanup()
        await self.session.close()

    def count(self, url: str, api: str, since: float = 0.0) -> int:
        return sum(1 for t, u, a in self.calls if u == url and a == api and t >= since)

    async def _handle(self, request: web.Request) -> web.Response:
        url = f"http://{request.host}"
        api = request.match_info.get("api", "resources")
        self.calls.append((time.monotonic(), url, api))
        body = await request.read()
        if api == "find_coordinator":
            assert decode(body) == {"group_id": "g"}
            answer = ({"error": None, "url": self.owner, "partition": 3} if self.owner
                      else {"error": "COORDINATOR_NOT_AVAILABLE", "url": "", "partition": 3})
            return web.Response(body=encode(answer), content_type=CONTENT_TYPE)
        if url != self.owner and request.method == "POST":
            if self.modes[url] == "loading":
                answer = {"error": "COORDINATOR_LOAD_IN_PROGRESS", "url": ""}
            else:
                answer = {"error": "NOT_COORDINATOR", "url": self.owner or ""}
            return web.Response(body=encode(answer), content_type=CONTENT_TYPE)
        async with self.session.request(request.method, self.backend + request.path,
                                        data=body, headers={
                                            "Content-Type": request.content_type}) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)


@pytest.fixture
async def fronts(server: InProcess) -> AsyncIterator[Fronts]:
    f = Fronts(server.url)
    yield f
    await f.close()


def _member(coordinator: Any, ledger: Ledger, **kw: Any) -> GroupMember:
    return GroupMember(coordinator, "g", ["shards"], listener=ledger.listener("w1"),
                       client_id="w1", session_timeout_ms=SESSION_MS, **kw)


async def _generation(server: InProcess) -> int:
    async with server.get("/v1/groups/g") as resp:
        doc = await resp.json()
    generation: int = doc["generation_id"]
    return generation


def _dead_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed: connections refused


async def test_a_member_given_a_dead_url_first_joins_through_the_next(
        server: InProcess) -> None:
    """[dead, good]: find_coordinator skips the refused URL. (A server
    without find_coordinator, v1, answers 404 and is its own coordinator.)"""
    ledger = Ledger()
    member = _member([_dead_url(), server.url], ledger)
    try:
        member.start()
        assert len(await member.wait_assigned(10)) == SHARDS
        assert member.coordinator_url is not None
        assert member.coordinator_url.startswith("http://127.0.0.1:")
    finally:
        await member.close()


def test_a_blocking_member_takes_a_list_too(start_server: StartServer) -> None:
    """The real ``groupcoord serve`` process (this thread blocks)."""
    server = start_server(initial_rebalance_delay_ms=0)
    with urllib.request.urlopen(urllib.request.Request(
            f"{server.admin_url}/v1/resources/shards", data=b'{"partitions": 8}',
            method="PUT", headers={"Content-Type": "application/json"}), timeout=5):
        pass
    with BlockingGroupMember([_dead_url(), server.url], "g", ["shards"], client_id="b1",
                             session_timeout_ms=SESSION_MS) as member:
        assert len(member.assignment) == SHARDS
    assert server.terminate() == 0


async def test_a_member_given_one_url_asks_no_find_coordinator(fronts: Fronts) -> None:
    """One URL is presumed to be the coordinator, as before v1.1: a one-process
    server is never asked find_coordinator (nor does its --advertised-url
    matter)."""
    a = await fronts.start()
    fronts.owner = a
    ledger = Ledger()
    member = _member(a, ledger)
    try:
        member.start()
        await member.wait_assigned(10)
        await asyncio.sleep(0.5)
        assert fronts.count(a, "join") >= 1
        assert fronts.count(a, "find_coordinator") == 0
        assert member.coordinator_url == a
    finally:
        await member.close()


async def test_a_member_follows_not_coordinator_and_keeps_its_resources(
        server: InProcess, fronts: Fronts, caplog: pytest.LogCaptureFixture) -> None:
    a, b = await fronts.start(), await fronts.start()
    fronts.owner = b
    ledger = Ledger()
    member = _member([a, b], ledger)
    try:
        member.start()
        await member.wait_assigned(10)
        await asyncio.sleep(0.5)
        assert member.coordinator_url == b
        generation = await _generation(server)
        moved = time.monotonic()
        with caplog.at_level(logging.INFO, logger="groupcoord.client"):
            fronts.owner = a  # b now answers NOT_COORDINATOR naming a
            await asyncio.sleep(SESSION_MS / 1000 + 0.5)
        assert member.coordinator_url == a
        assert fronts.count(a, "heartbeat", since=moved) >= 2
        assert await _generation(server) == generation
        assert len(member.assignment) == SHARDS
    finally:
        await member.close()
    assert ledger.count("w1", "lost") == 0
    assert ledger.count("w1", "assigned") == 1
    lines = [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]
    assert lines == [f"member w1: the coordinator of group 'g' is now {a} "
                     f"(NOT_COORDINATOR from {b}; was {b})"]


async def test_a_member_whose_coordinator_is_killed_finds_the_next_through_the_list(
        server: InProcess, fronts: Fronts, caplog: pytest.LogCaptureFixture) -> None:
    a, b, c = await fronts.start(), await fronts.start(), await fronts.start()
    fronts.owner = a
    ledger = Ledger()
    member = _member([a, b, c], ledger)
    caplog.set_level(logging.INFO, logger="groupcoord.client")
    try:
        member.start()
        await member.wait_assigned(10)
        await asyncio.sleep(0.5)
        generation = await _generation(server)
        fronts.owner = c
        await fronts.kill(a)  # its parked heartbeat is cut, new connections refused
        await asyncio.sleep(SESSION_MS / 1000 + 0.5)
        assert member.coordinator_url == c
        assert await _generation(server) == generation
        assert len(member.assignment) == SHARDS
    finally:
        await member.close()
    assert ledger.count("w1", "lost") == 0
    assert ledger.count("w1", "assigned") == 1
    # The warning names the coordinator that failed, not the whole list.
    failed = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert failed and failed[0].startswith(f"member w1: cannot reach the coordinator at {a} ("), \
        failed
    assert b not in failed[0].split(" (")[0], failed
    back = [r.getMessage() for r in caplog.records if "reached the coordinator" in r.getMessage()]
    assert back and back[0].startswith(f"member w1: reached the coordinator at {c} again"), back


async def test_the_transport_reads_the_not_served_answers_before_the_call_fields(
        fronts: Fronts) -> None:
    """``{error, url}`` only: not a join response; raised as NotCoordinatorError
    (retriable) with the owner's URL, or the loading code."""
    a, b = await fronts.start(), await fronts.start()
    fronts.owner = b
    transport = AiohttpTransport(a)
    join = JoinRequest("g", "", "resources", (("range", b""),), 6000, 6000)
    try:
        with pytest.raises(NotCoordinatorError) as caught:
            await transport.call("join", join)
        assert caught.value.code is ErrorCode.NOT_COORDINATOR
        assert caught.value.owner_url == b
        assert str(caught.value).startswith("join: NOT_COORDINATOR at ")
        fronts.modes[a] = "loading"
        with pytest.raises(NotCoordinatorError) as caught:
            await transport.at(a).call("join", join)
        assert caught.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert caught.value.owner_url == ""
    finally:
        await transport.aclose()


def test_each_url_of_the_list_is_checked_and_a_bad_one_named() -> None:
    with pytest.raises(ValueError, match=r"coordinator\[1\].*'ftp://b:9080'"):
        GroupMember(["http://a:9080", "ftp://b:9080"], "g", ["s"])
    with pytest.raises(ValueError, match=r"coordinator\[0\].*no host"):
        GroupMember(["http://", "http://b:9080"], "g", ["s"])
    with pytest.raises(ValueError, match="empty"):
        GroupMember([], "g", ["s"])
    with pytest.raises(ValueError, match=r"coordinator\[1\].*string"):
        GroupMember(["http://a:9080", 9080], "g", ["s"])
    with pytest.raises(ValueError, match=r"coordinator\[1\].*https://") as caught:
        GroupMember(["https://a:9080", "http://u:secret@b:9080"], "g", ["s"],
                    ca_file="/nonexistent.pem")
    assert "secret" not in str(caught.value)
    with pytest.raises(ValueError, match="port"):
        GroupMember("http://a:notaport", "g", ["s"])
    # one URL keeps its old message
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        GroupMember("a:9080", "g", ["s"])
