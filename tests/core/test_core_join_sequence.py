"""A member's join delayed past its next one is not applied (simulator finding
11, seed 61599): ``JoinRequest.sequence``, docs/coordinator-semantics.md."""

from __future__ import annotations

from coretest_kit import PROTOS, G, Harness, reply

from coordinator.core.commands import Join
from coordinator.core.effects import Effect
from coordinator.core.replay import fold
from protocol.errors import ErrorCode
from protocol.messages import JoinRequest, JoinResponse


def _join(h: Harness, member_id: str, sequence: int | None) -> tuple[int, list[Effect]]:
    rid = h.rid()
    req = JoinRequest(G, member_id, "resources", PROTOS, 10_000, 30_000,
                      client_id="cli", sequence=sequence)
    return rid, h.run(Join(rid, req, "10.0.0.1", h.new_id(), None))


def _refused_as_late(h: Harness, member_id: str, sequence: int) -> None:
    """The join is not applied: answered REBALANCE_IN_PROGRESS, the group as it was."""
    state = h.state()
    rid, out = _join(h, member_id, sequence=sequence)
    answer = reply(out, rid)
    assert isinstance(answer, JoinResponse)
    assert answer.error is ErrorCode.REBALANCE_IN_PROGRESS
    assert h.state() == state


def test_a_join_older_than_one_applied_does_not_count_as_a_rejoin() -> None:
    h = Harness()
    h.put_resource("orders", 4)
    (leader, follower), generation = h.stable_group(2)
    # The follower's join 0 is delayed on the network; it gives up on it, joins
    # again (1) and gets the current generation back, with its assignment.
    rid, out = _join(h, follower, sequence=1)
    answer = reply(out, rid)
    assert isinstance(answer, JoinResponse) and answer.error is None
    assert answer.generation_id == generation and h.state() == "Stable"
    # The leader starts a rebalance (a catalog change, say).
    h.join(leader)
    assert h.state() == "PreparingRebalance"
    # Join 0 lands now. Applied, it would stand for the follower's rejoin (its
    # word that it owns nothing) while it still owns its assignment under a
    # live lease, and the next generation would form and give that away.
    _refused_as_late(h, follower, sequence=0)
    # The follower's own rejoin (after its heartbeat saw the rebalance) counts.
    rid, out = _join(h, follower, sequence=2)
    assert h.state() == "CompletingRebalance"
    answer = reply(out, rid)
    assert isinstance(answer, JoinResponse) and answer.generation_id == generation + 1


def test_joins_without_a_sequence_are_applied_as_before() -> None:
    h = Harness()
    h.put_resource("orders", 4)
    (leader, follower), _ = h.stable_group(2)
    _join(h, follower, sequence=5)
    h.join(leader)
    _join(h, follower, sequence=None)   # a v1 client
    assert h.state() == "CompletingRebalance"


def test_a_join_delayed_across_a_coordinator_restart_is_refused_too() -> None:
    """Simulator seed 6342355: the follower's join 0, delayed 18 s on the
    network, reached a coordinator that had restarted meanwhile; with the
    sequence kept in memory only it was applied as the follower's rejoin, and
    the next generation gave away what the follower still held. The sequence
    is part of the member's durable record, written even by a join answered
    from the current generation."""
    h = Harness()
    h.put_resource("orders", 4)
    (leader, follower), generation = h.stable_group(2)
    rid, out = _join(h, follower, sequence=1)  # answered from the current generation
    assert reply(out, rid).generation_id == generation
    restarted = Harness()
    restarted.restore_from(fold(h.records))
    restarted.join(leader)
    assert restarted.state() == "PreparingRebalance"
    _refused_as_late(restarted, follower, sequence=0)


def _static_join(h: Harness, member_id: str, process: str, started_ms: int,
                 sequence: int) -> tuple[int, list[Effect]]:
    rid = h.rid()
    req = JoinRequest(G, member_id, "resources", PROTOS, 10_000, 30_000,
                      group_instance_id="i1", client_id="cli", sequence=sequence,
                      incarnation=process, incarnation_ms=started_ms)
    return rid, h.run(Join(rid, req, "10.0.0.1", h.new_id(), None))


def test_a_new_process_of_a_static_instance_counts_its_joins_from_its_own_start() -> None:
    """Simulator seed 8024833: a static instance restarted (a new process, its
    joins counted from 0 again) took the instance over, and kept the old
    process's join sequence; its next joins were refused as late until the
    group expelled it, a rebalance of a group that had no fault left."""
    h = Harness()
    h.put_resource("orders", 4)
    rid, out = _static_join(h, "", "p1", 1_000, sequence=0)
    first = reply(out, rid)
    assert isinstance(first, JoinResponse) and first.error is None
    # The first process joins again, its answer lost, say: its sequence is 3.
    rid, out = _static_join(h, first.member_id, "p1", 1_000, sequence=3)
    assert reply(out, rid).error is None
    # It is restarted: the new process takes the instance over with its join 0 ...
    rid, out = _static_join(h, "", "p2", 2_000, sequence=0)
    taken = reply(out, rid)
    assert isinstance(taken, JoinResponse) and taken.error is None
    assert taken.member_id != first.member_id
    # ... and its join 1 with the new member id is applied, not refused as late.
    rid, out = _static_join(h, taken.member_id, "p2", 2_000, sequence=1)
    answer = reply(out, rid)
    assert isinstance(answer, JoinResponse)
    assert answer.error is None and answer.generation_id == taken.generation_id

