"""The side channel: when to heartbeat beside the main channel, what its answers mean.

:class:`BackgroundHeartbeat` is :meth:`MemberStateMachine.background_heartbeat
<client.member_state.machine.MemberStateMachine.background_heartbeat>` and its
outcomes (KIP-62; the channel's one heartbeat in flight is
:class:`~client.member_state.heartbeat.SideChannel`): a heartbeat while the
member rejoins or a listener callback runs; its answers renew the lease, end
a backoff, tell a join or sync in flight lost, release a closing member's
join, or start the error table's action.
"""

from __future__ import annotations

from client.errors import FatalMemberError
from client.member_state.actions import (
    ERROR_ACTIONS,
    Call,
    ErrorAction,
    InvokeListener,
    MemberState,
    Wait,
)
from client.member_state.core import MemberCore
from client.member_state.main_channel import MainCall
from client.member_state.recovery import Recovery
from client.member_state.states import Joining, Stable, Syncing
from protocol.errors import ErrorCode
from protocol.messages import Api, HeartbeatRequest, HeartbeatResponse

__all__ = ["BackgroundHeartbeat"]


class BackgroundHeartbeat:
    """The side channel's heartbeats and their outcomes."""

    def __init__(self, core: MemberCore, recovery: Recovery) -> None:
        self._m = core
        self._recovery = recovery

    def heartbeat(self, now_ms: int) -> Call | Wait | None:
        """:meth:`MemberStateMachine.background_heartbeat`."""
        m = self._m
        side = m._side
        if side.call is not None:
            raise RuntimeError(f"background_heartbeat with {side.call!r} still outstanding")
        if not self.applies():
            return None
        if now_ms < side.next_ms:
            return Wait(side.next_ms)
        request = HeartbeatRequest(m.config.group_id, m.member_id, m.generation_id,
                                   m.config.group_instance_id, 0)
        # Answered at once (wait_ms 0), so within reply_ms on a healthy
        # network; a later answer is not waited for (the timing rule).
        timeout = m._timing.heartbeat_timeout_ms(now_ms, 0, m._lease_end_now())
        call = Call(Api.HEARTBEAT, request, timeout, interruptible=True)
        side.sent(call, now_ms, m._timing.heartbeat_interval_ms)
        return call

    def received(self, now_ms: int, response: object) -> None:
        m = self._m
        call = m._side.take()
        if not isinstance(response, HeartbeatResponse):
            raise RuntimeError(f"response {type(response).__name__} to a background heartbeat")
        # The coordinator answers: whatever the answer is about, it is there.
        m._schedule.answered(response.error)
        request = call.request
        assert isinstance(request, HeartbeatRequest)
        sent = m._side.sent_ms
        if (request.member_id != m.member_id or request.generation_id != m.generation_id
                or m.state not in (MemberState.JOINING, MemberState.SYNCING,
                                   MemberState.STABLE)):
            # Superseded: the join answer gave a new generation (or the member
            # id was reset) since it was sent; an answer about an older
            # generation says nothing about this one (an old-generation
            # ILLEGAL_GENERATION must not reset a member that just joined).
            # A closing member's answers (it heartbeats while it finishes a join
            # or sync, or while on_revoked runs) count as ever: they renew its
            # lease, or tell it that what it revokes may be someone else's.
            return
        code = response.error
        main = m._in_flight
        if isinstance(main, MainCall):
            main.watch(now_ms, sent, code, m._timing.reply_ms)
        if code is None or code is ErrorCode.REBALANCE_IN_PROGRESS:
            self.coordinator_answered(now_ms)
        if code is not ErrorCode.ILLEGAL_GENERATION:
            # Sent after the close: the join is parked or has not arrived (or the
            # coordinator cannot tell), not answered; abandoning it keeps the
            # group in our generation.
            self.release_join()
        if code is None:
            # The coordinator was in CompletingRebalance or Stable with our
            # generation: we are known, and no join phase was in progress.
            m._lease.settled(sent)
            m.last_resources_epoch = max(m.last_resources_epoch, response.resources_epoch)
            m._drain_asked(now_ms, response)
            return
        action = ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if action is ErrorAction.REJOIN:
            # PreparingRebalance re-armed our session: we are known. We are
            # rejoining already (or our sync will be told to rejoin); a stable
            # member heartbeating during a callback rejoins once it returned.
            m._lease.known(sent)
            if m.state is MemberState.STABLE and not m._closing:
                m._request_rejoin(now_ms, f"heartbeat: {code.value}")
            return
        if action is ErrorAction.RETRY:
            m._side.next_ms = now_ms + min(m.config.retry_backoff_ms,
                                           m._timing.heartbeat_interval_ms)
            return
        if (code is ErrorCode.ILLEGAL_GENERATION and m.state is MemberState.JOINING
                and isinstance(main, MainCall) and main.call.api == Api.JOIN):
            # Member validation passed, so the coordinator formed a newer
            # generation *with us* (a member that did not rejoin is removed,
            # and answered UNKNOWN_MEMBER_ID): the join phase completed and
            # our join's answer is on its way. That generation was assigned
            # from the claims our join carried, so nothing we own moved;
            # the join's answer decides, and the rule's bounds hold meanwhile.
            return
        self._recovery.apply_side(now_ms, code, action)

    def failed(self, now_ms: int, error: Exception) -> None:
        """:meth:`MemberStateMachine.background_failed`."""
        m = self._m
        m._side.take()
        self.release_join()  # no answer: waiting on the join gains nothing
        if isinstance(error, FatalMemberError):
            if m.state not in (MemberState.CLOSED, MemberState.FAILED):
                m._mark_stale()
                self._recovery.fail(error)
            return
        m._side.next_ms = now_ms + min(m.config.retry_backoff_ms,
                                       m._timing.heartbeat_interval_ms)

    def abandoned(self, now_ms: int) -> None:
        """:meth:`MemberStateMachine.background_abandoned`."""
        m = self._m
        m._side.take()

    def applies(self) -> bool:
        m = self._m
        phase = m._phase
        if m.failure is not None or not isinstance(phase, (Joining, Syncing, Stable)):
            return False
        if not m.member_id or m.generation_id < 0:
            return False  # nothing to heartbeat with (a new or reset member)
        if isinstance(phase, Syncing) and phase.pending is not None:
            return False  # the main channel is verifying a late sync answer by heartbeat
        main = m._in_flight
        if isinstance(main, InvokeListener):
            # A listener callback holds the main channel: the side channel keeps
            # the member's session (Kafka's heartbeat thread runs while
            # onPartitionsRevoked does), in every state and while closing, so a
            # slow on_revoked, or the close's after the rebalance's, can still
            # commit at its end. A rebalance the coordinator starts meanwhile is
            # still bounded by the rebalance timeout (the lease's rebalance bound).
            return True
        if isinstance(phase, Stable) or (m._closing and not m._finishing_rebalance()):
            return False  # the main channel heartbeats; a closing member leaves
        return not (isinstance(main, MainCall) and main.call.api == Api.HEARTBEAT)

    def release_join(self) -> None:
        """A side-channel outcome other than ILLEGAL_GENERATION, to a heartbeat
        sent since the close: the join in flight may go (_finishing_join)."""
        m = self._m
        if m._finishing_join() and m._side.sent_count > m._close_heartbeats:
            m._join_released = True

    def coordinator_answered(self, now_ms: int) -> None:
        """The coordinator answers again: a join, sync or catalog read waiting
        out the backoff of a failure to reach it goes now (the member would
        otherwise sit out up to ``retry_backoff_max_ms`` holding nothing while
        the coordinator, answered by its heartbeats, counts it as a member
        holding its resources: simulator seed 737)."""
        m = self._m
        schedule = m._schedule
        if schedule.retry_pending and m._in_flight is None and schedule.due_ms > now_ms:
            schedule.retry_pending = False
            schedule.attempts = 0
            schedule.due_ms = now_ms
