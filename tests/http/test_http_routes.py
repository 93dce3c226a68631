"""HTTP routes of both listeners (in-process, listeners_kit), with the real runtime, core
and SQLite.

Bad input: 400/413/415 with an ``INVALID_REQUEST`` body in the call's encoding,
naming the field, and no state change.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from listeners_kit import InProcess, serve_in_process

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.resources import ResourceAssignment

MSGPACK = {"Content-Type": "application/msgpack"}
MAX_BODY = 4096


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def join_body(member_id: str = "", group: str = "g", **extra: Any) -> dict[str, Any]:
    body = {"group_id": group, "member_id": member_id, "protocol_type": "resources",
            "protocols": [["range", b"meta"]], "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 10_000, "client_id": "web"}
    body.update(extra)
    return body


class Api:
    def __init__(self, client: InProcess, runtime: Runtime, storage: Storage) -> None:
        self.client = client
        self.runtime = runtime
        self.storage = storage

    async def call(self, api: str, body: Any, status: int = 200) -> dict[str, Any]:
        resp = await self.client.post(f"/v1/{api}", data=pack(body), headers=MSGPACK)
        assert resp.status == status, await resp.read()
        assert resp.content_type == "application/msgpack"
        doc: dict[str, Any] = msgpack.unpackb(await resp.read(), raw=False)
        return doc

    async def stable_member(self, group: str = "g", assignment: bytes = b"") -> tuple[str, int]:
        first = await self.call("join", join_body(group=group))
        assert first["error"] == "MEMBER_ID_REQUIRED"
        member = first["member_id"]
        assert member.startswith("web-")
        joined = await self.call("join", join_body(member, group=group))
        assert joined["error"] is None, joined
        synced = await self.call("sync", {"group_id": group, "member_id": member,
                                          "generation_id": joined["generation_id"],
                                          "assignments": [{"member_id": member,
                                                           "assignment": assignment}]})
        assert synced["error"] is None
        return member, joined["generation_id"]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    storage = await Storage.open(tmp_path / "g.db")
    core = GroupCoordinator(CoreConfig(min_session_timeout_ms=100, initial_rebalance_delay_ms=0))
    metrics = Metrics()
    metrics.watch_core(core.state_counts, core.member_count)
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()
    async with serve_in_process(runtime, metrics, max_body_bytes=MAX_BODY) as client:
        yield Api(client, runtime, storage)
    await runtime.stop()
    await storage.close()


# ---------------------------------------------------------------- protocol calls


async def test_join_sync_heartbeat_commit_fetch(api: Api) -> None:
    assignment = ResourceAssignment({"orders": [0, 2]}).encode()
    member, generation = await api.stable_member(assignment=assignment)
    beat = await api.call("heartbeat", {"group_id": "g", "member_id": member,
                                        "generation_id": generation})
    assert beat == {"error": None, "resources_epoch": 0}
    stale = await api.call("heartbeat", {"group_id": "g", "member_id": member,
                                         "generation_id": generation + 5})
    assert stale["error"] == "ILLEGAL_GENERATION"
    # A "resources" group commits only resources of the catalog.
    async with api.client.put("/v1/resources/orders", json={"partitions": 4}) as resp:
        assert resp.status == 200
    done = await api.call("commit", {"group_id": "g", "member_id": member,
                                     "generation_id": generation,
                                     "checkpoints": [["orders", 0, 99], ["orders", 2, b"x"]]})
    assert done == {"error": None}
    fetched = await api.call("fetch", {"group_id": "g"})
    assert sorted(map(tuple, fetched["checkpoints"])) == [("orders", 0, 99), ("orders", 2, b"x")]
    left = await api.call("leave", {"group_id": "g", "members": [{"member_id": member}]})
    assert left["error"] is None and left["members"][0]["error"] is None


async def _assert_refused(api: Api, path: str, data: bytes, status: int, needle: str,
                          content_type: str = "application/msgpack") -> None:
    resp = await api.client.post(path, data=data, headers={"Content-Type": content_type})
    assert resp.status == status
    assert resp.content_type == "application/msgpack"
    doc = msgpack.unpackb(await resp.read(), raw=False)
    assert doc["error"] == "INVALID_REQUEST"
    assert needle in doc["message"], doc


BAD_REQUESTS = [
    ("join", b"\xc1", "not valid msgpack"),
    ("join", pack([1, 2]), "body: expected a map"),
    ("join", pack({k: v for k, v in join_body().items() if k != "group_id"}), "group_id: missing"),
    ("join", pack(join_body(session_timeout_ms="10")), "session_timeout_ms: expected an integer"),
    ("join", pack(join_body(session_timeout_ms=-1)), "session_timeout_ms: must be >= 0"),
    ("join", pack(join_body(group="g" * 256)), "group_id: longer than 255"),
    ("join", pack(join_body(protocols=[["range", "not-bytes"]])), "protocols[0][1]"),
    ("join", pack(join_body(protocols=[])), "protocols: must list at least one"),
    ("sync", pack({"group_id": "g", "member_id": "m", "generation_id": True}), "generation_id"),
    ("heartbeat", pack({"group_id": "g", "member_id": "m", "generation_id": 1,
                        "wait_ms": 10**9}), "wait_ms: must be <="),
    ("heartbeat", pack({"group_id": "g", "member_id": "m", "generation_id": 1}) + b"\x00",
     "trailing bytes"),
    ("leave", pack({"group_id": "g", "members": []}), "members: must list at least one"),
    ("commit", pack({"group_id": "g", "member_id": "m", "generation_id": 1,
                     "checkpoints": [["orders", -1, 5]]}), "checkpoints[0][1]"),
    ("fetch", pack({"group_id": 7}), "group_id: expected a string"),
]


@pytest.mark.parametrize(("api_name", "data", "needle"), BAD_REQUESTS)
async def test_bad_protocol_requests_are_400_naming_the_field(
        api: Api, api_name: str, data: bytes, needle: str) -> None:
    await _assert_refused(api, f"/v1/{api_name}", data, 400, needle)
    assert list(api.runtime.core.list_groups()) == []


async def test_oversize_wrong_type_and_state_untouched(api: Api) -> None:
    member, generation = await api.stable_member()
    before = api.runtime.core.describe_group("g")
    journal_before = await api.storage.journal()
    big = pack(join_body(member, reason="x" * (MAX_BODY + 10)))
    await _assert_refused(api, "/v1/join", big, 413, "over the limit")
    await _assert_refused(api, "/v1/heartbeat", pack({"group_id": "g"}), 415, "Content-Type",
                          content_type="text/plain")
    await _assert_refused(api, "/v1/heartbeat", b"", 415, "Content-Type", content_type="")
    for _, data, _ in BAD_REQUESTS:
        await _assert_refused(api, "/v1/join", data, 400, "")
    # The stable group is exactly as it was, and nothing was written.
    assert api.runtime.core.describe_group("g") == before
    assert await api.storage.journal() == journal_before
    beat = await api.call("heartbeat", {"group_id": "g", "member_id": member,
                                        "generation_id": generation})
    assert beat["error"] is None


async def test_unknown_extra_fields_are_ignored(api: Api) -> None:
    first = await api.call("join", join_body(future_field={"x": 1}))
    assert first["error"] == "MEMBER_ID_REQUIRED"


# ---------------------------------------------------------------- admin


async def test_admin_groups(api: Api) -> None:
    assignment = ResourceAssignment({"orders": [1, 3]}).encode()
    member, generation = await api.stable_member(assignment=assignment)
    resp = await api.client.get("/v1/groups")
    assert resp.status == 200
    assert (await resp.json())["groups"] == [{
        "group_id": "g", "state": "Stable", "protocol_type": "resources",
        "protocol_name": "range", "generation_id": generation, "member_count": 1,
        "health": "OK", "health_reasons": []}]
    resp = await api.client.get("/v1/groups/g")
    doc = await resp.json()
    assert doc["leader"] == member
    assert doc["members"][0]["assignment"] == {"orders": [1, 3]}
    assert doc["members"][0]["client_id"] == "web"
    assert doc["members"][0]["session_timeout_ms"] == 10_000

    resp = await api.client.get("/v1/groups/nope")
    assert resp.status == 404 and await resp.json() == {"error": "UNKNOWN_GROUP"}
    resp = await api.client.delete("/v1/groups/g")
    assert resp.status == 409 and (await resp.json())["error"] == "NON_EMPTY_GROUP"
    resp = await api.client.delete("/v1/groups/nope")
    assert resp.status == 404

    await api.call("leave", {"group_id": "g", "members": [{"member_id": member}]})
    resp = await api.client.delete("/v1/groups/g")
    assert resp.status == 204
    assert (await api.client.get("/v1/groups/g")).status == 404


async def test_admin_shows_opaque_assignments_as_base64(api: Api) -> None:
    first = await api.call("join", join_body(group="o", protocol_type="custom"))
    joined = await api.call("join", join_body(first["member_id"], group="o",
                                              protocol_type="custom"))
    member = joined["member_id"]
    await api.call("sync", {"group_id": "o", "member_id": member,
                            "generation_id": joined["generation_id"],
                            "assignments": [{"member_id": member, "assignment": b"\x00\xff"}]})
    doc = await (await api.client.get("/v1/groups/o")).json()
    assert doc["members"][0]["assignment"] == base64.b64encode(b"\x00\xff").decode()


async def test_admin_resources(api: Api) -> None:
    resp = await api.client.put("/v1/resources/orders", json={"partitions": 12})
    assert resp.status == 200
    assert (await resp.json())["resources_epoch"] == 1
    resp = await api.client.put("/v1/resources/users", json={"partitions": 4})
    resp = await api.client.get("/v1/resources")
    assert await resp.json() == {"resources_epoch": 2, "resources": {"orders": 12, "users": 4}}
    resp = await api.client.delete("/v1/resources/users")
    assert resp.status == 200
    resp = await api.client.delete("/v1/resources/users")
    assert resp.status == 404
    # Heartbeats and syncs carry the epoch.
    member, generation = await api.stable_member()
    beat = await api.call("heartbeat", {"group_id": "g", "member_id": member,
                                        "generation_id": generation})
    assert beat["resources_epoch"] == 3


@pytest.mark.parametrize(("body", "content_type", "status", "needle"), [
    (b'{"partitions": 0}', "application/json", 400, "partitions: must be >= 1"),
    (b'{"partitions": "3"}', "application/json", 400, "partitions: expected an integer"),
    (b"{}", "application/json", 400, "partitions: missing"),
    (b'{"partitions": 3', "application/json", 400, "not valid JSON"),
    (b"[3]", "application/json", 400, "expected an object"),
    (b'{"partitions": 3}', "text/plain", 415, "Content-Type"),
    (b'{"partitions": 3, "pad": "' + b"x" * MAX_BODY + b'"}', "application/json", 413,
     "over the limit"),
])
async def test_bad_resource_puts(api: Api, body: bytes, content_type: str, status: int,
                                 needle: str) -> None:
    resp = await api.client.put("/v1/resources/orders", data=body,
                                headers={"Content-Type": content_type})
    assert resp.status == status
    doc = await resp.json()
    assert doc["error"] == "INVALID_REQUEST" and needle in doc["message"]
    assert dict(api.runtime.core.catalog()) == {}


async def test_resource_name_too_long(api: Api) -> None:
    resp = await api.client.put("/v1/resources/" + "r" * 256, json={"partitions": 1})
    assert resp.status == 400
    assert "name: longer than 255" in (await resp.json())["message"]


# ---------------------------------------------------------------- health, metrics


async def test_health_ready_metrics(api: Api) -> None:
    assert (await api.client.get("/healthz")).status == 200
    assert (await api.client.get("/readyz")).status == 200
    await api.stable_member()
    await api.client.post("/v1/join", data=b"\xc1", headers=MSGPACK)
    text = await (await api.client.get("/metrics")).text()
    assert 'groupcoord_requests_total{api="join",outcome="MEMBER_ID_REQUIRED"} 1.0' in text
    assert 'groupcoord_requests_total{api="join",outcome="INVALID_REQUEST"} 1.0' in text
    assert 'groupcoord_requests_total{api="sync",outcome="ok"} 1.0' in text
    assert 'groupcoord_groups{state="Stable"} 1.0' in text
    assert "groupcoord_members 1.0" in text
    assert "groupcoord_rebalances_completed_total 1.0" in text
    assert "groupcoord_storage_commit_duration_seconds_count" in text
    await api.runtime.stop()
    assert (await api.client.get("/readyz")).status == 503
    answer = await api.call("heartbeat", {"group_id": "g", "member_id": "m", "generation_id": 1})
    assert answer["error"] == "COORDINATOR_NOT_AVAILABLE"


async def test_client_disconnect_cancels_its_parked_join(api: Api) -> None:
    await api.stable_member()
    newcomer = await api.call("join", join_body())
    assert newcomer["error"] == "MEMBER_ID_REQUIRED"
    # The newcomer's join parks until the stable member rejoins...
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(api.call("join", join_body(newcomer["member_id"])), 0.3)
    # ...and the client gave up: the connection closed, the handler was
    # cancelled, the core was told. Nothing waits for that request any more.
    for _ in range(100):
        if api.runtime.core.parked_request_count() == 0:
            break
        await asyncio.sleep(0.01)
    assert api.runtime.core.parked_request_count() == 0


# ---------------------------------------------------------------- authentication wiring


async def test_tokens_guard_groups_and_member_ids(tmp_path: Path) -> None:
    import hashlib

    from coordinator.auth import TokenEntry, TokenStore

    def entry(name: str, token: str, prefixes: tuple[str, ...], admin: bool) -> TokenEntry:
        return TokenEntry(name, hashlib.sha256(token.encode()).digest(), prefixes, admin)

    alice, bob = "a" * 40, "b" * 40
    tokens = TokenStore([entry("alice", alice, ("orders-",), False),
                         entry("bob", bob, ("orders-",), True)])
    storage = await Storage.open(tmp_path / "g.db")
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0)),
                      storage, WallClock(), Metrics())
    await runtime.start()
    try:
        async with serve_in_process(runtime, Metrics(), max_body_bytes=MAX_BODY,
                                    tokens=tokens) as client:
            async def call(token: str | None, body: dict[str, Any]) -> tuple[int, Any]:
                headers = dict(MSGPACK)
                if token is not None:
                    headers["Authorization"] = f"Bearer {token}"
                resp = await client.post("/v1/join", data=pack(body), headers=headers)
                return resp.status, msgpack.unpackb(await resp.read(), raw=False)

            status, _ = await call(None, join_body(group="orders-eu"))
            assert status == 401
            status, doc = await call(alice, join_body(group="users"))
            assert status == 403 and doc["error"] == "GROUP_AUTHORIZATION_FAILED"
            status, doc = await call(alice, join_body(group="orders-eu"))
            assert status == 200 and doc["error"] == "MEMBER_ID_REQUIRED"
            minted = doc["member_id"]
            # Bob learns alice's member id (as a leader would): it does not work for him.
            status, doc = await call(bob, join_body(minted, group="orders-eu"))
            assert status == 200 and doc["error"] == "UNKNOWN_MEMBER_ID"
            assert runtime.core.pending_member_count("orders-eu") == 1
            # Health stays open.
            assert (await client.get("/healthz")).status == 200
    finally:
        await runtime.stop()
        await storage.close()
