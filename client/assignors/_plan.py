"""The output of a sticky planner and the two ways to finish it: eager
(hand out the whole plan) and cooperative (KIP-429: hold back every resource
that another member still claims)."""

from __future__ import annotations

from dataclasses import dataclass

from ._claims import Claims
from ._layout import Layout

__all__ = ["Plan", "cooperative_cut", "merge"]


@dataclass
class Plan:
    """``kept[m]``: what member ``m`` keeps of its own claims;
    ``taken[m]``: what it gets that it did not claim (``{set position:
    indexes}``); ``moved``: global ids taken from a member that kept them."""

    kept: list[dict[int, list[int]]]
    taken: list[dict[int, list[int]]]
    moved: set[int]


def merge(plan: Plan) -> list[dict[int, list[int]]]:
    """The whole plan per member, index lists sorted."""
    out: list[dict[int, list[int]]] = []
    for held, got in zip(plan.kept, plan.taken, strict=True):
        if not got or not held:
            out.append(got or held)
            continue
        both = dict(held)
        for t, indexes in got.items():
            both[t] = sorted(both[t] + indexes) if t in both else indexes
        out.append(both)
    return out


def cooperative_cut(plan: Plan, claims: Claims, layout: Layout) -> Plan:
    """Drop from ``taken`` every resource that a member other than the taker
    still claims (honoured or not): its owner revokes it this round and the
    follow-up rebalance hands it over (KIP-429)."""
    moved, contested = plan.moved, claims.contested
    if not moved and not contested:
        return plan
    offsets = layout.offsets
    taken: list[dict[int, list[int]]] = []
    for m, got in enumerate(plan.taken):
        kept_now: dict[int, list[int]] = {}
        for t, indexes in got.items():
            o = offsets[t]
            ok = [
                i
                for i in indexes
                if (o + i) not in moved
                and ((o + i) not in contested or _only_claimer(claims, o + i, m))
            ]
            if ok:
                kept_now[t] = ok
        taken.append(kept_now)
    return Plan(plan.kept, taken, moved)


def _only_claimer(claims: Claims, g: int, m: int) -> bool:
    """True if ``m`` claims ``g`` itself, so it is no *new* owner; or
    nobody else does."""
    who = claims.claimers(g)
    return m in who or not who
