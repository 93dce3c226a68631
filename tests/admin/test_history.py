"""The rebalance history of the admin API: what moved between generations."""

from __future__ import annotations

from typing import Any

from coordinator.history import gained_by_cause, moves, owners, resource_history, summarize
from protocol.resources import ResourceAssignment


def row(generation: int, assigned: dict[str, dict[str, list[int]]], *,
        instances: dict[str, str] | None = None, reason: str = "member joined",
        started: int = 1_000, ended: int = 1_250, protocol_type: str = "resources",
        joined: tuple[str, ...] = (), left: tuple[str, ...] = (),
        why: dict[str, tuple[tuple[str, int, str], ...]] | None = None,
        standby: dict[str, dict[str, list[int]]] | None = None) -> dict[str, Any]:
    instances = instances or {}
    why = why or {}
    standby = standby or {}
    return {
        "group_id": "g", "generation_id": generation, "protocol_type": protocol_type,
        "protocol_name": "cooperative-sticky", "leader": next(iter(assigned), None),
        "member_count": len(assigned),
        "members": [[m, instances.get(m), "c"] for m in assigned],
        "joined": list(joined), "left": list(left), "reason": reason,
        "started_ms": started, "ended_ms": ended,
        "assignments": {m: ResourceAssignment(a, why=why.get(m, ()),
                                              standby=standby.get(m, {})).encode()
                        for m, a in assigned.items()},
    }


def test_moves_counts_moved_assigned_and_revoked() -> None:
    before = {("s", 0): "a", ("s", 1): "a", ("s", 2): "b"}
    after = {("s", 0): "a", ("s", 1): "b", ("s", 3): "b"}
    assert moves(before, after) == {"moved": 1, "assigned": 1, "revoked": 1,
                                    "causes": {"unknown": 3}}


def test_a_cooperative_hand_over_is_revoked_then_assigned() -> None:
    g1 = row(1, {"a": {"s": [0, 1, 2, 3]}})
    g2 = row(2, {"a": {"s": [0, 1]}, "b": {}}, joined=("b",))      # a revokes 2, 3
    g3 = row(3, {"a": {"s": [0, 1]}, "b": {"s": [2, 3]}}, reason="leader rebalance")
    history = summarize([g3, g2, g1], limit=2)
    assert [h["generation_id"] for h in history] == [3, 2]
    assert history[0]["resources"] == {"moved": 0, "assigned": 2, "revoked": 0,
                                       "causes": {"unknown": 2}}
    assert history[1]["resources"] == {"moved": 0, "assigned": 0, "revoked": 2,
                                       "causes": {"unknown": 2}}
    assert history[1]["joined"] == ["b"]
    assert history[0]["duration_ms"] == 250


def test_a_static_member_that_restarted_moved_nothing() -> None:
    g1 = row(1, {"m-old": {"s": [0, 1]}}, instances={"m-old": "worker-1"})
    g2 = row(2, {"m-new": {"s": [0, 1]}}, instances={"m-new": "worker-1"})
    assert summarize([g2, g1], limit=1)[0]["resources"] == {
        "moved": 0, "assigned": 0, "revoked": 0, "causes": {}}
    # Dynamic members: a new member id is a new owner.
    d1 = row(1, {"m-old": {"s": [0, 1]}})
    d2 = row(2, {"m-new": {"s": [0, 1]}})
    assert summarize([d2, d1], limit=1)[0]["resources"] == {
        "moved": 2, "assigned": 0, "revoked": 0, "causes": {"unknown": 2}}


def test_the_first_generation_assigns_everything_and_opaque_protocols_count_nothing() -> None:
    g1 = row(1, {"a": {"s": [0, 1, 2]}})
    assert summarize([g1], limit=5)[0]["resources"] == {"moved": 0, "assigned": 3, "revoked": 0,
                                                        "causes": {"unknown": 3}}
    other = row(1, {"a": {"s": [0]}}, protocol_type="consumer")
    assert owners(other) is None
    assert summarize([other], limit=1)[0]["resources"] is None


