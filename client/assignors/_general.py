"""KIP-54's sticky algorithm for any mix of subscriptions.

Balance first, then stickiness:

1. Every member keeps its honoured claims (``_claims``).
2. Free resources are handed out set by set, sets with the fewest
   subscribers first (KIP-54's ``sortedAllPartitions``), each resource to the
   subscriber that holds the fewest so far (ties: member id).
3. Balance with augmenting paths: while some member ``u`` holds 2+ more than
   a member ``v`` that can be reached through a chain ``u -> w1 -> ... -> v``
   (each one can take a resource of a set it subscribes to from the one
   before), shift one resource along the chain. The search starts from all
   the most-loaded members at once (breadth first, so chains are short); when
   nothing is reachable from them, everything they reach is final (no chain
   can ever leave that part again) and drops out of the search. Along a chain
   a resource handed out in step 2 is moved in preference to a kept one,
   since moving it costs no stickiness.

When it stops, no resource can move to a subscriber with 2+ fewer: that is
KIP-54's definition of balanced, and because no improving *chain* is left
either, the loads are as even as the subscriptions allow.
"""

from __future__ import annotations

import heapq

from ._claims import Claims
from ._layout import Layout, Members
from ._plan import Plan

__all__ = ["general_plan"]


def general_plan(layout: Layout, members: Members, claims: Claims) -> Plan:
    n_members = len(members.ids)
    n_sets = len(layout.names)
    kept, owner, offsets = claims.kept, claims.owner, layout.offsets
    load = list(claims.counts)
    subscribers: list[list[int]] = [[] for _ in range(n_sets)]
    for m, sets in enumerate(members.subscribed):
        for t in sets:
            subscribers[t].append(m)
    taken: list[dict[int, list[int]]] = [{} for _ in range(n_members)]

    # Step 2: free resources, scarcest sets first, each to the least loaded.
    free = layout.group(claims.free_ids())
    for t in sorted(free, key=lambda t: (len(subscribers[t]), t)):
        heap = [(load[m], m) for m in subscribers[t]]
        heapq.heapify(heap)
        for i in free[t]:
            n, m = heap[0]
            taken[m].setdefault(t, []).append(i)
            heapq.heapreplace(heap, (n + 1, m))
        for n, m in heap:
            load[m] = n

    # Step 3: augmenting chains from the most loaded members.
    moved: set[int] = set()
    subscriber_sets = [frozenset(s) for s in subscribers]
    active = {m for m in range(n_members) if members.subscribed[m]}
    while active:
        top = max(load[m] for m in active)
        if top - min(load[m] for m in active) <= 1:
            break
        level = sorted(m for m in active if load[m] == top)
        while True:
            sources = [m for m in level if load[m] == top]
            if not sources:
                break
            parent: dict[int, tuple[int, int]] = {}
            unvisited = active.difference(sources)
            frontier = sources
            target = -1
            while frontier and target < 0:
                following: list[int] = []
                for w in frontier:
                    # Sets where w holds something; fresh ones first (free to move).
                    for t in [*sorted(taken[w]), *sorted(kept[w])]:
                        if not (taken[w].get(t) or kept[w].get(t)):
                            continue
                        reach = subscriber_sets[t].intersection(unvisited)
                        if not reach:
                            continue
                        unvisited.difference_update(reach)
                        for a in sorted(reach):
                            parent[a] = (w, t)
                            following.append(a)
                            if target < 0 and load[a] <= top - 2:
                                target = a
                        if target >= 0:
                            break
                    if target >= 0:
                        break
                frontier = following
            if target < 0:
                # Nothing below top - 1 is reachable: that whole part is final.
                active.intersection_update(unvisited)
                break
            # Shift as many units along the chain as keep improving the balance
            # and as each link can carry (a link that moves fresh resources only
            # carries those: a kept one might have a cheaper chain next time).
            chain: list[tuple[int, int, int]] = []
            a = target
            while a in parent:
                w, t = parent[a]
                chain.append((a, w, t))
                a = w
            units = (load[a] - load[target]) // 2
            for _, w, t in chain:
                fresh = taken[w].get(t)
                units = min(units, len(fresh) if fresh else len(kept[w][t]))
            load[target] += units
            load[a] -= units
            for _ in range(units):
                for a, w, t in chain:
                    fresh = taken[w].get(t)
                    if fresh:
                        i = fresh.pop()
                        if not fresh:
                            del taken[w][t]
                    else:
                        own = kept[w][t]
                        i = own.pop()
                        if not own:
                            del kept[w][t]
                        moved.add(offsets[t] + i)
                    g = offsets[t] + i
                    if owner[g] == a:  # back to the member that keeps it
                        moved.discard(g)
                        kept[a].setdefault(t, []).append(i)
                    else:
                        taken[a].setdefault(t, []).append(i)
    for held in (*kept, *taken):
        for indexes in held.values():
            indexes.sort()
    return Plan(kept, taken, moved)
