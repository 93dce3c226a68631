"""Placeholder, replaced below."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import Assignment, RebalanceProtocol, Subscription
from .sticky import sticky_plan


@dataclass(frozen=True)
class IncrementalCooperativeAssignor:
    scheduled_rebalance_max_delay_ms: int = 300_000
    name: str = "incremental-cooperative"
    protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.COOPERATIVE,)

    def assign(
        self, resources: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        return sticky_plan(resources, subscriptions, cooperative=True)
