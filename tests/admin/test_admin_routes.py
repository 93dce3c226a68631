"""The admin additions (docs/protocol.md, "Admin additions") through aiohttp's test client, with the
real runtime, core and SQLite: checkpoints, reset, rebalance history, member
removal, the state filter. Bad input is a 400 naming the field and changes nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from coordinator.core.commands import Commit, Join, Sync
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http.app import build_admin_app
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.messages import CommitRequest, JoinRequest, SyncAssignment, SyncRequest
from protocol.resources import ResourceAssignment


class Admin:
    def __init__(self, client: TestClient[Any, Any], runtime: Runtime) -> None:
        self.client = client
        self.runtime = runtime

    async def get(self, path: str, status: int = 200) -> Any:
        resp = await self.client.get(path)
        assert resp.status == status, await resp.text()
        return await resp.json()

    async def send(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        resp = await self.client.request(method, path, json=body)
        assert resp.status == status, await resp.text()
        return await resp.json() if resp.status != 204 else None

    async def simple_commit(self, group: str, checkpoints: list[tuple[str, int, Any]]) -> None:
        answer = await self.runtime.call(Commit(self.runtime.new_request_id(), CommitRequest(
            group, "tool", -1, tuple(checkpoints))))
        assert answer.error is None  # type: ignore[union-attr]

    async def member(self, group: str, assigned: dict[str, list[int]]) -> tuple[str, int]:
        """One member joined and synced (it leads): (member id, generation)."""
        req = JoinRequest(group, "", "resources", (("range", b""),), 10_000, 10_000,
                          group_instance_id="w1", client_id="admin-test")
        joined = await self.runtime.call(Join(self.runtime.new_request_id(), req, "127.0.0.1",
                                              "m-1"))
        member_id, generation = joined.member_id, joined.generation_id  # type: ignore[union-attr]
        blob = ResourceAssignment(assigned).encode()
        synced = await self.runtime.call(Sync(self.runtime.new_request_id(), SyncRequest(
            group, member_id, generation, (SyncAssignment(member_id, blob),))))
        assert synced.error is None  # type: ignore[union-attr]
        return member_id, generation


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    storage = await Storage.open(tmp_path / "g.db")
    core = GroupCoordinator(CoreConfig(min_session_timeout_ms=100, initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()
    app = build_admin_app(runtime, metrics, max_body_bytes=65536)
    async with TestClient(TestServer(app)) as client:
        yield Admin(client, runtime)
    await runtime.stop()
    await storage.close()


async def test_checkpoints_listing_shows_bytes_as_base64_and_who_wrote_them(
        admin: Admin) -> None:
    before = int(time.time() * 1000)
    await admin.simple_commit("g", [("s", 1, 42), ("s", 0, b"\x01\x02"), ("t", 0, "x")])
    doc = await admin.get("/v1/groups/g/checkpoints")
    who = {"member_id": "tool", "generation_id": -1}
    written = [c.pop("committed_at") for c in doc["checkpoints"]]
    assert doc["checkpoints"] == [
        {"set": "s", "index": 0, "value": "AQI=", "encoding": "base64", **who},
        {"set": "s", "index": 1, "value": 42, **who},
        {"set": "t", "index": 0, "value": "x", **who}]
    assert all(before <= t <= int(time.time() * 1000) for t in written)
    # An operator's reset is nobody's commit.
    await admin.send("POST", "/v1/groups/g/checkpoints/reset",
                     {"dry_run": False, "resources": [["s", 1]], "to_value": 0})
    doc = await admin.get("/v1/groups/g/checkpoints")
    assert doc["checkpoints"][1]["member_id"] is None
    assert doc["checkpoints"][1]["generation_id"] == -1
    assert (await admin.get("/v1/groups/nope/checkpoints", 404))["error"] == "UNKNOWN_GROUP"


async def test_reset_dry_run_then_execute(admin: Admin) -> None:
    await admin.simple_commit("g", [("s", 0, 10), ("s", 1, 20)])
    dry = await admin.send("POST", "/v1/groups/g/checkpoints/reset", {"shift_by": -3})
    assert dry["dry_run"] is True
    assert dry["before"] == [{"set": "s", "index": 0, "value": 10},
                             {"set": "s", "index": 1, "value": 20}]
    assert dry["after"] == [{"set": "s", "index": 0, "value": 7},
                            {"set": "s", "index": 1, "value": 17}]
    assert admin.runtime.core.checkpoints("g") == {("s", 0): 10, ("s", 1): 20}
    done = await admin.send("POST", "/v1/groups/g/checkpoints/reset",
                            {"dry_run": False, "resources": [["s", 1]],
                             "values": [["s", 1, "AA==", "base64"]]})
    assert done["after"] == [{"set": "s", "index": 1, "value": "AA==", "encoding": "base64"}]
    assert admin.runtime.core.checkpoints("g") == {("s", 0): 10, ("s", 1): b"\x00"}


@pytest.mark.parametrize(("body", "needle"), [
    ({}, "exactly one of to_value, shift_by, delete, values"),
    ({"to_value": 1, "delete": True}, "got to_value, delete"),
    ({"shift_by": "1"}, "shift_by: expected an integer"),
    ({"dry_run": "no", "delete": True}, "dry_run: expected true or false"),
    ({"delete": True, "resources": [["s"]]}, "resources[0]: expected [set, index]"),
    ({"values": [["s", 0, {"a": 1}]]}, "values[0][2]: expected a scalar"),
    ({"values": [["s", 0, "!!", "base64"]]}, "values[0][2]: not valid base64"),
    ({"to_value": [1]}, "to_value: expected a scalar"),
])
async def test_bad_reset_bodies_are_400_and_change_nothing(admin: Admin, body: Any,
                                                           needle: str) -> None:
    await admin.simple_commit("g", [("s", 0, 10)])
    doc = await admin.send("POST", "/v1/groups/g/checkpoints/reset", body, status=400)
    assert doc["error"] == "INVALID_REQUEST" and needle in doc["message"], doc
    assert admin.runtime.core.checkpoints("g") == {("s", 0): 10}


async def test_reset_of_an_active_group_is_409(admin: Admin) -> None:
    await admin.send("PUT", "/v1/resources/s", {"partitions": 2})
    member_id, generation = await admin.member("g", {"s": [0]})
    answer = await admin.runtime.call(Commit(admin.runtime.new_request_id(), CommitRequest(
        "g", member_id, generation, (("s", 0, 5),), "w1")))
    assert answer.error is None  # type: ignore[union-attr]
    doc = await admin.send("POST", "/v1/groups/g/checkpoints/reset",
                           {"dry_run": False, "to_value": 0}, status=409)
    assert doc["error"] == "NON_EMPTY_GROUP"
    assert admin.runtime.core.checkpoints("g") == {("s", 0): 5}


async def test_remove_member_and_the_history_says_why(admin: Admin) -> None:
    member_id, generation = await admin.member("g", {"s": [0, 1, 2]})
    history = await admin.get("/v1/groups/g/rebalances?limit=5")
    assert [r["generation_id"] for r in history["rebalances"]] == [generation]
    # The test's leader gives no why: the three are counted, their cause unknown.
    assert history["rebalances"][0]["resources"] == {"moved": 0, "assigned": 3, "revoked": 0,
                                                     "causes": {"unknown": 3}}
    assert history["rebalances"][0]["joined"] == [member_id]
    doc = await admin.send("DELETE", f"/v1/groups/g/members/{member_id}")
    assert doc == {"group_id": "g", "removed": member_id}
    group = await admin.get("/v1/groups/g")
    assert group["members"] == [] and group["state"] == "Empty"
    missing = await admin.send("DELETE", "/v1/groups/g/members/nobody", status=404)
    assert missing["error"] == "UNKNOWN_MEMBER_ID"
    assert (await admin.get("/v1/groups/g/rebalances?limit=0", 400))["error"] == \
        "INVALID_REQUEST"
    assert (await admin.get("/v1/groups/none/rebalances", 404))["error"] == "UNKNOWN_GROUP"


async def test_state_filter_and_a_group_id_with_a_slash(admin: Admin) -> None:
    await admin.simple_commit("team/a", [("s", 0, 1)])
    await admin.member("b", {"s": [0]})
    assert [g["group_id"] for g in (await admin.get("/v1/groups?state=Stable"))["groups"]] == ["b"]
    both = await admin.get("/v1/groups?state=empty,Stable")
    assert [g["group_id"] for g in both["groups"]] == ["b", "team/a"]
    bad = await admin.get("/v1/groups?state=Sleeping", 400)
    assert "unknown state 'Sleeping'" in bad["message"]
    doc = await admin.get("/v1/groups/team%2Fa/checkpoints")
    assert doc["group_id"] == "team/a" and doc["checkpoints"][0]["value"] == 1


async def test_a_resource_history_route_refuses_what_it_cannot_read(admin: Admin) -> None:
    """``GET .../resources/{set}/{index}/history``: an unknown group is a 404, an
    index that is not one or a limit out of range a 400 naming it; a set name
    may hold a "/" (sent as %2F), as a group id may."""
    await admin.member("team/a", {"orders/eu": [5]})
    doc = await admin.get("/v1/groups/team%2Fa/resources/orders%2Feu/5/history")
    assert (doc["group_id"], doc["set"], doc["index"]) == ("team/a", "orders/eu", 5)
    assert [(g["owner"], g["change"], g["cause"]) for g in doc["generations"]] == [
        ("w1", "assigned", "unknown")]
    assert (await admin.get("/v1/groups/none/resources/s/0/history", 404))["error"] == \
        "UNKNOWN_GROUP"
    bad = await admin.get("/v1/groups/team%2Fa/resources/s/x/history", 400)
    assert "index" in bad["message"]
    bad = await admin.get("/v1/groups/team%2Fa/resources/s/-1/history", 400)
    assert "index" in bad["message"]
    bad = await admin.get("/v1/groups/team%2Fa/resources/s/0/history?limit=1001", 400)
    assert "limit" in bad["message"]
