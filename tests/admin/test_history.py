"""The rebalance history of the admin API: what moved between generations."""

from __future__ import annotations

from typing import Any

from coordinator.history import moves, owners, summarize
from protocol.resources import ResourceAssignment


def row(generation: int, assigned: dict[str, dict[str, list[int]]], *,
        instances: dict[str, str] | None = None, reason: str = "member joined",
        started: int = 1_000, ended: int = 1_250, protocol_type: str = "resources",
        joined: tuple[str, ...] = (), left: tuple[str, ...] = ()) -> dict[str, Any]:
    instances = instances or {}
    return {
        "group_id": "g", "generation_id": generation, "protocol_type": protocol_type,
        "protocol_name": "cooperative-sticky", "leader": next(iter(assigned), None),
        "member_count": len(assigned),
        "members": [[m, instances.get(m), "c"] for m in assigned],
        "joined": list(joined), "left": list(left), "reason": reason,
        "started_ms": started, "ended_ms": ended,
        "assignments": {m: ResourceAssignment(a).encode() for m, a in assigned.items()},
    }


def test_moves_counts_moved_assigned_and_revoked() -> None:
    before = {("s", 0): "a", ("s", 1): "a", ("s", 2): "b"}
    after = {("s", 0): "a", ("s", 1): "b", ("s", 3): "b"}
    assert moves(before, after) == {"moved": 1, "assigned": 1, "revoked": 1}


def test_a_cooperative_hand_over_is_revoked_then_assigned() -> None:
    g1 = row(1, {"a": {"s": [0, 1, 2, 3]}})
    g2 = row(2, {"a": {"s": [0, 1]}, "b": {}}, joined=("b",))      # a revokes 2, 3
    g3 = row(3, {"a": {"s": [0, 1]}, "b": {"s": [2, 3]}}, reason="leader rebalance")
    history = summarize([g3, g2, g1], limit=2)
    assert [h["generation_id"] for h in history] == [3, 2]
    assert history[0]["resources"] == {"moved": 0, "assigned": 2, "revoked": 0}
    assert history[1]["resources"] == {"moved": 0, "assigned": 0, "revoked": 2}
    assert history[1]["joined"] == ["b"]
    assert history[0]["duration_ms"] == 250


def test_a_static_member_that_restarted_moved_nothing() -> None:
    g1 = row(1, {"m-old": {"s": [0, 1]}}, instances={"m-old": "worker-1"})
    g2 = row(2, {"m-new": {"s": [0, 1]}}, instances={"m-new": "worker-1"})
    assert summarize([g2, g1], limit=1)[0]["resources"] == {
        "moved": 0, "assigned": 0, "revoked": 0}
    # Dynamic members: a new member id is a new owner.
    d1 = row(1, {"m-old": {"s": [0, 1]}})
    d2 = row(2, {"m-new": {"s": [0, 1]}})
    assert summarize([d2, d1], limit=1)[0]["resources"] == {
        "moved": 2, "assigned": 0, "revoked": 0}


def test_the_first_generation_assigns_everything_and_opaque_protocols_count_nothing() -> None:
    g1 = row(1, {"a": {"s": [0, 1, 2]}})
    assert summarize([g1], limit=5)[0]["resources"] == {"moved": 0, "assigned": 3, "revoked": 0}
    other = row(1, {"a": {"s": [0]}}, protocol_type="consumer")
    assert owners(other) is None
    assert summarize([other], limit=1)[0]["resources"] is None
