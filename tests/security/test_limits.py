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


async def test_max_parked_requests_answers_long_polls_at_once_and_refuses_joins(
        limited: Client) -> None:
    member = await _new_id(limited)
    status, joined = await _call(limited, "join", _join(member))
    assert joined["error"] is None
    generation = joined["generation_id"]
    status, synced = await _call(limited, "sync", SyncRequest(
        "g", member, generation, ()).to_wire())
    assert synced["error"] is None
    poll = HeartbeatRequest("g", member, generation, wait_ms=4_000).to_wire()
    polls = [asyncio.ensure_future(_call(limited, "heartbeat", poll)) for _ in range(2)]
    try:
        await asyncio.sleep(0.2)
        assert not any(p.done() for p in polls)
        # A third long-poll is answered at once (as if wait_ms were 0)...
        status, body = await asyncio.wait_for(_call(limited, "heartbeat", poll), 2)
        assert (status, body["error"]) == (200, None)
        # ...and a join is refused, creating nothing.
        status, body = await _call(limited, "join", _join(group_id="other"))
        assert (status, body["error"]) == (200, "COORDINATOR_NOT_AVAILABLE")
        assert [g["group_id"] for g in await _groups(limited)] == ["g"]
        assert await _refused(limited, "max_parked_requests") == "1.0"
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
