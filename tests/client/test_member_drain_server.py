"""Drain and warm-up standbys with real members against a real ``groupcoord
serve`` (docs/client.md, "Drain and warm-up"): a draining member's resources
go to the others through standby first (``on_standby`` before
``on_assigned``), it ends owning nothing and out of the group; a warm-up
that fails is not reported warm, and the move happens anyway once the
assignor's ``warmup_timeout_ms`` has passed."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from client_harness import admin_put_resource, check_ledger
from server_harness import StartServer

from client import BlockingGroupMember, GroupMember, RebalanceListener
from client.listener import Resource
from client.member_state import MemberState

pytestmark = pytest.mark.timeout(120)

Event = tuple[float, str, str, frozenset[Resource]]


class Recorder(RebalanceListener):
    """Every callback with its time; ``on_standby`` warms for ``warm_s`` per
    resource, or raises when ``fail_warmup``."""

    def __init__(self, name: str, events: list[Event], warm_s: float = 0.0,
                 fail_warmup: bool = False) -> None:
        self.name, self.events, self.warm_s, self.fail_warmup = name, events, warm_s, fail_warmup

    def _record(self, kind: str, resources: set[Resource]) -> None:
        self.events.append((time.monotonic(), self.name, kind, frozenset(resources)))

    async def on_assigned(self, resources: set[Resource]) -> None:
        self._record("assigned", resources)

    async def on_revoked(self, resources: set[Resource]) -> None:
        self._record("revoked", resources)

    async def on_lost(self, resources: set[Resource]) -> None:
        self._record("lost", resources)

    async def on_standby(self, resources: set[Resource]) -> None:
        self._record("standby", resources)
        await asyncio.sleep(self.warm_s * len(resources))
        if self.fail_warmup:
            raise RuntimeError("warm-up failed (test)")
        self._record("warm", resources)

    async def on_standby_dropped(self, resources: set[Resource]) -> None:
        self._record("standby_dropped", resources)


def group_members(admin_url: str) -> list[str]:
    with urllib.request.urlopen(f"{admin_url}/v1/groups/g", timeout=10) as resp:
        return [m["member_id"] for m in json.load(resp)["members"]]


def make(url: str, name: str, events: list[Event], warmup_timeout_ms: int,
         **listener: Any) -> GroupMember:
    return GroupMember(url, "g", ["s"], assignors=["balanced"], client_id=name,
                       listener=Recorder(name, events, **listener),
                       session_timeout_ms=6_000, heartbeat_interval_ms=500,
                       assignor_settings={"balanced": {
                           "warmup": True, "warmup_timeout_ms": warmup_timeout_ms,
                           "round_delay_ms": 100}})


async def settle(members: list[GroupMember], each: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(m.assignment) == each for m in members):
        assert time.monotonic() < deadline, [len(m.assignment) for m in members]
        await asyncio.sleep(0.05)


def first(events: list[Event], member: str, kind: str, r: Resource, since: float) -> float:
    return min(t for t, m, k, rs in events if t >= since and m == member and k == kind
               and r in rs)


async def test_a_drain_hands_over_through_warm_standbys_and_leaves(
        start_server: StartServer) -> None:
    server = start_server()
    admin_put_resource(server.admin_url, "s", 12)
    events: list[Event] = []
    a, b, c = (make(server.url, n, events, 30_000, warm_s=0.05) for n in "abc")
    async with a, b, c:
        await settle([a, b, c], 4)
        held = set(c.assignment)
        since = time.monotonic()
        assert await c.drain(timeout_s=30) is True
        took = time.monotonic() - since
        assert c.state is MemberState.CLOSED and c.assignment == frozenset()
        await settle([a, b], 6)
        # Warmed by their new owner before it owned them; c served them until then.
        for r in held:
            new = "a" if r in a.assignment else "b"
            assert first(events, new, "warm", r, since) < first(events, new, "assigned", r, since)
            assert first(events, "c", "revoked", r, since) > first(events, new, "warm", r, since)
        assert not a.standby and not b.standby
        assert c.member_id not in group_members(server.admin_url)
        assert took < 10, took  # no waiting for the warm-up timeout (30 s)
    check_ledger([e for e in events if e[2] != "warm"])


async def test_a_failed_warm_up_falls_back_to_a_plain_move_at_the_timeout(
        start_server: StartServer) -> None:
    server = start_server()
    admin_put_resource(server.admin_url, "s", 8)
    events: list[Event] = []
    a, b = (make(server.url, n, events, 2_000, fail_warmup=True) for n in "ab")
    async with a, b:
        await settle([a, b], 4)
        held = set(b.assignment)
        since = time.monotonic()
        assert await b.drain(timeout_s=30) is True
        took = time.monotonic() - since
        await settle([a], 8)
        # Nothing was reported warm, so b's resources moved when their warm-up
        # timed out (2 s), not before, and were given to a as a plain move.
        assert 2.0 <= took < 10, took
        for r in held:
            assert first(events, "a", "standby", r, since) < first(events, "b", "revoked", r,
                                                                   since)
            assert first(events, "b", "revoked", r, since) >= since + 2.0
        assert not [e for e in events if e[2] == "warm"]
        # The rebalance history and the metrics say they moved cold.
        with urllib.request.urlopen(f"{server.admin_url}/v1/groups/g/rebalances",
                                    timeout=10) as resp:
            rebalances = json.load(resp)["rebalances"]
        cold = sum(r["resources"].get("causes", {}).get("warm_timeout", 0) for r in rebalances)
        assert cold >= len(held), rebalances
        with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert f'groupcoord_warmups_ended_total{{outcome="timed_out"}} {float(len(held))}' \
            in metrics, [line for line in metrics.splitlines() if "warmups_ended" in line]
    check_ledger(events)


def test_a_blocking_member_drains(start_server: StartServer) -> None:
    server = start_server()
    admin_put_resource(server.admin_url, "s", 4)
    a = BlockingGroupMember(server.url, "g", ["s"], client_id="a", session_timeout_ms=6_000)
    b = BlockingGroupMember(server.url, "g", ["s"], client_id="b", session_timeout_ms=6_000)
    with a, b:
        deadline = time.monotonic() + 30
        while not len(a.assignment) == 2 == len(b.assignment):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert b.drain(timeout_s=20) is True
        assert b.assignment == frozenset() and b.member.state is MemberState.CLOSED
        while len(a.assignment) != 4:
            assert time.monotonic() < deadline + 30
            time.sleep(0.05)
        assert b.member.member_id not in group_members(server.admin_url)
