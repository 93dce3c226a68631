"""Incarnations (v1.1): a static join with an empty member
id is told apart from a newer process's by the process's incarnation.

Kafka's rule (KIP-345) replaces the member id of a known instance on every
such join, so a join of the live member's own process delayed on the network
(seeds 102063, 110964), or one of an older process of the same instance
(seed 108585), fenced the live member. docs/coordinator-semantics.md,
"Incarnations".
"""

from __future__ import annotations

from coretest_kit import G, Harness, no_reply, persisted, reply, transitions

from coordinator.core.records import GroupRecord
from coordinator.core.replay import fold
from protocol.errors import ErrorCode

T0 = 1_700_000_000_000


def _static_pair(h: Harness) -> int:
    """Static members s1 (instance i1, process p1) and s2 (i2, process p2),
    Stable; s1 leads. Returns the generation."""
    h.join("", instance="i1", new_id="s1", incarnation="p1", incarnation_ms=T0)
    h.join("", instance="i2", new_id="s2", incarnation="p2", incarnation_ms=T0 + 10)
    h.join("s1", instance="i1", incarnation="p1", incarnation_ms=T0)
    view = h.coord.describe_group(G)
    assert view is not None and view.state == "CompletingRebalance" and view.leader == "s1"
    h.sync("s2", view.generation_id, instance="i2")
    h.sync("s1", view.generation_id, {"s1": b"A-s1", "s2": b"A-s2"}, instance="i1")
    assert h.state() == "Stable"
    return view.generation_id


def _members(h: Harness) -> dict[str, tuple[str | None, str | None, int | None]]:
    view = h.coord.describe_group(G)
    assert view is not None
    return {m.member_id: (m.group_instance_id, m.incarnation, m.incarnation_ms)
            for m in view.members}


def test_the_incarnation_is_kept_with_the_static_member_and_persisted() -> None:
    h = Harness()
    _static_pair(h)
    assert _members(h) == {"s1": ("i1", "p1", T0), "s2": ("i2", "p2", T0 + 10)}
    record = [r for r in h.records if isinstance(r, GroupRecord)][-1]
    assert {(m.member_id, m.incarnation, m.incarnation_ms) for m in record.members} == {
        ("s1", "p1", T0), ("s2", "p2", T0 + 10)}


def test_a_replayed_join_of_the_current_incarnation_does_not_fence() -> None:
    # Seeds 102063 and 110964: the process re-sent its join after a reset; the
    # first copy arrives after the second was answered.
    h = Harness()
    generation = _static_pair(h)
    rid_hb, _ = h.heartbeat("s2", generation, instance="i2", wait_ms=2_000)
    rid, out = h.join("", instance="i2", new_id="s2-late", incarnation="p2",
                      incarnation_ms=T0 + 10)
    resp = reply(out, rid)
    # Answered as a join of the current member id (a follower, same metadata:
    # the current generation at once), nothing fenced, nothing replaced.
    assert (resp.error, resp.member_id, resp.generation_id) == (None, "s2", generation)
    assert no_reply(out, rid_hb)  # the held heartbeat stays held: not fenced
    assert transitions(out) == [] and persisted(out) == []
    assert _members(h) == {"s1": ("i1", "p1", T0), "s2": ("i2", "p2", T0 + 10)}
    rid, out = h.heartbeat("s2", generation, instance="i2")
    assert reply(out, rid).error is None
    rid, out = h.sync("s2", generation, instance="i2")
    assert reply(out, rid).error is None and reply(out, rid).assignment == b"A-s2"


