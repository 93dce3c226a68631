"""Leave batches and static membership (KIP-345, KIP-814)."""

from __future__ import annotations

from coretest_kit import (
    G,
    Harness,
    index_of,
    no_reply,
    persisted,
    reply,
    transitions,
)

from coordinator.core.effects import Persist, Reply
from coordinator.core.records import GroupRecord, JournalEntry
from protocol.errors import ErrorCode


def _static_stable(h: Harness, instances: list[str], **kw: object) -> tuple[list[str], int]:
    """Static members s1.. (instance ids as given) joined and synced; s1 leads."""
    ids = []
    rids = []
    for i, inst in enumerate(instances):
        rid, _ = h.join("", instance=inst, new_id=f"s{i + 1}", **kw)  # type: ignore[arg-type]
        ids.append(f"s{i + 1}")
        rids.append(rid)
    # No MEMBER_ID_REQUIRED step: with no initial delay the first join completes
    # generation 1 at once; later ones rebalance, and earlier members rejoin.
    if h.state() == "PreparingRebalance":
        for member_id, inst in zip(ids[:-1], instances[:-1], strict=True):
            h.join(member_id, instance=inst, **kw)  # type: ignore[arg-type]
    view = h.coord.describe_group(G)
    assert view is not None and view.state == "CompletingRebalance", view
    generation = view.generation_id
    for member_id, inst in zip(ids, instances, strict=True):
        if member_id != view.leader:
            h.sync(member_id, generation, instance=inst)
    leader_inst = instances[ids.index(str(view.leader))]
    h.sync(str(view.leader), generation, {m: f"A-{m}".encode() for m in ids},
           instance=leader_inst)
    assert h.state() == "Stable"
    return ids, generation


# ---------------------------------------------------------------- leave


def test_batch_leave_rebalances_once_with_per_member_results() -> None:
    h = Harness()
    ids, _generation = h.stable_group(4, session=60_000)
    _rid_p, out = h.join("", new_id="pend", session=60_000)  # a pending member
    rid, out = h.leave((ids[1], None), (ids[2], None), ("ghost", None), ("pend", None),
                       (ids[1], None))
    resp = reply(out, rid)
    assert resp.error is None
    assert [(m.member_id, m.error) for m in resp.members] == [
        (ids[1], None), (ids[2], None), ("ghost", ErrorCode.UNKNOWN_MEMBER_ID),
        ("pend", None), (ids[1], ErrorCode.UNKNOWN_MEMBER_ID)]
    assert transitions(out) == [("Stable", "PreparingRebalance", "leave")]
    assert h.coord.member_count() == 2
    assert h.coord.pending_member_count(G) == 0
    assert f"session:{G}:{ids[1]}" not in h.timers and f"pending:{G}:pend" not in h.timers


def test_leave_of_an_unknown_group_and_of_the_last_member() -> None:
    h = Harness()
    rid, out = h.leave(("x", None), group="nope")
    assert [m.error for m in reply(out, rid).members] == [ErrorCode.UNKNOWN_MEMBER_ID]
    ids, _generation = h.stable_group(1)
    rid, out = h.leave((ids[0], None))
    # Last member gone: the rebalance completes at once and the group is Empty,
    # persisted before the leave is answered.
    assert transitions(out) == [("Stable", "PreparingRebalance", "leave"),
                                ("PreparingRebalance", "Empty", "all_members_left")]
    record = persisted(out)[0]
    assert isinstance(record, GroupRecord)
    assert (record.state, record.generation_id, record.members) == ("Empty", 2, ())
    assert index_of(out, lambda e: isinstance(e, Persist)) < \
        index_of(out, lambda e: isinstance(e, Reply) and e.request_id == rid)


