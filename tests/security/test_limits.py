"""The server's limits, each answered with a clear error and no state change.

Body size (413, ``--max-body-bytes``), name lengths and list sizes (400 naming
the field), timeouts (400), members per group (``GROUP_MAX_SIZE_REACHED``,
``--group-max-size``), groups held (``--max-groups``) and parked requests
(``--max-parked-requests``): ``COORDINATOR_NOT_AVAILABLE`` in an HTTP 200
body, which clients retry with backoff (docs/reliability.md, "Limits").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from listeners_kit import InProcess, serve_in_process

from protocol import codec
from protocol.messages import HeartbeatRequest, JoinRequest, SyncRequest
from protocol.resources import MemberMetadata

MSGPACK = {"Content-Type": codec.CONTENT_TYPE}
MAX_BODY = 4096
META = MemberMetadata(sets=("orders",)).encode()

Client = InProcess


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    from coordinator.core import GroupCoordinator
    from coordinator.core.config import CoreConfig
    from coordinator.metrics import Metrics
    from coordinator.runtime.clock import WallClock
    from coordinator.runtime.runtime import Runtime
    from coordinator.storage.sqlite import Storage

    storage = await Storage.open(tmp_path / "limits.db")
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0,
                                                  group_max_size=2)),
                      storage, WallClock(), Metrics())
    await runtime.start()
    async with serve_in_process(runtime, Metrics(), max_body_bytes=MAX_BODY) as tc:
        yield tc
    await runtime.stop()
    await storage.close()


async def _call(client: Client, api: str, body: Any) -> tuple[int, dict[str, Any]]:
    resp = await client.post(f"/v1/{api}", data=codec.encode(body), headers=MSGPACK)
    return resp.status, codec.decode(await resp.read())


def _join(member_id: str = "", **changes: Any) -> dict[str, Any]:
    wire = JoinRequest("g", member_id, "resources", (("range", META),), 10_000,
                       10_000).to_wire()
    wire.update(changes)
    return wire


async def _groups(client: Client) -> list[Any]:
    groups: list[Any] = (await (await client.get("/v1/groups")).json())["groups"]
    return groups


async def test_body_over_the_limit_is_413_and_creates_nothing(client: Client) -> None:
    status, body = await _call(client, "join", _join(reason="x" * MAX_BODY))
    assert status == 413
    assert body["error"] == "INVALID_REQUEST" and str(MAX_BODY) in body["message"]
    assert await _groups(client) == []


@pytest.mark.parametrize(("changes", "field"), [
    ({"group_id": "g" * 256}, "group_id"),
    ({"client_id": "c" * 256}, "client_id"),
    ({"group_instance_id": "i" * 256}, "group_instance_id"),
    ({"protocols": [[f"p{i}", b""] for i in range(33)]}, "protocols"),
    ({"protocols": [["p" * 256, b""]]}, "protocols[0][0]"),
    ({"session_timeout_ms": -1}, "session_timeout_ms"),
    ({"rebalance_timeout_ms": 2**31}, "rebalance_timeout_ms"),
])
async def test_names_lists_and_timeouts_out_of_bounds_are_400_naming_the_field(
        client: Client, changes: dict[str, Any], field: str) -> None:
    status, body = await _call(client, "join", _join(**changes))
    assert status == 400
    assert body["error"] == "INVALID_REQUEST" and body["message"].startswith(field)
    assert await _groups(client) == []


async def test_rebalance_timeout_over_the_server_limit_is_400_naming_it(client: Client) -> None:
    """--max-rebalance-timeout-ms (default 5 minutes) bounds how long a join parks;
    the security re-attack parked joins with the protocol's largest timeout."""
    for timeout_ms in (2**31 - 1, 300_001):
        status, body = await _call(client, "join", _join(rebalance_timeout_ms=timeout_ms))
        assert status == 400 and body["error"] == "INVALID_REQUEST"
        assert body["message"] == (
            f"rebalance_timeout_ms: {timeout_ms} is over the server's "
            "--max-rebalance-timeout-ms (300000); allowed: 0 to 300000")
    assert await _groups(client) == []
    status, body = await _call(client, "join", _join(rebalance_timeout_ms=300_000))
    assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED")


