"""Prometheus metrics of one coordinator (``GET /metrics``; PROTOCOL.md: ``groupcoord_*``).

Each server instance owns its :class:`CollectorRegistry`, so tests can run many
servers in one process. No metric has a per-member or per-group label: the
number of series stays bounded however many groups come and go. Group and
member gauges are read from the core when scraped, so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol.errors import ErrorCode

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")

# Latency buckets of one request: parked joins last up to a rebalance timeout.
_REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                      300.0)
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0)


class _CoreGauges(Collector):
    """Groups by state and members, read from the core at scrape time."""

    def __init__(self, state_counts: Callable[[], Mapping[str, int]],
                 member_count: Callable[[], int]) -> None:
        self._state_counts = state_counts
        self._member_count = member_count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        groups = GaugeMetricFamily("groupcoord_groups", "Groups by state", labels=["state"])
        counts = dict(self._state_counts())
        for state in sorted({*GROUP_STATES, *counts}):
            groups.add_metric([state], counts.get(state, 0))
        yield groups
        yield GaugeMetricFamily("groupcoord_members", "Members of all groups",
                                value=self._member_count())


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("groupcoord_requests", "Requests by API and outcome",
                                ["api", "outcome"], registry=r)
        self.request_seconds = Histogram(
            "groupcoord_request_duration_seconds",
            "Time from a request's arrival to its answer, by API and outcome",
            ["api", "outcome"], buckets=_REQUEST_BUCKETS, registry=r)
        self.rebalances_started = Counter("groupcoord_rebalances_started",
                                          "Rebalances started (groups entering "
                                          "PreparingRebalance)", registry=r)
        self.rebalances_completed = Counter("groupcoord_rebalances_completed",
                                            "Generations that got their assignment", registry=r)
        self.rebalance_seconds = Histogram("groupcoord_rebalance_duration_seconds",
                                           "From a rebalance's start to its assignment",
                                           buckets=_REBALANCE_BUCKETS, registry=r)
        self.session_expiries = Counter("groupcoord_session_expiries",
                                        "Members removed because their session timed out",
                                        registry=r)
        self.commit_seconds = Histogram("groupcoord_storage_commit_duration_seconds",
                                        "Duration of one storage transaction (a batch of "
                                        "records, fsynced)", buckets=_COMMIT_BUCKETS, registry=r)
        self.records_written = Counter("groupcoord_storage_records_written",
                                       "Records made durable", registry=r)
        self.storage_failures = Counter("groupcoord_storage_failures",
                                        "Failed storage transactions (the server stops serving)",
                                        registry=r)
        # reason: "max_groups" or "max_parked_requests" (a fixed, small set).
        self.requests_refused = Counter("groupcoord_requests_refused",
                                        "Requests refused by a server limit, by limit",
                                        ["reason"], registry=r)
        self.ready = Gauge("groupcoord_ready", "1 when state is loaded and requests are served",
                           registry=r)
        # Children by label values, cached: labels() costs a lock and a dict
        # lookup per call, which shows on the heartbeat path.
        self._request_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    def watch_core(self, state_counts: Callable[[], Mapping[str, int]],
                   member_count: Callable[[], int]) -> None:
        self.registry.register(_CoreGauges(state_counts, member_count))

    def observe_request(self, api: str, error: ErrorCode | str | None, seconds: float) -> None:
        outcome = "ok" if error is None else str(error)
        children = self._request_children.get((api, outcome))
        if children is None:
            children = (self.requests.labels(api, outcome),
                        self.request_seconds.labels(api, outcome))
            self._request_children[(api, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_commit(self, seconds: float, records: int) -> None:
        self.commit_seconds.observe(seconds)
        self.records_written.inc(records)

    def render(self) -> bytes:
        return generate_latest(self.registry)
