"""Sync, heartbeat (incl. long-poll), session expiry, sync deadline, journal."""

from __future__ import annotations

import pytest
from coretest_kit import (
    G,
    Harness,
    cancelled,
    index_of,
    no_reply,
    persisted,
    reply,
    scheduled,
    transitions,
)

from coordinator.core.effects import (
    MemberExpired,
    Persist,
    RebalanceCompleted,
    Reply,
)
from coordinator.core.records import GroupRecord, JournalEntry
from protocol.errors import ErrorCode


def _completing(h: Harness, n: int, **kw: object) -> list[str]:
    """n members joined, generation 1 formed, nobody synced yet."""
    ids = []
    for _ in range(n):
        rid, out = h.join("", **kw)  # type: ignore[arg-type]
        ids.append(reply(out, rid).member_id)
    for member_id in ids:
        h.join(member_id, **kw)  # type: ignore[arg-type]
    assert h.state() == "CompletingRebalance"
    return ids


def test_sync_parks_until_the_leader_assigns_then_persists_and_answers_all() -> None:
    h = Harness()
    a, b, c = _completing(h, 3)
    rid_b, out = h.sync(b, 1)
    assert no_reply(out, rid_b)
    rid_a, out = h.sync(a, 1, {a: b"A", b: b"B", "stranger": b"X"})
    # Records first (group Stable + journal), then the replies.
    records = persisted(out)
    assert isinstance(records[0], GroupRecord) and records[0].state == "Stable"
    assert {m.member_id: m.assignment for m in records[0].members} == {a: b"A", b: b"B",
                                                                       c: b""}
    journal = records[1]
    assert isinstance(journal, JournalEntry)
    assert (journal.generation_id, journal.reason, journal.leader) == (1, "initial", a)
    assert journal.joined == (a, b, c) and journal.left == ()
    assert journal.assignments == {a: b"A", b: b"B", c: b""}
    last_persist = max(i for i, e in enumerate(out) if isinstance(e, Persist))
    first_reply = index_of(out, lambda e: isinstance(e, Reply))
    assert last_persist < first_reply
    assert reply(out, rid_a).assignment == b"A"
    assert reply(out, rid_b).assignment == b"B"
    assert reply(out, rid_b).protocol_name == "range"
    assert transitions(out) == [("CompletingRebalance", "Stable", "assignment_received")]
    completed = [e for e in out if isinstance(e, RebalanceCompleted)]
    assert completed == [RebalanceCompleted(G, 1, 0, 3)]
    # c was not in the leader's list: it gets an empty assignment, at once in Stable.
    rid_c, out = h.sync(c, 1)
    assert reply(out, rid_c).assignment == b""
    assert f"sync:{G}" in cancelled(out)  # everyone synced: the deadline is gone


def test_sync_errors() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    rid, out = h.sync(ids[1], generation + 5)
    assert reply(out, rid).error is ErrorCode.ILLEGAL_GENERATION
    rid, out = h.sync("ghost", generation)
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    rid, out = h.sync(ids[1], generation, ptype="other")
    assert reply(out, rid).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    rid, out = h.sync(ids[1], generation, pname="sticky")
    assert reply(out, rid).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    rid, out = h.sync(ids[1], generation, group="nope")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    rid, out = h.sync(ids[1], generation, ptype="resources", pname="range")
    assert reply(out, rid).error is None and reply(out, rid).assignment == f"A-{ids[1]}".encode()
    h.join(ids[0])  # leader rejoins -> PreparingRebalance
    rid, out = h.sync(ids[1], generation)
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert reply(out, rid).resources_epoch == 0


def test_sync_deadline_removes_members_that_never_synced_and_rebalances() -> None:
    h = Harness()
    _a, b, _c = _completing(h, 3, session=60_000)
    rid_b, _ = h.sync(b, 1)
    out = h.advance(30_000)  # the sync deadline = rebalance timeout
    assert reply(out, rid_b).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert transitions(out)[0] == ("CompletingRebalance", "PreparingRebalance", "sync_timeout")
    view = h.coord.describe_group(G)
    assert view is not None and [m.member_id for m in view.members] == [b]


def test_sync_deadline_in_stable_removes_a_follower_that_never_synced() -> None:
    h = Harness()
    a, b = _completing(h, 2, session=60_000)
    h.sync(a, 1, {a: b"A", b: b"B"})
    assert h.state() == "Stable"
    out = h.advance(30_000)
    assert transitions(out)[0] == ("Stable", "PreparingRebalance", "sync_timeout")
    # Only the leader is left; it is not parked, so the barrier waits for it.
    assert h.coord.member_count() == 1


def test_heartbeat_answers_in_each_state() -> None:
    h = Harness()
    rid, out = h.heartbeat("x", 0)
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID  # no group
    a, b = _completing(h, 2)
    rid, out = h.heartbeat(a, 1)  # CompletingRebalance: fine
    assert reply(out, rid).error is None
    assert scheduled(out) == {f"session:{G}:{a}": h.now + 10_000}
    h.sync(a, 1, {a: b"A"})
    rid, out = h.heartbeat(b, 1)  # Stable
    assert reply(out, rid).error is None
    rid, out = h.heartbeat(b, 0)
    assert reply(out, rid).error is ErrorCode.ILLEGAL_GENERATION
    rid, out = h.heartbeat("ghost", 1)
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    rid, out = h.heartbeat(b, 1, instance="never-seen")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    h.join(a)  # PreparingRebalance
    rid, out = h.heartbeat(b, 1)
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert scheduled(out) == {f"session:{G}:{b}": h.now + 10_000}  # still keeps it alive


def test_heartbeat_carries_the_resources_epoch() -> None:
    h = Harness()
    ids, generation = h.stable_group(1)
    h.put_resource("orders", 4)
    rid, out = h.heartbeat(ids[0], generation)
    assert reply(out, rid).resources_epoch == 1


