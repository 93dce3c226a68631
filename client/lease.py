"""The timing rule of the safety lease (docs/client.md, "Timing rule").

A member may believe it owns its resources until its *safety deadline*: the
end of a lease that starts at the send time of the last answer proving the
coordinator still knew the member (the rule itself is in
:mod:`client.member_state.lease`). In STABLE a no-error heartbeat proves both that
the member is known and that no rebalance was under way, so the lease lasts
``lease_ms = min(session_timeout_ms, rebalance_timeout_ms)`` from the send
time of the last such heartbeat.

A heartbeat proves membership only as of when it was *sent*, but its answer
comes back only when the coordinator stops holding it (the long-poll,
``wait_ms``). A heartbeat held for a whole interval therefore renews the
lease an interval late: with a hold of one interval, the answer renewing a
lease started at ``t`` arrives at ``t + 2 x interval`` (plus two round
trips), which is the whole session when the interval is half of it (a
member re-joining every session: session 6000 ms, interval 3000 ms).

:class:`LeaseTiming` keeps the member able to prove itself before its
deadline, whatever configuration it accepted:

1. ``heartbeat_interval_ms <= lease_ms / 3`` (Kafka's rule: at most a third
   of the session). Left unset, the interval is ``min(3000, lease_ms // 3)``;
   set larger, the configuration is refused (``ValueError`` naming the
   parameters and the bound).
2. A heartbeat's answer is awaited for its hold plus ``reply_ms``, never
   past the lease's end; then it counts as failed and is retried.
   ``reply_ms = min(request_timeout_ms, (lease_ms - 2 x interval) / 2)``:
   the slack the rule leaves after a renewal cycle (a heartbeat sent an
   interval after the last renewal, held an interval), split between that
   heartbeat's answer and one retry. At the boundary (interval = lease / 3)
   it is half an interval.
3. A heartbeat is held at most ``heartbeat_interval_ms`` and never so long
   that its answer, plus one retry answered within ``reply_ms``, could come
   after the lease's end: ``hold = min(interval, end - now - 2 x reply_ms)``,
   at least 0.
4. A failed heartbeat is retried after its backoff, but no later than
   ``end - reply_ms`` (the last moment an unheld heartbeat can still renew
   the lease); one that fails after that moment is retried halfway to the
   lease's end.

With (1) and (3), on a network that answers within ``reply_ms``, every
heartbeat renews the lease before it ends (the hold is a full interval in
the steady state: ``end - now`` is ``lease_ms - interval >= 2 x interval``),
and one heartbeat lost on the way still leaves time for a retry.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.limits import MAX_HEARTBEAT_WAIT_MS

__all__ = ["DEFAULT_HEARTBEAT_INTERVAL_MS", "HEARTBEATS_PER_LEASE", "LeaseTiming"]

#: the interval used when none is configured and the lease allows it (Kafka's default).
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
#: Kafka's rule: a member heartbeats at least three times per session timeout.
HEARTBEATS_PER_LEASE = 3


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The validated timing settings of one member and what follows from them."""

    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_interval_ms: int
    request_timeout_ms: int

    @classmethod
    def derive(cls, *, session_timeout_ms: int, rebalance_timeout_ms: int,
               heartbeat_interval_ms: int | None, request_timeout_ms: int) -> LeaseTiming:
        """Check the timing rule; an unset interval is derived from it.
        Raises ``ValueError`` saying what to change."""
        for name, value in (("session_timeout_ms", session_timeout_ms),
                            ("rebalance_timeout_ms", rebalance_timeout_ms),
                            ("request_timeout_ms", request_timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive number of milliseconds, "
                                 f"got {value!r}")
        lease_ms = min(session_timeout_ms, rebalance_timeout_ms)
        bound = lease_ms // HEARTBEATS_PER_LEASE
        binding = ("session_timeout_ms", session_timeout_ms)
        if rebalance_timeout_ms < session_timeout_ms:
            binding = ("rebalance_timeout_ms", rebalance_timeout_ms)
        if heartbeat_interval_ms is None:
            if bound < 1:
                raise ValueError(
                    f"{binding[0]}={binding[1]} is too short to heartbeat "
                    f"{HEARTBEATS_PER_LEASE} times within it; give it at least "
                    f"{HEARTBEATS_PER_LEASE} ms (a real coordinator requires 6000 by default)")
            heartbeat_interval_ms = min(DEFAULT_HEARTBEAT_INTERVAL_MS, bound)
        elif (isinstance(heartbeat_interval_ms, bool) or not isinstance(heartbeat_interval_ms, int)
              or heartbeat_interval_ms <= 0):
            raise ValueError(f"heartbeat_interval_ms must be a positive number of "
                             f"milliseconds (or None to derive it), got {heartbeat_interval_ms!r}")
        elif heartbeat_interval_ms > bound:
            why = ("a member's ownership ends a session timeout after its last answered "
                   "heartbeat" if binding[0] == "session_timeout_ms" else
                   "a member's ownership ends a rebalance timeout after its last heartbeat "
                   "that saw no rebalance")
            raise ValueError(
                f"heartbeat_interval_ms={heartbeat_interval_ms} is more than a third of "
                f"{binding[0]}={binding[1]} ({why}; Kafka's rule: at most a third, so one "
                f"slow or lost heartbeat does not cost the membership): set "
                f"heartbeat_interval_ms <= {bound} (or leave it unset to derive it), or "
                f"{binding[0]} >= {HEARTBEATS_PER_LEASE * heartbeat_interval_ms}")
        return cls(session_timeout_ms, rebalance_timeout_ms, heartbeat_interval_ms,
                   request_timeout_ms)

    # ------------------------------------------------------------ derived settings

    @property
    def lease_ms(self) -> int:
        """How long a STABLE member's lease lasts after a no-error heartbeat's send."""
        return min(self.session_timeout_ms, self.rebalance_timeout_ms)

    @property
    def reply_ms(self) -> int:
        """How long a heartbeat's answer may take once its hold is over."""
        slack = self.lease_ms - 2 * self.heartbeat_interval_ms
        return min(self.request_timeout_ms, max(1, slack // 2))

    @property
    def max_hold_ms(self) -> int:
        return min(self.heartbeat_interval_ms, MAX_HEARTBEAT_WAIT_MS)

    # ------------------------------------------------------------ the lease

    def end(self, anchor_ms: int, rebalance_base_ms: int | None) -> int:
        """The lease's end: a session timeout after ``anchor_ms`` and a
        rebalance timeout after ``rebalance_base_ms`` (when known)."""
        end = anchor_ms + self.session_timeout_ms
        if rebalance_base_ms is not None:
            end = min(end, rebalance_base_ms + self.rebalance_timeout_ms)
        return end

    def hold_ms(self, now_ms: int, end_ms: int | None) -> int:
        """The long-poll hold (``wait_ms``) of a heartbeat sent at ``now_ms``
        (rule 3); ``end_ms`` None: no lease to keep (not a member yet)."""
        if end_ms is None:
            return self.max_hold_ms
        return max(0, min(self.max_hold_ms, end_ms - now_ms - 2 * self.reply_ms))

    def heartbeat_timeout_ms(self, now_ms: int, hold_ms: int, end_ms: int | None) -> int:
        """How long to await the answer of a heartbeat held ``hold_ms`` (rule 2)."""
        timeout = hold_ms + self.reply_ms
        if end_ms is not None and end_ms > now_ms:
            timeout = min(timeout, end_ms - now_ms)
        return max(1, timeout)

    def retry_at(self, now_ms: int, backoff_ms: int, end_ms: int | None) -> int:
        """When to retry a failed heartbeat (rule 4): after the backoff, but
        never later than the last moment a retry can still renew the lease
        (``end - reply_ms``); past that moment, halfway to the lease's end
        (so failing at once, as a refused connection does, never spins)."""
        at = now_ms + backoff_ms
        if end_ms is None or now_ms >= end_ms:
            return at
        last_chance = end_ms - self.reply_ms
        if at <= last_chance:
            return at
        if now_ms < last_chance:
            return last_chance
        return now_ms + max(1, min(backoff_ms, (end_ms - now_ms) // 2))
