"""The member's side of a planned hand-over: warm-up standbys and drain
(docs/protocol.md, "Drain" and "Warm-up on the member").

:class:`Handover` holds what outlives any one state: the standby resources
the last assignment gave (to warm, never to act on), those whose
``on_standby`` returned (reported ``warm`` at the next join), and whether the
member drains. The machine consults it when an assignment arrives, when a
standby callback returns, when it builds a join's metadata, and before each
step (a drained member leaves).

The rules it keeps:

- a resource is never owned and standby at once: what an assignment gives
  as owned is not standby, and a standby is never in ``owned``, so it is
  never in ``on_assigned`` and never committable;
- a standby that is no longer in the assignment, and is not owned now,
  is dropped (``on_standby_dropped``); one that becomes owned is simply
  in ``on_assigned``;
- a draining member reports ``draining: true`` until it stops; it is
  drained once it owns nothing (with ``leave=False``, once an assignment
  answering a join that said so has been delivered: until then the group
  may still have given it something).
"""

from __future__ import annotations

from dataclasses import dataclass

from client.member_state.actions import CallbackKind, InvokeListener, Resource

__all__ = ["Handover", "StandbyChange"]


@dataclass(frozen=True, slots=True)
class StandbyChange:
    """What an assignment changed about the standbys: the callbacks it calls for,
    in order (``on_standby_dropped`` first, then ``on_standby``)."""

    started: frozenset[Resource]
    dropped: frozenset[Resource]

    def callbacks(self) -> list[InvokeListener]:
        out = []
        if self.dropped:
            out.append(InvokeListener(CallbackKind.STANDBY_DROPPED, self.dropped))
        if self.started:
            out.append(InvokeListener(CallbackKind.STANDBY, self.started))
        return out


class Handover:
    """Standbys and drain, for one member (see the module docstring)."""

    __slots__ = ("_join_draining", "confirmed", "draining", "leave", "standby", "warm")

    def __init__(self) -> None:
        #: the standbys of the last assignment (never owned at the same time).
        self.standby: frozenset[Resource] = frozenset()
        #: the standbys whose ``on_standby`` returned (a subset of ``standby``).
        self.warm: frozenset[Resource] = frozenset()
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
                 standby: frozenset[Resource]) -> StandbyChange:
        """An assignment arrived giving ``owned`` to own and ``standby`` to warm."""
        standby = standby - owned
        change = StandbyChange(started=standby - self.standby,
                               dropped=self.standby - standby - owned)
        self.standby = standby
        self.warm &= standby
        self.confirmed = self._join_draining
        return change

    def live(self, action: InvokeListener) -> InvokeListener | None:
        """``action`` (a standby callback) narrowed to what it still applies to:
        an ``on_standby`` to what is still standby and not warm yet, an
        ``on_standby_dropped`` to what has not become standby again."""
        if action.kind is CallbackKind.STANDBY:
            rest = action.resources & (self.standby - self.warm)
        else:
            rest = action.resources - self.standby
        if not rest:
            return None
        return action if rest == action.resources else InvokeListener(action.kind, rest)

    def warmed(self, resources: frozenset[Resource]) -> bool:
        """``on_standby(resources)`` returned; whether some are newly warm (to
        report at a rejoin)."""
        new = (resources & self.standby) - self.warm
        self.warm |= new
        return bool(new)

    def close(self) -> InvokeListener | None:
        """The member closes: every standby is dropped."""
        standby, self.standby, self.warm = self.standby, frozenset(), frozenset()
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