def test_a_replayed_join_while_preparing_is_a_rejoin_of_the_current_id() -> None:
    h = Harness()
    generation = _static_pair(h)
    h.join("", new_id="d1")  # a dynamic newcomer (MEMBER_ID_REQUIRED)
    h.join("d1")  # -> PreparingRebalance
    assert h.state() == "PreparingRebalance"
    rid, out = h.join("", instance="i2", new_id="s2-late", incarnation="p2",
                      incarnation_ms=T0 + 10)
    assert no_reply(out, rid)  # parked until the barrier, as s2's
    assert set(_members(h)) == {"s1", "s2", "d1"}
    rid_hb, out = h.heartbeat("s2", generation, instance="i2")
    assert reply(out, rid_hb).error is ErrorCode.REBALANCE_IN_PROGRESS  # not fenced
    _, out = h.join("s1", instance="i1", incarnation="p1", incarnation_ms=T0)
    resp = reply(out, rid)
    assert (resp.error, resp.member_id, resp.generation_id) == (None, "s2", generation + 1)


def test_a_join_of_a_new_incarnation_fences_the_old_member_id() -> None:
    # Kafka's rule, unchanged: a restarted process takes the instance over.
    h = Harness()
    generation = _static_pair(h)
    rid, out = h.join("", instance="i2", new_id="s2b", incarnation="p2b",
                      incarnation_ms=T0 + 5_000)
    resp = reply(out, rid)
    assert (resp.error, resp.member_id, resp.generation_id) == (None, "s2b", generation)
    assert _members(h) == {"s1": ("i1", "p1", T0), "s2b": ("i2", "p2b", T0 + 5_000)}
    record = persisted(out)[0]
    assert isinstance(record, GroupRecord)
    assert {(m.member_id, m.incarnation) for m in record.members} == {("s1", "p1"),
                                                                      ("s2b", "p2b")}
    rid, out = h.heartbeat("s2", generation, instance="i2")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID


def test_a_join_of_an_older_incarnation_is_refused_and_changes_nothing() -> None:
    # Seed 108585: a process's join delayed past its own end arrives after the
    # next process of the same instance has joined.
    h = Harness()
    generation = _static_pair(h)
    h.join("", instance="i2", new_id="s2b", incarnation="p2b", incarnation_ms=T0 + 5_000)
    for late in ("p2", "p2-never-joined"):
        rid, out = h.join("", instance="i2", new_id="s2c", incarnation=late,
                          incarnation_ms=T0 + 4_000)
        assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
        assert transitions(out) == [] and persisted(out) == []
        assert _members(h) == {"s1": ("i1", "p1", T0), "s2b": ("i2", "p2b", T0 + 5_000)}
        rid, out = h.heartbeat("s2b", generation, instance="i2")
        assert reply(out, rid).error is None


def test_without_an_incarnation_on_either_side_kafkas_rule_applies() -> None:
    h = Harness()
    generation = _static_pair(h)
    # A v1 client's join (no incarnation) takes over a member that has one...
    rid, out = h.join("", instance="i2", new_id="s2b")
    assert reply(out, rid).member_id == "s2b"
    assert _members(h)["s2b"] == ("i2", None, None)
    # ... and any join takes over a member without one (even an older start).
    rid, out = h.join("", instance="i2", new_id="s2c", incarnation="p0", incarnation_ms=T0)
    assert reply(out, rid).member_id == "s2c"
    rid, out = h.heartbeat("s2b", generation, instance="i2")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    # The same start time but another id: another process, Kafka's rule.
    rid, out = h.join("", instance="i2", new_id="s2d", incarnation="p0b", incarnation_ms=T0)
    assert reply(out, rid).member_id == "s2d"


def test_the_incarnation_survives_a_coordinator_restart() -> None:
    h = Harness()
    generation = _static_pair(h)
    fresh = Harness()
    fresh.now = h.now + 1_000
    fresh._rid = h._rid + 1000
    fresh._mid = h._mid + 1000
    fresh.restore_from(fold(h.records))
    rid, out = fresh.join("", instance="i2", new_id="s2-late", incarnation="p2",
                          incarnation_ms=T0 + 10)
    assert reply(out, rid).member_id == "s2"
    rid, out = fresh.join("", instance="i1", new_id="s1-old", incarnation="p0",
                          incarnation_ms=T0 - 1)
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    rid, out = fresh.heartbeat("s2", generation, instance="i2")
    assert reply(out, rid).error is None
