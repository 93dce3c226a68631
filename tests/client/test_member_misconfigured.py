"""A worker set up wrong is told what is wrong, against a real ``groupcoord serve``.

A session timeout outside the coordinator's range names the range; the admin
listener's URL given as the coordinator stops the member with one line
saying so (instead of retrying a 404 forever); a subscription to a set the
catalog does not have is warned about once, naming the sets it does have.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.request

import msgpack
import pytest
from client_harness import admin_put_resource
from server_harness import StartServer

from client import GroupMember
from client.errors import InvalidSessionTimeoutError, WrongListenerError

pytestmark = pytest.mark.timeout(120)


async def test_a_session_timeout_out_of_range_names_the_range(
        start_server: StartServer) -> None:
    # The server's own default range: 6,000 ms to 30 min.
    server = start_server(min_session_timeout_ms=6_000)
    member = GroupMember(server.url, "orders", ["shards"], session_timeout_ms=3_000)
    member.start()
    with pytest.raises(InvalidSessionTimeoutError) as caught:
        await member.wait_assigned(timeout_s=30)
    await member.close()
    assert "session_timeout_ms 3000" in str(caught.value)
    assert "allowed range 6000 to 1800000 ms" in str(caught.value)
    # The answer itself carries it, for clients in other languages.
    body = msgpack.packb({"group_id": "orders", "member_id": "", "protocol_type": "resources",
                          "protocols": [["range", b""]], "session_timeout_ms": 3_000,
                          "rebalance_timeout_ms": 10_000})
    req = urllib.request.Request(f"{server.url}/v1/join", data=body,
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        doc = msgpack.unpackb(answer.read())
    assert doc["error"] == "INVALID_SESSION_TIMEOUT"
    assert "allowed range 6000 to 1800000 ms" in doc["message"]


async def test_a_member_given_the_admin_port_stops_saying_so(
        start_server: StartServer, caplog: pytest.LogCaptureFixture) -> None:
    server = start_server()
    caplog.set_level(logging.INFO, logger="groupcoord.client")
    member = GroupMember(server.admin_url, "orders", ["shards"], session_timeout_ms=6_000)
    member.start()
    with pytest.raises(WrongListenerError) as caught:
        await member.wait_assigned(timeout_s=30)
    await member.close()
    assert f"{server.admin_url} is the coordinator's admin listener" in str(caught.value)
    # One line says it, and no retry lines follow.
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "admin listener" in lines[0], lines


async def test_a_set_the_catalog_does_not_have_is_warned_about_once(
        start_server: StartServer, caplog: pytest.LogCaptureFixture) -> None:
    server = start_server()
    admin_put_resource(server.admin_url, "shards", 4)
    admin_put_resource(server.admin_url, "orders", 2)
    caplog.set_level(logging.INFO, logger="groupcoord.client")

    def member(name: str) -> GroupMember:
        return GroupMember(server.url, "g", ["shardz"], client_id=name,
                           session_timeout_ms=6_000)

    async with member("typo") as first:
        assert first.assignment == frozenset()
        async with member("typo-2") as second:  # another rebalance: no second warning
            while first.generation_id != second.generation_id:
                await asyncio.sleep(0.05)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "subscribes to 'shardz'" in warnings[0]
    assert "the catalog has: 'orders', 'shards'" in warnings[0]