async def test_heartbeat_wait_over_the_limit_is_400(client: Client) -> None:
    wire = HeartbeatRequest("g", "m", 1).to_wire()
    wire["wait_ms"] = 60_001
    status, body = await _call(client, "heartbeat", wire)
    assert status == 400 and body["message"].startswith("wait_ms")


async def _new_id(client: Client) -> str:
    status, body = await _call(client, "join", _join())
    assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED")
    member_id: str = body["member_id"]
    return member_id


async def test_group_max_size_refuses_the_third_member(client: Client) -> None:
    a = await _new_id(client)
    assert (await _call(client, "join", _join(a)))[1]["error"] is None
    # The second member parks until the first rejoins; then the group has two.
    b = await _new_id(client)
    second = asyncio.ensure_future(_call(client, "join", _join(b)))
    await asyncio.sleep(0.05)
    assert (await _call(client, "join", _join(a)))[1]["error"] is None
    assert (await second)[1]["error"] is None
    # A third is refused, at its first join or with its new id (Kafka does either).
    status, third = await _call(client, "join", _join())
    if third["error"] == "MEMBER_ID_REQUIRED":
        status, third = await _call(client, "join", _join(third["member_id"]))
    assert (status, third["error"]) == (200, "GROUP_MAX_SIZE_REACHED")
    view = await (await client.get("/v1/groups/g")).json()
    assert sorted(m["member_id"] for m in view["members"]) == sorted([a, b])


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[Client]:
    """A server holding at most 2 groups and 2 parked requests."""
    from coordinator.core import GroupCoordinator
    from coordinator.core.config import CoreConfig
    from coordinator.metrics import Metrics
    from coordinator.runtime.clock import WallClock
    from coordinator.runtime.runtime import Runtime
    from coordinator.storage.sqlite import Storage

    storage = await Storage.open(tmp_path / "limited.db")
    metrics = Metrics()
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0,
                                                  max_groups=2)),
                      storage, WallClock(), metrics, max_parked_requests=2)
    await runtime.start()
    async with serve_in_process(runtime, metrics, max_body_bytes=MAX_BODY) as tc:
        yield tc
    await runtime.stop()
    await storage.close()


async def _refused(client: Client, reason: str) -> str:
    text = await (await client.get("/metrics")).text()
    lines = [line for line in text.splitlines()
             if line.startswith(f'groupcoord_requests_refused_total{{reason="{reason}"}}')]
    return lines[0].split()[-1] if lines else "0"


async def test_max_groups_refuses_a_join_that_would_create_a_group(limited: Client) -> None:
    for group in ("a", "b"):
        status, body = await _call(limited, "join", _join(group_id=group))
        assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED")
    status, body = await _call(limited, "join", _join(group_id="c"))
    assert (status, body["error"]) == (200, "COORDINATOR_NOT_AVAILABLE")
    assert sorted(g["group_id"] for g in await _groups(limited)) == ["a", "b"]
    assert await _refused(limited, "max_groups") == "1.0"
    # A group that exists still takes joins.
    status, body = await _call(limited, "join", _join(group_id="a"))
    assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED")


async def test_long_polls_of_one_member_never_starve_other_groups_joins(
        limited: Client) -> None:
    """One member's long-polls used to fill --max-parked-requests
    and every other group's joins were refused."""
    member = await _new_id(limited)
    status, joined = await _call(limited, "join", _join(member))
    assert joined["error"] is None
    generation = joined["generation_id"]
    status, synced = await _call(limited, "sync", SyncRequest(
        "g", member, generation, ()).to_wire())
    assert synced["error"] is None
    poll = HeartbeatRequest("g", member, generation, wait_ms=4_000).to_wire()
    polls = []
    try:
        for _ in range(3):
            polls.append(asyncio.ensure_future(_call(limited, "heartbeat", poll)))
            await asyncio.sleep(0.1)
        # Each newer long-poll of the member supersedes its parked one, which is
        # answered at once without error: one stays parked, below the limit of 2.
        assert [p.done() for p in polls] == [True, True, False]
        assert [p.result() for p in polls[:2]] == [(200, {"error": None,
                                                          "resources_epoch": 0})] * 2
        # Another group's joins are served.
        status, body = await _call(limited, "join", _join(group_id="other"))
        assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED")
        assert await _refused(limited, "max_parked_requests") == "0"
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)


