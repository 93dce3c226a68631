"""Per-group health, in the spirit of Burrow's consumer status (docs/operations.md, "Group health").

The coordinator sees every rebalance and every commit of a group, so it can
say what an operator asks first: is this group well? One word per group:

``STORM``
    at least ``health_storm_rebalances`` rebalances started within
    ``health_window_ms`` (members that keep crashing, a session timeout too
    short for the workers' pauses, a deploy that never settles): the rule of
    coordinator/core/storm.py, which ``groupcoord analyze`` applies to the
    journal too, set so that a routine rolling restart does not trip it;
``REWIND``
    an integer checkpoint went backwards within ``health_window_ms``: a member
    committed a smaller value than the one it replaced (a reprocessing worker,
    two members that both think they own a resource). An operator's reset
    is intended and does not count;
``STALLED``
    the group has members and keeps checkpoints, and none was committed for
    ``health_stall_ms``: the workers are alive (they heartbeat) but make no
    progress;
``OK``
    none of these.

When several hold, the first in that order is shown, and ``reasons`` lists
every one in words. The record is in memory only: after a restart a group
starts OK, with its last commit time taken from storage (the retention
bookkeeping's ``last_commits``) or the load time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from coordinator.core.config import CoreConfig

OK, STORM, REWIND, STALLED = "OK", "STORM", "REWIND", "STALLED"
#: every status, most urgent first.
STATUSES = (STORM, REWIND, STALLED, OK)


@dataclass(slots=True)
class GroupHealth:
    """What one group's health is computed from."""

    #: start times (ms) of its recent rebalances, oldest first, at most the storm threshold.
    rebalances: deque[int] = field(default_factory=deque)
    #: when it last committed a checkpoint (ms); ``None``: never seen.
    last_commit_ms: int | None = None
    #: when an integer checkpoint last went backwards, and which.
    last_rewind_ms: int | None = None
    rewind: str = ""

    def rebalance_started(self, now_ms: int, config: CoreConfig) -> None:
        keep = max(1, config.health_storm_rebalances)  # all the rule can count
        self.rebalances.append(now_ms)
        while len(self.rebalances) > keep:
            self.rebalances.popleft()

    def committed(self, now_ms: int) -> None:
        self.last_commit_ms = now_ms

    def rewound(self, now_ms: int, resource: tuple[str, int], old: int, new: int) -> None:
        self.last_rewind_ms = now_ms
        self.rewind = f"{resource[0]}[{resource[1]}] went from {old} back to {new}"


@dataclass(frozen=True, slots=True)
class Health:
    """A group's status and why (``reasons`` empty when OK)."""

    status: str
    reasons: tuple[str, ...] = ()


HEALTHY = Health(OK)


def assess(h: GroupHealth | None, now_ms: int, config: CoreConfig, *, has_members: bool,
           keeps_checkpoints: bool) -> Health:
    """The group's health at ``now_ms`` (pure: nothing is changed)."""
    if h is None:
        return HEALTHY
    window = config.health_window_ms
    reasons: list[tuple[str, str]] = []
    storm = config.storm_rule
    recent = sum(1 for t in h.rebalances if storm.in_window(t, now_ms))
    if storm.is_storm(recent):
        reasons.append((STORM, f"{recent} rebalances in the last {window // 1000} s "
                               f"(a storm is {storm.describe()})"))
    if h.last_rewind_ms is not None and now_ms - h.last_rewind_ms <= window:
        reasons.append((REWIND, f"a checkpoint went backwards: {h.rewind}"))
    stall = config.health_stall_ms
    if (stall > 0 and has_members and keeps_checkpoints and h.last_commit_ms is not None
            and now_ms - h.last_commit_ms > stall):
        reasons.append((STALLED, f"no checkpoint committed for "
                                 f"{(now_ms - h.last_commit_ms) // 1000} s"))
    if not reasons:
        return HEALTHY
    reasons.sort(key=lambda r: STATUSES.index(r[0]))
    return Health(reasons[0][0], tuple(text for _, text in reasons))
