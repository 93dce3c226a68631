"""The background heartbeat: the side channel of KIP-62.

The member keeps heartbeating while it rejoins (Kafka's heartbeat thread),
alongside the join or sync in flight, so a healthy member's session anchor
stays fresh during a long rebalance (:class:`client.member_state.lease.Lease`).
The heartbeat carries the generation the member still has (the old one while
joining, the new one while syncing). REBALANCE_IN_PROGRESS and no-error
answers prove the coordinator still knows the member; a no-error answer also
proves no join phase was in progress. :class:`SideChannel` holds its one
outstanding heartbeat and when the next is due;
:mod:`client.member_state.background` decides
(:meth:`MemberStateMachine.background_heartbeat` and friends).

A call the coordinator is done with: a join or sync lost on a connection
that hangs (neither answered nor reset) would hold the member until the
call's timeout, ``rebalance_timeout + max(5000, session_timeout)``, while its
side-channel heartbeats keep it a member, holding its assignment, in the
coordinator's view (simulator seeds 374 and 1774). The side channel's
answers say when the coordinator can no longer be holding the call: for a
join, a heartbeat answered without error (no join phase is in progress: a
join that reached the coordinator starts one or is answered at once) or
ILLEGAL_GENERATION (a join phase completed with us, so our join was
answered); for a sync, an answer without error (the group is Stable, or
waits for the leader's sync) or REBALANCE_IN_PROGRESS (a parked sync was
answered when the rebalance began, a later one is answered at once). When
two such answers, ``reply_ms`` (the timing rule's reply allowance) apart,
came while the call was in flight, the answer it would have had is lost:
the call is abandoned and sent again (``wants_interrupt``;
:meth:`client.member_state.main_channel.MainCall.watch`). Sending it again
is safe because the coordinator treats a known member's join or sync as
idempotent (docs/client.md, "A call the coordinator is done with"); the
only cost of a false alarm is one more request.
"""

from __future__ import annotations

from client.member_state.actions import Call

__all__ = ["SideChannel"]


class SideChannel:
    """The side channel's one outstanding heartbeat and its schedule."""

    __slots__ = ("call", "next_ms", "sent_count", "sent_ms")

    def __init__(self) -> None:
        self.call: Call | None = None
        self.sent_ms = 0
        #: how many were sent (the one answered is the last: one at a time).
        self.sent_count = 0
        #: when the next background heartbeat is due.
        self.next_ms = 0

    def sent(self, call: Call, now_ms: int, interval_ms: int) -> None:
        if self.call is not None:
            raise RuntimeError(f"background_heartbeat with {self.call!r} still outstanding")
        self.call = call
        self.sent_ms = now_ms
        self.sent_count += 1
        self.next_ms = now_ms + interval_ms

    def take(self) -> Call:
        """The heartbeat whose outcome the driver reports."""
        call = self.call
        if call is None:
            raise RuntimeError("no background heartbeat outstanding")
        self.call = None
        return call
