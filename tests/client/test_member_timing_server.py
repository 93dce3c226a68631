"""The timing rule's reported case (a member re-joining every session), in virtual time.

Two members with ``session_timeout_ms=6000`` (the server's default minimum)
and the default heartbeat interval share 12 resources for more than two
sessions: no ``on_lost``, no rebalance. Before the timing rule they lost
everything and rejoined every ~6 s. The real member (driver, machine), the
real runtime and core with the server's default minimum session, on one
virtual clock behind a network with a round trip; the coordinator's log is
read for the churn as the server's stderr was. (This ran over the real
server for 14 s of real time; the driver over real HTTP keeps its smoke
tests, e.g. test_member_processes.py.) The whole configuration space is
swept by test_member_timing.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from client_harness import Ledger
from virtual_time import LatencyTransport, in_process_coordinator, loop_ms, loop_s, run_virtual

from client.member import GroupMember

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 6_000
WATCH_S = 14.0  # more than two sessions
RTT_MS = 4


async def _scenario(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(clock=loop_s)
    async with in_process_coordinator(min_session_timeout_ms=SESSION_MS,
                                      initial_rebalance_delay_ms=0) as coordinator:
        await coordinator.put_resource("shards", 12)
        members = [GroupMember(LatencyTransport(coordinator, RTT_MS), "indexers", ["shards"],
                               listener=ledger.listener(name), client_id=name, clock=loop_ms,
                               session_timeout_ms=SESSION_MS) for name in ("w1", "w2")]
        assert members[0].config.heartbeat_interval_ms == SESSION_MS // 3
        try:
            for m in members:
                m.start()
            for m in members:
                await m.wait_assigned(30)
            # the cooperative follow-up rebalance (the second member's share) settles
            deadline = loop_s() + 20
            while {len(m.assignment) for m in members} != {6}:
                assert loop_s() < deadline, [m.assignment for m in members]
                await asyncio.sleep(0.1)
            generations = [m.generation_id for m in members]
            # (marks, not times: in virtual time the assignment and the
            # watch's start may be one instant)
            seen, logged = len(ledger.events), len(caplog.records)
            await asyncio.sleep(WATCH_S)
            assert [m.generation_id for m in members] == generations, "the group rebalanced"
            assert {len(m.assignment) for m in members} == {6}
            churn = [r.getMessage() for r in caplog.records[logged:]
                     if "PreparingRebalance" in r.getMessage()]
            assert not churn, churn
        finally:
            for m in members:
                await m.close()
    assert ledger.count("w1", "lost") == ledger.count("w2", "lost") == 0
    assigned_since = [(m, k) for _, m, k, _ in ledger.events[seen:] if k == "assigned"]
    assert assigned_since == []


def test_members_with_the_minimum_session_and_default_heartbeat_stay_stable(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="groupcoord.runtime"):
        run_virtual(lambda: _scenario(caplog))
