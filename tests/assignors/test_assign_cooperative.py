"""cooperative-sticky: ownership claims (KIP-429, KIP-615) and convergence
over many rounds of members joining, leaving and crashing."""

from __future__ import annotations

import random

import pytest
from assignors_testkit import flat, owners, spread, subscribed_resources

from client.assignors import Assignment, Subscription, get_assignor, validate_assignment

COOP = get_assignor("cooperative-sticky")


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_highest_generation_wins(name: str) -> None:
    subs = {
        "new": Subscription(sets=["a"], owned={"a": [0, 1]}, generation=5),
        "old": Subscription(sets=["a"], owned={"a": [1, 2]}, generation=4),
    }
    result = get_assignor(name).assign({"a": 4}, subs)
    assert result["new"].assigned == {"a": [0, 1]}
    # The stale member's claims are not honoured. Cooperative: a[2] is still
    # claimed by it, so nobody else gets it; it may have it back though.
    got = flat(result["old"])
    assert ("a", 1) not in got


def test_stale_claims_are_not_kept_but_block_others() -> None:
    """A member that rejoined with an old generation keeps nothing by right;
    what it claims is not given to anyone else until it gave it up."""
    subs = {
        "a": Subscription(sets=["s"], owned={"s": [0, 1]}, generation=7),
        "b": Subscription(sets=["s"], owned={"s": [2, 3, 4, 5]}, generation=6),
        "c": Subscription(sets=["s"]),
    }
    result = COOP.assign({"s": 6}, subs)
    validate_assignment({"s": 6}, subs, result, cooperative=True)
    assert result["a"].assigned == {"s": [0, 1]}
    taken_by_others = {i for m in ("a", "c") for _, i in flat(result[m])}
    assert not taken_by_others & {2, 3, 4, 5}


def test_same_generation_conflict_drops_both_claims() -> None:
    subs = {
        "a": Subscription(sets=["s"], owned={"s": [0, 1]}, generation=3),
        "b": Subscription(sets=["s"], owned={"s": [1, 2]}, generation=3),
    }
    sticky = get_assignor("sticky").assign({"s": 4}, subs)
    assert owners(sticky)[("s", 0)] == "a" and owners(sticky)[("s", 2)] == "b"
    coop = COOP.assign({"s": 4}, subs)
    validate_assignment({"s": 4}, subs, coop, cooperative=True)
    # s[1] goes to one of its two claimers (neither is a *new* owner).
    assert owners(coop).get(("s", 1)) in (None, "a", "b")


def test_claims_beyond_size_or_unknown_set_are_dropped() -> None:
    subs = {
        "a": Subscription(sets=["s"], owned={"s": [0, 1, 9], "gone": [0]}, generation=2),
        "b": Subscription(sets=["s"], owned={"s": [2]}, generation=2),
    }
    result = COOP.assign({"s": 3}, subs)  # the set shrank from 10 to 3
    assert result["a"].assigned == {"s": [0, 1]}
    assert result["b"].assigned == {"s": [2]}


def test_leaver_resources_go_at_once() -> None:
    """Nobody claims a departed member's resources: no follow-up needed."""
    subs = {
        "a": Subscription(sets=["s"], owned={"s": [0, 1]}, generation=2),
        "b": Subscription(sets=["s"], owned={"s": [2, 3]}, generation=2),
    }  # "c" owned 4 and 5 and left
    result = COOP.assign({"s": 6}, subs)
    assert sorted(len(flat(a)) for a in result.values()) == [3, 3]


# ------------------------------------------------------------------ simulation


class Group:
    """Members that follow KIP-429: rejoin with what they were assigned
    (revoking the rest); a crashed member keeps its stale view."""

    def __init__(self, resources: dict[str, int], sets: list[str]) -> None:
        self.resources = resources
        self.sets = sets
        self.owned: dict[str, dict[str, list[int]]] = {}
        self.gen: dict[str, int] = {}
        self.generation = 0
        self.next_id = 0

    def add(self) -> str:
        m = f"m{self.next_id:03d}"
        self.next_id += 1
        self.owned[m], self.gen[m] = {}, -1
        return m

    def subscriptions(self) -> dict[str, Subscription]:
        return {
            m: Subscription(sets=self.sets, owned=self.owned[m], generation=self.gen[m])
            for m in self.owned
        }

    def rebalance(self) -> dict[str, Assignment]:
        subs = self.subscriptions()
        result = COOP.assign(self.resources, subs)
        validate_assignment(self.resources, subs, result, cooperative=True)
        self.generation += 1
        for m, a in result.items():
            self.owned[m] = {s: list(i) for s, i in a.assigned.items()}
            self.gen[m] = self.generation
        return result

    def settled(self, result: dict[str, Assignment]) -> bool:
        wanted = subscribed_resources(self.resources, self.subscriptions())
        return set(owners(result)) == wanted and spread(result) <= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_converges_within_two_rounds_after_each_change(seed: int) -> None:
    rng = random.Random(seed)
    group = Group({"x": 30, "y": 17, "z": 5}, ["x", "y", "z"])
    for _ in range(5):
        group.add()
    group.rebalance()
    crashed: dict[str, tuple[dict[str, list[int]], int]] = {}
    for _ in range(50):
        event = rng.choice(["join", "leave", "crash", "return", "grow"])
        if event == "join" or len(group.owned) <= 1:
            group.add()
        elif event == "leave":
            m = rng.choice(sorted(group.owned))
            del group.owned[m], group.gen[m]
        elif event == "crash":
            m = rng.choice(sorted(group.owned))
            crashed[m] = (group.owned.pop(m), group.gen.pop(m))
        elif event == "return" and crashed:
            # Rejoins with the stale view it had when it crashed.
            m = rng.choice(sorted(crashed))
            group.owned[m], group.gen[m] = crashed.pop(m)
        else:
            group.resources = {**group.resources, "z": group.resources["z"] + 3}
        first = group.rebalance()
        if group.settled(first):
            continue
        second = group.rebalance()
        assert group.settled(second), f"not settled two rounds after {event}"
        assert group.rebalance() == second, "a settled group moved again"
