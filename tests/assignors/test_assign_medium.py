"""Medium-sized inputs: the fast paths that tiny property examples never
reach (C-level grouping of >= 64 resources, scanning for a few free ones,
the garbage-collector pause) give the same guarantees."""

from __future__ import annotations

import gc
import random

import pytest
from assignors_testkit import (
    honoured_owner,
    kip54_balanced,
    min_moves_uniform,
    moves,
    next_round,
    owners,
    spread,
    subscribed_resources,
)

from client.assignors import Subscription, get_assignor, validate_assignment
from client.assignors._gc import LARGE


def uniform_group(n_members: int, sets: dict[str, int]) -> dict[str, Subscription]:
    return {f"m{k:03d}": Subscription(sets=sorted(sets)) for k in range(n_members)}


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
@pytest.mark.parametrize("change", ["leave", "join", "grow", "three_leave_two_join"])
def test_uniform_medium(name: str, change: str) -> None:
    rng = random.Random(change)
    resources = {f"s{k:02d}": 300 + 37 * k for k in range(12)}
    assignor = get_assignor(name)
    subs = uniform_group(40, resources)
    first = assignor.assign(resources, subs)
    subs = next_round(first, subs, 1)
    if change == "leave":
        del subs[rng.choice(sorted(subs))]
    elif change == "join":
        subs["new"] = Subscription(sets=sorted(resources))
    elif change == "grow":
        resources = {**resources, "s03": resources["s03"] + 500, "extra": 90}
        subs = {
            m: Subscription(sets=sorted(resources), owned=s.owned, generation=1)
            for m, s in subs.items()
        }
    else:
        for m in rng.sample(sorted(subs), 3):
            del subs[m]
        subs["new1"] = Subscription(sets=sorted(resources))
        subs["new2"] = Subscription(sets=sorted(resources))
    before = honoured_owner(resources, subs)
    minimum = min_moves_uniform(resources, subs)
    result = assignor.assign(resources, subs)
    validate_assignment(resources, subs, result, cooperative=name == "cooperative-sticky")
    if name == "cooperative-sticky":
        subs = next_round(result, subs, 2)
        result = assignor.assign(resources, subs)
        validate_assignment(resources, subs, result, cooperative=True)
    assert set(owners(result)) == subscribed_resources(resources, subs)
    assert spread(result) <= 1
    assert moves(before, result) == minimum


def test_uniform_medium_minimum_moves_exact() -> None:
    resources = {f"s{k:02d}": 250 for k in range(8)}
    subs = uniform_group(30, resources)
    sticky = get_assignor("sticky")
    subs = next_round(sticky.assign(resources, subs), subs, 1)
    del subs["m007"], subs["m021"]
    subs["x"] = Subscription(sets=sorted(resources))
    before = honoured_owner(resources, subs)
    result = sticky.assign(resources, subs)
    assert moves(before, result) == min_moves_uniform(resources, subs)


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_general_medium(name: str) -> None:
    rng = random.Random(5)
    resources = {f"s{k:02d}": rng.randrange(20, 120) for k in range(30)}
    names = sorted(resources)
    subs = {
        f"m{k:02d}": Subscription(sets=rng.sample(names, rng.randrange(1, 12))) for k in range(60)
    }
    assignor = get_assignor(name)
    for generation in range(1, 4):
        result = assignor.assign(resources, subs)
        validate_assignment(resources, subs, result, cooperative=name == "cooperative-sticky")
        subs = next_round(result, subs, generation)
        for m in rng.sample(sorted(subs), 2):
            del subs[m]
    result = assignor.assign(resources, subs)
    if name == "cooperative-sticky":
        result = assignor.assign(resources, next_round(result, subs, 9))
    assert set(owners(result)) == subscribed_resources(resources, subs)
    assert kip54_balanced(resources, subs, result)


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_state_is_restored(enabled: bool) -> None:
    resources = {"big": LARGE + 10}
    subs = uniform_group(3, resources)
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        for name in ("range", "roundrobin", "sticky"):
            get_assignor(name).assign(resources, subs)
            assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("seed", range(12))
def test_random_medium_with_noise(seed: int) -> None:
    """Random medium groups whose claims come from a real earlier round, then
    churn and noise: a stale member, a conflict, claims beyond the size."""
    rng = random.Random(seed)
    resources = {f"s{k:02d}": rng.randrange(40, 260) for k in range(rng.randrange(3, 10))}
    names = sorted(resources)
    uniform = seed % 2 == 0
    subs = {
        f"m{k:02d}": Subscription(
            sets=names if uniform else rng.sample(names, rng.randrange(1, len(names) + 1))
        )
        for k in range(rng.randrange(5, 30))
    }
    for name in ("sticky", "cooperative-sticky"):
        assignor = get_assignor(name)
        coop = name == "cooperative-sticky"
        s = next_round(assignor.assign(resources, subs), subs, 4)
        for m in rng.sample(sorted(s), 2):
            del s[m]
        s["joiner"] = Subscription(sets=names)
        victim, thief = rng.sample(sorted(x for x in s if s[x].owned), 2)
        stolen = {t: list(i[:3]) for t, i in s[victim].owned.items()}
        s[thief] = Subscription(
            sets=s[thief].sets,
            owned={
                t: [*s[thief].owned.get(t, []), *stolen.get(t, []), 10_000]
                for t in {*s[thief].owned, *stolen}
            },
            generation=4,
        )
        stale = rng.choice(sorted(x for x in s if x not in (victim, thief)))
        s[stale] = Subscription(sets=s[stale].sets, owned=s[stale].owned, generation=2)
        before = honoured_owner(resources, s)
        minimum = min_moves_uniform(resources, s) if uniform else None
        result = assignor.assign(resources, s)
        validate_assignment(resources, s, result, cooperative=coop)
        if coop:
            s = next_round(result, s, 5)
            result = assignor.assign(resources, s)
            validate_assignment(resources, s, result, cooperative=True)
        assert set(owners(result)) == subscribed_resources(resources, s)
        if uniform:
            assert spread(result) <= 1
            assert moves(before, result) == minimum
        else:
            assert kip54_balanced(resources, s, result)
