"""Issue 11 item 1, as reported: the real server, real time, real HTTP.

Two members with ``session_timeout_ms=6000`` (the server's default minimum)
and the default heartbeat interval share 12 resources for more than two
sessions: no ``on_lost``, no rebalance. Before the timing rule they lost
everything and rejoined every ~6 s. The whole configuration space is swept
in virtual time by test_member_timing.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from client_harness import Ledger
from server_harness import StartServer

from client.member import GroupMember

pytestmark = pytest.mark.timeout(90)

SESSION_MS = 6_000
WATCH_S = 14.0  # more than two sessions


async def _put_shards(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.put(
            f"{url}/v1/resources/shards", json={"partitions": 12}) as resp:
        assert resp.status in (200, 201, 204), await resp.text()


async def test_members_with_the_minimum_session_and_default_heartbeat_stay_stable(
        start_server: StartServer) -> None:
    server = start_server(min_session_timeout_ms=SESSION_MS, initial_rebalance_delay_ms=0)
    await _put_shards(server.admin_url)
    ledger = Ledger()
    members = [GroupMember(server.url, "indexers", ["shards"],
                           listener=ledger.listener(name), client_id=name,
                           session_timeout_ms=SESSION_MS) for name in ("w1", "w2")]
    assert members[0].config.heartbeat_interval_ms == SESSION_MS // 3
    try:
        for m in members:
            m.start()
        for m in members:
            await m.wait_assigned(30)
        # the cooperative follow-up rebalance (the second member's share) settles
        deadline = time.monotonic() + 20
        while {len(m.assignment) for m in members} != {6}:
            assert time.monotonic() < deadline, [m.assignment for m in members]
            await asyncio.sleep(0.1)
        generations = [m.generation_id for m in members]
        started, logged = time.time(), len(server.stderr_lines)
        await asyncio.sleep(WATCH_S)
        assert [m.generation_id for m in members] == generations, "the group rebalanced"
        assert {len(m.assignment) for m in members} == {6}
        churn = [line for line in server.stderr_lines[logged:] if "PreparingRebalance" in line]
        assert not churn, churn
    finally:
        for m in members:
            await m.close()
    assert ledger.count("w1", "lost") == ledger.count("w2", "lost") == 0
    assert ledger.count("w1", "assigned", since=started) == 0
    assert ledger.count("w2", "assigned", since=started) == 0
    assert server.terminate() == 0
