"""``/metrics`` for the request counter and latency histogram.

Those two are counted in plain Python on the hot path (coordinator/metrics.py,
``_RequestStats``); what a scraper reads must be exactly what prometheus-client's
``Counter`` and ``Histogram`` of the same names gave: same families, samples,
bucket boundaries and values, and no ``_created`` series (noise).
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from coordinator.metrics import _REQUEST_BUCKETS, Metrics
from protocol.errors import ErrorCode

OBSERVATIONS: list[tuple[str, ErrorCode | None, float]] = [
    ("heartbeat", None, 0.0004),
    ("heartbeat", None, 0.0005),  # exactly on a bound: counted in that bucket
    ("heartbeat", ErrorCode.UNKNOWN_MEMBER_ID, 0.002),
    ("join", None, 3.5),
    ("heartbeat", None, 0.01234),
    ("sync", ErrorCode.REBALANCE_IN_PROGRESS, 0.0),
    ("join", None, 1_000.0),  # over the last bound: +Inf only
    ("heartbeat", ErrorCode.UNKNOWN_MEMBER_ID, 0.3),
]


def reference(observations: list[tuple[str, ErrorCode | None, float]]) -> str:
    """What prometheus-client's own Counter + Histogram expose for the same requests."""
    registry = CollectorRegistry()
    requests = Counter("groupcoord_requests", "Requests by API and outcome",
                       ["api", "outcome"], registry=registry)
    seconds = Histogram("groupcoord_request_duration_seconds",
                        "Time from a request's arrival to its answer, by API and outcome",
                        ["api", "outcome"], buckets=_REQUEST_BUCKETS, registry=registry)
    for api, error, value in observations:
        outcome = "ok" if error is None else str(error)
        requests.labels(api, outcome).inc()
        seconds.labels(api, outcome).observe(value)
    return generate_latest(registry).decode()


def request_lines(text: str) -> list[str]:
    """The lines of the two request families, creation timestamps blanked."""
    lines = [line for line in text.splitlines()
             if re.search(r"groupcoord_request(s_total|s_created|_duration_seconds"
                          r"(_bucket|_count|_sum|_created)?)\b", line)]
    return [re.sub(r"(_created\{[^}]*\}) \S+$", r"\1 T", line) for line in lines]


def test_request_metrics_expose_what_prometheus_client_would() -> None:
    metrics = Metrics()
    for api, error, value in OBSERVATIONS:
        metrics.observe_request(api, error, value)
    ours = request_lines(metrics.render().decode())
    expected = request_lines(reference(OBSERVATIONS))
    assert ours == expected
    assert 'groupcoord_requests_total{api="heartbeat",outcome="ok"} 3.0' in ours
    assert ('groupcoord_request_duration_seconds_bucket{api="heartbeat",le="0.0005",'
            'outcome="ok"} 2.0') in ours
    assert ('groupcoord_request_duration_seconds_bucket{api="join",le="300.0",'
            'outcome="ok"} 1.0') in ours


def test_request_metrics_families_are_listed_with_no_requests_yet() -> None:
    text = Metrics().render().decode()
    assert request_lines(text) == request_lines(reference([]))
    assert "# TYPE groupcoord_requests_total counter" in text
    assert "# TYPE groupcoord_request_duration_seconds histogram" in text


def test_no_created_series_anywhere() -> None:
    metrics = Metrics()
    metrics.observe_request("fetch", None, 0.001)
    metrics.rebalances_started.labels("join").inc()
    metrics.rebalance_seconds.observe(0.5)
    metrics.requests_refused.labels("max_groups").inc()
    text = metrics.render().decode()
    assert "groupcoord_requests_total" in text and "groupcoord_rebalances_started_total" in text
    assert "_created" not in text