def test_leave_answers_a_parked_join_of_the_leaving_member() -> None:
    h = Harness()
    ids, _ = h.stable_group(3, session=60_000)
    rid_j0, _ = h.join(ids[0], session=60_000)  # the leader rejoining starts a rebalance
    rid_j, _ = h.join(ids[1], session=60_000)
    _rid, out = h.leave((ids[1], None), (ids[2], None))
    assert reply(out, rid_j).error is ErrorCode.UNKNOWN_MEMBER_ID
    # ids[0] is the only member left and it rejoined: generation 2 forms.
    assert reply(out, rid_j0).generation_id == 2


def test_static_member_leaves_by_instance_id_and_fenced_ids_cannot_leave() -> None:
    h = Harness()
    _ids, _ = _static_stable(h, ["i1", "i2", "i3"])
    rid, out = h.leave(("", "i2"), ("wrong-id", "i3"), ("", "unknown-instance"))
    assert [(m.member_id, m.group_instance_id, m.error) for m in reply(out, rid).members] == [
        ("", "i2", None),
        ("wrong-id", "i3", ErrorCode.FENCED_INSTANCE_ID),
        ("", "unknown-instance", ErrorCode.UNKNOWN_MEMBER_ID)]
    view = h.coord.describe_group(G)
    assert view is not None and [m.member_id for m in view.members] == ["s1", "s3"]


# ---------------------------------------------------------------- static membership


def test_static_member_joins_without_member_id_required() -> None:
    h = Harness()
    rid, out = h.join("", instance="i1", new_id="s1")
    resp = reply(out, rid)
    assert resp.error is None and resp.member_id == "s1" and resp.generation_id == 1


def test_static_rejoin_in_stable_with_same_metadata_needs_no_rebalance() -> None:
    h = Harness()
    _ids, generation = _static_stable(h, ["i1", "i2"])
    rid_hb, _ = h.heartbeat("s2", generation, instance="i2", wait_ms=2_000)
    rid, out = h.join("", instance="i2", new_id="s2b")
    resp = reply(out, rid)
    assert (resp.error, resp.member_id, resp.generation_id, resp.leader, resp.members,
            resp.skip_assignment) == (None, "s2b", generation, "s1", (), False)
    assert reply(out, rid_hb).error is ErrorCode.FENCED_INSTANCE_ID
    assert transitions(out) == []
    record = persisted(out)[0]
    assert isinstance(record, GroupRecord) and record.state == "Stable"
    assert {m.member_id: m.assignment for m in record.members} == {"s1": b"A-s1",
                                                                   "s2b": b"A-s2"}
    assert index_of(out, lambda e: isinstance(e, Persist)) < \
        index_of(out, lambda e: isinstance(e, Reply) and e.request_id == rid)
    assert f"session:{G}:s2" not in h.timers and f"session:{G}:s2b" in h.timers
    # The old id is fenced everywhere; the new one gets the old assignment.
    for call in (lambda: h.heartbeat("s2", generation, instance="i2"),
                 lambda: h.sync("s2", generation, instance="i2"),
                 lambda: h.commit("s2", generation, [("orders", 0, 1)], instance="i2"),
                 lambda: h.join("s2", instance="i2")):
        rid_x, out_x = call()
        assert reply(out_x, rid_x).error is ErrorCode.FENCED_INSTANCE_ID
    rid, out = h.sync("s2b", generation, instance="i2")
    assert reply(out, rid).assignment == b"A-s2"
    assert h.state() == "Stable"


def test_static_leader_rejoin_gets_members_and_skip_assignment() -> None:
    h = Harness()
    _ids, generation = _static_stable(h, ["i1", "i2"])
    rid, out = h.join("", instance="i1", new_id="s1b")
    resp = reply(out, rid)
    assert resp.leader == "s1b" and resp.skip_assignment is True
    assert [m.member_id for m in resp.members] == ["s1b", "s2"]
    assert h.coord.describe_group(G).leader == "s1b"  # type: ignore[union-attr]
    rid, out = h.sync("s1b", generation, {}, instance="i1")
    assert reply(out, rid).assignment == b"A-s1"  # stored, not reassigned
    assert h.state() == "Stable"


