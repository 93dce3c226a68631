"""A member's commit delayed past its next one is not applied over it
(``CommitRequest.sequence``; docs/coordinator-semantics.md, "The commit sequence")."""

from __future__ import annotations

from coretest_kit import G, Harness

from coordinator.core.commands import Commit, Fetch
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


def test_commits_without_a_sequence_are_applied_as_before() -> None:
    h = Harness()
    h.put_resource("orders", 1)
    (member_id,), generation = h.stable_group(1)
    assert _commit(h, member_id, generation, 5, sequence=3).error is None
    assert _commit(h, member_id, generation, 4, sequence=None).error is None   # a v1 client
    assert _stored(h) == 4