def test_session_expiry_removes_the_member_and_rebalances() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    h.advance(9_000)
    h.heartbeat(ids[0], generation)
    out = h.advance(1_000)  # ids[1]'s session (10 s since its sync) runs out
    assert [e for e in out if isinstance(e, MemberExpired)] == [MemberExpired(G, ids[1])]
    assert transitions(out)[0] == ("Stable", "PreparingRebalance", "session_expiry")
    rid, out = h.heartbeat(ids[1], generation)
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    rid, out = h.join(ids[0])
    resp = reply(out, rid)
    assert resp.generation_id == generation + 1 and [m.member_id for m in resp.members] == \
        [ids[0]]


def test_a_parked_join_keeps_the_member_alive() -> None:
    h = Harness()
    ids, _ = h.stable_group(2, session=6_000, rebalance=30_000)
    rid, _ = h.join(ids[0], session=6_000, rebalance=30_000)
    # Both sessions run out at the same instant; ids[0]'s timer fires first, but
    # ids[0] is parked, so it re-arms instead of expiring; ids[1] expires, which
    # completes the barrier.
    out = h.advance(6_000)
    assert [e.member_id for e in out if isinstance(e, MemberExpired)] == [ids[1]]
    assert reply(out, rid).error is None
    assert reply(out, rid).generation_id == 2


def test_long_poll_heartbeat_is_answered_after_the_clamped_wait() -> None:
    h = Harness()
    ids, generation = h.stable_group(1, session=10_000)
    rid, out = h.heartbeat(ids[0], generation, wait_ms=60_000)
    assert no_reply(out, rid)
    assert scheduled(out)[f"heartbeat:{rid}"] == h.now + 5_000  # half the session timeout
    out = h.advance(4_999)
    assert no_reply(out, rid)
    out = h.advance(1)
    assert reply(out, rid).error is None
    assert scheduled(out) == {f"session:{G}:{ids[0]}": h.now + 10_000}
    assert h.coord.parked_request_count() == 0


def test_long_poll_is_answered_at_once_when_a_rebalance_starts() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    rid, _ = h.heartbeat(ids[1], generation, wait_ms=3_000)
    _rid_j, out = h.join(ids[0])
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert f"heartbeat:{rid}" in cancelled(out)
    assert h.coord.parked_request_count() == 1  # only the join


def test_long_poll_is_answered_when_the_member_leaves_or_is_fenced() -> None:
    h = Harness()
    (s1,), generation = _static_stable(h, ["i1"])
    rid, _ = h.heartbeat(s1, generation, instance="i1", wait_ms=3_000)
    _rid_j, out = h.join("", instance="i1", new_id="s1-new")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    rid2, _ = h.heartbeat("s1-new", generation, instance="i1", wait_ms=3_000)
    rid_l, out = h.leave(("s1-new", "i1"))
    assert reply(out, rid2).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert reply(out, rid_l).members[0].error is None


def test_long_poll_is_answered_at_once_when_the_resources_epoch_moves() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    rid1, _ = h.heartbeat(ids[0], generation, wait_ms=3_000)
    rid2, _ = h.heartbeat(ids[1], generation, wait_ms=3_000)
    _rid_p, out = h.put_resource("orders", 8)
    assert reply(out, rid1).resources_epoch == 1 and reply(out, rid1).error is None
    assert reply(out, rid2).resources_epoch == 1
    assert index_of(out, lambda e: isinstance(e, Persist)) < \
        index_of(out, lambda e: isinstance(e, Reply))
    assert h.state() == "Stable"  # the coordinator never rebalances by itself


def test_cancelled_long_poll_is_dropped() -> None:
    h = Harness()
    ids, generation = h.stable_group(1)
    rid, _ = h.heartbeat(ids[0], generation, wait_ms=3_000)
    out = h.cancel(rid)
    assert cancelled(out) == {f"heartbeat:{rid}"}
    assert out == [out[0]]
    assert h.coord.parked_request_count() == 0
    assert h.cancel(rid) == []  # unknown request: nothing


def _static_stable(h: Harness, instances: list[str]) -> tuple[list[str], int]:
    ids = []
    for i, inst in enumerate(instances):
        _rid, _out = h.join("", instance=inst, new_id=f"s{i + 1}")
        ids.append(f"s{i + 1}")
    # Static members join at once; the first ones were parked until the last.
    view = h.coord.describe_group(G)
    assert view is not None
    if view.state == "PreparingRebalance":
        for member_id in ids[:-1]:
            h.join(member_id, instance=instances[ids.index(member_id)])
    view = h.coord.describe_group(G)
    assert view is not None and view.state == "CompletingRebalance", view
    generation = view.generation_id
    leader = view.leader
    for member_id, inst in zip(ids, instances, strict=True):
        if member_id != leader:
            h.sync(member_id, generation, instance=inst)
    h.sync(str(leader), generation, {m: f"A-{m}".encode() for m in ids},
           instance=instances[ids.index(str(leader))])
    assert h.state() == "Stable"
    return ids, generation


@pytest.mark.parametrize("n", [1, 3])
def test_journal_joined_and_left_follow_generations(n: int) -> None:
    h = Harness()
    ids, generation = h.stable_group(n, session=60_000)
    leader = ids[0]
    _rid, _out = h.leave((ids[-1], None))
    if n == 1:
        assert h.state() == "Empty"
        return
    for member_id in ids[:-1]:
        h.join(member_id, session=60_000)
    h.sync(leader, generation + 1, {})
    journal = [r for r in h.records if isinstance(r, JournalEntry)][-1]
    assert journal.reason == "leave"
    assert journal.left == (ids[-1],) and journal.joined == ()
