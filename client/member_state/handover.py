"""The member's side of a planned hand-over: warm-up standbys and drain
(docs/protocol.md, "Drain" and "Warm-up on the member").

:class:`Handover` holds what outlives any one state: the standby resources
the last assignment gave (to warm, never to act on), those whose warm-up
runs, those whose ``on_standby`` returned (reported ``warm`` at the next
join), and whether the member drains. The machine consults it when an
assignment arrives, when warm-ups are to start or one has ended, when it
builds a join's metadata, and before each step (a drained member leaves).

A warm-up runs beside the member's protocol steps, not on them: it may take
as long as warming takes without holding up the group's rebalances (the
driver starts it, the runtime reports its end). ``on_standby_dropped`` is a
listener callback like the others, in protocol order.

The rules it keeps:

- a resource is never owned and standby at once: what an assignment gives
  as owned (or the member still owns until ``on_revoked`` returns) is not
  standby, and a standby is never in ``owned``, so it is never in
  ``on_assigned`` and never committable;
- a standby that is no longer in the assignment, and is not owned now, is
  dropped (``on_standby_dropped``); one that becomes owned is simply in
  ``on_assigned``;
- a warm-up that failed is not reported warm, nor started again while the
  resource stays a standby (the assignor's warm-up timeout moves it);
- a draining member reports ``draining: true`` until it stops; it is
  drained once it owns nothing (with ``leave=False``, once an assignment
  answering a join that said so has been delivered: until then the group
  may still have given it something).
"""

from __future__ import annotations

from client.member_state.actions import CallbackKind, InvokeListener, Resource

__all__ = ["Handover"]


class Handover:
    """Standbys and drain, for one member (see the module docstring)."""

    __slots__ = ("_join_draining", "_last_run", "_unreported", "_warming", "confirmed",
                 "draining", "failed", "leave", "standby", "warm")

    def __init__(self) -> None:
        #: the standbys of the last assignment (never owned at the same time).
        self.standby: frozenset[Resource] = frozenset()
        #: standbys whose warm-up runs, each with the number of the warm-up
        #: (``on_standby`` call) that counts for it: an earlier call may still
        #: run for a standby dropped and offered again since, and its end says
        #: nothing of this offer; then those whose on_standby returned, or raised.
        self._warming: dict[Resource, int] = {}
        self._last_run = 0
        self.warm: frozenset[Resource] = frozenset()
        self.failed: frozenset[Resource] = frozenset()
        #: some became warm since the last rejoin asked to report them.
        self._unreported = False
        #: the member drains: its joins say ``draining``, it leaves (``leave``)
        #: or stays idle once it owns nothing.
        self.draining = False
        self.leave = True
        #: the last join built said ``draining``.
        self._join_draining = False
        #: an assignment answering a join that said ``draining`` was delivered.
        self.confirmed = False

    # ------------------------------------------------------------ standbys

    def assigned(self, owned: frozenset[Resource],
                 standby: frozenset[Resource]) -> InvokeListener | None:
        """An assignment arrived giving ``standby`` to warm; ``owned``: what the
        member owns or is given. Returns the ``on_standby_dropped`` it calls for."""
        standby = standby - owned
        dropped = self.standby - standby - owned
        self.standby = standby
        self._warming = {r: k for r, k in self._warming.items() if r in standby}
        self.warm &= standby
        self.failed &= standby
        self.confirmed = self._join_draining
        return InvokeListener(CallbackKind.STANDBY_DROPPED, dropped) if dropped else None

    def live(self, action: InvokeListener) -> InvokeListener | None:
        """An ``on_standby_dropped`` narrowed to what has not become a standby
        again meanwhile (None: nothing is left)."""
        rest = action.resources - self.standby
        if not rest:
            return None
        return action if rest == action.resources else InvokeListener(action.kind, rest)

    def start_warmups(self) -> tuple[int, frozenset[Resource]]:
        """The standbys whose warm-up is to start now (marked as running), and
        the number of that warm-up (for :meth:`warmed`)."""
        start = self.standby - frozenset(self._warming) - self.warm - self.failed
        if not start:
            return 0, start
        self._last_run += 1
        for r in start:
            self._warming[r] = self._last_run
        return self._last_run, start

    def warmed(self, run: int, resources: frozenset[Resource], *, failed: bool) -> bool:
        """Warm-up ``run``, ``on_standby(resources)``, returned (``failed``:
        raised). Only the resources it is still the warm-up of end: one
        dropped meanwhile, and offered again, waits for its new warm-up.
        Returns whether the member should rejoin to report what is warm:
        something became warm since the last report, and none of its warm-ups
        runs any more (one rebalance for a batch of warm-ups, not one each)."""
        warming = self._warming
        ended = frozenset(r for r in resources if warming.get(r) == run)
        for r in ended:
            del warming[r]
        if failed:
            self.failed |= ended
        else:
            self.warm |= ended
            self._unreported = self._unreported or bool(ended)
        if self._unreported and not self._warming:
            self._unreported = False
            return True
        return False

    def close(self) -> InvokeListener | None:
        """The member closes: every standby is dropped."""
        standby = self.standby
        self.standby = self.warm = self.failed = frozenset()
        self._warming = {}
        return InvokeListener(CallbackKind.STANDBY_DROPPED, standby) if standby else None

    # ------------------------------------------------------------ drain

    def start_drain(self, leave: bool) -> bool:
        """Drain; ``leave``: leave once drained. Returns whether it is new (a
        second call only changes ``leave`` to what it says)."""
        new = not self.draining
        self.draining = True
        self.leave = leave
        return new

    def join_built(self) -> None:
        """A join is sent with the metadata of now."""
        self._join_draining = self.draining

    def drained(self, owned: frozenset[Resource]) -> bool:
        """Draining, and done: nothing owned, and (staying) the group knows."""
        return self.draining and not owned and (self.leave or self.confirmed)