# ---------------------------------------------------------------- checkpoints


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[Client]:
    """A server with small checkpoint caps: 20 per group, 8-byte values."""
    from coordinator.core import GroupCoordinator
    from coordinator.core.config import CoreConfig
    from coordinator.metrics import Metrics
    from coordinator.runtime.clock import WallClock
    from coordinator.runtime.runtime import Runtime
    from coordinator.storage.sqlite import Storage

    storage = await Storage.open(tmp_path / "capped.db")
    metrics = Metrics()
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0,
                                                  max_checkpoints_per_group=20,
                                                  max_checkpoint_value_bytes=8)),
                      storage, WallClock(), metrics)
    await runtime.start()
    async with serve_in_process(runtime, metrics, max_body_bytes=1024 * 1024) as tc:
        yield tc
    await runtime.stop()
    await storage.close()


def _commit(group: str, checkpoints: list[list[Any]], member: str = "tool",
            generation: int = -1) -> dict[str, Any]:
    return {"group_id": group, "member_id": member, "generation_id": generation,
            "checkpoints": checkpoints}


async def _fetched(client: Client, group: str) -> list[Any]:
    status, body = await _call(client, "fetch", {"group_id": group, "resources": None})
    assert status == 200, body
    found: list[Any] = body["checkpoints"]
    return found


async def test_a_commit_outside_the_catalog_is_400_naming_the_field(client: Client) -> None:
    async with client.put("/v1/resources/orders", json={"partitions": 4}) as resp:
        assert resp.status == 200
    member = await _new_id(client)
    status, joined = await _call(client, "join", _join(member))
    assert joined["error"] is None
    generation = joined["generation_id"]
    status, synced = await _call(client, "sync", SyncRequest("g", member, generation,
                                                             ()).to_wire())
    assert synced["error"] is None
    for checkpoints, message in (
            ([["orders", 0, 1], ["junk-set", 0, 1]],
             "checkpoints[1][0]: resource set 'junk-set' is not in the catalog"),
            ([["orders", 4, 1]],
             "checkpoints[0][1]: index 4 is beyond resource set 'orders' (4 partitions: 0..3)")):
        status, body = await _call(client, "commit", _commit("g", checkpoints, member, generation))
        assert (status, body) == (400, {"error": "INVALID_REQUEST", "message": message})
    assert await _fetched(client, "g") == []
    status, body = await _call(client, "commit", _commit("g", [["orders", 3, 1]], member,
                                                         generation))
    assert (status, body["error"]) == (200, None)


async def test_a_value_over_the_limit_is_400_and_a_cap_refuses_the_commit_whole(
        capped: Client) -> None:
    status, body = await _call(capped, "commit", _commit("junk", [["s", 0, "x" * 9]]))
    assert status == 400 and body["error"] == "INVALID_REQUEST"
    assert body["message"].startswith("checkpoints[0][2]: a value of 9 bytes is over")
    assert await _groups(capped) == []
    status, body = await _call(capped, "commit",
                               _commit("junk", [["s", i, i] for i in range(15)]))
    assert (status, body["error"]) == (200, None)
    status, body = await _call(capped, "commit",
                               _commit("junk", [["s", i, i] for i in range(15, 21)]))
    assert status == 200 and body["error"] == "CHECKPOINT_LIMIT_REACHED"
    assert "--max-checkpoints-per-group (20)" in body["message"]
    assert len(await _fetched(capped, "junk")) == 15


async def test_a_big_group_is_read_in_pages(client: Client) -> None:
    page_size = 1000  # protocol.limits.MAX_FETCH_CHECKPOINTS, part of the wire contract
    total = page_size + 200
    for start in range(0, total, 200):
        status, body = await _call(client, "commit", _commit(
            "big", [["s", i, i] for i in range(start, min(start + 200, total))]))
        assert (status, body["error"]) == (200, None)
    # A v1 fetch of everything would not fit one answer: refused, naming paging.
    status, body = await _call(client, "fetch", {"group_id": "big", "resources": None})
    assert status == 400 and "after" in body["message"]
    pages: list[Any] = []
    after: list[Any] = []
    while True:
        status, body = await _call(client, "fetch", {"group_id": "big", "after": after})
        assert status == 200 and body["error"] is None
        pages.append(body["checkpoints"])
        if body["next"] is None:
            break
        after = body["next"]
    assert [len(p) for p in pages] == [page_size, 200]
    assert [c for p in pages for c in p] == sorted([["s", i, i] for i in range(total)])
