"""The member's metrics do not keep a dropped member alive."""

from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry

from client import GroupMember
from client.metrics import MemberMetrics


class _NoTransport:
    async def call(self, api: str, request: object) -> object:
        raise AssertionError("never started")


def test_metrics_with_their_own_registry_are_freed_with_their_owner() -> None:
    metrics = MemberMetrics(None, "g", "a", lambda: 0)
    registry = weakref.ref(metrics.registry)
    owner = weakref.ref(metrics)
    del metrics
    gc.collect()
    assert owner() is None
    assert registry() is None


def test_a_member_dropped_is_freed_with_its_private_registry() -> None:
    member = GroupMember(_NoTransport(), "g", ["s"], client_id="a")  # type: ignore[arg-type]
    gone = weakref.ref(member)
    registry = weakref.ref(member.registry)
    del member
    gc.collect()
    assert gone() is None
    assert registry() is None


def test_a_member_dropped_from_a_shared_registry_is_freed_and_its_series_read_as_idle() -> None:
    shared = CollectorRegistry()
    metrics = MemberMetrics(shared, "g", "a", lambda: 5_000)
    metrics.rebalance_completed(4_000, 10)
    labels = {"group_id": "g", "client_id": "a"}
    assert shared.get_sample_value("groupcoord_client_last_rebalance_seconds_ago", labels) == 1.0
    assert shared.get_sample_value("groupcoord_client_rebalance_rate_per_hour", labels) == 1.0
    owner = weakref.ref(metrics)
    del metrics
    gc.collect()
    assert owner() is None
    assert shared.get_sample_value("groupcoord_client_last_rebalance_seconds_ago", labels) == -1.0
    assert shared.get_sample_value("groupcoord_client_rebalance_rate_per_hour", labels) == 0.0
