"""A member's commit delayed past its next one is not applied over it
(``CommitRequest.sequence``; docs/coordinator-semantics.md, "The commit sequence")."""

from __future__ import annotations

from coretest_kit import G, Harness

from coordinator.core.commands import Commit, Fetch
from coordinator.core.replay import fold
from protocol.messages import CommitRequest, CommitResponse, FetchRequest, FetchResponse


def _commit(h: Harness, member_id: str, generation: int, value: int,
            sequence: int | None) -> CommitResponse:
    effects = h.run(Commit(h.rid(), CommitRequest(
        G, member_id, generation, (("orders", 0, value),), sequence=sequence)))
    (answer,) = [e.response for e in effects if hasattr(e, "response")]
    assert isinstance(answer, CommitResponse)
    return answer


def _stored(h: Harness) -> object:
    effects = h.run(Fetch(h.rid(), FetchRequest(G)))
    (answer,) = [e.response for e in effects if hasattr(e, "response")]
    assert isinstance(answer, FetchResponse)
    return {(s, i): v for s, i, v in answer.checkpoints}[("orders", 0)]


def test_a_commit_older_than_one_applied_is_answered_but_not_applied() -> None:
    h = Harness()
    h.put_resource("orders", 1)
    (member_id,), generation = h.stable_group(1)
    assert _commit(h, member_id, generation, 54, sequence=7).error is None
    assert _commit(h, member_id, generation, 61, sequence=8).error is None
    # Commit 7 again (delayed on the network, the member gave up on it): superseded.
    assert _commit(h, member_id, generation, 54, sequence=7).error is None
    assert _stored(h) == 61
    assert _commit(h, member_id, generation, 70, sequence=9).error is None
    assert _stored(h) == 70


def test_a_commit_delayed_across_a_coordinator_restart_is_not_applied_either() -> None:
    """Simulator seed 8215649: a member's commit timed out, its next one was
    acknowledged, and the coordinator reloaded the group before the late one
    arrived. With the sequence in memory only, the late commit's older value
    replaced the acknowledged one. The sequence is stored with the values
    it wrote, and a load gives the member back its largest."""
    h = Harness()
    h.put_resource("orders", 1)
    (member_id,), generation = h.stable_group(1)
    assert _commit(h, member_id, generation, 54, sequence=7).error is None
    assert _commit(h, member_id, generation, 61, sequence=8).error is None
    restarted = Harness()
    restarted.restore_from(fold(h.records))
    assert _commit(restarted, member_id, generation, 54, sequence=7).error is None
    assert _stored(restarted) == 61
    assert _commit(restarted, member_id, generation, 70, sequence=9).error is None
    assert _stored(restarted) == 70


def test_a_restore_gives_each_member_its_own_largest_sequence() -> None:
    """Two members' sequences are their own counts: one's is not the other's bound."""
    h = Harness()
    h.put_resource("orders", 2)
    (first, second), generation = h.stable_group(2)

    def commit_both(h: Harness, first_sequence: int, second_sequence: int) -> object:
        for member, index, sequence in ((first, 0, first_sequence),
                                        (second, 1, second_sequence)):
            effects = h.run(Commit(h.rid(), CommitRequest(
                G, member, generation, (("orders", index, sequence),), sequence=sequence)))
            assert [e.response.error for e in effects if hasattr(e, "response")] == [None]
        effects = h.run(Fetch(h.rid(), FetchRequest(G)))
        (answer,) = [e.response for e in effects if hasattr(e, "response")]
        assert isinstance(answer, FetchResponse)
        return sorted(answer.checkpoints)

    assert commit_both(h, 40, 3) == [("orders", 0, 40), ("orders", 1, 3)]
    restarted = Harness()
    restarted.restore_from(fold(h.records))
    assert commit_both(restarted, 39, 2) == [("orders", 0, 40), ("orders", 1, 3)]   # late
    assert commit_both(restarted, 41, 4) == [("orders", 0, 41), ("orders", 1, 4)]


def test_commits_without_a_sequence_are_applied_as_before() -> None:
    h = Harness()
    h.put_resource("orders", 1)
    (member_id,), generation = h.stable_group(1)
    assert _commit(h, member_id, generation, 5, sequence=3).error is None
    assert _commit(h, member_id, generation, 4, sequence=None).error is None   # a v1 client
    assert _stored(h) == 4
