"""The per-token budget of checkpoint bytes (``max_checkpoint_bytes_per_token``).

With authentication on, the bytes of checkpoints (``checkpoint_size``, as for the
per-group cap) held in every group one token created count against its budget. A
commit or reset that would take the group's creator over it is refused whole with
``CHECKPOINT_LIMIT_REACHED`` naming the limit, the token's usage and the budget,
and changes nothing. The count comes back on restore and is released when a
group's checkpoints are deleted, reset, or go with the group.
"""

from __future__ import annotations

from coretest_kit import G, Harness, persisted, reply

from coordinator.core.commands import ResetCheckpoints
from coordinator.core.replay import fold
from protocol.errors import ErrorCode
from protocol.validate import checkpoint_size

#: one checkpoint ("s", i, an int) counts 1 + 8 + 8 bytes.
SIZE = checkpoint_size("s", 0)
BUDGET = 10 * SIZE


def fill(h: Harness, group: str, first: int, count: int, principal: str | None = "a") -> None:
    rid, out = h.commit("", -1, [("s", i, i) for i in range(first, first + count)],
                        group=group, principal=principal)
    assert reply(out, rid).error is None


def test_a_commit_over_the_tokens_budget_is_refused_whole_and_names_the_limit() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, "a-1", 0, 6)
    fill(h, "a-2", 0, 3)
    # A new group whose first commit would take "a" to 11 checkpoints' worth.
    rid, out = h.commit("", -1, [("s", 0, 1), ("s", 1, 1)], group="a-3", principal="a")
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert answer.message == (
        f"token 'a' holds {9 * SIZE} bytes of checkpoints in the groups it created; this "
        f"write to group 'a-3' would add {2 * SIZE}, over --max-checkpoint-bytes-per-token "
        f"({BUDGET}); nothing was written")
    assert persisted(out) == [] and h.coord.describe_group("a-3") is None
    # The same through a group it already has: nothing written there either.
    rid, out = h.commit("", -1, [("s", 10, 1), ("s", 11, 1)], group="a-1", principal="a")
    assert reply(out, rid).error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert persisted(out) == [] and len(h.coord.checkpoints("a-1")) == 6
    # What fits still goes, and writes that do not grow always do.
    fill(h, "a-3", 0, 1)
    rid, out = h.commit("", -1, [("s", 0, 99), ("s", 1, None)], group="a-1", principal="a")
    assert reply(out, rid).error is None
    # Another token is not affected.
    fill(h, "b-1", 0, 10, principal="b")


def test_a_write_by_another_token_counts_for_the_groups_creator() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, "shared", 0, 8, principal="a")
    rid, out = h.commit("", -1, [("s", i, i) for i in range(8, 11)], group="shared",
                        principal="b")
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert "token 'a' holds" in answer.message
    fill(h, "b-1", 0, 10, principal="b")


def test_the_budget_is_counted_again_after_a_restart() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, "a-1", 0, 5)
    h.put_resource("s", 100)
    (member,), generation = h.stable_group(1, group="a-2", principal="a")
    rid, out = h.commit(member, generation, [("s", i, i) for i in range(4)], group="a-2",
                        principal="a")
    assert reply(out, rid).error is None
    fresh = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fresh.now = h.now
    fresh.restore_from(fold(h.records))
    rid, out = fresh.commit("", -1, [("s", 0, 1), ("s", 1, 1)], group="a-3", principal="a")
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert f"holds {9 * SIZE} bytes" in answer.message
    fill(fresh, "a-3", 0, 1)


def test_deleting_a_group_releases_its_bytes() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, "a-1", 0, 10)
    rid, out = h.commit("", -1, [("s", 0, 1)], group="a-2", principal="a")
    assert reply(out, rid).error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    rid, out = h.delete_group("a-1")
    assert reply(out, rid).error is None
    fill(h, "a-2", 0, 10)


def test_deleting_or_resetting_checkpoints_releases_their_bytes() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, G, 0, 10)
    # A member's delete (value nil) releases at once.
    rid, out = h.commit("", -1, [("s", 0, None), ("s", 1, None)], group=G, principal="a")
    assert reply(out, rid).error is None
    fill(h, "a-2", 0, 2)
    # An operator's reset: deleting every checkpoint of G gives its 8 back.
    rid = h.rid()
    out = h.run(ResetCheckpoints(rid, G, dry_run=False, resources=None, delete=True))
    assert reply(out, rid).error is None and h.coord.checkpoints(G) == {}
    fill(h, "a-3", 0, 8)
    # A reset that would grow past the budget is refused like a commit.
    rid = h.rid()
    out = h.run(ResetCheckpoints(rid, "a-3", dry_run=False, resources=None,
                                 values=(("s", 100, 1),)))
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert "--max-checkpoint-bytes-per-token" in answer.message and persisted(out) == []


def test_an_expired_group_releases_its_bytes() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET, group_retention_ms=60_000)
    fill(h, "a-1", 0, 10)
    h.advance(60_001)
    assert h.coord.describe_group("a-1") is None
    fill(h, "a-2", 0, 10)


def test_without_authentication_or_with_0_there_is_no_budget() -> None:
    h = Harness(max_checkpoint_bytes_per_token=BUDGET)
    fill(h, "g-1", 0, 20, principal=None)
    h = Harness(max_checkpoint_bytes_per_token=0)
    fill(h, "a-1", 0, 20)
