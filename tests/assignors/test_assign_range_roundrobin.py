"""range and roundrobin: Kafka's orderings, exactly."""

from __future__ import annotations

from assignors_testkit import flat

from client.assignors import Subscription, get_assignor


def test_range_cuts_each_set_first_ones_get_more() -> None:
    subs = {m: Subscription(sets=["a", "b"]) for m in ("c0", "c1", "c2")}
    result = get_assignor("range").assign({"a": 7, "b": 3}, subs)
    assert {m: r.assigned for m, r in result.items()} == {
        "c0": {"a": [0, 1, 2], "b": [0]},
        "c1": {"a": [3, 4], "b": [1]},
        "c2": {"a": [5, 6], "b": [2]},
    }


def test_range_keeps_copartitioning() -> None:
    subs = {f"m{k}": Subscription(sets=["left", "right"]) for k in range(4)}
    result = get_assignor("range").assign({"left": 10, "right": 10}, subs)
    for a in result.values():
        assert a.assigned["left"] == a.assigned["right"]


def test_range_orders_static_members_by_instance_id() -> None:
    """A restarted static member gets a new member id but keeps its place."""

    def group(ids: dict[str, str]) -> dict[str, list[int]]:
        subs = {m: Subscription(sets=["a"], group_instance_id=i) for m, i in ids.items()}
        result = get_assignor("range").assign({"a": 6}, subs)
        return {ids[m]: r.assigned.get("a", []) for m, r in result.items()}

    before = group({"zz-1": "east", "aa-2": "west", "mm-3": "north"})
    after = group({"zz-1": "east", "bb-9": "west", "mm-3": "north"})  # west restarted
    assert before == after == {"east": [0, 1], "north": [2, 3], "west": [4, 5]}


def test_range_static_before_dynamic() -> None:
    subs = {
        "a-dynamic": Subscription(sets=["s"]),
        "z-static": Subscription(sets=["s"], group_instance_id="i"),
    }
    result = get_assignor("range").assign({"s": 3}, subs)
    assert result["z-static"].assigned == {"s": [0, 1]}
    assert result["a-dynamic"].assigned == {"s": [2]}


def test_range_only_subscribers() -> None:
    subs = {"m1": Subscription(sets=["a"]), "m2": Subscription(sets=["b"])}
    result = get_assignor("range").assign({"a": 2, "b": 2}, subs)
    assert result["m1"].assigned == {"a": [0, 1]}
    assert result["m2"].assigned == {"b": [0, 1]}


def test_roundrobin_deals_over_the_circle() -> None:
    subs = {m: Subscription(sets=["a", "b"]) for m in ("c0", "c1", "c2")}
    result = get_assignor("roundrobin").assign({"a": 4, "b": 3}, subs)
    # a0 c0, a1 c1, a2 c2, a3 c0, b0 c1, b1 c2, b2 c0
    assert {m: r.assigned for m, r in result.items()} == {
        "c0": {"a": [0, 3], "b": [2]},
        "c1": {"a": [1], "b": [0]},
        "c2": {"a": [2], "b": [1]},
    }


def test_roundrobin_skips_non_subscribers() -> None:
    """Kafka's CircularIterator: advance until a subscriber of the set."""
    subs = {
        "c0": Subscription(sets=["t0"]),
        "c1": Subscription(sets=["t0", "t1"]),
        "c2": Subscription(sets=["t0", "t1", "t2"]),
    }
    result = get_assignor("roundrobin").assign({"t0": 1, "t1": 2, "t2": 3}, subs)
    # t0p0 c0, t1p0 c1, t1p1 c2, t2p0 c2, t2p1 c2, t2p2 c2 (KIP-54 example 2)
    assert {m: sorted(flat(r)) for m, r in result.items()} == {
        "c0": [("t0", 0)],
        "c1": [("t1", 0)],
        "c2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)],
    }
