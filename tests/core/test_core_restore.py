"""Replay round-trip: records -> fold -> Snapshot -> restore gives the same durable state."""

from __future__ import annotations

import pytest
from coretest_kit import G, Harness, reply, scheduled, transitions

from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import ScheduleTimer
from coordinator.core.records import (
    CatalogChanged,
    CheckpointsWritten,
    GroupDeleted,
    GroupRecord,
    JournalEntry,
    MemberRecord,
    Snapshot,
)
from coordinator.core.replay import fold
from protocol.errors import ErrorCode


def _restarted(h: Harness, advance_ms: int = 5_000) -> Harness:
    """A fresh coordinator restored from everything ``h`` persisted."""
    fresh = Harness(**{f: getattr(h.config, f) for f in
                       ("min_session_timeout_ms", "max_session_timeout_ms",
                        "initial_rebalance_delay_ms", "group_max_size")})
    fresh.now = h.now + advance_ms
    fresh._rid = h._rid + 1000
    fresh._mid = h._mid + 1000
    fresh.restore_from(fold(h.records))
    return fresh


def test_fold_applies_records_in_order() -> None:
    member = MemberRecord("m", None, "c", "h", 10_000, 30_000, (("range", b""),), b"A")
    g1 = GroupRecord("a", "CompletingRebalance", 1, "resources", "range", "m", (member,), 5)
    g2 = GroupRecord("a", "Stable", 1, "resources", "range", "m", (member,), 6)
    snap = fold([
        g1, g2,
        GroupRecord("b", "Empty", 3, "resources", None, None, ()),
        CheckpointsWritten("a", (("s", 0, 1), ("s", 1, 2))),
        CheckpointsWritten("a", (("s", 0, None),)),
        CheckpointsWritten("b", (("s", 0, 1),)),
        GroupDeleted("b"),
        CatalogChanged("s", 4, 1), CatalogChanged("t", 2, 2), CatalogChanged("t", None, 3),
        JournalEntry("a", 1, "resources", "range", "m", (("m", None, "c"),), ("m",), (),
                     "initial", 0, 6),
    ])
    assert snap == Snapshot((g2,), {"a": {("s", 1): 2}}, {"s": 4}, 3)
    with pytest.raises(TypeError):
        fold(["not a record"])  # type: ignore[list-item]


def test_stable_group_resumes_without_a_rebalance() -> None:
    h = Harness()
    ids, generation = h.stable_group(3)
    h.put_resource("orders", 2)
    h.commit(ids[0], generation, [("orders", 0, 7), ("orders", 1, "x")])
    before = h.coord.describe_group(G)
    r = _restarted(h)
    assert r.coord.describe_group(G) == before
    assert r.coord.resources_epoch == 1 and r.coord.catalog() == {"orders": 2}
    assert r.coord.checkpoints(G) == {("orders", 0): 7, ("orders", 1): "x"}
    # Every session re-armed from the restart, nothing else.
    restore_effects = list(r.effects)
    assert scheduled(restore_effects) == {f"session:{G}:{m}": r.now + 10_000 for m in ids}
    assert transitions(restore_effects) == []
    # Heartbeats on the same generation: no error; a re-sent sync: the stored assignment.
    rid, out = r.heartbeat(ids[1], generation)
    assert reply(out, rid).error is None and reply(out, rid).resources_epoch == 1
    rid, out = r.sync(ids[2], generation)
    assert reply(out, rid).assignment == f"A-{ids[2]}".encode()
    assert r.state() == "Stable"
    # A member that never comes back expires by its session timeout as usual.
    r.heartbeat(ids[0], generation)
    r.heartbeat(ids[1], generation)
    out = r.advance(10_000)
    assert transitions(out)[0] == ("Stable", "PreparingRebalance", "session_expiry")


