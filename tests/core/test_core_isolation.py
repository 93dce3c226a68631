"""Tenants sharing a coordinator.

Item 10: a static instance belongs to the token (``principal``) that created
it; another token can neither take it over (join with an empty member id and
the instance id) nor remove it (leave by instance id alone): both answer
``FENCED_INSTANCE_ID`` and change nothing. The binding is persisted with the
member, so it holds after a restart; with authentication off (no principal)
nothing changes.

Item 11a: ``max_groups_per_token`` bounds the groups one token created that are
held at once (joins and simple commits alike); the owner is persisted, so the
count survives a restart.
"""

from __future__ import annotations

from coretest_kit import G, Harness, persisted, reply
from coretest_kit import replies as replies_of

from coordinator.core.commands import ReleaseHeartbeat
from coordinator.core.effects import RequestRefused
from coordinator.core.records import GroupOwner, GroupRecord
from coordinator.core.replay import fold
from protocol.errors import ErrorCode

# ---------------------------------------------------------------- item 10


def _static_pair(h: Harness) -> int:
    """Static members s1 (instance i1, token "alice") and s2 (i2, "bob"), Stable."""
    h.join("", instance="i1", new_id="s1", principal="alice")
    h.join("", instance="i2", new_id="s2", principal="bob")
    h.join("s1", instance="i1", principal="alice")
    view = h.coord.describe_group(G)
    assert view is not None and view.state == "CompletingRebalance"
    generation = view.generation_id
    h.sync("s2", generation, instance="i2")
    h.sync("s1", generation, {"s1": b"A1", "s2": b"A2"}, instance="i1")
    assert h.state() == "Stable"
    return generation


def _members(h: Harness) -> list[tuple[str, str | None, bytes]]:
    view = h.coord.describe_group(G)
    assert view is not None
    return [(m.member_id, m.group_instance_id, m.assignment) for m in view.members]


def test_another_token_cannot_take_over_a_static_instance() -> None:
    h = Harness()
    generation = _static_pair(h)
    before = _members(h)
    rid_hb, _ = h.heartbeat("s1", generation, instance="i1", wait_ms=2_000)
    rid, out = h.join("", instance="i1", new_id="thief", principal="bob")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    assert reply(out, rid).member_id == ""
    # Nothing changed: no write, the owner's parked heartbeat still parked,
    # the same members with the same assignments, still Stable.
    assert persisted(out) == []
    assert rid_hb not in {e.request_id for e in out if hasattr(e, "request_id")}
    assert _members(h) == before and h.state() == "Stable"
    rid, out = h.heartbeat("s1", generation, instance="i1")
    assert reply(out, rid).error is None


def test_another_token_cannot_remove_a_static_instance_by_instance_id() -> None:
    h = Harness()
    _static_pair(h)
    before = _members(h)
    rid, out = h.leave(("", "i1"), group=G, principal="bob")
    assert [(m.group_instance_id, m.error) for m in reply(out, rid).members] == [
        ("i1", ErrorCode.FENCED_INSTANCE_ID)]
    assert _members(h) == before and h.state() == "Stable"
    # The owner may.
    rid, out = h.leave(("", "i1"), group=G, principal="alice")
    assert reply(out, rid).members[0].error is None
    assert [m[0] for m in _members(h)] == ["s2"]


def test_the_owning_token_restarts_its_static_member_as_before() -> None:
    h = Harness()
    generation = _static_pair(h)
    rid, out = h.join("", instance="i1", new_id="s1b", principal="alice")
    resp = reply(out, rid)
    assert (resp.error, resp.member_id, resp.generation_id) == (None, "s1b", generation)
    record = persisted(out)[-1]
    assert isinstance(record, GroupRecord)
    assert {m.member_id: m.owner for m in record.members} == {"s1b": "alice", "s2": "bob"}


def test_the_binding_survives_a_restart() -> None:
    h = Harness()
    _static_pair(h)
    fresh = Harness()
    fresh.now = h.now
    fresh.restore_from(fold(h.records))
    before = _members(fresh)
    rid, out = fresh.join("", instance="i2", new_id="thief", principal="alice")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID
    rid, out = fresh.leave(("", "i2"), principal="alice")
    assert reply(out, rid).members[0].error is ErrorCode.FENCED_INSTANCE_ID
    assert _members(fresh) == before


def test_without_authentication_static_members_behave_as_kafka() -> None:
    h = Harness()
    h.join("", instance="i1", new_id="s1")
    rid, out = h.join("", instance="i1", new_id="s1b")
    assert reply(out, rid).error is None and reply(out, rid).member_id == "s1b"
    rid, out = h.leave(("", "i1"))
    assert reply(out, rid).members[0].error is None


