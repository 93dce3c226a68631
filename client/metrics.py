"""The member's metrics: KIP-429's list, through prometheus-client.

Each member writes into a ``CollectorRegistry`` the caller may pass; by
default a fresh one per member, never the process-global registry, so many
members in one process never collide. Members sharing a registry share the
metric families and are told apart by the ``group_id`` and ``client_id``
labels.

KIP-429 name                         here (``groupcoord_client_`` prefix)
-----------------------------------  -----------------------------------------------
rebalance-latency-avg / -total       ``rebalance_latency_seconds`` (summary: _sum/_count)
rebalance-latency-max                ``rebalance_latency_max_seconds``
rebalance-total                      ``rebalances_total``
rebalance-rate-per-hour              ``rebalance_rate_per_hour`` (completed in the last hour)
failed-rebalance-total               ``failed_rebalances_total``
failed-rebalance-rate-per-hour       ``failed_rebalance_rate_per_hour``
last-rebalance-seconds-ago           ``last_rebalance_seconds_ago`` (-1: none yet, as Kafka)
partitions-{assigned,revoked,lost}-  ``callback_latency_seconds{callback}`` (summary) and
latency-avg / -max                   ``callback_latency_max_seconds{callback}``
(ours)                               ``callback_errors_total{callback}``, ``owned_resources``

Rebalance latency runs from the moment the member starts a rebalance (before
an eager ``on_revoked``) to the end of its ``on_assigned``, so it includes the
callback time, as KIP-429 asks.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary

__all__ = ["MemberMetrics"]

HOUR_MS = 3_600_000
CALLBACKS = ("assigned", "revoked", "lost", "standby", "standby_dropped")
_LABELS = ("group_id", "client_id")


@dataclass
class _Families:
    latency: Summary
    latency_max: Gauge
    rebalances: Counter
    rate: Gauge
    failed: Counter
    failed_rate: Gauge
    last_ago: Gauge
    cb_latency: Summary
    cb_latency_max: Gauge
    cb_errors: Counter
    owned: Gauge


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


def _families(registry: CollectorRegistry) -> _Families:
    fam = _FAMILIES.get(registry)
    if fam is None:
        p = "groupcoord_client_"
        cb = (*_LABELS, "callback")
        fam = _Families(
            latency=Summary(p + "rebalance_latency_seconds",
                            "Rebalance latency, from its start to the end of on_assigned",
                            _LABELS, registry=registry),
            latency_max=Gauge(p + "rebalance_latency_max_seconds",
                              "Longest rebalance latency seen", _LABELS, registry=registry),
            rebalances=Counter(p + "rebalances", "Completed rebalances", _LABELS,
                               registry=registry),
            rate=Gauge(p + "rebalance_rate_per_hour", "Rebalances completed in the last hour",
                       _LABELS, registry=registry),
            failed=Counter(p + "failed_rebalances", "Rebalances that failed", _LABELS,
                           registry=registry),
            failed_rate=Gauge(p + "failed_rebalance_rate_per_hour",
                              "Rebalances failed in the last hour", _LABELS, registry=registry),
            last_ago=Gauge(p + "last_rebalance_seconds_ago",
                           "Seconds since the last completed rebalance (-1: none)", _LABELS,
                           registry=registry),
            cb_latency=Summary(p + "callback_latency_seconds", "Listener callback latency", cb,
                               registry=registry),
            cb_latency_max=Gauge(p + "callback_latency_max_seconds",
                                 "Longest listener callback", cb, registry=registry),
            cb_errors=Counter(p + "callback_errors", "Listener callbacks that raised", cb,
                              registry=registry),
            owned=Gauge(p + "owned_resources", "Resources the member owns now", _LABELS,
                        registry=registry),
        )
        _FAMILIES[registry] = fam
    return fam


def _weakly(method: Callable[[], float], gone: float) -> Callable[[], float]:
    """``method`` of an object held weakly: ``gone`` once the object is."""
    ref = weakref.WeakMethod(method)

    def call() -> float:
        bound = ref()
        return gone if bound is None else bound()
    return call


class MemberMetrics:
    """One member's view of the metric families. ``clock`` returns monotonic ms."""

    def __init__(self, registry: CollectorRegistry | None, group_id: str, client_id: str,
                 clock: Callable[[], int]) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._fam = _families(self.registry)
        self._labels = (group_id, client_id)
        self._clock = clock
        self._completed: deque[int] = deque()
        self._failed: deque[int] = deque()
        self._last_ms: int | None = None
        self._latency_max = 0.0
        self._cb_max = dict.fromkeys(CALLBACKS, 0.0)
        self.rebalances = 0
        self.failed_rebalances = 0
        self.callback_errors = 0
        labels = self._labels
        # The metric families keep these functions as long as the registry lives, and
        # _FAMILIES keeps the families until the registry is gone: the functions hold
        # this object weakly, or a member with its own registry would keep that
        # registry (and itself) alive forever through _FAMILIES.
        self._fam.rate.labels(*labels).set_function(_weakly(self._completed_per_hour, 0.0))
        self._fam.failed_rate.labels(*labels).set_function(_weakly(self._failed_per_hour, 0.0))
        self._fam.last_ago.labels(*labels).set_function(_weakly(self._seconds_ago, -1.0))
        self._fam.latency_max.labels(*labels).set(0)
        for name in CALLBACKS:
            self._fam.cb_errors.labels(*labels, name)
            self._fam.cb_latency_max.labels(*labels, name).set(0)

    def _completed_per_hour(self) -> float:
        return self._per_hour(self._completed)

    def _failed_per_hour(self) -> float:
        return self._per_hour(self._failed)

    def _per_hour(self, stamps: deque[int]) -> float:
        now = self._clock()
        while stamps and stamps[0] <= now - HOUR_MS:
            stamps.popleft()
        return float(len(stamps))

    def _seconds_ago(self) -> float:
        if self._last_ms is None:
            return -1.0
        return (self._clock() - self._last_ms) / 1000.0

    def rebalance_completed(self, at_ms: int, latency_ms: int) -> None:
        seconds = latency_ms / 1000.0
        self.rebalances += 1
        self._fam.latency.labels(*self._labels).observe(seconds)
        self._latency_max = max(self._latency_max, seconds)
        self._fam.latency_max.labels(*self._labels).set(self._latency_max)
        self._fam.rebalances.labels(*self._labels).inc()
        self._completed.append(at_ms)
        self._last_ms = at_ms

    def rebalance_failed(self, at_ms: int) -> None:
        self.failed_rebalances += 1
        self._fam.failed.labels(*self._labels).inc()
        self._failed.append(at_ms)

    def callback(self, name: str, seconds: float, failed: bool) -> None:
        self._fam.cb_latency.labels(*self._labels, name).observe(seconds)
        if seconds > self._cb_max[name]:
            self._cb_max[name] = seconds
            self._fam.cb_latency_max.labels(*self._labels, name).set(seconds)
        if failed:
            self.callback_errors += 1
            self._fam.cb_errors.labels(*self._labels, name).inc()

    def owned(self, count: int) -> None:
        self._fam.owned.labels(*self._labels).set(count)
