"""How the member reports a coordinator it cannot reach: log lines that back off.

The member retries an unreachable coordinator with exponential backoff and
jitter, capped at ``retry_backoff_max_ms`` (Kafka's ``retry.backoff.ms`` /
``retry.backoff.max.ms``, ``reconnect.backoff.max.ms``), for as long as it
runs. Logging every attempt would write a line a second forever; this
reports the first failure at once, then again only after 1 s, 2 s, 4 s, ...
of failures (at most every ``max_interval_ms``, a minute by default), each
line naming the coordinator's URL once, the attempts since the last line and
the latest error. When a call gets through again, one line says so.

Sans-IO: :meth:`RetryLog.failed` and :meth:`RetryLog.succeeded` return the
line to log (or None); the driver logs it. Each line names the coordinator
that failed (or answered) when the driver knows it, else the one, or the
list of bootstrap URLs, the log was made with.
"""

from __future__ import annotations

__all__ = ["RetryLog"]


class RetryLog:
    def __init__(self, member: str, coordinator: str, *, first_interval_ms: int = 1_000,
                 max_interval_ms: int = 60_000) -> None:
        if not 0 < first_interval_ms <= max_interval_ms:
            raise ValueError("need 0 < first_interval_ms <= max_interval_ms")
        self._member = member
        self._coordinator = coordinator
        self._first = first_interval_ms
        self._max = max_interval_ms
        self._since_ms: int | None = None  # the first failure of the current streak
        self._failures = 0
        self._unreported = 0
        self._next_report_ms = 0
        self._interval = first_interval_ms

    @property
    def failing(self) -> bool:
        return self._since_ms is not None

    def failed(self, now_ms: int, error: str, coordinator: str | None = None
               ) -> str | None:
        """A call failed for want of a coordinator; the line to log, if any.
        ``coordinator``: the one that failed, when it is known (else the
        coordinator, or list of them, the log was made with)."""
        where = coordinator or self._coordinator
        self._failures += 1
        self._unreported += 1
        if self._since_ms is None:
            self._since_ms = now_ms
            self._next_report_ms = now_ms + self._interval
            self._unreported = 0
            return (f"member {self._member}: cannot reach the coordinator at "
                    f"{where} ({error}); retrying with backoff")
        if now_ms < self._next_report_ms:
            return None
        self._interval = min(self._max, self._interval * 2)
        self._next_report_ms = now_ms + self._interval
        attempts, self._unreported = self._unreported, 0
        return (f"member {self._member}: still cannot reach the coordinator at "
                f"{where} after {(now_ms - self._since_ms) / 1000:.1f} s "
                f"({attempts} more failed attempts; last: {error})")

    def succeeded(self, now_ms: int, coordinator: str | None = None) -> str | None:
        """A call got an answer (from ``coordinator``, when known); the line to
        log if it ends a failure streak."""
        if self._since_ms is None:
            return None
        line = (f"member {self._member}: reached the coordinator at "
                f"{coordinator or self._coordinator} "
                f"again after {(now_ms - self._since_ms) / 1000:.1f} s and "
                f"{self._failures} failed attempts")
        self._since_ms = None
        self._failures = self._unreported = 0
        self._interval = self._first
        return line
