"""The rebalance listener a worker implements (KIP-429's ConsumerRebalanceListener).

Every method may be a plain function or a coroutine function; the member
awaits what it returns. Callbacks run in the member's driver task, one at a
time, in protocol order, and the member takes the next protocol step only
after the callback returned: ``on_revoked`` finishing *is* the hand-over
(the new owner gets the resources only afterwards). While a coroutine
callback awaits, the member keeps heartbeating, so its session does not run
out; a rebalance the group starts meanwhile still waits for it at most the
rebalance timeout, and a plain-function callback blocks the heartbeats (start
and stop work from callbacks; do the work elsewhere). An exception in a
callback is logged and counted (``groupcoord_client_callback_errors_total``),
never fatal to the member.

Order (KIP-429, "ConsumerRebalanceListener and ConsumerPartitionAssignor
Semantics"):

- eager: ``on_revoked(everything)`` before each join, then
  ``on_assigned(everything new)`` after the sync;
- cooperative: ``on_revoked(only what moves away)`` after the sync (and
  then a follow-up rebalance), then ``on_assigned(only what was added)`` on
  every completed rebalance, possibly with an empty set;
- both: ``on_lost(everything)`` when the member learns it is no longer in the
  group (a stale generation, an unknown member id, no heartbeat for a session
  timeout, a fatal error) -- the resources may already belong to someone else,
  so do not commit for them.

Standbys (v1.2; only an assignor that warms up, ``balanced`` with
``warmup``, gives them): ``on_standby(resources)`` for resources the member
will probably be given soon -- load their state, fill caches, never act on
them (they are not owned, not in ``assignment``, not committable). It runs
beside the protocol steps, not as one of them (it may overlap the other
callbacks): an async ``on_standby`` may take as long as warming takes, and
the member goes on heartbeating and rebalancing meanwhile (a plain function
blocks the event loop like any other callback). When it returns the member
reports them warm and rejoins (cooperatively), and the assignor moves them;
when it raises they are not reported warm. ``on_standby_dropped(resources)``
(a callback in protocol order) when standbys are no longer wanted and not
owned (a standby that becomes owned is in ``on_assigned`` instead), and
when the member closes; it may come while their ``on_standby`` still runs.
The defaults do nothing, so a member reports its standbys warm at once.
"""


from __future__ import annotations

from collections.abc import Awaitable

__all__ = ["RebalanceListener", "Resource"]

Resource = tuple[str, int]


class RebalanceListener:
    """Base class with do-nothing callbacks; override what you need."""

    def on_assigned(self, resources: set[Resource]) -> Awaitable[None] | None:
        """Start processing ``resources`` (newly owned)."""
        return None

    def on_revoked(self, resources: set[Resource]) -> Awaitable[None] | None:
        """Stop processing ``resources`` and commit their checkpoints; they are
        still owned while this runs."""
        return None

    def on_lost(self, resources: set[Resource]) -> Awaitable[None] | None:
        """Stop processing ``resources`` at once; they are no longer owned."""
        return None

    def on_standby(self, resources: set[Resource]) -> Awaitable[None] | None:
        """Warm ``resources`` up (load state, fill caches) without acting on
        them; return when they are warm."""
        return None

    def on_standby_dropped(self, resources: set[Resource]) -> Awaitable[None] | None:
        """Forget the warm-up of ``resources``: no longer wanted as standbys."""
        return None
