"""KIP-615's constrained sticky algorithm: every member subscribes to the
same sets, so a balanced assignment gives each member ``floor(P/N)`` or
``ceil(P/N)`` resources and the plan is a few linear passes over counts.

Differences from the KIP's pseudo-code, all for fewer moves or speed:

* Which members get the ``ceil`` quota: the ones that already keep the most
  (ties: member id), so the number of revoked resources is exactly the
  minimum ``sum(max(0, kept - quota))`` (KIP-615 lets every member keep up to
  ``ceil`` and then steals back, which moves the same count).
* The free resources (new, orphaned, released) are dealt out like cards in
  ``(set, index)`` order over the members that are short, in member-id
  order. A set's indexes therefore go to different members (KIP-615 sorts
  ``t0p0, t1p0, ...`` for the same reason), a fresh assignment equals
  roundrobin's (as in KIP-54's examples), and dealing is done with C-level
  list slices rather than one Python step per resource.
"""

from __future__ import annotations

from ._claims import Claims
from ._layout import Layout
from ._plan import Plan

__all__ = ["constrained_plan", "deal"]


def deal(pool: list[int], need: list[int]) -> list[list[int]]:
    """Deal ``pool`` one card at a time, round after round, over the takers
    (in order) that still need cards; ``sum(need)`` must be ``len(pool)``.
    Each taker's cards come out in pool order."""
    out: list[list[int]] = [[] for _ in need]
    active = [k for k, n in enumerate(need) if n > 0]
    position = 0
    rounds_done = 0
    while active:
        # Every active taker needs at least `step` more rounds: do them at
        # once; taker j of this block gets block[j], block[j + n], ...
        step = min(need[k] for k in active) - rounds_done
        n = len(active)
        end = position + n * step
        block = pool[position:end]
        for j, k in enumerate(active):
            out[k].extend(block[j::n])
        position = end
        rounds_done += step
        active = [k for k in active if need[k] > rounds_done]
    return out


def constrained_plan(layout: Layout, claims: Claims) -> Plan:
    kept, counts = claims.kept, claims.counts
    n_members = len(kept)
    total = layout.total
    floor, extra = divmod(total, n_members)
    # The `extra` members that keep the most get the ceiling quota.
    order = sorted(range(n_members), key=lambda m: (-counts[m], m))
    quota = [floor] * n_members
    for m in order[:extra]:
        quota[m] = floor + 1

    released: list[int] = []
    offsets = layout.offsets
    for m in range(n_members):
        surplus = counts[m] - quota[m]
        if surplus <= 0:
            continue
        # Give up the highest (set, index) first; deterministic and cheap.
        held = kept[m]
        for t in sorted(held, reverse=True):
            indexes = held[t]
            give = min(surplus, len(indexes))
            o = offsets[t]
            released.extend(o + i for i in indexes[len(indexes) - give :])
            del indexes[len(indexes) - give :]
            if not indexes:
                del held[t]
            surplus -= give
            if surplus == 0:
                break
        counts[m] = quota[m]

    pool = claims.free_ids()
    if released:
        pool.extend(released)
        pool.sort()
    need = [quota[m] - counts[m] for m in range(n_members)]
    dealt = deal(pool, need)
    taken = [layout.group(cards) for cards in dealt]
    return Plan(kept, taken, set(released))
