"""``range``: Kafka's RangeAssignor, eager.

Per set, its indexes in order are cut into contiguous ranges over the set's
subscribers; the first ``n % m`` subscribers get one more. Subscribers are
ordered as Kafka's ``MemberInfo`` orders them: static members (KIP-345) first,
by ``group_instance_id``, so a restart (new member id) keeps the order; then
dynamic members by member id. Sets with the same subscribers and size are
cut the same way, which keeps them co-partitioned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._gc import paused_gc
from ._layout import clean_catalog, read_members
from .model import Assignment, RebalanceProtocol, Resources, Subscription

__all__ = ["RangeAssignor", "member_order"]


def member_order(member_id: str, sub: Subscription) -> tuple[int, str, str]:
    """Kafka's ``MemberInfo.compareTo``: static members first, by instance id."""
    if sub.group_instance_id is not None:
        return (0, sub.group_instance_id, member_id)
    return (1, member_id, "")


@dataclass(frozen=True)
class RangeAssignor:
    name: str = "range"
    protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.EAGER,)

    def assign(
        self, resources: Resources, subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        catalog = clean_catalog(resources)
        with paused_gc(sum(catalog.values())):
            return self._assign(catalog, subscriptions)

    def _assign(
        self, catalog: dict[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        members = read_members(catalog, subscriptions)
        keys = [member_order(m, sub) for m, sub in zip(members.ids, members.subs, strict=True)]
        everyone = sorted(range(len(members.ids)), key=keys.__getitem__)
        subscribers: list[list[int]] = [[] for _ in members.names]
        if not members.uniform:
            for m, sets in enumerate(members.subscribed):
                for t in sets:
                    subscribers[t].append(m)
        assigned: list[dict[str, list[int]]] = [{} for _ in members.ids]
        # Sets with the same subscribers share one ordering (the usual case).
        order_cache: dict[tuple[int, ...], list[int]] = {}
        for t, name in enumerate(members.names):
            if members.uniform:
                ordered = everyone
            else:
                key = tuple(subscribers[t])
                found = order_cache.get(key)
                if found is None:
                    found = order_cache[key] = sorted(key, key=keys.__getitem__)
                ordered = found
            n = catalog[name]
            share, extra = divmod(n, len(ordered))
            if share == 0:  # fewer resources than subscribers: one each
                for i in range(n):
                    assigned[ordered[i]][name] = [i]
                continue
            indexes = list(range(n))
            start = 0
            for k, m in enumerate(ordered):
                size = share + 1 if k < extra else share
                assigned[m][name] = indexes[start : start + size]
                start += size
        return {member_id: Assignment(assigned[m]) for m, member_id in enumerate(members.ids)}
