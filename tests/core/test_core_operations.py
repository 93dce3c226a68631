"""Operators' actions on a group: remove a member, reset checkpoints (core/operations.py)."""

from __future__ import annotations

from coordinator.core.commands import RemoveMember, ResetCheckpoints
from coordinator.core.records import CheckpointsWritten
from protocol.errors import ErrorCode
from tests.core.coretest_kit import G, Harness, persisted, reply, transitions


def reset(h: Harness, **kw: object) -> tuple[object, list[object]]:
    rid = h.rid()
    kw.setdefault("dry_run", True)
    kw.setdefault("resources", None)
    out = h.run(ResetCheckpoints(rid, G, **kw))  # type: ignore[arg-type]
    return reply(out, rid), persisted(out)


def empty_group_with_checkpoints(h: Harness) -> None:
    rid, out = h.commit("tool", -1, [("s", 0, 10), ("s", 1, 20), ("t", 0, "text")])
    assert reply(out, rid).error is None
    assert h.state() == "Empty"


def test_remove_member_rebalances_the_group_and_the_member_learns_it() -> None:
    h = Harness()
    (a, b), generation = h.stable_group(2)
    rid = h.rid()
    out = h.run(RemoveMember(rid, G, b))
    assert reply(out, rid).error is None
    assert ("Stable", "PreparingRebalance", "admin_removal") in transitions(out)
    view = h.coord.describe_group(G)
    assert view is not None and [m.member_id for m in view.members] == [a]
    hrid, hout = h.heartbeat(b, generation)
    assert reply(hout, hrid).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_remove_member_of_an_unknown_group_or_member_changes_nothing() -> None:
    h = Harness()
    (a,), _ = h.stable_group(1)
    rid = h.rid()
    out = h.run(RemoveMember(rid, G, "nobody"))
    answer = reply(out, rid)
    assert answer.error is ErrorCode.UNKNOWN_MEMBER_ID and not answer.found
    assert persisted(out) == [] and h.state() == "Stable"
    rid = h.rid()
    answer = reply(h.run(RemoveMember(rid, "other", a)), rid)
    assert answer.error is ErrorCode.UNKNOWN_GROUP


def test_reset_is_refused_unless_the_group_is_empty() -> None:
    h = Harness()
    h.put_resource("s", 4)
    (a,), generation = h.stable_group(1)
    rid, out = h.commit(a, generation, [("s", 0, 5)])
    assert reply(out, rid).error is None
    answer, written = reset(h, dry_run=False, has_value=True, to_value=0)
    assert answer.error is ErrorCode.NON_EMPTY_GROUP and "Stable" in answer.message
    assert written == [] and h.coord.checkpoints(G) == {("s", 0): 5}


def test_a_dry_run_shows_before_and_after_and_writes_nothing() -> None:
    h = Harness()
    empty_group_with_checkpoints(h)
    answer, written = reset(h, shift_by=-5, resources=(("s", 0), ("s", 1)))
    assert answer.error is None
    assert answer.before == (("s", 0, 10), ("s", 1, 20))
    assert answer.after == (("s", 0, 5), ("s", 1, 15))
    assert written == [] and h.coord.checkpoints(G)[("s", 0)] == 10


def test_execute_writes_one_record_and_changes_the_checkpoints() -> None:
    h = Harness()
    empty_group_with_checkpoints(h)
    answer, written = reset(h, dry_run=False, has_value=True, to_value=0,
                            resources=(("s", 0), ("s", 7)))
    assert answer.after == (("s", 0, 0), ("s", 7, 0))
    assert written == [CheckpointsWritten(G, (("s", 0, 0), ("s", 7, 0)))]
    assert h.coord.checkpoints(G) == {("s", 0): 0, ("s", 1): 20, ("s", 7): 0, ("t", 0): "text"}


def test_delete_and_values_round_trip_an_export() -> None:
    h = Harness()
    empty_group_with_checkpoints(h)
    exported = tuple((s, i, v) for (s, i), v in sorted(h.coord.checkpoints(G).items()))
    answer, _ = reset(h, dry_run=False, delete=True)
    assert answer.after == () and len(answer.before) == 3
    assert h.coord.checkpoints(G) == {}
    # The group stays (Empty, until its retention runs out), so the export undoes it.
    assert h.state() == "Empty"
    answer, _ = reset(h, dry_run=False, values=exported)
    assert answer.after == exported and answer.before == ()
    assert h.coord.checkpoints(G) == {(s, i): v for s, i, v in exported}


def test_shift_by_names_a_non_integer_or_missing_checkpoint() -> None:
    h = Harness()
    empty_group_with_checkpoints(h)
    answer, written = reset(h, dry_run=False, shift_by=1)
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert "('t', 0)" in answer.message and "not integers" in answer.message
    assert written == []
    answer, _ = reset(h, dry_run=False, shift_by=1, resources=(("s", 9),))
    assert answer.error is ErrorCode.INVALID_REQUEST and "('s', 9)" in answer.message
    assert h.coord.checkpoints(G)[("s", 0)] == 10


def test_reset_of_an_unknown_group() -> None:
    h = Harness()
    answer, _ = reset(h, has_value=True, to_value=1)
    assert answer.error is ErrorCode.UNKNOWN_GROUP and not answer.found


def test_a_reset_goes_through_the_commit_checks() -> None:
    h = Harness(max_checkpoints_per_group=3, max_checkpoint_value_bytes=8)
    empty_group_with_checkpoints(h)
    answer, written = reset(h, dry_run=False, values=(("s", 5, 1),))
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert "--max-checkpoints-per-group (3)" in answer.message and written == []
    answer, written = reset(h, dry_run=False, has_value=True, to_value="x" * 9,
                            resources=(("s", 0),))
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert answer.message.startswith("resources[0][2]") and written == []
    assert h.coord.checkpoints(G)[("s", 0)] == 10
