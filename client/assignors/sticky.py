"""``sticky``: KIP-54's assignor, eager protocol.

Balance first, then stickiness, for any mix of subscriptions. When every
member subscribes to the same sets the plan comes from KIP-615's linear
algorithm (``_constrained``), otherwise from KIP-54's (``_general``); both
reach the best balance and keep every claim that balance allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._claims import read_claims
from ._constrained import constrained_plan
from ._gc import paused_gc
from ._general import general_plan
from ._layout import Layout, build_result, clean_catalog, read_members
from ._plan import Plan, cooperative_cut, merge
from .model import Assignment, RebalanceProtocol, Resources, Subscription

__all__ = ["StickyAssignor", "sticky_plan"]


def sticky_plan(
    resources: Resources,
    subscriptions: Mapping[str, Subscription],
    cooperative: bool,
) -> dict[str, Assignment]:
    """The shared body of ``sticky`` and ``cooperative-sticky``."""
    catalog = clean_catalog(resources)
    with paused_gc(sum(catalog.values())):
        return _sticky_plan(catalog, subscriptions, cooperative)


def _sticky_plan(
    catalog: dict[str, int], subscriptions: Mapping[str, Subscription], cooperative: bool
) -> dict[str, Assignment]:
    members = read_members(catalog, subscriptions)
    if not members.ids:
        return {}
    layout = Layout(members.names, catalog)
    claims = read_claims(layout, members)
    plan: Plan
    if layout.total == 0:
        plan = Plan(claims.kept, [{} for _ in members.ids], set())
    elif members.uniform:
        plan = constrained_plan(layout, claims)
    else:
        plan = general_plan(layout, members, claims)
    if cooperative:
        plan = cooperative_cut(plan, claims, layout)
    return build_result(members.ids, layout.names, merge(plan))


@dataclass(frozen=True)
class StickyAssignor:
    name: str = "sticky"
    protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.EAGER,)

    def assign(
        self, resources: Resources, subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        return sticky_plan(resources, subscriptions, cooperative=False)
