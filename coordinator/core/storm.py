"""The rebalance-storm rule: one definition for the coordinator's group health
(``STORM``, coordinator/core/health.py) and for ``groupcoord analyze``
(``window_count``, ``storm_rebalances``, ``storming_groups``: pipeline/).

A group is in a storm at time ``T`` when at least ``rebalances`` of its
rebalances started in the window ``(T - window_ms, T]``. The coordinator asks
at any moment (the console, ``GET /v1/groups``, ``/metrics``); the pipeline
asks at each rebalance's start, so a rebalance is a *storm rebalance* when it
is the ``rebalances``-th or later within the window.

The default, 30 within 10 minutes, is set so that a routine deploy does not
trip it and a group that keeps rebalancing does (docs/operations.md, "Group
health"): a rolling restart of N members with cooperative rebalancing makes
about N to 2N rebalances (a restart is a leave and a join, often merged into
one rebalance, plus the cooperative follow-up that hands over the revoked
resources), so a deploy of 10 members makes at most about 20 in the few
minutes it takes. A storm is sustained: 30 within 10 minutes is a rebalance
every 20 s on average for 10 minutes, or a burst of 30 back to back.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A threshold no count reaches: what ``rebalances = 0`` ("never") compares with.
_NEVER = 2**62


def _duration(ms: int) -> str:
    if ms % 60_000 == 0:
        minutes = ms // 60_000
        return "1 minute" if minutes == 1 else f"{minutes} minutes"
    if ms % 1000 == 0:
        return f"{ms // 1000} s"
    return f"{ms} ms"


@dataclass(frozen=True, slots=True)
class StormRule:
    """Rebalances (``rebalances``; 0: never a storm) started within
    ``window_ms`` that make a storm."""

    window_ms: int = 600_000
    rebalances: int = 30

    def __post_init__(self) -> None:
        if self.window_ms < 1:
            raise ValueError(f"storm window_ms must be at least 1, not {self.window_ms}")
        if self.rebalances < 0:
            raise ValueError(f"storm rebalances must be 0 (never) or more, "
                             f"not {self.rebalances}")

    def in_window(self, started_ms: int, at_ms: int) -> bool:
        """Whether a rebalance that started at ``started_ms`` counts at
        ``at_ms``: it started in ``(at_ms - window_ms, at_ms]``."""
        return at_ms - self.window_ms < started_ms <= at_ms

    @property
    def trips_at(self) -> int:
        """The smallest count within the window that is a storm (a count no
        group reaches when the rule is off)."""
        return self.rebalances if self.rebalances > 0 else _NEVER

    def is_storm(self, in_window: int) -> bool:
        """Whether ``in_window`` rebalances within the window make a storm:
        ``in_window >= trips_at``, the comparison the pipeline makes per
        rebalance in numpy and Spark SQL with :attr:`trips_at`."""
        return in_window >= self.trips_at

    def describe(self) -> str:
        """The rule in words, as the console and the report print it."""
        if self.rebalances == 0:
            return "off: no count of rebalances is a storm"
        return f"{self.rebalances} or more rebalances started within {_duration(self.window_ms)}"


#: The rule both the coordinator (``--health-storm-rebalances``,
#: ``--health-window-ms``) and ``groupcoord analyze`` (``--storm-threshold``,
#: ``--storm-window``) use unless told otherwise.
STORM_RULE = StormRule()
