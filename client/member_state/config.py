"""A member's configuration, checked when it is built."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from client.assignors import Assignor, RebalanceProtocol
from client.lease import LeaseTiming
from protocol.limits import MAX_PROTOCOLS_PER_JOIN

__all__ = ["MemberConfig", "choose_protocol"]


@dataclass(frozen=True)
class MemberConfig:
    group_id: str
    sets: Sequence[str]
    assignors: Sequence[str] = ("cooperative-sticky",)
    group_instance_id: str | None = None
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 60_000
    #: None: derived by the timing rule (client/lease.py): min(3000, a third of
    #: the lease); after construction it holds the interval in use.
    heartbeat_interval_ms: int | None = None
    client_id: str | None = None
    rack: str | None = None
    user_data: bytes | None = None
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    request_timeout_ms: int = 30_000
    #: None: leave on close if dynamic, stay if static (KIP-345: a static
    #: member's restart within the session timeout causes no rebalance).
    leave_on_close: bool | None = None
    assignor_settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    #: this member's share relative to the others (a host with twice the cores
    #: says 2.0), sent in its metadata for load-aware assignors (``balanced``);
    #: None: not sent (1.0 to such an assignor).
    capacity: float | None = None
    #: a load report outside the band the leader gave makes the member rejoin at
    #: most this often, so noise in the measurements does not cause churn.
    load_rejoin_interval_ms: int = 30_000
    #: the timing rule applied to these settings (client/lease.py).
    timing: LeaseTiming = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        if isinstance(self.sets, str):
            raise ValueError("sets must be a list of set names, not a string")
        if not self.assignors:
            raise ValueError("assignors must name at least one assignor")
        if len(self.assignors) > MAX_PROTOCOLS_PER_JOIN:
            raise ValueError(f"at most {MAX_PROTOCOLS_PER_JOIN} assignors")
        if len(set(self.assignors)) != len(self.assignors):
            raise ValueError(f"assignors listed twice: {list(self.assignors)}")
        timing = LeaseTiming.derive(
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            request_timeout_ms=self.request_timeout_ms)
        object.__setattr__(self, "timing", timing)
        object.__setattr__(self, "heartbeat_interval_ms", timing.heartbeat_interval_ms)
        if self.retry_backoff_ms <= 0 or self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("need 0 < retry_backoff_ms <= retry_backoff_max_ms")
        if self.group_instance_id == "":
            raise ValueError("group_instance_id must be None or a non-empty string")
        if self.capacity is not None and (
                isinstance(self.capacity, bool) or not isinstance(self.capacity, int | float)
                or not math.isfinite(self.capacity) or self.capacity <= 0):
            raise ValueError(f"capacity must be a finite number > 0, got {self.capacity!r}")
        if self.load_rejoin_interval_ms < 0:
            raise ValueError("load_rejoin_interval_ms must be >= 0")


def choose_protocol(assignors: Iterable[Assignor]) -> RebalanceProtocol:
    """Kafka's rule (KIP-429): COOPERATIVE when every configured assignor
    supports it, else EAGER. During the upgrade's first rolling bounce
    (``["range", "cooperative-sticky"]``) members stay EAGER; only when
    ``range`` is gone from the configuration does a member turn cooperative."""
    return (RebalanceProtocol.COOPERATIVE
            if all(RebalanceProtocol.COOPERATIVE in a.protocols for a in assignors)
            else RebalanceProtocol.EAGER)
