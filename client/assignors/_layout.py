"""Input normalisation shared by every assignor.

An assignor must not crash on odd input (docs/protocol.md, "The embedded
"resources" protocol"): a subscription that names a set the catalog
does not have is ignored for that set, a set with no partitions has nothing to
hand out, owned indexes beyond the set's current size are dropped.

For speed the sticky assignors number every resource of the sets in play with
one integer, its *global id*: ``offsets[t] + index`` where ``t`` is the set's
position in the sorted list of set names. Sorting global ids therefore sorts
resources by ``(set name, index)``, and a member's resources are plain
``list[int]``s instead of per-resource tuples (the 1,000,000-resource
benchmark allocates no tuple per resource).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from .model import Assignment, Resources, ResourceSet, Subscription

__all__ = [
    "Layout",
    "Members",
    "build_result",
    "clean_catalog",
    "read_members",
]


def clean_catalog(resources: Resources) -> dict[str, int]:
    """The sets that have something to assign, with their partition counts
    (a ``ResourceSet`` counts its ``partitions``): a count that is not a
    positive ``int`` (``bool`` excluded) means no resources."""
    out: dict[str, int] = {}
    for name, n in resources.items():
        if isinstance(n, ResourceSet):
            n = n.partitions
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out[name] = n
    return out


@dataclass(frozen=True)
class Members:
    """The group, members sorted by id, with each member's subscribed sets
    reduced to known, non-empty ones (as set positions in ``names``)."""

    ids: list[str]
    subs: list[Subscription]
    names: list[str]  # sorted names of the sets someone subscribes to
    subscribed: list[tuple[int, ...]]  # per member, sorted set positions
    uniform: bool  # every member subscribes to the same sets


def read_members(catalog: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> Members:
    ids = sorted(subscriptions)
    subs = [subscriptions[m] for m in ids]
    # Many members send the same list of sets: work on each distinct list once.
    by_list: dict[tuple[str, ...], frozenset[str]] = {}
    chosen: list[frozenset[str]] = []
    for sub in subs:
        key = tuple(sub.sets)
        known = by_list.get(key)
        if known is None:
            known = frozenset(key).intersection(catalog)
            by_list[key] = known
        chosen.append(known)
    union: set[str] = set()
    for known in set(chosen):
        union.update(known)
    names = sorted(union)
    position = {name: t for t, name in enumerate(names)}
    as_positions: dict[frozenset[str], tuple[int, ...]] = {}
    subscribed: list[tuple[int, ...]] = []
    for known in chosen:
        pos = as_positions.get(known)
        if pos is None:
            pos = tuple(sorted(position[name] for name in known))
            as_positions[known] = pos
        subscribed.append(pos)
    return Members(ids, subs, names, subscribed, len(as_positions) <= 1)


class Layout:
    """Global ids for the resources of ``names`` (sorted set names)."""

    __slots__ = ("_index_of", "_set_of", "names", "offsets", "position", "sizes", "total")

    def __init__(self, names: Sequence[str], catalog: Mapping[str, int]) -> None:
        self.names = list(names)
        self.sizes = [catalog[name] for name in self.names]
        self.position = {name: t for t, name in enumerate(self.names)}
        self.offsets: list[int] = []
        total = 0
        for n in self.sizes:
            self.offsets.append(total)
            total += n
        self.total = total
        self._set_of: list[int] | None = None
        self._index_of: list[int] | None = None

    def set_of(self, g: int) -> int:
        return bisect_right(self.offsets, g) - 1

    def _arrays(self) -> tuple[list[int], list[int]]:
        """``set_of[g]`` and ``index_of[g]`` for every global id; built on
        first use (two lists of ``total`` entries), only for large groups."""
        if self._set_of is None:
            set_of: list[int] = []
            index_of: list[int] = []
            for t, n in enumerate(self.sizes):
                set_of += [t] * n
                index_of += range(n)
            self._set_of, self._index_of = set_of, index_of
        assert self._index_of is not None
        return self._set_of, self._index_of

    def group(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """``{set position: ascending indexes}`` of ascending global ids."""
        into: dict[int, list[int]] = {}
        if not ids:
            return into
        if len(ids) < 64:
            offsets, sizes = self.offsets, self.sizes
            end = -1
            base = 0
            current: list[int] = []
            for g in ids:
                if g >= end or g < base:
                    t = bisect_right(offsets, g) - 1
                    base = offsets[t]
                    end = base + sizes[t]
                    current = into.setdefault(t, [])
                current.append(g - base)
            return into
        set_of, index_of = self._arrays()
        pick = itemgetter(*ids)
        sets: tuple[int, ...] = pick(set_of)
        indexes: tuple[int, ...] = pick(index_of)
        if sets[0] == sets[-1]:  # one set (ids are ascending)
            into[sets[0]] = list(indexes)
        elif len(set(sets)) == len(sets):  # one index per set: all in C
            into.update(zip(sets, map(list, zip(indexes)), strict=True))
        else:
            for t, i in zip(sets, indexes, strict=True):
                found = into.get(t)
                if found is None:
                    into[t] = [i]
                else:
                    found.append(i)
        return into


def build_result(
    ids: Sequence[str],
    names: Sequence[str],
    per_member: Sequence[Mapping[int, list[int]]],
) -> dict[str, Assignment]:
    """``Assignment``s from per-member ``{set position: sorted indexes}``:
    empty sets left out, sets in name order."""
    result: dict[str, Assignment] = {}
    for member, held in zip(ids, per_member, strict=True):
        assigned = {names[t]: held[t] for t in sorted(held) if held[t]}
        result[member] = Assignment(assigned)
    return result
