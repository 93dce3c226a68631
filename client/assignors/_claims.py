"""Who owns what before the rebalance: the ownership claims of the members.

The sticky assignors read the claims from ``Subscription.owned`` (KIP-429's
``ownedPartitions``; a member keeps sending what it holds even when the group
runs the eager protocol, where it is only a hint for stickiness). Rules, after
KIP-429 and the constrained path of KIP-615 (see docs/assignors.md):

* A claim on an unknown set or on an index beyond the set's size is dropped.
* Let ``top`` be the highest generation among members that claim anything.
  A member whose generation is older has rejoined with a stale view (it was
  out of the group for a generation or more): its claims are not *honoured*,
  so the highest generation always wins a conflict.
* Two members claiming the same resource at generation ``top`` is a
  conflict nobody can settle: both claims are dropped.
* A claim on a set the member no longer subscribes to is not honoured either.

A claim that is not honoured still counts for safety: a cooperative assignor
must not hand that resource to anybody else in this round (the claimer gives
it up first, KIP-429), so those claims are kept in ``contested``.
"""

from __future__ import annotations

from ._layout import Layout, Members

__all__ = ["Claims", "read_claims"]


class Claims:
    """The honoured claims, as data the planners can work on quickly.

    ``owner[g]``: position of the member that keeps resource ``g``, or -1.
    ``kept[m]``: ``{set position: sorted indexes}`` member ``m`` keeps.
    ``counts[m]``: how many resources ``kept[m]`` holds.
    ``contested[g]``: members whose claim on ``g`` was not honoured.
    """

    __slots__ = ("contested", "counts", "kept", "owned_total", "owner")

    def __init__(
        self,
        owner: list[int],
        kept: list[dict[int, list[int]]],
        counts: list[int],
        contested: dict[int, list[int]],
    ) -> None:
        self.owner = owner
        self.kept = kept
        self.counts = counts
        self.contested = contested
        # Resources with an owner; fixed here, as planners change `counts`.
        self.owned_total = sum(counts)

    def free_ids(self) -> list[int]:
        """Ascending global ids of the resources nobody keeps."""
        owner = self.owner
        total = len(owner)
        n_free = total - self.owned_total
        if n_free == total:
            return list(range(total))
        if n_free == 0:
            return []
        if n_free * 32 < total:
            # Few holes (someone left): let list.index scan in C.
            out: list[int] = []
            g = -1
            for _ in range(n_free):
                g = owner.index(-1, g + 1)
                out.append(g)
            return out
        return [g for g, o in enumerate(owner) if o < 0]

    def claimers(self, g: int) -> list[int]:
        out = list(self.contested.get(g, ()))
        if self.owner[g] >= 0:
            out.append(self.owner[g])
        return out


def read_claims(layout: Layout, members: Members) -> Claims:
    subs = members.subs
    n_members = len(subs)
    n_sets = len(layout.names)
    owner = [-1] * layout.total
    contested: dict[int, list[int]] = {}
    kept: list[dict[int, list[int]]] = [{} for _ in range(n_members)]
    counts = [0] * n_members
    top = max((sub.generation for sub in subs if sub.owned), default=-1)
    position, offsets, sizes = layout.position, layout.offsets, layout.sizes
    subscribed_as_set: dict[int, frozenset[int]] = {}
    # Members whose kept lists may hold a resource they must not keep.
    recheck: set[int] = set()

    # Pass 1: mark every honoured claim in `owner`, tentatively keep it, and
    # spot conflicts. Written for speed: the 1,000,000-resource benchmark
    # comes here with a million one-element lists.
    for m, sub in enumerate(subs):
        if not sub.owned:
            continue
        mine_key = members.subscribed[m]
        if len(mine_key) == n_sets:
            mine = None  # subscribes to every set in play
        else:
            mine = subscribed_as_set.get(id(mine_key))
            if mine is None:
                mine = subscribed_as_set[id(mine_key)] = frozenset(mine_key)
        current = sub.generation == top
        held = kept[m]
        count = 0
        for name, indexes in sub.owned.items():
            t = position.get(name)
            if t is None or not indexes:
                continue
            n = sizes[t]
            o = offsets[t]
            if len(indexes) == 1:
                i = indexes[0]
                if not 0 <= i < n:
                    continue
                if not current or (mine is not None and t not in mine):
                    contested.setdefault(o + i, []).append(m)
                    continue
                g = o + i
                c = owner[g]
                if c == -1:
                    owner[g] = m
                    held[t] = [i]
                    count += 1
                    continue
                keep = [i]
            else:
                if min(indexes) < 0 or max(indexes) >= n:
                    indexes = [i for i in indexes if 0 <= i < n]
                    if not indexes:
                        continue
                if not current or (mine is not None and t not in mine):
                    for i in indexes:
                        contested.setdefault(o + i, []).append(m)
                    continue
                keep = sorted(indexes)
            held[t] = keep
            count += len(keep)
            for i in keep:
                g = o + i
                c = owner[g]
                if c == -1:
                    owner[g] = m
                    continue
                recheck.add(m)  # a repeat or a conflict
                if c == m:
                    continue
                if c >= 0:
                    contested.setdefault(g, []).append(c)
                    recheck.add(c)
                    owner[g] = -2
                contested.setdefault(g, []).append(m)
        counts[m] = count

    # Pass 2: only members touched by a conflict or a repeat keep less.
    for m in recheck:
        held = kept[m]
        count = 0
        for t in list(held):
            o = offsets[t]
            keep = sorted({i for i in held[t] if owner[o + i] == m})
            if keep:
                held[t] = keep
                count += len(keep)
            else:
                del held[t]
        counts[m] = count
    for g in contested:
        if owner[g] == -2:
            owner[g] = -1
    return Claims(owner, kept, counts, contested)