def test_an_instance_created_without_authentication_is_claimed_by_the_first_token() -> None:
    h = Harness()
    h.join("", instance="i1", new_id="s1")
    rid, out = h.join("", instance="i1", new_id="s1b", principal="alice")
    assert reply(out, rid).error is None
    rid, out = h.join("", instance="i1", new_id="s1c", principal="bob")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID


# ---------------------------------------------------------------- item 11a


def _refused(out: list[object]) -> list[str]:
    return [e.reason for e in out if isinstance(e, RequestRefused)]


def test_a_token_holds_at_most_max_groups_per_token_groups() -> None:
    h = Harness(max_groups_per_token=3, max_groups=50)
    for i in range(3):
        rid, out = h.commit("", -1, [("s", 0, i)], group=f"team-a-junk-{i}", principal="a")
        assert reply(out, rid).error is None
    # The fourth group of "a" is refused, whether by simple commit or by join,
    # and nothing is created.
    rid, out = h.commit("", -1, [("s", 0, 9)], group="team-a-junk-3", principal="a")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert _refused(out) == ["max_groups_per_token"] and persisted(out) == []
    rid, out = h.join("", group="team-a-other", principal="a")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert _refused(out) == ["max_groups_per_token"]
    assert {g.group_id for g in h.coord.list_groups()} == {f"team-a-junk-{i}" for i in range(3)}
    # Another tenant is not affected; groups "a" already has still take commits.
    rid, out = h.join("", group="team-b", principal="b")
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
    rid, out = h.commit("", -1, [("s", 1, 1)], group="team-a-junk-0", principal="a")
    assert reply(out, rid).error is None
    # Deleting one of its groups frees a place.
    h.delete_group("team-a-junk-0")
    rid, out = h.commit("", -1, [("s", 0, 9)], group="team-a-junk-3", principal="a")
    assert reply(out, rid).error is None


def test_a_vacant_group_gives_its_place_back() -> None:
    h = Harness(max_groups_per_token=1)
    rid, out = h.join("", group="g-a", principal="a")
    pending = reply(out, rid).member_id
    h.leave((pending, None), group="g-a", principal="a")  # the group was vacant: forgotten
    assert h.coord.describe_group("g-a") is None
    rid, out = h.join("", group="g-b", principal="a")
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED


def test_the_owner_is_written_once_before_the_first_record_and_survives_a_restart() -> None:
    h = Harness(max_groups_per_token=2)
    rid, out = h.commit("", -1, [("s", 0, 1)], group="x1", principal="a")
    records = persisted(out)
    assert records[0] == GroupOwner("x1", "a") and len(records) == 2
    rid, out = h.commit("", -1, [("s", 0, 2)], group="x1", principal="a")
    assert not any(isinstance(r, GroupOwner) for r in persisted(out))
    # A group made by join: its owner goes with its first group record.
    h.stable_group(1, group="x2", principal="a")
    assert [r for r in h.records if isinstance(r, GroupOwner)] == [
        GroupOwner("x1", "a"), GroupOwner("x2", "a")]
    fresh = Harness(max_groups_per_token=2)
    fresh.now = h.now
    fresh.restore_from(fold(h.records))
    rid, out = fresh.commit("", -1, [("s", 0, 1)], group="x3", principal="a")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    rid, out = fresh.commit("", -1, [("s", 0, 1)], group="x3", principal="b")
    assert reply(out, rid).error is None


def test_without_authentication_there_is_no_quota() -> None:
    h = Harness(max_groups_per_token=1)
    for i in range(3):
        rid, out = h.commit("", -1, [("s", 0, 1)], group=f"g{i}")
        assert reply(out, rid).error is None


# ---------------------------------------------------------------- item 11b


def test_a_newer_long_poll_supersedes_the_members_parked_one() -> None:
    h = Harness()
    (member,), generation = h.stable_group(1)
    first, out = h.heartbeat(member, generation, wait_ms=2_000)
    assert first not in replies_of(out)
    second, out = h.heartbeat(member, generation, wait_ms=2_000)
    assert reply(out, first).error is None and second not in replies_of(out)
    assert h.coord.parked_request_count() == 1
    assert [k for k in h.timers if k.startswith("heartbeat:")] == [f"heartbeat:{second}"]


def test_release_heartbeat_answers_the_oldest_parked_long_poll() -> None:
    h = Harness()
    (m1,), gen1 = h.stable_group(1, group="a")
    (m2,), gen2 = h.stable_group(1, group="b")
    old, _ = h.heartbeat(m1, gen1, group="a", wait_ms=2_000)
    new, _ = h.heartbeat(m2, gen2, group="b", wait_ms=2_000)
    out = h.run(ReleaseHeartbeat())
    assert reply(out, old).error is None and new not in replies_of(out)
    assert h.coord.parked_request_count() == 1
    assert h.run(ReleaseHeartbeat()) and h.coord.parked_request_count() == 0
    assert h.run(ReleaseHeartbeat()) == []
