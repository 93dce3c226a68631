"""What bounds the joins one caller can park: one per member, a rebalance timeout
within ``max_rebalance_timeout_ms``, and a count per token for the runtime's
``--max-parked-per-token`` (tests/runtime/test_runtime_limits.py enforces it)."""

from __future__ import annotations

from coretest_kit import G, Harness, no_reply, reply, scheduled

from coordinator.core.records import GroupRecord, MemberRecord, Snapshot
from protocol.errors import ErrorCode

#: what the security re-attack sent: the protocol's largest timeout.
HUGE_MS = 2**31 - 1
#: joins one member sent in a row in that attack.
JOINS = 105


def test_one_member_sending_many_joins_keeps_one_parked() -> None:
    h = Harness()
    ids, _ = h.stable_group(2)
    rids = [h.join(ids[0])[0] for _ in range(JOINS)]
    # Each newer join takes the place of the parked one, answered at once.
    answered = [e for rid in rids[:-1] for e in h.effects
                if getattr(e, "request_id", None) == rid]
    assert [e.response.error for e in answered] == [ErrorCode.REBALANCE_IN_PROGRESS] * (JOINS - 1)
    assert h.coord.parked_request_count() == 1
    rid_b, out = h.join(ids[1])
    assert reply(out, rids[-1]).error is None and reply(out, rid_b).error is None


def test_one_static_instance_sending_many_joins_keeps_one_parked() -> None:
    h = Harness()
    h.stable_group(1)  # a member that does not rejoin: joins park
    rids = [h.join(instance="i1", protocols=(("range", b"changed"),))[0]
            for _ in range(JOINS)]
    # Each join with the instance id and an empty member id fences the member
    # id the previous one got: its parked join is answered FENCED_INSTANCE_ID.
    fenced = [e for rid in rids[:-1] for e in h.effects
              if getattr(e, "request_id", None) == rid]
    assert [e.response.error for e in fenced] == [ErrorCode.FENCED_INSTANCE_ID] * (JOINS - 1)
    assert h.coord.parked_request_count() == 1
    assert no_reply(h.effects, rids[-1])


def test_parked_joins_and_syncs_are_counted_per_token() -> None:
    """One client minting member ids (empty member id, MEMBER_ID_REQUIRED) parks
    one join per id: the count the runtime caps per token."""
    h = Harness()
    ids, _ = h.stable_group(2, principal="a")
    h.join(ids[0], principal="a", protocols=(("range", b"changed"),))
    minted = [reply(out, rid).member_id
              for rid, out in (h.join(principal="a") for _ in range(3))]
    assert h.coord.parked_by("a") == 1  # MEMBER_ID_REQUIRED parks nothing
    joins = [h.join(m, principal="a")[0] for m in minted[:2]]
    assert h.coord.parked_by("a") == 3
    # Another token's parked calls are its own; a long-poll heartbeat counts for none.
    other, generation_b = h.stable_group(1, group="g2", principal="b")
    h.heartbeat(other[0], generation_b, group="g2", wait_ms=1_000)
    assert (h.coord.parked_by("a"), h.coord.parked_by("b")) == (3, 0)
    assert h.coord.parked_request_count() == 4
    # A join superseded by its member's next one is counted once.
    h.join(minted[0], principal="a")
    assert h.coord.parked_by("a") == 3
    # A cancelled join no longer counts.
    h.cancel(joins[1])
    assert h.coord.parked_by("a") == 2
    # The last member's join completes the barrier: every join is answered.
    h.join(ids[1], principal="a")
    h.join(minted[1], principal="a")
    rid, out = h.join(minted[2], principal="a")
    joined = reply(out, rid)
    assert joined.error is None and h.coord.parked_by("a") == 0
    # Followers' syncs park until the leader's: they count, and go with its sync.
    followers = [m for m in (*ids, *minted) if m != joined.leader]
    for member_id in followers:
        h.sync(member_id, joined.generation_id, principal="a")
    assert h.coord.parked_by("a") == len(followers)
    h.sync(joined.leader, joined.generation_id, principal="a")
    assert h.coord.parked_by("a") == 0
    assert h.coord.parked_request_count() == 1  # b's long-poll


def test_rebalance_timeout_over_the_limit_is_refused_naming_it() -> None:
    h = Harness()  # the default limit, 5 minutes
    rid, out = h.join(rebalance=HUGE_MS)
    answer = reply(out, rid)
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert answer.message == (f"rebalance_timeout_ms: {HUGE_MS} is over the server's "
                              "--max-rebalance-timeout-ms (300000); allowed: 0 to 300000")
    assert h.coord.describe_group(G) is None  # nothing created
    # A member of a group refused the same way: nothing changes.
    ids, _ = h.stable_group(1, rebalance=300_000)
    rid, out = h.join(ids[0], rebalance=300_001)
    assert reply(out, rid).error is ErrorCode.INVALID_REQUEST
    assert h.state() == "Stable" and h.coord.parked_request_count() == 0
    rid, out = h.join(ids[0], rebalance=300_000)
    assert reply(out, rid).error is None


def test_a_member_restored_with_a_larger_rebalance_timeout_is_held_no_longer() -> None:
    """A member stored before the limit was lowered keeps its record, but the
    group's join phase lasts at most the limit."""
    h = Harness(max_rebalance_timeout_ms=60_000)
    member = MemberRecord("old", None, "cli", "10.0.0.1", 10_000, HUGE_MS,
                          (("range", b"meta-range"),), assignment=b"")
    h.restore_from(Snapshot(groups=(GroupRecord(G, "Stable", 3, "resources", "range", "old",
                                                (member,), h.now),)))
    rid, out = h.join(protocols=(("range", b"meta-range"),))
    new_id = reply(out, rid).member_id
    rid, out = h.join(new_id)
    assert no_reply(out, rid)
    assert scheduled(out)[f"join:{G}"] == h.now + 60_000
