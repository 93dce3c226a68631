"""Join: member ids, validation, protocol vote, leader, join barrier, initial delay, max size."""

from __future__ import annotations

from coretest_kit import (
    G,
    Harness,
    no_reply,
    persisted,
    reply,
    scheduled,
    transitions,
)

from coordinator.core.commands import TimerFired
from coordinator.core.effects import Reply
from coordinator.core.records import GroupRecord
from protocol.errors import ErrorCode


def test_dynamic_first_join_gets_member_id_required_and_becomes_pending() -> None:
    h = Harness()
    rid, out = h.join("", new_id="minted-1")
    resp = reply(out, rid)
    assert resp.error is ErrorCode.MEMBER_ID_REQUIRED
    assert resp.member_id == "minted-1"
    assert transitions(out) == [(None, "Empty", "created")]
    assert scheduled(out) == {f"pending:{G}:minted-1": h.now + 10_000}
    assert h.coord.pending_member_count(G) == 1
    assert h.coord.member_count() == 0
    # Rejoining with the id makes it a member; with no delay the join completes at once.
    rid2, out2 = h.join("minted-1")
    resp2 = reply(out2, rid2)
    assert resp2.error is None
    assert resp2.generation_id == 1
    assert resp2.leader == "minted-1"
    assert resp2.protocol_name == "range"
    assert [m.member_id for m in resp2.members] == ["minted-1"]
    assert resp2.members[0].metadata == b"meta-range"
    assert f"pending:{G}:minted-1" in {e.key for e in out2 if hasattr(e, "key")}
    assert transitions(out2) == [("Empty", "PreparingRebalance", "initial"),
                                 ("PreparingRebalance", "CompletingRebalance", "join_complete")]
    assert h.coord.pending_member_count(G) == 0


def test_generation_record_is_persisted_before_the_join_replies() -> None:
    h = Harness()
    member_id, rid, out = h.join_dynamic()
    persist_at = next(i for i, e in enumerate(out) if persisted([e]))
    reply_at = next(i for i, e in enumerate(out) if isinstance(e, Reply) and e.request_id == rid)
    assert persist_at < reply_at
    record = persisted(out)[0]
    assert isinstance(record, GroupRecord)
    assert (record.state, record.generation_id, record.leader) == ("CompletingRebalance", 1,
                                                                   member_id)
    assert record.members[0].assignment is None
    # The sync deadline is armed at the rebalance timeout.
    assert scheduled(out)[f"sync:{G}"] == h.now + 30_000


def test_unknown_group_answers_unknown_member_id_for_a_known_member_id() -> None:
    h = Harness()
    rid, out = h.join("who")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.coord.describe_group(G) is None


def test_session_timeout_outside_bounds_is_refused_without_creating_the_group() -> None:
    h = Harness(min_session_timeout_ms=6_000, max_session_timeout_ms=60_000)
    for session in (5_999, 60_001):
        rid, out = h.join("", session=session)
        assert reply(out, rid).error is ErrorCode.INVALID_SESSION_TIMEOUT
        assert out == [out[0]]
    assert h.coord.list_groups() == []


def test_inconsistent_protocol_type_or_protocols_leave_the_group_undisturbed() -> None:
    h = Harness()
    ids, _generation = h.stable_group(2)
    before = h.coord.describe_group(G)
    rid, out = h.join("", ptype="other")
    assert reply(out, rid).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert out == [out[0]]
    rid, out = h.join("", protocols=(("sticky", b""),))
    assert reply(out, rid).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # A known member switching to protocols nobody else has: refused too.
    rid, out = h.join(ids[1], protocols=(("sticky", b""),))
    assert reply(out, rid).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.coord.describe_group(G) == before
    assert h.coord.pending_member_count(G) == 0


def test_protocol_vote_most_votes_wins() -> None:
    h = Harness()
    a = (("range", b"a-r"), ("sticky", b"a-s"))
    b = (("sticky", b"b-s"), ("range", b"b-r"))
    h.join_dynamic(protocols=a, new_id="a")
    rid, out = h.sync("a", 1, {"a": b""})  # a Stable group of one
    assert reply(out, rid).error is None
    # Two newcomers who prefer sticky; a rejoins preferring range: 2 votes to 1.
    h.join_dynamic(protocols=b, new_id="b")
    h.join_dynamic(protocols=(*b, ("roundrobin", b"")), new_id="c")
    rid_a, out_a = h.join("a", protocols=a)
    resp = reply(out_a, rid_a)
    assert resp.protocol_name == "sticky"
    assert resp.leader == "a"
    assert {m.member_id: m.metadata for m in resp.members} == {"a": b"a-s", "b": b"b-s",
                                                              "c": b"b-s"}


