"""Shared helpers and hypothesis strategies for the assignor tests (a plain
module, not a conftest, so test files import what they use)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import strategies as st

from client.assignors import Assignment, Subscription

Resource = tuple[str, int]
Owned = dict[str, list[int]]

EAGER_FULL = ("range", "roundrobin", "sticky")
STICKY = ("sticky", "cooperative-sticky")
COOPERATIVE = ("cooperative-sticky", "incremental-cooperative", "balanced")


def flat(assignment: Assignment) -> set[Resource]:
    return {(s, i) for s, idx in assignment.assigned.items() for i in idx}


def owners(result: Mapping[str, Assignment]) -> dict[Resource, str]:
    out: dict[Resource, str] = {}
    for m, a in result.items():
        for r in flat(a):
            assert r not in out, f"{r} assigned twice"
            out[r] = m
    return out


def subscribed_resources(
    resources: Mapping[str, int], subs: Mapping[str, Subscription]
) -> set[Resource]:
    wanted = {s for sub in subs.values() for s in sub.sets if s in resources}
    return {(s, i) for s in wanted for i in range(max(resources[s], 0))}


def counts(result: Mapping[str, Assignment]) -> dict[str, int]:
    return {m: len(flat(a)) for m, a in result.items()}


def spread(result: Mapping[str, Assignment]) -> int:
    c = list(counts(result).values()) or [0]
    return max(c) - min(c)


def kip54_balanced(
    resources: Mapping[str, int],
    subs: Mapping[str, Subscription],
    result: Mapping[str, Assignment],
) -> bool:
    """KIP-54: counts differ by at most one, or no resource of a member B can
    go to a member A (a subscriber of its set) that has 2+ fewer."""
    c = counts(result)
    if max(c.values(), default=0) - min(c.values(), default=0) <= 1:
        return True
    for b, a_b in result.items():
        for s, _ in flat(a_b):
            for a, sub in subs.items():
                if a != b and s in sub.sets and s in resources and c[a] + 2 <= c[b]:
                    return False
    return True


def honoured_owner(
    resources: Mapping[str, int], subs: Mapping[str, Subscription]
) -> dict[Resource, str]:
    """The claims the sticky assignors honour (docs/assignors.md): top
    generation only, subscribed sets, valid indexes, no two claimers."""
    top = max((s.generation for s in subs.values() if s.owned), default=-1)
    seen: Counter[Resource] = Counter()
    who: dict[Resource, str] = {}
    for m, sub in subs.items():
        if sub.generation != top:
            continue
        for s, idx in sub.owned.items():
            if s not in resources or s not in sub.sets:
                continue
            for i in set(idx):
                if 0 <= i < resources[s]:
                    seen[(s, i)] += 1
                    who[(s, i)] = m
    return {r: m for r, m in who.items() if seen[r] == 1}


def min_moves_uniform(resources: Mapping[str, int], subs: Mapping[str, Subscription]) -> int:
    """Fewest resources that must change owner (the scenarios' evaluate()
    formula): the ones nobody keeps plus what keepers hold above their quota."""
    total = len(subscribed_resources(resources, subs))
    keep = honoured_owner(resources, subs)
    n = len(subs)
    q, r = divmod(total, n)
    kept = sorted(Counter(keep.values()).values(), reverse=True)
    kept += [0] * (n - len(kept))
    over = sum(max(0, k - (q + 1 if j < r else q)) for j, k in enumerate(kept))
    return total - len(keep) + over


def moves(before: Mapping[Resource, str], result: Mapping[str, Assignment]) -> int:
    after = owners(result)
    return sum(1 for r, m in before.items() if r in after and after[r] != m) + sum(
        1 for r in after if r not in before
    )


def next_round(
    result: Mapping[str, Assignment], subs: Mapping[str, Subscription], generation: int
) -> dict[str, Subscription]:
    """Every member rejoins owning exactly what it was assigned."""
    return {
        m: Subscription(
            sets=sub.sets,
            owned={s: list(i) for s, i in result[m].assigned.items()},
            generation=generation,
            group_instance_id=sub.group_instance_id,
        )
        for m, sub in subs.items()
    }


# ---------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Case:
    resources: dict[str, int]
    subs: dict[str, Subscription]
    uniform: bool


@st.composite
def cases(
    draw: st.DrawFn,
    uniform: bool | None = None,
    with_owned: bool = True,
    noisy: bool = True,
) -> Case:
    """A catalog, subscriptions and (optionally) a previous assignment.

    The previous assignment is a random ownership of a random part of the
    resources by the members (anything, balanced or not); with ``noisy`` some
    claims are odd: unknown sets, indexes out of range, duplicates, another
    member's resource, a stale generation.
    """
    n_sets = draw(st.integers(1, 5))
    names = [f"s{k}" for k in range(n_sets)]
    resources = {s: draw(st.integers(0, 12)) for s in names}
    n_members = draw(st.integers(1, 7))
    members = [f"m{k}" for k in range(n_members)]
    is_uniform = draw(st.booleans()) if uniform is None else uniform
    if is_uniform:
        common = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        sets = {m: list(common) for m in members}
    else:
        sets = {m: draw(st.lists(st.sampled_from([*names, "ghost"]), unique=True)) for m in members}
    owned: dict[str, Owned] = {m: {} for m in members}
    generation = dict.fromkeys(members, 3)
    if with_owned and draw(st.booleans()):
        for s in names:
            for i in range(resources[s]):
                who = draw(st.sampled_from([None, *members]))
                if who is not None and (s in sets[who] or draw(st.booleans())):
                    owned[who].setdefault(s, []).append(i)
        if noisy and draw(st.booleans()):
            m = draw(st.sampled_from(members))
            kind = draw(st.sampled_from(["ghost", "range", "dup", "steal", "stale"]))
            if kind == "ghost":
                owned[m]["ghost"] = [0, 1]
            elif kind == "range":
                s = draw(st.sampled_from(names))
                owned[m].setdefault(s, []).extend([resources[s], resources[s] + 5, -1])
            elif kind == "dup":
                for s in list(owned[m]):
                    owned[m][s] = owned[m][s] + owned[m][s]
            elif kind == "steal":
                other = draw(st.sampled_from(members))
                for s, idx in owned[other].items():
                    owned[m].setdefault(s, []).extend(idx[:1])
            else:
                generation[m] = 1
    subs = {
        m: Subscription(
            sets=sets[m],
            owned=owned[m],
            generation=generation[m] if owned[m] else -1,
        )
        for m in members
    }
    return Case(resources, subs, is_uniform)
