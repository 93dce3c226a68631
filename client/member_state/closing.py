"""Closing: the final revocation, the standbys dropped, the leave.

:class:`CloseStep` starts a close and takes its steps once no join or sync
is being finished for the final commits (:meth:`MemberCore._finishing_join`,
:meth:`MemberCore._finishing_sync`): ``on_revoked`` of everything owned,
``on_standby_dropped``, then the leave (dynamic members, and a static member
in the middle of a hand-over it started) or nothing (static members).
"""

from __future__ import annotations

from client.member_state.actions import Action, Call, MemberState, Stop
from client.member_state.core import MemberCore
from client.member_state.states import Ended, Stable
from protocol.messages import Api, LeaveMember, LeaveRequest

__all__ = ["CloseStep"]


class CloseStep:
    """A close's start and its steps."""

    def __init__(self, core: MemberCore) -> None:
        self._m = core

    def step(self, now_ms: int) -> Action:
        m = self._m
        if m._owned:
            # Kafka's onLeavePrepare: a member with a valid generation revokes.
            return m._revoke_owned()
        dropped = m._handover.close()
        if dropped is not None:
            m._in_flight = dropped
            return dropped
        # A static member stays in the group when it closes (a restart gets its
        # assignment back without a rebalance), except in the middle of a hand-over
        # it started: it revoked resources and its rejoin was to start the follow-up
        # rebalance that gives them to their new owner. Without that rebalance they
        # would belong to nobody (its restart would get its stored assignment back),
        # so it leaves, which starts it (simulator seeds 700838430, 700838624).
        phase = m._phase
        handover = isinstance(phase, Stable) and phase.handover_pending
        if (m._leave_on_close or handover) and m.member_id:
            m._phase = Ended(MemberState.LEAVING)
            request = LeaveRequest(m.config.group_id, (LeaveMember(
                m.member_id, m.config.group_instance_id, "the member is closing"),))
            # Waiting longer than a session for the leave gains nothing: the
            # session timeout removes the member by then anyway.
            timeout = min(m.config.request_timeout_ms, m.config.session_timeout_ms)
            return m._send(now_ms, Call(Api.LEAVE, request, timeout))
        m._finish_close()
        return Stop(None)

    def close(self, leave: bool | None = None) -> None:
        """:meth:`MemberStateMachine.close`."""
        m = self._m
        if m.state in (MemberState.CLOSED, MemberState.FAILED):
            return
        m._closing = True
        if leave is not None:
            m._leave_on_close = leave
        # A join in flight waits for a side-channel answer to a heartbeat sent
        # from now on (_finishing_join): the next one goes at once.
        m._close_heartbeats = m._side.sent_count
        m._side.next_ms = 0