def test_protocol_vote_tie_is_broken_by_total_rank_then_name() -> None:
    from coordinator.core.protocol_selection import select_protocol

    # One vote each; "x" is ranked 0+1, "y" 1+0: equal rank -> smallest name.
    assert select_protocol([["y", "x"], ["x", "y"]], {"x", "y"}) == "x"
    # One vote each for x and y, but z's third member ranks y second -> y wins on rank.
    assert select_protocol([["x", "y"], ["y", "x"], ["z", "y", "x"]], {"x", "y"}) == "y"
    # Non-candidates are ignored for votes and ranks.
    assert select_protocol([["a", "b"], ["b", "a"], ["c", "b", "a"]], {"a", "b"}) == "b"
    # Order of members does not matter.
    assert select_protocol([["x", "y"], ["y", "x"]], {"x", "y"}) == \
        select_protocol([["y", "x"], ["x", "y"]], {"x", "y"})


def test_leader_is_kept_when_it_rejoins_and_replaced_when_it_does_not() -> None:
    h = Harness()
    # Sessions longer than the rebalance timeout: the join deadline decides.
    ids, generation = h.stable_group(3, session=60_000)
    leader = ids[0]
    # A follower with new metadata starts a rebalance; everyone rejoins.
    rid1, _ = h.join(ids[1], protocols=(("range", b"new"),), session=60_000)
    _rid2, _ = h.join(ids[2], session=60_000)
    rid0, out = h.join(leader, session=60_000)
    assert reply(out, rid0).leader == leader
    assert reply(out, rid1).generation_id == generation + 1
    gen = generation + 1
    for m in ids[1:]:
        h.sync(m, gen)
    h.sync(leader, gen, {})
    # Now the leader does not rejoin: it is removed at the timeout; the
    # longest-standing rejoined member leads.
    h.join(ids[2], protocols=(("range", b"newer"),), session=60_000)
    rid1, out1 = h.join(ids[1], session=60_000)
    assert no_reply(out1, rid1)
    out = h.advance(30_000)
    resp = reply(out, rid1)
    assert resp.error is None
    assert resp.leader == ids[1]
    assert [m.member_id for m in resp.members] == [ids[1], ids[2]]
    assert h.coord.describe_group(G).leader == ids[1]  # type: ignore[union-attr]


def test_join_barrier_completes_when_every_member_rejoined() -> None:
    h = Harness()
    ids, generation = h.stable_group(3)
    rid_a, out = h.join(ids[0])  # the leader rejoining forces a rebalance
    assert transitions(out) == [("Stable", "PreparingRebalance", "rejoin")]
    assert scheduled(out)[f"join:{G}"] == h.now + 30_000
    assert no_reply(out, rid_a)
    rid_b, out = h.join(ids[1])
    assert no_reply(out, rid_b) and no_reply(out, rid_a)
    rid_c, out = h.join(ids[2])
    got = {rid: reply(out, rid) for rid in (rid_a, rid_b, rid_c)}
    assert all(r.error is None and r.generation_id == generation + 1 for r in got.values())
    assert len(got[rid_a].members) == 3 and got[rid_b].members == () == got[rid_c].members
    assert f"join:{G}" in {e.key for e in out if type(e).__name__ == "CancelTimer"}


def test_join_barrier_times_out_and_removes_members_that_did_not_rejoin() -> None:
    h = Harness()
    ids, generation = h.stable_group(3, session=60_000)
    rid_a, _ = h.join(ids[0], session=60_000)
    _rid_b, _ = h.join(ids[1], session=60_000)
    out = h.advance(29_999)
    assert no_reply(out, rid_a)
    out = h.advance(1)
    resp = reply(out, rid_a)
    assert resp.generation_id == generation + 1
    assert [m.member_id for m in resp.members] == ids[:2]
    assert f"session:{G}:{ids[2]}" not in h.timers
    assert h.coord.member_count() == 2


