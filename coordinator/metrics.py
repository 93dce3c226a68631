"""Prometheus metrics of one coordinator (``GET /metrics``; names ``groupcoord_*``, as
docs/protocol.md, "Running the server", says).

Each server instance owns its :class:`CollectorRegistry`, so tests can run many
servers in one process. No metric has a per-member label, and per-group series
exist only when asked for (``--group-metrics N``, at most N groups): the
number of series stays bounded however many groups come and go. Group and
member gauges are read from the core when scraped, so they cannot drift.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from coordinator.core.records import JournalEntry
from coordinator.core.views import DrainCounts, GroupSummary, GroupView
from coordinator.placement import load_imbalance
from coordinator.warmups import WarmupTracker
from protocol.errors import ErrorCode
from protocol.resources import CAUSES
from protocol.resources import PROTOCOL_TYPE as RESOURCES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every counter and histogram would also export a ``*_created`` series (the
# Unix time the series was created): noise on dashboards, and one more series
# per label set. prometheus-client's public switch turns them off for the process
# (typed here: the library's function is not).
_disable_created: Callable[[], None] = disable_created_metrics
_disable_created()
#: the ``cause`` label of a move whose cause this version does not know.
OTHER_CAUSE = "other"
_CAUSES = frozenset(CAUSES)
GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")

# Latency buckets of one request: parked joins last up to a rebalance timeout.
_REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                      300.0)
# A warm-up lasts from seconds (a cache) to many minutes (a state store).
_WARMUP_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0)


class _CoreGauges(Collector):
    """Groups by state, members, and members draining or asked to, read from the
    core at scrape time."""

    def __init__(self, state_counts: Callable[[], Mapping[str, int]],
                 member_count: Callable[[], int],
                 drain_counts: Callable[[], DrainCounts] | None = None) -> None:
        self._state_counts = state_counts
        self._member_count = member_count
        self._drain_counts = drain_counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        groups = GaugeMetricFamily("groupcoord_groups", "Groups by state", labels=["state"])
        counts = dict(self._state_counts())
        for state in sorted({*GROUP_STATES, *counts}):
            groups.add_metric([state], counts.get(state, 0))
        yield groups
        yield GaugeMetricFamily("groupcoord_members", "Members of all groups",
                                value=self._member_count())
        if self._drain_counts is not None:
            drains = self._drain_counts()
            yield GaugeMetricFamily("groupcoord_draining_members",
                                    "Members whose metadata says draining",
                                    value=drains.draining)
            yield GaugeMetricFamily("groupcoord_drain_requested_members",
                                    "Members an operator asked to drain that have not "
                                    "rejoined draining yet", value=drains.requested)


class _GroupGauges(Collector):
    """Per-group series (``--group-metrics N``): at most ``cap`` groups, the largest
    by members first (ties by group id), so the series stay bounded; the rest are
    counted in ``groupcoord_group_metrics_omitted``."""

    def __init__(self, groups: Callable[[], Sequence[GroupSummary]],
                 health: Callable[[str], str], cap: int,
                 describe: Callable[[str], GroupView | None] | None = None) -> None:
        self._groups = groups
        self._health = health
        self._cap = cap
        self._describe = describe
        #: group id -> (generation, load imbalance) of the shown groups: decoded
        #: once per generation, not at every scrape.
        self._imbalance: dict[str, tuple[int, float | None]] = {}

    def _imbalance_of(self, g: GroupSummary) -> float | None:
        cached = self._imbalance.get(g.group_id)
        if cached is not None and (cached[0] == g.generation_id or g.state != "Stable"):
            return cached[1]  # between a generation's forming and its assignment: the last
        if self._describe is None or g.state != "Stable":
            return None
        view = self._describe(g.group_id)
        value = None if view is None else load_imbalance(view)
        self._imbalance[g.group_id] = (g.generation_id, value)
        return value

    def collect(self) -> Iterator[GaugeMetricFamily]:
        groups = sorted(self._groups(), key=lambda g: (-g.member_count, g.group_id))
        shown = groups[:self._cap]
        members = GaugeMetricFamily("groupcoord_group_members", "Members of one group",
                                    labels=["group"])
        generation = GaugeMetricFamily("groupcoord_group_generation",
                                       "Generation of one group", labels=["group"])
        state = GaugeMetricFamily("groupcoord_group_state",
                                  "1 for the state one group is in", labels=["group", "state"])
        health = GaugeMetricFamily("groupcoord_group_health",
                                   "1 for one group's health: OK, STORM, REWIND or STALLED",
                                   labels=["group", "health"])
        imbalance = GaugeMetricFamily(
            "groupcoord_group_load_imbalance",
            "Busiest member's reported load per capacity over the group's, for groups "
            "whose assignor hands out a load band (1 is even)", labels=["group"])
        for g in shown:
            members.add_metric([g.group_id], g.member_count)
            generation.add_metric([g.group_id], g.generation_id)
            state.add_metric([g.group_id, g.state], 1)
            health.add_metric([g.group_id, self._health(g.group_id)], 1)
            if g.protocol_type == RESOURCES and (x := self._imbalance_of(g)) is not None:
                imbalance.add_metric([g.group_id], x)
        shown_ids = {g.group_id for g in shown}
        for group_id in [k for k in self._imbalance if k not in shown_ids]:
            del self._imbalance[group_id]
        yield members
        yield generation
        yield state
        yield health
        yield imbalance
        yield GaugeMetricFamily("groupcoord_group_metrics_omitted",
                                "Groups without their own series (over --group-metrics)",
                                value=len(groups) - len(shown))


class _Series:
    """One (api, outcome) pair: its request count, latency buckets and sum."""

    __slots__ = ("buckets", "count", "total_seconds")

    def __init__(self, buckets: int) -> None:
        self.count = 0
        #: observations per bucket (not cumulative; the last one is +Inf).
        self.buckets = [0] * buckets
        self.total_seconds = 0.0


class _RequestStats(Collector):
    """``groupcoord_requests`` (counter) and ``groupcoord_request_duration_seconds``
    (histogram), both by ``api`` and ``outcome``, counted in plain Python.

    prometheus-client's ``Counter.inc`` and ``Histogram.observe`` take a lock
    per value and walk the buckets in Python: about 2-3 us on every heartbeat.
    Every request is counted on the event loop thread, which also renders
    ``/metrics``, so plain numbers suffice. The exposition is the one the
    ``Counter`` and ``Histogram`` of the same names gave (same families, samples,
    label order, no ``_created`` series; tests/runtime/test_runtime_metrics.py).
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self._bounds = (*buckets, float("inf"))
        self._le = tuple(_go_float(b) for b in self._bounds)
        self._series: dict[tuple[str, str], _Series] = {}

    def observe(self, api: str, outcome: str, seconds: float) -> None:
        series = self._series.get((api, outcome))
        if series is None:
            series = self._series[(api, outcome)] = _Series(len(self._bounds))
        series.count += 1
        # The first bucket whose upper bound is >= seconds (Histogram.observe's rule).
        series.buckets[bisect_left(self._bounds, seconds)] += 1
        series.total_seconds += seconds

    def describe(self) -> Iterator[Metric]:
        yield Metric("groupcoord_requests", _REQUESTS_HELP, "counter")
        yield Metric("groupcoord_request_duration_seconds", _DURATION_HELP, "histogram")

    def collect(self) -> Iterator[Metric]:
        requests = Metric("groupcoord_requests", _REQUESTS_HELP, "counter")
        durations = Metric("groupcoord_request_duration_seconds", _DURATION_HELP, "histogram")
        for (api, outcome), series in self._series.items():
            labels = {"api": api, "outcome": outcome}
            requests.add_sample("groupcoord_requests_total", labels, float(series.count))
            cumulative = 0.0
            for le, count in zip(self._le, series.buckets, strict=True):
                cumulative += count
                durations.add_sample("groupcoord_request_duration_seconds_bucket",
                                     {**labels, "le": le}, cumulative)
            durations.add_sample("groupcoord_request_duration_seconds_count", labels, cumulative)
            durations.add_sample("groupcoord_request_duration_seconds_sum", labels,
                                 series.total_seconds)
        yield requests
        yield durations