def test_causes_come_from_the_new_owners_why_else_the_old_owners() -> None:
    g1 = row(1, {"a": {"s": [0, 1, 2, 3]}})
    # One generation: a loses 0 to b (both explain, differently), revokes 1
    # (only a explains), and 2 goes to b unexplained. 3 stays, though a's why
    # names it: a resource that did not change owner is not counted.
    g2 = row(2, {"a": {"s": [3]}, "b": {"s": [0, 2]}},
             why={"a": (("s", 0, "load"), ("s", 1, "drain"), ("s", 3, "zone")),
                  "b": (("s", 0, "balance"),)})
    assert summarize([g2, g1], limit=1)[0]["resources"] == {
        "moved": 2, "assigned": 0, "revoked": 1,
        "causes": {"balance": 1, "drain": 1, "unknown": 1}}


def test_a_resource_history_names_each_owner_change_and_its_cause() -> None:
    instances = {"m1": "worker-1", "m2": "worker-2", "m1b": "worker-1"}
    rows = [
        row(1, {"m1": {"s": [0, 1]}}, instances=instances, ended=1_100,
            why={"m1": (("s", 0, "join"),)}),
        row(2, {"m1": {"s": [1]}, "m2": {}}, instances=instances, ended=1_200,
            why={"m1": (("s", 0, "load"),)}, standby={"m2": {"s": [0]}}),
        row(3, {"m1": {"s": [1]}, "m2": {"s": [0]}}, instances=instances, ended=1_300,
            why={"m2": (("s", 0, "warm"),)}),
        # worker-1 restarted (a new member id): it kept what it had.
        row(4, {"m1b": {"s": [1]}, "m2": {"s": [0]}}, instances=instances, ended=1_400),
        row(5, {"m1b": {"s": [0, 1]}}, instances=instances, ended=1_500),
    ]
    newest_first = rows[::-1]
    story = resource_history(newest_first, 5, ("s", 0))
    assert [(g["generation_id"], g["owner"], g["member_id"], g["change"], g["cause"],
             g["standby"], g["ended_ms"]) for g in story] == [
        (5, "worker-1", "m1b", "moved", "unknown", [], 1_500),
        (4, "worker-2", "m2", "kept", None, [], 1_400),
        (3, "worker-2", "m2", "assigned", "warm", [], 1_300),
        (2, None, None, "revoked", "load", ["worker-2"], 1_200),
        (1, "worker-1", "m1", "assigned", "join", [], 1_100),
    ]
    # The oldest row read is compared with the one before it, as summarize does.
    assert [g["change"] for g in resource_history(newest_first, 2, ("s", 1))] == [
        "kept", "kept"]
    assert [g["change"] for g in resource_history(newest_first, 5, ("s", 7))] == [
        "unowned"] * 5
    other = row(1, {"a": {"s": [0]}}, protocol_type="consumer")
    assert resource_history([other], 1, ("s", 0)) == []


def test_the_counter_counts_what_members_gain_once() -> None:
    """A cooperative hand-over: the loser's why in one generation, the gainer's
    in the next; only the gain is counted. A cause is kept as sent."""
    losing = row(2, {"a": {"s": [1]}}, why={"a": (("s", 0, "load"),)})
    gaining = row(3, {"a": {"s": [1]}, "b": {"s": [0, 2]}},
                  why={"b": (("s", 0, "load"), ("s", 2, "later-cause"))})
    assert gained_by_cause("resources", losing["assignments"]) == {}
    assert gained_by_cause("resources", gaining["assignments"]) == {"load": 1, "later-cause": 1}
    assert gained_by_cause("consumer", gaining["assignments"]) == {}
    assert gained_by_cause("resources", {"a": b"\xa3why not msgpack of a map"}) == {}