def test_pending_member_blocks_the_barrier_until_it_expires() -> None:
    h = Harness()
    ids, _ = h.stable_group(1)
    rid, out = h.join("", new_id="late")  # pending, session 10s
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
    rid_a, out = h.join(ids[0])  # leader rejoins: rebalance, but a pending member exists
    assert no_reply(out, rid_a)
    out = h.advance(10_000)  # the pending member expires -> barrier completes
    assert reply(out, rid_a).generation_id == 2
    assert h.coord.pending_member_count(G) == 0


def test_pending_member_expires_and_its_id_is_then_unknown() -> None:
    h = Harness()
    rid, out = h.join("", new_id="p1")
    out = h.advance(10_000)
    assert h.coord.pending_member_count(G) == 0
    # The group never formed a generation and holds nothing: it is forgotten.
    assert h.coord.describe_group(G) is None
    assert transitions(out) == [("Empty", "Dead", "vacant")]
    rid, out = h.join("p1")
    assert reply(out, rid).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_follower_rejoining_stable_with_same_metadata_gets_current_generation() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    rid, out = h.join(ids[1])
    resp = reply(out, rid)
    assert (resp.error, resp.generation_id, resp.leader, resp.members) == (
        None, generation, ids[0], ())
    assert h.state() == "Stable"
    assert persisted(out) == []


def test_rejoin_in_completing_rebalance_with_same_metadata_returns_generation() -> None:
    h = Harness()
    a, _, _ = h.join_dynamic()
    assert h.state() == "CompletingRebalance"
    rid, out = h.join(a)
    resp = reply(out, rid)
    assert resp.generation_id == 1 and [m.member_id for m in resp.members] == [a]
    assert h.state() == "CompletingRebalance"
    # Changed metadata in CompletingRebalance: rebalance.
    rid, out = h.join(a, protocols=(("range", b"changed"),))
    assert transitions(out)[0] == ("CompletingRebalance", "PreparingRebalance",
                                   "metadata_change")


def test_new_member_during_completing_rebalance_answers_parked_syncs_rebalance() -> None:
    h = Harness()
    a, _, _ = h.join_dynamic()
    b, _, out = h.join_dynamic()
    # b's join started a rebalance from CompletingRebalance; a must rejoin.
    rid_a, out = h.join(a)
    assert reply(out, rid_a).generation_id == 2
    rid_sync_b, out = h.sync(b, 2)
    assert no_reply(out, rid_sync_b)
    _, _, out = h.join_dynamic()  # newcomer c
    assert reply(out, rid_sync_b).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert h.state() == "PreparingRebalance"


def test_initial_delay_waits_extends_per_newcomer_and_is_capped() -> None:
    h = Harness(initial_rebalance_delay_ms=3_000)
    _a, rid_a, out = h.join_dynamic(rebalance=7_000)
    assert scheduled(out)[f"join:{G}"] == h.now + 3_000
    t0 = h.now
    h.advance(2_000)
    _b, rid_b, out = h.join_dynamic(rebalance=7_000)
    assert no_reply(out, rid_b)
    out = h.advance(1_000)  # t0+3000: newcomer arrived -> extend by min(3000, 4000)
    assert no_reply(out, rid_a)
    assert h.timers[f"join:{G}"] == t0 + 6_000
    h.advance(1_000)
    _c, rid_c, _ = h.join_dynamic(rebalance=7_000)
    out = h.advance(2_000)  # t0+6000: extend again, but only 1000 left of the 7000 timeout
    assert no_reply(out, rid_a)
    assert h.timers[f"join:{G}"] == t0 + 7_000
    h.join_dynamic(rebalance=7_000)  # d arrives: remaining is 0, no more extension
    out = h.advance(1_000)
    got = [reply(out, r) for r in (rid_a, rid_b, rid_c)]
    assert all(r.generation_id == 1 for r in got)
    assert len(got[0].members) == 4
    assert h.now == t0 + 7_000


def test_initial_delay_without_newcomers_completes_after_one_delay() -> None:
    h = Harness(initial_rebalance_delay_ms=3_000)
    _a, rid_a, out = h.join_dynamic()
    out = h.advance(2_999)
    assert no_reply(out, rid_a)
    out = h.advance(1)
    assert reply(out, rid_a).generation_id == 1


