"""The safety lease: until when a member may believe it owns its resources.

The coordinator removes a member in three ways (docs/coordinator-semantics.md):
one session timeout after the last request that re-armed its session timer,
at the join deadline of a rebalance it did not rejoin (rebalance start + the
group's largest rebalance timeout), and at the sync deadline of a generation
it did not sync (formation + that timeout). So what the member owns ends at
the earliest of

- ``anchor + session_timeout``, the anchor being the *send* time of the last
  answer that proved the coordinator still knew the member with its
  generation (a heartbeat answered without error or REBALANCE_IN_PROGRESS, a
  completed join or sync);
- while JOINING or STABLE: ``settled + rebalance_timeout``, ``settled`` being
  the send time of the last answer that proved no join phase was in progress
  (a heartbeat answered without error, a completed sync): any rebalance
  started later, so its join deadline is no earlier;
- while SYNCING: ``join_sent + rebalance_timeout``, ``join_sent`` being the
  send time of the first join since the last successful one (the generation
  formed after it, so its sync deadline is no earlier; kept by the SYNCING
  state, :class:`client.member_state.states.Syncing`, as ``base_ms``).

:class:`Lease` holds the two proofs that outlive a state (``anchor_ms``,
``settled_ms``); the timing rule that keeps a healthy member able to renew
it in time is :class:`client.lease.LeaseTiming`.
"""

from __future__ import annotations

from client.lease import LeaseTiming

__all__ = ["Lease"]


class Lease:
    """The proofs of membership a member has, and the lease they give."""

    __slots__ = ("anchor_ms", "settled_ms", "timing")

    def __init__(self, timing: LeaseTiming) -> None:
        self.timing = timing
        #: send time of the last answer that proved our membership.
        self.anchor_ms: int | None = None
        #: send time of the last answer that proved no join phase was in
        #: progress at the coordinator (a no-error heartbeat, a completed sync).
        self.settled_ms: int | None = None

    def known(self, sent_ms: int) -> None:
        """An answer to a request sent at ``sent_ms`` proved the coordinator
        knew the member (a completed join, REBALANCE_IN_PROGRESS to a heartbeat)."""
        self.anchor_ms = max(self.anchor_ms or sent_ms, sent_ms)

    def settled(self, sent_ms: int) -> None:
        """It also proved no join phase was in progress (a heartbeat answered
        without error, a completed sync)."""
        self.known(sent_ms)
        self.settled_ms = max(self.settled_ms or sent_ms, sent_ms)

    def end(self, rebalance_base_ms: int | None) -> int | None:
        """The lease's end (None before any proof); ``rebalance_base_ms`` is
        ``settled_ms`` except while SYNCING (see the module docstring)."""
        if self.anchor_ms is None:
            return None
        return self.timing.end(self.anchor_ms, rebalance_base_ms)

    def end_if_settled(self, sent_ms: int) -> int:
        """The end the lease would have if an answer to a request sent at
        ``sent_ms`` settled it now (a sync's answer, before it is trusted)."""
        return self.timing.end(max(self.anchor_ms or sent_ms, sent_ms),
                               max(self.settled_ms or sent_ms, sent_ms))

    def session_expired(self, now_ms: int) -> bool:
        """Whether a session timeout has passed since the last proof (as
        opposed to the rebalance bound)."""
        assert self.anchor_ms is not None  # a deadline needs an anchor
        return now_ms >= self.anchor_ms + self.timing.session_timeout_ms
