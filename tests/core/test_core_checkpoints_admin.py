"""Checkpoints (commit/fetch) and admin commands (delete group, resource catalog)."""

from __future__ import annotations

from coretest_kit import G, Harness, index_of, persisted, reply, transitions

from coordinator.core.effects import AdminResult, Persist, Reply
from coordinator.core.records import CatalogChanged, CheckpointsWritten, GroupDeleted
from protocol.errors import ErrorCode
from protocol.limits import MAX_PARTITIONS


def test_commit_from_current_generation_is_persisted_then_answered() -> None:
    h = Harness()
    h.put_resource("orders", 8)
    ids, generation = h.stable_group(2)
    rid, out = h.commit(ids[1], generation, [("orders", 0, 42), ("orders", 1, b"\x01")])
    assert reply(out, rid).error is None
    assert persisted(out) == [CheckpointsWritten(G, (("orders", 0, 42), ("orders", 1, b"\x01")))]
    assert index_of(out, lambda e: isinstance(e, Persist)) < \
        index_of(out, lambda e: isinstance(e, Reply))
    rid, out = h.fetch()
    assert reply(out, rid).checkpoints == (("orders", 0, 42), ("orders", 1, b"\x01"))
    rid, out = h.fetch((("orders", 1), ("orders", 7)))
    assert reply(out, rid).checkpoints == (("orders", 1, b"\x01"),)
    # None deletes.
    h.commit(ids[1], generation, [("orders", 0, None)])
    rid, out = h.fetch()
    assert reply(out, rid).checkpoints == (("orders", 1, b"\x01"),)


def test_zombie_commit_is_refused_after_a_new_generation() -> None:
    h = Harness()
    h.put_resource("orders", 8)
    ids, generation = h.stable_group(2, session=60_000)
    zombie = ids[1]
    # The leader rejoins; the zombie does not, is removed at the join deadline.
    _rid_a, _ = h.join(ids[0], session=60_000)
    # During PreparingRebalance the old generation may still commit (Kafka).
    rid, out = h.commit(zombie, generation, [("orders", 0, 1)])
    assert reply(out, rid).error is None
    h.advance(30_000)
    h.sync(ids[0], generation + 1, {ids[0]: b"all"})
    rid, out = h.commit(zombie, generation, [("orders", 0, 999)])
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert persisted(out) == []
    rid, out = h.commit(ids[0], generation, [("orders", 0, 999)])
    assert reply(out, rid).error is ErrorCode.ILLEGAL_GENERATION
    rid, out = h.commit(ids[0], generation + 1, [("orders", 0, 2)])
    assert reply(out, rid).error is None
    assert h.coord.checkpoints(G) == {("orders", 0): 2}


def test_commit_in_completing_rebalance_is_rebalance_in_progress() -> None:
    h = Harness()
    member_id, rid, out = h.join_dynamic()
    rid, out = h.commit(member_id, 1, [("orders", 0, 1)])
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS


def test_commit_from_a_fenced_static_member_is_refused() -> None:
    h = Harness()
    h.join("", instance="i1", new_id="s1")
    h.sync("s1", 1, {"s1": b""}, instance="i1")
    h.join("", instance="i1", new_id="s1b")
    rid, out = h.commit("s1", 1, [("orders", 0, 1)], instance="i1")
    assert reply(out, rid).error is ErrorCode.FENCED_INSTANCE_ID


def test_simple_commits_for_a_missing_or_empty_group() -> None:
    h = Harness()
    rid, out = h.commit("anyone", 5, [("s", 0, 1)], group="g2")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.coord.describe_group("g2") is None
    rid, out = h.commit("anyone", -1, [("s", 0, 1)], group="g2")
    assert reply(out, rid).error is None
    assert transitions(out) == [(None, "Empty", "created")]
    assert h.state("g2") == "Empty"
    rid, out = h.commit("someone-else", -1, [("s", 1, "text")], group="g2")
    assert reply(out, rid).error is None
    # A non-empty group only takes commits from its members.
    ids, _generation = h.stable_group(1)
    rid, out = h.commit("outsider", -1, [("s", 0, 1)])
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    rid, out = h.commit(ids[0], -1, [("s", 0, 1)])
    assert reply(out, rid).error is ErrorCode.ILLEGAL_GENERATION
    # Deleting the last checkpoint of a never-formed group forgets the group.
    h.commit("x", -1, [("s", 0, None), ("s", 1, None)], group="g2")
    assert h.coord.describe_group("g2") is None


def test_fetch_of_an_unknown_group_is_empty() -> None:
    h = Harness()
    rid, out = h.fetch(group="none")
    assert reply(out, rid).error is None and reply(out, rid).checkpoints == ()
    assert h.coord.list_groups() == []


def test_delete_group() -> None:
    h = Harness()
    rid, out = h.delete_group("none")
    assert reply(out, rid) == AdminResult(ErrorCode.UNKNOWN_GROUP, 0, found=False)
    ids, generation = h.stable_group(1)
    h.commit(ids[0], generation, [("s", 0, 1)])
    rid, out = h.delete_group()
    assert reply(out, rid).error is ErrorCode.NON_EMPTY_GROUP
    h.leave((ids[0], None))
    rid, out = h.delete_group()
    assert reply(out, rid) == AdminResult(None, 0)
    assert persisted(out) == [GroupDeleted(G)]
    assert transitions(out) == [("Empty", "Dead", "deleted")]
    assert h.coord.describe_group(G) is None
    assert h.coord.checkpoints(G) == {}
    assert h.coord.state_counts() == {"Empty": 0, "PreparingRebalance": 0,
                                      "CompletingRebalance": 0, "Stable": 0, "Dead": 0}


def test_catalog_changes_bump_the_epoch() -> None:
    h = Harness()
    rid, out = h.put_resource("orders", 12)
    assert reply(out, rid) == AdminResult(None, 1)
    assert persisted(out) == [CatalogChanged("orders", 12, 1)]
    rid, out = h.put_resource("orders", 12)  # unchanged: idempotent
    assert reply(out, rid) == AdminResult(None, 1) and persisted(out) == []
    rid, out = h.put_resource("orders", 16)
    assert reply(out, rid).resources_epoch == 2
    rid, out = h.put_resource("users", 4)
    assert h.coord.catalog() == {"orders": 16, "users": 4}
    rid, out = h.delete_resource("nope")
    assert reply(out, rid) == AdminResult(None, 3, found=False)
    rid, out = h.delete_resource("users")
    assert reply(out, rid) == AdminResult(None, 4)
    assert persisted(out) == [CatalogChanged("users", None, 4)]
    assert h.coord.resources_epoch == 4
    # Sync responses carry it too.
    ids, generation = h.stable_group(1)
    rid, out = h.sync(ids[0], generation)
    assert reply(out, rid).resources_epoch == 4


def test_put_resource_refuses_bad_partitions_or_names_and_changes_nothing() -> None:
    h = Harness()
    for name, partitions, field in (("orders", 0, "partitions"),
                                    ("orders", MAX_PARTITIONS + 1, "partitions"),
                                    ("", 3, "name"), ("x" * 256, 3, "name")):
        rid, out = h.put_resource(name, partitions)
        result = reply(out, rid)
        assert result.error is ErrorCode.INVALID_REQUEST
        assert result.message.startswith(field)
        assert persisted(out) == []
    assert h.coord.catalog() == {} and h.coord.resources_epoch == 0
    rid, out = h.put_resource("orders", MAX_PARTITIONS)
    assert reply(out, rid).error is None
