"""Protocol calls in JSON (docs/protocol.md, "JSON on the protocol calls"): a call
sent as application/json is
answered in JSON, bytes as base64 (checkpoint values as {"base64": ...});
refusals speak JSON too; msgpack calls are unchanged."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from listeners_kit import InProcess, serve_in_process

from coordinator.core import GroupCoordinator
from coordinator.core.config import CoreConfig
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.resources import ResourceAssignment

JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcess]:
    storage = await Storage.open(tmp_path / "json.db")
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0)),
                      storage, WallClock(), Metrics())
    await runtime.start()
    async with serve_in_process(runtime, Metrics(), max_body_bytes=64 * 1024) as tc:
        yield tc
    await runtime.stop()
    await storage.close()


async def call(server: InProcess, api: str, doc: Any, status: int = 200) -> dict[str, Any]:
    resp = await server.post(f"/v1/{api}", data=json.dumps(doc), headers=JSON)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    answer: dict[str, Any] = json.loads(await resp.read())
    return answer


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_member_in_json_alone(server: InProcess) -> None:
    resp = await server.put("/v1/resources/shards", json={"partitions": 4})
    assert resp.status == 200
    join = {"group_id": "g", "member_id": "", "protocol_type": "resources",
            "protocols": [["range", b64(b"meta")]], "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 10_000, "client_id": "curl"}
    first = await call(server, "join", join)
    assert first["error"] == "MEMBER_ID_REQUIRED"
    member = first["member_id"]
    joined = await call(server, "join", {**join, "member_id": member})
    assert joined["error"] is None and joined["leader"] == member
    assert joined["members"] == [{"member_id": member, "group_instance_id": None,
                                  "metadata": b64(b"meta")}]
    generation = joined["generation_id"]
    assignment = ResourceAssignment({"shards": [0, 1, 2, 3]}).encode()
    synced = await call(server, "sync", {
        "group_id": "g", "member_id": member, "generation_id": generation,
        "assignments": [{"member_id": member, "assignment": b64(assignment)}]})
    assert synced["error"] is None and base64.b64decode(synced["assignment"]) == assignment
    beat = await call(server, "heartbeat", {"group_id": "g", "member_id": member,
                                            "generation_id": generation})
    assert beat == {"error": None, "resources_epoch": 1}
    done = await call(server, "commit", {
        "group_id": "g", "member_id": member, "generation_id": generation,
        "checkpoints": [["shards", 0, 42], ["shards", 1, "text"],
                        ["shards", 2, {"base64": b64(b"\x00\xff")}]]})
    assert done["error"] is None
    fetched = await call(server, "fetch", {"group_id": "g"})
    assert fetched["checkpoints"] == [["shards", 0, 42], ["shards", 1, "text"],
                                      ["shards", 2, {"base64": "AP8="}]]
    # The same checkpoints in msgpack: the bytes are bytes, the text is text.
    resp = await server.post("/v1/fetch", data=msgpack.packb({"group_id": "g"}),
                             headers={"Content-Type": "application/msgpack"})
    assert resp.content_type == "application/msgpack"
    assert msgpack.unpackb(await resp.read())["checkpoints"][1:] == [
        ["shards", 1, "text"], ["shards", 2, b"\x00\xff"]]
    left = await call(server, "leave", {"group_id": "g", "members": [{"member_id": member}]})
    assert left["error"] is None and left["members"][0]["error"] is None


@pytest.mark.parametrize(("api", "doc", "needle"), [
    ("join", "{not json", "body is not valid JSON"),
    ("join", {"group_id": "g", "member_id": "", "protocol_type": "resources",
              "protocols": [["range", "!!not base64"]], "session_timeout_ms": 10_000,
              "rebalance_timeout_ms": 10_000}, "protocols[0][1]: not valid base64"),
    ("commit", {"group_id": "g", "member_id": "m", "generation_id": 1,
                "checkpoints": [["s", 0, {"hex": "00"}]]}, "checkpoints[0][2]"),
    ("heartbeat", [1, 2], "body: expected a map"),
])
async def test_bad_json_is_a_json_400_naming_the_problem(server: InProcess, api: str, doc: Any,
                                                         needle: str) -> None:
    data = doc if isinstance(doc, str) else json.dumps(doc)
    resp = await server.post(f"/v1/{api}", data=data, headers=JSON)
    assert resp.status == 400 and resp.content_type == "application/json"
    answer = json.loads(await resp.read())
    assert answer["error"] == "INVALID_REQUEST" and needle in answer["message"], answer
    groups = await server.get("/v1/groups")
    assert (await groups.json())["groups"] == []


async def test_json_with_parameters_and_a_json_413(server: InProcess) -> None:
    resp = await server.post("/v1/heartbeat", data=json.dumps({"group_id": "g"}),
                             headers={"Content-Type": "application/json; charset=utf-8"})
    assert resp.status == 400 and resp.content_type == "application/json"
    assert "generation_id" in (await resp.json())["message"] or \
        "member_id" in (await resp.json())["message"]
    big = json.dumps({"group_id": "g", "pad": "x" * (70 * 1024)})
    resp = await server.post("/v1/heartbeat", data=big, headers=JSON)
    assert resp.status == 413 and resp.content_type == "application/json"
    assert (await resp.json())["error"] == "INVALID_REQUEST"
