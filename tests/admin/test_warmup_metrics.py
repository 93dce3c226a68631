"""Warm-ups as the metrics count them from the rebalance journal
(coordinator/warmups.py; docs/operations.md, "Metrics"): started when a
resource is first given to a member as standby, ended owned (with the time
from that generation to the one the member owns it in) or dropped."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from server_harness import ServerProcess, StartServer, call, wait_until

from coordinator.core.records import JournalEntry, JournalMember
from coordinator.warmups import WarmupEvents, WarmupTracker
from protocol.resources import MemberMetadata, ResourceAssignment

A = ResourceAssignment


def entry(generation: int, ended_ms: int, given: Mapping[str, ResourceAssignment],
          group: str = "g", protocol_type: str = "resources") -> JournalEntry:
    """A journal row; member ``x`` is the static instance ``x`` (member id ``x-id``)."""
    return JournalEntry(group, generation, protocol_type, "balanced", None,
                        tuple(JournalMember(f"{m}-id", m, m) for m in given), (), (), "join",
                        ended_ms - 10, ended_ms,
                        {f"{m}-id": a.encode() for m, a in given.items()})


def test_a_warm_up_starts_hands_over_and_ends_owned_with_its_duration() -> None:
    t = WarmupTracker()
    assert t.observe(entry(1, 1_000, {"a": A({"s": [0, 1]}), "b": A()})) == WarmupEvents()
    # b is asked to warm s0 up.
    assert t.observe(entry(2, 2_000, {"a": A({"s": [0, 1]}), "b": A(standby={"s": [0]})})) \
        == WarmupEvents(started=1)
    # Still standby: nothing new.
    assert t.observe(entry(3, 5_000, {"a": A({"s": [0, 1]}), "b": A(standby={"s": [0]})})) \
        == WarmupEvents()
    # b reported it warm: a revokes it (cooperative), b does not own it yet.
    assert t.observe(entry(4, 9_000, {"a": A({"s": [1]}), "b": A()})) == WarmupEvents()
    # b owns it: over, 9 s after the generation that gave it as standby.
    assert t.observe(entry(5, 11_000, {"a": A({"s": [1]}),
                                       "b": A({"s": [0]}, why=(("s", 0, "warm"),))})) \
        == WarmupEvents(owned=(9_000,))


def test_a_warm_up_that_ran_out_of_time_ends_timed_out() -> None:
    t = WarmupTracker()
    t.observe(entry(1, 1_000, {"a": A({"s": [0, 1]}), "b": A()}))
    t.observe(entry(2, 2_000, {"a": A({"s": [0, 1]}), "b": A(standby={"s": [0, 1]})}))
    t.observe(entry(3, 8_000, {"a": A(why=(("s", 0, "warm_timeout"), ("s", 1, "warm"))),
                               "b": A()}))
    # s0 moved cold when its warm-up ran out of time; s1 was reported warm.
    assert t.observe(entry(4, 9_000, {
        "a": A(), "b": A({"s": [0, 1]}, why=(("s", 0, "warm_timeout"), ("s", 1, "warm")))})) \
        == WarmupEvents(owned=(7_000, 7_000), timed_out=1)


def test_a_standby_the_plan_gives_up_is_dropped() -> None:
    t = WarmupTracker()
    t.observe(entry(1, 1_000, {"a": A({"s": [0]}), "b": A()}))
    t.observe(entry(2, 2_000, {"a": A({"s": [0]}), "b": A(standby={"s": [0]})}))
    # No longer standby, nobody took it from a: after one more generation, dropped.
    assert t.observe(entry(3, 3_000, {"a": A({"s": [0]}), "b": A()})) == WarmupEvents()
    assert t.observe(entry(4, 4_000, {"a": A({"s": [0]}), "b": A()})) == \
        WarmupEvents(dropped=1)


def test_what_this_process_did_not_see_begin_has_no_duration_and_late_rows_are_ignored() -> None:
    t = WarmupTracker()
    # First seen at generation 7 with a standby: counted, its start unknown.
    assert t.observe(entry(7, 7_000, {"a": A({"s": [0]}), "b": A(standby={"s": [0]})})) \
        == WarmupEvents(started=1)
    assert t.observe(entry(8, 8_000, {"a": A(), "b": A({"s": [0]})})) == \
        WarmupEvents(owned=(None,))
    # A row older than one already taken (counted late, on the offload worker): ignored.
    assert t.observe(entry(6, 6_000, {"a": A(), "b": A(standby={"s": [3]})})) == WarmupEvents()
    # Another protocol's rows are not read; a forgotten group starts over.
    assert t.observe(entry(9, 9_000, {"a": A(standby={"s": [1]})}, protocol_type="x")) == \
        WarmupEvents()
    t.forget("g")
    assert t.observe(entry(1, 1_000, {"a": A(), "b": A(standby={"s": [1]})})) == \
        WarmupEvents(started=1)


# ---------------------------------------------------------------- a real server



def state(server: ServerProcess) -> str | None:
    try:
        with urllib.request.urlopen(f"{server.admin_url}/v1/groups/w", timeout=10) as answer:
            found: str = json.loads(answer.read())["state"]
            return found
    except urllib.error.HTTPError:
        return None


def generation(server: ServerProcess, ids: dict[str, str], leader: str | None,
               given: dict[str, ResourceAssignment]) -> tuple[dict[str, str], str]:
    """Every member (static instances ``given``'s keys) joins, the leader hands out
    ``given``: one generation. The leader rejoins first (which starts the
    rebalance), the others once it is under way. Returns the member ids by
    instance, and the leader."""
    def join(instance: str) -> dict[str, Any]:
        return call(server, "join", {
            "group_id": "w", "member_id": ids.get(instance, ""), "group_instance_id": instance,
            "protocol_type": "resources",
            "protocols": [["balanced", MemberMetadata(sets=("s",)).encode()]],
            "session_timeout_ms": 300_000, "rebalance_timeout_ms": 10_000,
            "client_id": instance})
    with ThreadPoolExecutor(len(given)) as pool:
        first = pool.submit(join, leader) if leader is not None else None
        if first is not None:
            assert wait_until(lambda: state(server) == "PreparingRebalance", 10)
        others = [i for i in given if i != leader]
        joined = dict(zip(others, pool.map(join, others), strict=True))
        if first is not None and leader is not None:
            joined[leader] = first.result()
    assert all(j["error"] is None for j in joined.values()), joined
    leader = next(i for i, j in joined.items() if j["member_id"] == j["leader"])
    synced = call(server, "sync", {
        "group_id": "w", "member_id": joined[leader]["member_id"],
        "generation_id": joined[leader]["generation_id"], "group_instance_id": leader,
        "assignments": [{"member_id": joined[i]["member_id"], "assignment": a.encode()}
                        for i, a in given.items()]})
    assert synced["error"] is None, synced
    return {i: j["member_id"] for i, j in joined.items()}, leader


def scrape(server: ServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(
        r"^(groupcoord_warmup\S*) (\S+)$", text, re.M)}


async def test_the_server_counts_the_warm_ups_its_journal_shows(
        start_server: StartServer) -> None:
    server = start_server(initial_rebalance_delay_ms=1_000)
    before = await asyncio.to_thread(scrape, server)
    assert before["groupcoord_warmups_started_total"] == 0
    assert before['groupcoord_warmups_ended_total{outcome="owned"}'] == 0
    plans = [
        {"a": A({"s": [0, 1]}), "b": A()},
        {"a": A({"s": [0, 1]}), "b": A(standby={"s": [0, 1]})},
        {"a": A({"s": [1]}), "b": A(standby={"s": [1]})},
        {"a": A({"s": [1]}), "b": A({"s": [0]}, why=(("s", 0, "warm"),))},
        {"a": A({"s": [1]}), "b": A({"s": [0]})},
        {"a": A({"s": [1]}), "b": A({"s": [0]})},
    ]
    ids: dict[str, str] = {}
    leader: str | None = None
    for plan in plans:
        ids, leader = await asyncio.to_thread(generation, server, ids, leader, plan)
    after = await asyncio.to_thread(scrape, server)
    assert after["groupcoord_warmups_started_total"] == 2
    assert after['groupcoord_warmups_ended_total{outcome="owned"}'] == 1
    assert after['groupcoord_warmups_ended_total{outcome="dropped"}'] == 1
    assert after["groupcoord_warmup_duration_seconds_count"] == 1


def test_bytes_that_are_not_a_resources_map_stop_the_following_and_count_nothing() -> None:
    t = WarmupTracker()
    t.observe(entry(1, 1_000, {"a": A({"s": [0]}), "b": A(standby={"s": [0]})}))
    bad = replace(entry(2, 2_000, {"a": A({"s": [0]})}), assignments={"a-id": b"\xc1"})
    assert t.observe(bad) == WarmupEvents()
    # Nothing is left under way: a later hand-over is not counted as this warm-up's end.
    assert t.observe(entry(3, 3_000, {"a": A(), "b": A({"s": [0]})})) == WarmupEvents()