def test_static_rejoin_with_changed_metadata_rebalances() -> None:
    h = Harness()
    _ids, generation = _static_stable(h, ["i1", "i2"], session=60_000)
    rid, out = h.join("", instance="i2", new_id="s2b", protocols=(("range", b"changed"),),
                      session=60_000)
    assert no_reply(out, rid)
    assert transitions(out) == [("Stable", "PreparingRebalance", "static_change")]
    rid1, out = h.join("s1", instance="i1", session=60_000)
    assert reply(out, rid).generation_id == generation + 1
    assert {m.member_id: m.metadata for m in reply(out, rid1).members} == {
        "s1": b"meta-range", "s2b": b"changed"}
    h.sync("s1", generation + 1, {"s1": b"x", "s2b": b"y"}, instance="i1")
    journal = [r for r in h.records if isinstance(r, JournalEntry)][-1]
    assert journal.reason == "static_change"
    assert journal.joined == ("s2b",) and journal.left == ("s2",)


def test_static_rejoin_in_completing_rebalance_reaches_the_new_id() -> None:
    h = Harness()
    h.join("", instance="i1", new_id="s1")           # generation 1, s1 alone
    h.sync("s1", 1, {"s1": b""}, instance="i1")
    _rid2, _ = h.join("", instance="i2", new_id="s2")  # rebalance
    rid1, out = h.join("s1", instance="i1")
    leader_view = reply(out, rid1)
    assert leader_view.generation_id == 2
    rid_s2, _ = h.sync("s2", 2, instance="i2")       # parked
    # s2 restarts before the leader assigns: its parked sync is fenced, no rebalance.
    rid, out = h.join("", instance="i2", new_id="s2b")
    assert reply(out, rid_s2).error is ErrorCode.FENCED_INSTANCE_ID
    assert reply(out, rid).generation_id == 2 and reply(out, rid).skip_assignment is False
    assert h.state() == "CompletingRebalance"
    assert persisted(out)[0].members[1].member_id == "s2b"  # type: ignore[union-attr]
    rid_s2b, _ = h.sync("s2b", 2, instance="i2")
    # The leader assigns by the ids it saw (s2): the new id gets it.
    rid_l, out = h.sync("s1", 2, {"s1": b"one", "s2": b"two"}, instance="i1")
    assert reply(out, rid_s2b).assignment == b"two"
    assert reply(out, rid_l).assignment == b"one"


def test_static_member_rejoining_during_preparing_rebalance_is_parked() -> None:
    h = Harness()
    _ids, generation = _static_stable(h, ["i1", "i2", "i3"], session=60_000)
    rid1, _ = h.join("s1", instance="i1", session=60_000)  # leader rejoin -> rebalance
    rid_old, _ = h.join("s2", instance="i2", session=60_000)
    rid_new, out = h.join("", instance="i2", new_id="s2b", session=60_000)
    assert reply(out, rid_old).error is ErrorCode.FENCED_INSTANCE_ID
    assert no_reply(out, rid_new) and h.state() == "PreparingRebalance"
    assert persisted(out) == []  # PreparingRebalance is not persisted
    _rid3, out = h.join("s3", instance="i3", session=60_000)  # barrier complete
    resp = reply(out, rid_new)
    assert resp.generation_id == generation + 1 and resp.member_id == "s2b"
    assert [m.member_id for m in reply(out, rid1).members] == ["s1", "s2b", "s3"]


def test_group_full_still_lets_a_known_static_instance_back() -> None:
    h = Harness(group_max_size=2)
    _static_stable(h, ["i1", "i2"])
    rid, out = h.join("", instance="i3", new_id="s3")
    assert reply(out, rid).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    rid, out = h.join("", instance="i2", new_id="s2b")
    assert reply(out, rid).error is None


