"""KIP-54's three worked examples (from the KIP-54 page, "Sticky Partition Assignment
Strategy"), for sticky and, over its two
rounds, cooperative-sticky."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from assignors_testkit import flat, next_round, owners

from client.assignors import Assignment, Subscription, get_assignor, validate_assignment

ALL4 = ["t0", "t1", "t2", "t3"]


def table(result: Mapping[str, Assignment]) -> dict[str, set[str]]:
    return {m: {f"{s}p{i}" for s, i in flat(a)} for m, a in result.items()}


def parse(cells: Mapping[str, str]) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for m, text in cells.items():
        owned: dict[str, list[int]] = {}
        for tp in text.split():
            t, p = tp.split("p")
            owned.setdefault(t, []).append(int(p))
        out[m] = owned
    return out


def run(
    name: str, resources: dict[str, int], subs: dict[str, Subscription]
) -> dict[str, Assignment]:
    """One rebalance; for a cooperative assignor also its follow-up."""
    assignor = get_assignor(name)
    coop = name == "cooperative-sticky"
    result = assignor.assign(resources, subs)
    validate_assignment(resources, subs, result, cooperative=coop)
    if coop:
        subs2 = next_round(result, subs, generation=max(s.generation for s in subs.values()) + 1)
        result = assignor.assign(resources, subs2)
        validate_assignment(resources, subs2, result, cooperative=True)
    return result


def kept(before: Mapping[str, dict[str, list[int]]], result: Mapping[str, Assignment]) -> int:
    after = owners(result)
    return sum(
        1 for m, o in before.items() for s, idx in o.items() for i in idx if after.get((s, i)) == m
    )


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_example_1(name: str) -> None:
    resources = dict.fromkeys(ALL4, 2)
    fresh = run(name, resources, {m: Subscription(sets=ALL4) for m in ("C0", "C1", "C2")})
    assert table(fresh) == {
        "C0": {"t0p0", "t1p1", "t3p0"},
        "C1": {"t0p1", "t2p0", "t3p1"},
        "C2": {"t1p0", "t2p1"},
    }
    before = parse({"C0": "t0p0 t1p1 t3p0", "C2": "t1p0 t2p1"})
    subs = {m: Subscription(sets=ALL4, owned=before[m], generation=1) for m in before}
    after = run(name, resources, subs)
    assert sorted(len(flat(a)) for a in after.values()) == [4, 4]
    assert kept(before, after) == 5  # "preserving 5 of the previous assignments"


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_example_2(name: str) -> None:
    resources = {"t0": 1, "t1": 2, "t2": 3}
    sets = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    fresh = run(name, resources, {m: Subscription(sets=s) for m, s in sets.items()})
    assert table(fresh) == {
        "C0": {"t0p0"},
        "C1": {"t1p0", "t1p1"},
        "C2": {"t2p0", "t2p1", "t2p2"},
    }
    before = parse({"C1": "t1p0 t1p1", "C2": "t2p0 t2p1 t2p2"})
    subs = {m: Subscription(sets=sets[m], owned=before[m], generation=1) for m in before}
    after = run(name, resources, subs)
    assert table(after) == {"C1": {"t1p0", "t1p1", "t0p0"}, "C2": {"t2p0", "t2p1", "t2p2"}}
    assert kept(before, after) == 5


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_example_3(name: str) -> None:
    resources = {"t0": 2, "t1": 2}
    both = ["t0", "t1"]
    fresh = run(name, resources, {m: Subscription(sets=both) for m in ("C0", "C1")})
    assert table(fresh) == {"C0": {"t0p0", "t1p0"}, "C1": {"t0p1", "t1p1"}}
    before = parse({"C0": "t0p0 t1p0", "C1": "t0p1 t1p1"})
    subs = {m: Subscription(sets=both, owned=before[m], generation=1) for m in before}
    subs["C2"] = Subscription(sets=both)
    after = run(name, resources, subs)
    assert sorted(len(flat(a)) for a in after.values()) == [1, 1, 2]
    assert kept(before, after) == 3  # "preserving 3 partition assignments"
    assert table(after) == {"C0": {"t0p0", "t1p0"}, "C1": {"t0p1"}, "C2": {"t1p1"}}


def test_example_3_cooperative_first_round_only_revokes() -> None:
    """KIP-429: in the first round the moving resource goes nowhere."""
    both = ["t0", "t1"]
    subs = {
        "C0": Subscription(sets=both, owned={"t0": [0], "t1": [0]}, generation=1),
        "C1": Subscription(sets=both, owned={"t0": [1], "t1": [1]}, generation=1),
        "C2": Subscription(sets=both),
    }
    first = get_assignor("cooperative-sticky").assign({"t0": 2, "t1": 2}, subs)
    assert table(first) == {"C0": {"t0p0", "t1p0"}, "C1": {"t0p1"}, "C2": set()}
