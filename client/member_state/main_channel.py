"""The main channel: the one call in flight, and when the next is due.

:class:`MainCall` is a join, sync, heartbeat, catalog read or leave the
driver is performing, with what the side channel has learnt about it since
(module :mod:`client.member_state.heartbeat`, "A call the coordinator is
done with"). :class:`Schedule` says when the current state's next request is
due and carries the retry backoff (Kafka's ``retry.backoff``, exponential,
+-20% jitter).
"""

from __future__ import annotations

from collections.abc import Callable

from client.member_state.actions import ERROR_ACTIONS, Call, ErrorAction
from protocol.errors import ErrorCode
from protocol.messages import Api

__all__ = ["MainCall", "Schedule"]


class MainCall:
    """A call on the main channel, from :meth:`MemberStateMachine.next_action`
    to its outcome."""

    __slots__ = ("call", "done_seen_ms", "resend", "sent_ms", "stale")

    def __init__(self, call: Call, sent_ms: int) -> None:
        self.call = call
        self.sent_ms = sent_ms
        #: overtaken by a side-channel outcome (reset, fatal): its answer
        #: means nothing any more.
        self.stale = False
        #: when a side-channel answer first showed the coordinator done with
        #: this join or sync, and whether to send it again.
        self.done_seen_ms: int | None = None
        self.resend = False

    def watch(self, now_ms: int, hb_sent_ms: int, code: ErrorCode | None,
              reply_ms: int) -> None:
        """Is this a join or sync the coordinator is done with? Judged from a
        side-channel answer to a heartbeat sent at ``hb_sent_ms`` with the
        generation the member still has (:mod:`client.member_state.heartbeat`)."""
        api = self.call.api
        if api not in (Api.JOIN, Api.SYNC) or hb_sent_ms < self.sent_ms or self.resend:
            return  # not a join or sync, or the heartbeat left before it: says nothing of it
        if api == Api.JOIN:
            # No error: no join phase (ours would have started one, or been
            # answered at once). ILLEGAL_GENERATION: a join phase completed
            # with us in it, and our join was answered then.
            done = code is None or code is ErrorCode.ILLEGAL_GENERATION
        else:
            # No error: Stable (a sync is answered at once) or waiting for the
            # leader's sync (ours may be parked: sending it again replaces it).
            # REBALANCE_IN_PROGRESS: a sync gets nothing else any more.
            done = code is None or code is ErrorCode.REBALANCE_IN_PROGRESS
        if not done:
            self.done_seen_ms = None  # e.g. our slow join arrived and began a rebalance
            return
        first = self.done_seen_ms
        if first is None:
            self.done_seen_ms = now_ms
        elif now_ms >= first + reply_ms and hb_sent_ms >= first:
            # An answer the coordinator sent before ``first`` has had the reply
            # allowance to arrive, and this heartbeat, sent since, says the
            # same: the call's answer (or the call) is lost.
            self.resend = True


class Schedule:
    """When the main channel's next request is due, and the backoff."""

    __slots__ = ("_backoff_max_ms", "_backoff_ms", "_rng", "attempts", "due_ms",
                 "retry_pending")

    def __init__(self, backoff_ms: int, backoff_max_ms: int, rng: Callable[[], float]) -> None:
        self._backoff_ms = backoff_ms
        self._backoff_max_ms = backoff_max_ms
        self._rng = rng
        #: when the current state's next request is due (retries, heartbeats).
        self.due_ms = 0
        #: failures in a row to reach the coordinator (the backoff's exponent).
        self.attempts = 0
        #: the next join/sync/catalog call waits out a backoff after a failure
        #: to reach the coordinator.
        self.retry_pending = False

    def answered(self, code: ErrorCode | None) -> None:
        """The coordinator answered a call (either channel): the backoff grows
        only while it is unreachable or unavailable, so an answer other than
        "unavailable" restarts it from its base -- a join's MEMBER_ID_REQUIRED
        and a side-channel UNKNOWN_MEMBER_ID too (simulator seed 85751)."""
        if code is None or ERROR_ACTIONS.get(code, ErrorAction.RETRY) is not ErrorAction.RETRY:
            self.attempts = 0

    def backoff_ms(self) -> int:
        """Exponential backoff with +-20% jitter (Kafka's retry.backoff)."""
        self.attempts += 1
        base = min(self._backoff_max_ms,
                   self._backoff_ms * 2 ** min(self.attempts - 1, 20))
        return max(1, int(base * (0.8 + 0.4 * self._rng())))
