"""The protocol listener answers its own failures (no error middleware in front).

What a user relies on, unchanged by the hot-path work: an unexpected failure
in a protocol call is a 500 with an ``UNKNOWN_SERVER_ERROR`` msgpack body and
is counted; a content type with parameters is still msgpack; an admin
refusal (on the admin listener) is still JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from listeners_kit import InProcess, serve_in_process

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http import calls as calls_module
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage

HEARTBEAT = msgpack.packb({"group_id": "g", "member_id": "m", "generation_id": 1})


class Broken(Exception):
    pass


@pytest.fixture
async def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[InProcess, Metrics]]:
    storage = await Storage.open(tmp_path / "g.db")
    core = GroupCoordinator(CoreConfig(min_session_timeout_ms=100, initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()

    def broken_fetch(_wire: object) -> Any:
        raise Broken("a bug")

    # Bound when the listeners' Calls is made, so patch before starting them.
    apis = dict(calls_module.PROTOCOL_APIS)
    apis["fetch"] = (broken_fetch, apis["fetch"][1])
    monkeypatch.setattr(calls_module, "PROTOCOL_APIS", apis)
    async with serve_in_process(runtime, metrics, max_body_bytes=4096) as test_client:
        yield test_client, metrics
    await runtime.stop()
    await storage.close()


async def test_an_unexpected_failure_in_a_protocol_call_is_a_counted_500(
        client: tuple[InProcess, Metrics]) -> None:
    http, metrics = client
    resp = await http.post("/v1/fetch", data=msgpack.packb({"group_id": "g"}),
                           headers={"Content-Type": "application/msgpack"})
    assert resp.status == 500
    assert resp.content_type == "application/msgpack"
    assert msgpack.unpackb(await resp.read())["error"] == "UNKNOWN_SERVER_ERROR"
    assert b'groupcoord_requests_total{api="fetch",outcome="UNKNOWN_SERVER_ERROR"} 1.0' in (
        metrics.render())


async def test_content_type_parameters_and_case_are_accepted(
        client: tuple[InProcess, Metrics]) -> None:
    http, _ = client
    for content_type in ("application/msgpack; charset=binary", "Application/MsgPack",
                         "application/x-msgpack"):
        resp = await http.post("/v1/heartbeat", data=HEARTBEAT,
                               headers={"Content-Type": content_type})
        assert resp.status == 200, content_type
        assert msgpack.unpackb(await resp.read())["error"] == "UNKNOWN_MEMBER_ID"
    resp = await http.post("/v1/heartbeat", data=HEARTBEAT,
                           headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert msgpack.unpackb(await resp.read())["error"] == "INVALID_REQUEST"


async def test_admin_refusals_stay_json(client: tuple[InProcess, Metrics]) -> None:
    http, _ = client
    resp = await http.put("/v1/resources/orders", data=b"{",
                          headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert (await resp.json())["error"] == "INVALID_REQUEST"
    resp = await http.put("/v1/resources/orders", data=b"{}",
                          headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert (await resp.json())["error"] == "INVALID_REQUEST"