def test_rebalance_in_flight_restarts_cleanly() -> None:
    h = Harness()
    ids, generation = h.stable_group(2, session=60_000)
    h.join(ids[0], session=60_000)  # leader rejoins
    h.join(ids[1], session=60_000)  # generation 2 formed (persisted CompletingRebalance)
    assert h.state() == "CompletingRebalance"
    r = _restarted(h)
    effects = list(r.effects)
    assert transitions(effects) == [("CompletingRebalance", "PreparingRebalance", "restart")]
    assert scheduled(effects)[f"join:{G}"] == r.now + 30_000
    assert r.state() == "PreparingRebalance"
    rid, out = r.heartbeat(ids[1], generation + 1)
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    rid, out = r.sync(ids[1], generation + 1)
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    rid0, _ = r.join(ids[0], session=60_000)
    _rid1, out = r.join(ids[1], session=60_000)
    assert reply(out, rid0).generation_id == generation + 2
    assert reply(out, rid0).leader == ids[0]
    r.sync(ids[0], generation + 2, {})
    journal = [rec for rec in r.records if isinstance(rec, JournalEntry)][-1]
    assert journal.reason == "restart" and journal.joined == () and journal.left == ()


def test_empty_group_and_commit_only_group_come_back_empty() -> None:
    h = Harness()
    ids, _generation = h.stable_group(1)
    h.leave((ids[0], None))
    h.commit("tool", -1, [("s", 3, 9)], group="offsets-only")
    r = _restarted(h)
    assert r.state() == "Empty" and r.state("offsets-only") == "Empty"
    assert r.coord.describe_group(G).generation_id == 2  # type: ignore[union-attr]
    assert r.coord.checkpoints("offsets-only") == {("s", 3): 9}
    # Nothing but their retention timers (KIP-211): from when G emptied, and from
    # the last commit of the group that never had members.
    retention = h.config.group_retention_ms
    assert list(r.effects) == [ScheduleTimer(f"retention:{G}", h.now + retention),
                               ScheduleTimer("retention:offsets-only", h.now + retention)]


def test_deleted_group_stays_deleted() -> None:
    h = Harness()
    ids, generation = h.stable_group(1)
    h.commit(ids[0], generation, [("s", 0, 1)])
    h.leave((ids[0], None))
    h.delete_group()
    r = _restarted(h)
    assert r.coord.list_groups() == [] and r.coord.checkpoints(G) == {}


def test_static_replacement_survives_a_restart() -> None:
    h = Harness()
    h.join("", instance="i1", new_id="s1")
    h.sync("s1", 1, {"s1": b"mine"}, instance="i1")
    h.join("", instance="i1", new_id="s1b")
    r = _restarted(h)
    rid, out = r.heartbeat("s1b", 1, instance="i1")
    assert reply(out, rid).error is None
    rid, out = r.heartbeat("s1", 1, instance="i1")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    rid, out = r.sync("s1b", 1, instance="i1")
    assert reply(out, rid).assignment == b"mine"


def test_round_trip_of_a_long_scenario_gives_the_same_durable_state() -> None:
    h = Harness()
    ids, generation = h.stable_group(3, group="a")
    h.stable_group(2, group="b")
    h.put_resource("orders", 8)
    h.commit(ids[0], generation, [("orders", i, i * 10) for i in range(8)], group="a")
    h.leave((ids[2], None), group="a")
    h.join(ids[0], group="a")
    h.join(ids[1], group="a")
    h.sync(ids[0], generation + 1, {ids[0]: b"x", ids[1]: b"y"}, group="a")
    h.delete_resource("orders")
    r = _restarted(h)
    for group_id in ("a", "b"):
        assert r.coord.describe_group(group_id) == h.coord.describe_group(group_id)
    assert r.coord.checkpoints("a") == h.coord.checkpoints("a")
    assert (r.coord.catalog(), r.coord.resources_epoch) == ({}, 2)
    assert r.coord.state_counts() == h.coord.state_counts()
    assert r.coord.member_count() == 4


def test_restore_needs_a_fresh_coordinator() -> None:
    h = Harness()
    h.put_resource("orders", 1)
    with pytest.raises(RuntimeError):
        h.coord.restore(Snapshot(), h.now)
    GroupCoordinator(h.config).restore(Snapshot(), 0)