def test_static_member_expires_by_session_timeout() -> None:
    h = Harness()
    _ids, generation = _static_stable(h, ["i1", "i2"])
    h.advance(9_000)
    h.heartbeat("s1", generation, instance="i1")
    out = h.advance(1_000)
    assert transitions(out)[0] == ("Stable", "PreparingRebalance", "session_expiry")
    rid, out = h.heartbeat("s2", generation, instance="i2")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID


def _meta(sets: tuple[str, ...], owned: dict[str, list[int]] | None = None,
          generation: int = -1) -> tuple[tuple[str, bytes], ...]:
    from protocol.resources import MemberMetadata

    return (("range", MemberMetadata(sets, owned or {}, generation).encode()),)


def test_static_restart_owning_nothing_is_not_a_subscription_change() -> None:
    # A restarted worker comes back with empty `owned`: for the "resources"
    # protocol that is no reason to rebalance (KIP-345's whole point).
    h = Harness()
    owned = _meta(("orders",), {"orders": [0, 1]}, generation=1)
    _ids, generation = _static_stable(h, ["i1", "i2"], protocols=owned)
    rid, out = h.join("", instance="i2", new_id="s2b", protocols=_meta(("orders",)))
    assert transitions(out) == []
    assert reply(out, rid).generation_id == generation
    assert h.state() == "Stable"


def test_static_restart_with_other_sets_rebalances() -> None:
    h = Harness()
    _ids, _generation = _static_stable(h, ["i1", "i2"], protocols=_meta(("orders",)))
    _rid, out = h.join("", instance="i2", new_id="s2b",
                       protocols=_meta(("orders", "users")))
    assert transitions(out) == [("Stable", "PreparingRebalance", "static_change")]


def _balanced(**fields: object) -> tuple[tuple[str, bytes], ...]:
    """A ``balanced`` member's join protocols, its metadata built from ``fields``."""
    from protocol.resources import MemberMetadata
    return (("balanced", MemberMetadata(("orders",), **fields).encode()),)  # type: ignore[arg-type]


def test_static_restart_with_a_new_capacity_or_draining_rebalances() -> None:
    """The ``balanced`` assignor places by a member's ``capacity`` and
    ``draining``, and by what it has ``warm``: a static member that comes back
    with another capacity, draining, or with a standby warm that it did not have
    is a change (a rebalance); one that comes back with its claims, the loads it
    measured and its warmth gone, and capacity 1.0 for unset, is not."""
    before = _balanced(owned={"orders": [0, 1]}, generation=1, capacity=1.5,
                       load={"orders": {0: 3.0, 1: 4.0}}, warm={"orders": [2]})
    for changed, why in ((_balanced(capacity=3.0), "capacity"),
                         (_balanced(capacity=1.5, draining=True), "draining"),
                         (_balanced(capacity=1.5, warm={"orders": [2, 5]}), "a new warm")):
        h = Harness()
        _static_stable(h, ["i1", "i2"], protocols=before)
        rid, out = h.join("", instance="i2", new_id="s2b", protocols=changed)
        assert no_reply(out, rid), why
        assert transitions(out) == [("Stable", "PreparingRebalance", "static_change")], why
    h = Harness()
    _static_stable(h, ["i1", "i2"], protocols=_balanced(load={"orders": {0: 3.0}},
                                                        owned={"orders": [0]}, generation=1))
    rid, out = h.join("", instance="i2", new_id="s2b", protocols=_balanced(capacity=1.0))
    assert reply(out, rid).error is None
    assert transitions(out) == [] and h.state() == "Stable"
    # A settled member echoes empty user_data (balanced clears its hand-over
    # state so); a restarted process sends none: no change either.
    h = Harness()
    _static_stable(h, ["i1", "i2"], protocols=_balanced(user_data=b"", owned={"orders": [0]},
                                                        generation=1))
    rid, out = h.join("", instance="i2", new_id="s2b", protocols=_balanced())
    assert reply(out, rid).error is None
    assert transitions(out) == [] and h.state() == "Stable"
