"""``roundrobin``: Kafka's RoundRobinAssignor, eager.

All resources in ``(set, index)`` order are dealt over all members in a
circle (ordered like range's: static members by instance id first), skipping
members that do not subscribe to the resource's set. Within one set the
circle only stops at that set's subscribers, so a set costs one bisect plus
one slice per subscriber instead of a step per resource.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

from ._gc import paused_gc
from ._layout import clean_catalog, read_members
from .model import Assignment, RebalanceProtocol, Resources, Subscription
from .range_assignor import member_order

__all__ = ["RoundRobinAssignor"]


@dataclass(frozen=True)
class RoundRobinAssignor:
    name: str = "roundrobin"
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
        n_members = len(members.ids)
        circle = sorted(
            range(n_members), key=lambda m: member_order(members.ids[m], members.subs[m])
        )
        seat = [0] * n_members  # member -> its place in the circle
        for place, m in enumerate(circle):
            seat[m] = place
        seats_of_set: list[list[int]] = [[] for _ in members.names]
        for m in range(n_members):
            for t in members.subscribed[m]:
                seats_of_set[t].append(seat[m])
        assigned: list[dict[str, list[int]]] = [{} for _ in members.ids]
        pointer = 0  # the circle's next seat
        for t, name in enumerate(members.names):
            seats = sorted(seats_of_set[t])
            n, k = catalog[name], len(seats)
            first = bisect_left(seats, pointer)
            # Index i goes to seats[(first + i) % k].
            for j in range(min(k, n)):
                member = circle[seats[(first + j) % k]]
                assigned[member][name] = list(range(j, n, k))
            pointer = seats[(first + n - 1) % k] + 1
        return {member_id: Assignment(assigned[m]) for m, member_id in enumerate(members.ids)}