#: how prometheus-client writes a bucket's ``le`` value (typed: the library's is not).
_go_float: Callable[[float], str] = floatToGoString
_REQUESTS_HELP = "Requests by API and outcome"
_DURATION_HELP = "Time from a request's arrival to its answer, by API and outcome"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = _RequestStats(_REQUEST_BUCKETS)
        r.register(self._requests)
        # reason: one of coordinator.core.records.REBALANCE_REASONS (a fixed, small set).
        self.rebalances_started = Counter("groupcoord_rebalances_started",
                                          "Rebalances started (groups entering "
                                          "PreparingRebalance), by why", ["reason"], registry=r)
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
        # cause: "core" (a command raised in the group state machine) or "storage"
        # (the store would not take one of the group's records).
        self.group_reloads = Counter("groupcoord_reloaded_groups",
                                     "Groups evicted and reloaded from storage after a failure "
                                     "confined to them, by cause", ["cause"], registry=r)
        # reason: "max_groups", "max_groups_per_token", "max_parked_requests" or
        # "max_parked_per_token" (a fixed, small set).
        self.requests_refused = Counter("groupcoord_requests_refused",
                                        "Requests refused by a server limit, by limit",
                                        ["reason"], registry=r)
        # listener: "protocol" or "admin"; reason: a fixed, small set (malformed,
        # duplicate_header, head_too_large, content_encoding, not_found,
        # method_not_allowed, timeout). Refused requests are logged at DEBUG only,
        # so a client cannot fill the log: this counter is where they show.
        self.http_refused = Counter("groupcoord_http_refused",
                                    "HTTP requests refused before they reached a call or "
                                    "an admin handler, by listener and reason",
                                    ["listener", "reason"], registry=r)
        # cause: one of protocol.resources.CAUSES, or "other" for a cause a
        # later version adds (a fixed, small set).
        self.resource_moves = Counter("groupcoord_resource_moves",
                                      "Resources given to a member that did not own them, "
                                      "by the cause the leader's why gives (assignors that "
                                      "give none are not counted)", ["cause"], registry=r)
        for cause in (*CAUSES, OTHER_CAUSE):
            self.resource_moves.labels(cause)
        self.drain_requests = Counter("groupcoord_drain_requests",
                                      "Members an operator asked to drain (POST "
                                      ".../members/{member}/drain; a repeated request for "
                                      "the same member is not counted)", registry=r)
        self.warmups_started = Counter("groupcoord_warmups_started",
                                       "Resources given to a member as standby (warm-ups "
                                       "begun), from the rebalance journal", registry=r)
        # outcome: "owned" (the member got the resource warm), "timed_out" (got it
        # cold: its warm-up ran out of time) or "dropped" (it did not get it).
        self.warmups_ended = Counter("groupcoord_warmups_ended",
                                     "Warm-ups over, by outcome: owned (the member got the "
                                     "resource), timed_out (got it when its warm-up ran out "
                                     "of time) or dropped (the plan changed)", ["outcome"],
                                     registry=r)
        for outcome in ("owned", "timed_out", "dropped"):
            self.warmups_ended.labels(outcome)
        self.warmup_seconds = Histogram("groupcoord_warmup_duration_seconds",
                                        "From the generation that gave a resource as standby "
                                        "to the one in which that member owns it",
                                        buckets=_WARMUP_BUCKETS, registry=r)
        self._warmups = WarmupTracker()
        self.ready = Gauge("groupcoord_ready", "1 when state is loaded and requests are served",
                           registry=r)

    def watch_core(self, state_counts: Callable[[], Mapping[str, int]],
                   member_count: Callable[[], int],
                   drain_counts: Callable[[], DrainCounts] | None = None) -> None:
        self.registry.register(_CoreGauges(state_counts, member_count, drain_counts))

    def watch_groups(self, groups: Callable[[], Sequence[GroupSummary]],
                     health: Callable[[str], str], cap: int,
                     describe: Callable[[str], GroupView | None] | None = None) -> None:
        """Per-group series for at most ``cap`` groups (``--group-metrics``; 0: none);
        ``describe`` (a group's view) for their load imbalance."""
        if cap > 0:
            self.registry.register(_GroupGauges(groups, health, cap, describe))

    def count_moves(self, by_cause: Mapping[str, int]) -> None:
        """Add one generation's resource moves (cause -> count). Thread-safe."""
        for cause, n in by_cause.items():
            self.resource_moves.labels(cause if cause in _CAUSES else OTHER_CAUSE).inc(n)

    def count_warmups(self, entry: JournalEntry) -> None:
        """Start and end the warm-ups one journal entry shows (coordinator/warmups.py).
        Thread-safe."""
        events = self._warmups.observe(entry)
        if events.started:
            self.warmups_started.inc(events.started)
        if events.owned:
            warm = len(events.owned) - events.timed_out
            if warm:
                self.warmups_ended.labels("owned").inc(warm)
            if events.timed_out:
                self.warmups_ended.labels("timed_out").inc(events.timed_out)
            for took_ms in events.owned:
                if took_ms is not None:
                    self.warmup_seconds.observe(took_ms / 1000)
        if events.dropped:
            self.warmups_ended.labels("dropped").inc(events.dropped)

    def forget_group(self, group_id: str) -> None:
        """A group is gone (Dead): its warm-ups are no longer followed."""
        self._warmups.forget(group_id)

    def observe_request(self, api: str, error: ErrorCode | str | None, seconds: float) -> None:
        self._requests.observe(api, "ok" if error is None else str(error), seconds)

    def observe_commit(self, seconds: float, records: int) -> None:
        self.commit_seconds.observe(seconds)
        self.records_written.inc(records)

    def render(self) -> bytes:
        return generate_latest(self.registry)
