"""``cooperative-sticky``: KIP-429's assignor (with KIP-615's fast path).

The sticky plan, minus every resource that would change owner this round:
the owner sees it missing from its assignment, revokes it and rejoins, and
the follow-up rebalance hands it to its new owner. Supports COOPERATIVE
first and EAGER for the upgrade path (eager members claim nothing, so
nothing is held back for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import Assignment, RebalanceProtocol, Resources, Subscription
from .sticky import sticky_plan

__all__ = ["CooperativeStickyAssignor"]


@dataclass(frozen=True)
class CooperativeStickyAssignor:
    name: str = "cooperative-sticky"
    protocols: tuple[RebalanceProtocol, ...] = (
        RebalanceProtocol.COOPERATIVE,
        RebalanceProtocol.EAGER,
    )

    def assign(
        self, resources: Resources, subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        return sticky_plan(resources, subscriptions, cooperative=True)