def test_group_max_size_refuses_new_members_when_full() -> None:
    h = Harness(group_max_size=2)
    ids, _generation = h.stable_group(2)
    rid, out = h.join("")
    assert reply(out, rid).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.coord.pending_member_count(G) == 0
    # Known members are still accepted.
    rid, out = h.join(ids[1])
    assert reply(out, rid).error is None
    assert h.state() == "Stable"


def test_group_max_size_in_preparing_rebalance_counts_rejoined_members() -> None:
    h = Harness(group_max_size=2)
    ids, _ = h.stable_group(2)
    rid_p, out = h.join("", new_id="p")  # refused: 2 members already
    assert reply(out, rid_p).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    h.join(ids[0])  # leader rejoins -> PreparingRebalance with 1 awaiting
    rid_p, out = h.join("", new_id="p")  # 1 awaiting < 2: gets an id
    assert reply(out, rid_p).error is ErrorCode.MEMBER_ID_REQUIRED
    rid_p2, out = h.join("p")  # joins: now 2 awaiting
    assert no_reply(out, rid_p2)
    # ids[1] has not rejoined and the group has 2 rejoined members: it is
    # refused and removed (Kafka), which completes the barrier.
    rid_b, out = h.join(ids[1])
    assert reply(out, rid_b).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert reply(out, rid_p2).generation_id == 2
    view = h.coord.describe_group(G)
    assert view is not None and [m.member_id for m in view.members] == [ids[0], "p"]


def test_parked_join_is_superseded_by_a_retry() -> None:
    h = Harness()
    ids, _ = h.stable_group(2)
    rid1, _ = h.join(ids[0])
    rid2, out = h.join(ids[0])
    assert reply(out, rid1).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert no_reply(out, rid2)
    rid3, out = h.join(ids[1])
    assert reply(out, rid2).error is None and reply(out, rid3).error is None


def test_cancelled_join_is_not_counted_as_rejoined() -> None:
    h = Harness()
    ids, generation = h.stable_group(2)
    rid_a, _ = h.join(ids[0])
    out = h.cancel(rid_a)
    assert scheduled(out) == {f"session:{G}:{ids[0]}": h.now + 10_000}
    rid_b, out = h.join(ids[1])
    assert no_reply(out, rid_b)  # ids[0] is not parked any more
    rid_a2, out = h.join(ids[0])
    assert reply(out, rid_a2).generation_id == generation + 1
    assert h.coord.parked_request_count() == 0


def test_stale_timer_firings_are_ignored() -> None:
    h = Harness()
    ids, _ = h.stable_group(2)
    assert h.run(TimerFired("join:nope")) == []
    assert h.run(TimerFired(f"join:{G}")) == []  # not armed
    # An early firing of a session timer re-arms it at its recorded deadline.
    key = f"session:{G}:{ids[1]}"
    deadline = h.timers[key]
    out = h.fire(key)
    assert scheduled(out) == {key: deadline}
    assert h.state() == "Stable"


def test_initial_delay_end_waits_for_a_pending_newcomer_within_the_timeout() -> None:
    h = Harness(initial_rebalance_delay_ms=3_000)
    t0 = h.now
    _a, rid_a, _ = h.join_dynamic(rebalance=10_000, session=60_000)
    rid_b0, out = h.join("", new_id="b", session=60_000)  # b got its id, not rejoined yet
    assert reply(out, rid_b0).error is ErrorCode.MEMBER_ID_REQUIRED
    out = h.advance(3_000)  # delay over, no newcomer *joined*, but b is pending
    assert no_reply(out, rid_a)
    assert h.timers[f"join:{G}"] == t0 + 10_000  # the rest of the rebalance timeout
    h.advance(2_000)
    rid_b, out = h.join("b", rebalance=10_000, session=60_000)  # barrier complete at once
    assert reply(out, rid_a).generation_id == 1
    assert [m.member_id for m in reply(out, rid_a).members] == ["m1", "b"]
    assert reply(out, rid_b).generation_id == 1


def test_initial_delay_with_a_pending_newcomer_that_never_comes_is_capped() -> None:
    h = Harness(initial_rebalance_delay_ms=3_000)
    t0 = h.now
    _a, rid_a, _ = h.join_dynamic(rebalance=10_000, session=60_000)
    h.join("", new_id="b", session=60_000)
    out = h.advance(10_000)
    assert reply(out, rid_a).generation_id == 1
    assert h.now == t0 + 10_000 and h.coord.pending_member_count(G) == 1
