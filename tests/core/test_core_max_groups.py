"""``--max-groups``: a join (or simple commit) that would create a group beyond the limit.

What an operator relies on: at the limit no new group is created (memory
stays bounded), the caller gets ``COORDINATOR_NOT_AVAILABLE`` (retriable: the
client backs off and tries again), groups that exist carry on as before, and
deleting a group frees its slot.
"""

from __future__ import annotations

import pytest
from coretest_kit import Harness, persisted, reply, scheduled, transitions

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import RequestRefused
from protocol.errors import ErrorCode


def test_a_join_that_would_create_a_group_beyond_the_limit_is_refused_and_creates_nothing(
        ) -> None:
    h = Harness(max_groups=2)
    h.stable_group(1, group="a")
    h.stable_group(1, group="b")
    rid, out = h.join("", group="c")
    answer = reply(out, rid)
    assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert answer.member_id == ""
    assert h.coord.describe_group("c") is None
    assert [g.group_id for g in h.coord.list_groups()] == ["a", "b"]
    # Nothing was written, no timer armed, no state change: only the answer and the count.
    assert persisted(out) == [] and transitions(out) == []
    assert [e for e in out if isinstance(e, RequestRefused)] == [RequestRefused("c",
                                                                                "max_groups")]
    assert scheduled(out) == {}


def test_groups_that_exist_are_unaffected_at_the_limit() -> None:
    h = Harness(max_groups=1)
    ids, generation = h.stable_group(1, group="a")
    # A second member joins the existing group: a rebalance as usual.
    _member, rid, out = h.join_dynamic(group="a")
    assert h.state("a") == "PreparingRebalance"
    rid, out = h.heartbeat(ids[0], generation, group="a")
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    rid, out = h.join(ids[0], group="a")
    assert h.state("a") == "CompletingRebalance"
    assert not any(isinstance(e, RequestRefused) for e in h.effects)
    # A join naming a member of a group that does not exist is still UNKNOWN_MEMBER_ID.
    rid, out = h.join("someone", group="z")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_deleting_a_group_frees_its_slot() -> None:
    h = Harness(max_groups=1)
    ids, _generation = h.stable_group(1, group="a")
    rid, out = h.join("", group="b")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    h.leave((ids[0], None), group="a")
    assert h.state("a") == "Empty"
    # An Empty group still holds its slot (it has a generation and may have checkpoints)...
    rid, out = h.join("", group="b")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    # ...until it is deleted.
    rid, out = h.delete_group("a")
    assert reply(out, rid).error is None
    rid, out = h.join("", group="b")
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
    assert h.state("b") == "Empty"


def test_a_dropped_vacant_group_frees_its_slot() -> None:
    h = Harness(max_groups=1)
    # A first join creates the group with a pending member (KIP-394)...
    rid, out = h.join("", group="a", session=10_000)
    pending = reply(out, rid).member_id
    assert h.state("a") == "Empty"
    rid, out = h.join("", group="b")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    # ...which never comes back: once its pending id expires the group is forgotten.
    h.advance(10_000)
    assert h.coord.describe_group("a") is None
    rid, out = h.join("", group="b")
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
    assert pending != reply(out, rid).member_id


def test_a_simple_commit_that_would_create_a_group_is_refused_too() -> None:
    h = Harness(max_groups=1)
    h.stable_group(1, group="a")
    rid, out = h.commit("anyone", -1, [("s", 0, 1)], group="b")
    assert reply(out, rid).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert persisted(out) == []
    assert h.coord.describe_group("b") is None and h.coord.checkpoints("b") == {}
    assert [e for e in out if isinstance(e, RequestRefused)] == [RequestRefused("b",
                                                                                "max_groups")]


def test_zero_means_unlimited() -> None:
    h = Harness(max_groups=0)
    for i in range(50):
        rid, out = h.join("", group=f"g{i}")
        assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
    assert len(h.coord.list_groups()) == 50


def test_a_negative_limit_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="max_groups"):
        GroupCoordinator(CoreConfig(max_groups=-1))
