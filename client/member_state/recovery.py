"""The error table applied: what an error answer, or no answer, does to the member.

:class:`Recovery` turns a code of :data:`~client.member_state.actions.ERROR_ACTIONS`
answered to a call into the member's move (rejoin; reset the generation or
the member id, losing what is owned; stop; retry after the backoff), on the
main channel (:meth:`Recovery.apply`, :meth:`Recovery.retry_later`) and on
the side channel (:meth:`Recovery.apply_side`), and marks the rebalance
failed or what is owned lost.
"""

from __future__ import annotations

from client.errors import FatalMemberError, fatal_error_for
from client.member_state.actions import (
    ERROR_ACTIONS,
    CallbackKind,
    ErrorAction,
    InvokeListener,
    MemberState,
)
from client.member_state.core import MemberCore
from client.member_state.states import Ended, Joining
from protocol.errors import ErrorCode
from protocol.messages import Api

__all__ = ["Recovery"]


def with_api(api: str, reason: str) -> str:
    """``"api: reason"``, unless the reason names the call already (the
    transport's errors do: ``join: ClientConnectorError: ...``)."""
    return reason if reason.startswith(f"{api}:") else f"{api}: {reason}"


class Recovery:
    """The error table's actions, applied to the member."""

    def __init__(self, core: MemberCore) -> None:
        self._m = core

    def apply(self, now_ms: int, api: Api, code: ErrorCode,
              action: ErrorAction | None = None, detail: str = "") -> None:
        """React to ``code`` answered to ``api``; ``detail``: the coordinator's
        message, if it sent one (a fatal error carries it)."""
        m = self._m
        action = action or ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if action is not ErrorAction.RETRY:
            # The coordinator answered: the backoff grows only while it is
            # unreachable or unavailable (simulator seed 1424).
            m._schedule.attempts = 0
        in_rebalance = api in (Api.JOIN, Api.SYNC)
        if in_rebalance and action is not ErrorAction.RETRY:
            self.fail_rebalance(now_ms, f"{api}: {code.value}")
        if action is ErrorAction.REJOIN:
            m._enter_joining(now_ms, f"{api}: {code.value}",
                             at_ms=now_ms + (m._schedule.backoff_ms()
                                                if api == Api.JOIN else 0))
        elif action in (ErrorAction.RESET_GENERATION, ErrorAction.RESET_MEMBER,
                        ErrorAction.SET_MEMBER_ID):
            # KIP-429 step 1.4: we are out of the generation; whatever we own
            # may be someone else's already.
            self.lose_all(f"{api}: {code.value}")
            m.generation_id = -1
            m._owned_generation = -1
            if action is not ErrorAction.RESET_GENERATION:
                m.member_id = ""
            m._enter_joining(now_ms, f"{api}: {code.value}",
                             at_ms=now_ms + (m._schedule.backoff_ms()
                                                if api == Api.JOIN else 0))
        elif action is ErrorAction.FATAL:
            self.fail(fatal_error_for(code, api, detail))
        else:
            self.retry_later(now_ms, api, code.value)

    def retry_later(self, now_ms: int, api: Api, reason: str,
                    sent_ms: int | None = None) -> None:
        m = self._m
        # The same step again after a backoff: a join is rebuilt, a sync is
        # re-sent as is (the coordinator answers a repeated sync with the
        # stored assignment, docs/protocol.md, "Durability"), a heartbeat is retried.
        # The backoff spaces attempts: it counts from the failed call's start
        # (``sent_ms``, as gRPC's connection backoff does), so a call that
        # timed out after waiting longer than the backoff goes again at once.
        # A join lost on the network is only known lost at its timeout (the
        # rebalance timeout + 5 s); waiting out a backoff of up to
        # retry_backoff_max_ms after that kept a member that owns nothing out
        # of its group past the convergence bound at short sessions
        # (simulator seed 415932).
        if api in (Api.JOIN, Api.SYNC, Api.RESOURCES):
            self.fail_rebalance(now_ms, with_api(api, reason), retriable=True)
        schedule = m._schedule
        if api == Api.HEARTBEAT and m.state is MemberState.STABLE:
            # A failed heartbeat is retried no later than a healthy member's
            # next one (the backoff capped at the interval), as Kafka's
            # defaults have it (retry.backoff.max.ms 1 s, heartbeat.interval.ms
            # 3 s) and as the side channel probes while rejoining: with short
            # sessions the capped backoff (1 s) is several sessions, and a
            # member that owns nothing (so no on_lost moves it to JOINING)
            # came back that late after the coordinator did, and cost the group
            # a rebalance after it had converged (simulator seeds 113568,
            # 126479). Timing rule 4: the retry still renews the lease if it can.
            backoff = min(schedule.backoff_ms(), m._timing.heartbeat_interval_ms)
            schedule.due_ms = m._timing.retry_at(now_ms, backoff, m._lease_end_now())
            return
        start = now_ms if sent_ms is None else min(sent_ms, now_ms)
        schedule.due_ms = max(now_ms, start + schedule.backoff_ms())
        # Waiting out a backoff for want of a coordinator: an answer on the
        # side channel ends it (background_received).
        schedule.retry_pending = True

    def fail_rebalance(self, now_ms: int, reason: str, *, retriable: bool = False) -> None:
        m = self._m
        m._rebalance.fail(now_ms, reason, retriable=retriable,
                          syncing=m.state is MemberState.SYNCING)

    def lose_all(self, reason: str) -> None:
        m = self._m
        # Losing everything supersedes whatever callbacks were pending: a
        # revocation of something lost, or an assignment of a generation we
        # are no longer part of.
        m._callbacks.clear()
        m._rebalance.forget_assignment()
        # Out of the group (or no longer sure to be in it): the assignor's
        # state we carried belongs to a membership we lost, like what we own.
        m._echo = None
        if m._owned:
            m._callbacks.append(InvokeListener(CallbackKind.LOST, frozenset(m._owned)))
        m.last_error = reason

    def fail(self, error: FatalMemberError) -> None:
        m = self._m
        self.lose_all(str(error))
        m.failure = error
        m._phase = Ended(MemberState.FAILED)
        m._rejoin = None

    def apply_side(self, now_ms: int, code: ErrorCode, action: ErrorAction) -> None:
        """The table's action for a background heartbeat's answer: like the
        main channel's, and the join or sync in flight is abandoned (its
        answer would be about a member or generation we no longer have)."""
        m = self._m
        m._mark_stale()
        self.fail_rebalance(now_ms, f"heartbeat: {code.value}")
        if action is ErrorAction.FATAL:
            self.fail(fatal_error_for(code, Api.HEARTBEAT))
            return
        # RESET_GENERATION, RESET_MEMBER, SET_MEMBER_ID (KIP-429 step 1.4)
        self.lose_all(f"heartbeat: {code.value}")
        m.generation_id = -1
        m._owned_generation = -1
        if action is not ErrorAction.RESET_GENERATION:
            m.member_id = ""
            if isinstance(m._phase, Joining):
                m._phase.first_sent_ms = None
        m._enter_joining(now_ms, f"heartbeat: {code.value}", at_ms=now_ms)
