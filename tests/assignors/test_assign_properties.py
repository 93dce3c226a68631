"""Property tests over random catalogs, subscriptions and previous
assignments, for every assignor (seeded, bounded: the suite stays fast)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

import pytest
from assignors_testkit import (
    COOPERATIVE,
    EAGER_FULL,
    STICKY,
    Case,
    cases,
    flat,
    honoured_owner,
    kip54_balanced,
    min_moves_uniform,
    moves,
    next_round,
    owners,
    spread,
    subscribed_resources,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from client.assignors import Assignment, Subscription, get_assignor, validate_assignment
from client.assignors.incremental_cooperative import IncrementalCooperativeAssignor

FAST = settings(max_examples=100, derandomize=True, deadline=None, database=None)


def settle(name: str, case: Case) -> tuple[dict[str, Assignment], dict[str, Subscription], int]:
    """Run rebalances until the assignment stops changing (at most 4);
    returns the last result, the subscriptions it was made from and how many
    rounds it took."""
    assignor = get_assignor(name)
    subs = case.subs
    result = assignor.assign(case.resources, subs)
    generation = max((s.generation for s in subs.values()), default=0) + 1
    for rounds in range(1, 5):
        validate_assignment(case.resources, subs, result, cooperative=name in COOPERATIVE)
        nxt = next_round(result, subs, generation)
        again = assignor.assign(case.resources, nxt)
        if _assigned(again) == _assigned(result):
            return result, subs, rounds
        subs, result, generation = nxt, again, generation + 1
    raise AssertionError(f"{name} did not settle in 4 rounds")


def _assigned(result: Mapping[str, Assignment]) -> dict[str, dict[str, list[int]]]:
    return {m: a.assigned for m, a in result.items()}


@pytest.mark.parametrize("name", [*EAGER_FULL, *COOPERATIVE])
@FAST
@given(case=cases())
def test_valid_complete_deterministic(name: str, case: Case) -> None:
    assignor = get_assignor(name)

    def run(resources: dict[str, int], subs: dict[str, Subscription]) -> dict[str, Assignment]:
        if isinstance(assignor, IncrementalCooperativeAssignor):
            return assignor.assign(resources, subs, now_ms=1_000)  # time is an input
        return assignor.assign(resources, subs)

    result = run(case.resources, case.subs)
    assert set(result) == set(case.subs)
    validate_assignment(case.resources, case.subs, result, cooperative=name in COOPERATIVE)
    for a in result.values():
        for indexes in a.assigned.values():
            assert indexes and indexes == sorted(indexes)
    # Equal input, equal output; member order in the mapping does not matter.
    shuffled = dict(reversed(list(case.subs.items())))
    assert run(dict(case.resources), shuffled) == result
    wanted = subscribed_resources(case.resources, case.subs)
    if name in EAGER_FULL:
        assert set(owners(result)) == wanted
    else:
        final, _, rounds = settle(name, case)
        assert set(owners(final)) == wanted
        assert rounds <= 2, "the follow-up rebalance must complete the assignment"


@pytest.mark.parametrize("name", ["roundrobin", *STICKY])
@FAST
@given(case=cases(uniform=True))
def test_uniform_is_balanced(name: str, case: Case) -> None:
    result, _, _ = (
        settle(name, case)
        if name in COOPERATIVE
        else (get_assignor(name).assign(case.resources, case.subs), None, 0)
    )
    assert spread(result) <= 1


@FAST
@given(case=cases(uniform=True))
def test_range_balanced_per_set(case: Case) -> None:
    result = get_assignor("range").assign(case.resources, case.subs)
    for s in {s for sub in case.subs.values() for s in sub.sets if s in case.resources}:
        c = [len(a.assigned.get(s, [])) for a in result.values()]
        assert max(c) - min(c) <= 1


@pytest.mark.parametrize("name", STICKY)
@FAST
@given(case=cases(uniform=False))
def test_general_meets_kip54_balance(name: str, case: Case) -> None:
    result, subs, _ = (
        settle(name, case)
        if name in COOPERATIVE
        else (get_assignor(name).assign(case.resources, case.subs), case.subs, 0)
    )
    assert kip54_balanced(case.resources, subs, result)


@pytest.mark.parametrize("name", STICKY)
@FAST
@given(case=cases(uniform=True))
def test_uniform_moves_exactly_the_minimum(name: str, case: Case) -> None:
    before = honoured_owner(case.resources, case.subs)
    result, _, _ = (
        settle(name, case)
        if name in COOPERATIVE
        else (get_assignor(name).assign(case.resources, case.subs), None, 0)
    )
    assert moves(before, result) == min_moves_uniform(case.resources, case.subs)


@pytest.mark.parametrize("name", STICKY)
@FAST
@given(case=cases(uniform=False, noisy=False))
def test_balanced_previous_assignment_stays(name: str, case: Case) -> None:
    """Stickiness for any subscriptions: once settled, a rebalance with no
    change moves nothing, and honoured claims that are already balanced are
    all kept."""
    assignor = get_assignor(name)
    result, subs, _ = settle(name, case)
    again = assignor.assign(case.resources, next_round(result, subs, 9))
    assert _assigned(again) == _assigned(result)


@st.composite
def tiny_cases(draw: st.DrawFn) -> Case:
    """Small enough to try every assignment: up to 7 resources, 4 members."""
    case = draw(cases(uniform=False))
    total = len(subscribed_resources(case.resources, case.subs))
    assume(total <= 7 and len(case.subs) <= 4)
    return case


@pytest.mark.parametrize("name", STICKY)
@settings(max_examples=80, derandomize=True, deadline=None, database=None)
@given(case=tiny_cases())
def test_general_best_balance_with_fewest_moves(name: str, case: Case) -> None:
    """Against brute force: the most even loads any assignment reaches
    (smallest sum of squares, which also gives the smallest max - min), and
    among those the fewest moves from the honoured claims."""
    wanted = sorted(subscribed_resources(case.resources, case.subs))
    eligible = [[m for m, sub in sorted(case.subs.items()) if s in sub.sets] for s, _ in wanted]
    before = honoured_owner(case.resources, case.subs)
    best: tuple[int, int] | None = None
    for choice in itertools.product(*eligible):
        load = Counter(choice)
        squares = sum(load[m] ** 2 for m in case.subs)
        moved = sum(1 for r, m in zip(wanted, choice, strict=True) if before.get(r) != m)
        if best is None or (squares, moved) < best:
            best = (squares, moved)
    result, _, _ = (
        settle(name, case)
        if name in COOPERATIVE
        else (get_assignor(name).assign(case.resources, case.subs), None, 0)
    )
    load = {m: len(flat(a)) for m, a in result.items()}
    got = (sum(c**2 for c in load.values()), moves(before, result))
    assert best is not None
    assert got[0] == best[0], "not the most even loads"
    assert got[1] == best[1], f"{got[1]} moves, {best[1]} would do"


def _claimers(subs: Mapping[str, Subscription], s: str, i: int) -> set[str]:
    return {m for m, sub in subs.items() if i in sub.owned.get(s, ())}


@FAST
@given(case=cases())
def test_cooperative_never_transfers_a_claimed_resource(case: Case) -> None:
    result = get_assignor("cooperative-sticky").assign(case.resources, case.subs)
    for m, a in result.items():
        for s, i in flat(a):
            others = _claimers(case.subs, s, i) - {m}
            assert not others or m in _claimers(case.subs, s, i), (m, s, i, others)
