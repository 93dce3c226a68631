"""Group states and their allowed transitions (docs/protocol.md, "Group states").

The names and the transition table are Kafka's (``GroupState.scala``). Each
state class below is documentation plus the states it may be entered from;
what the coordinator does with every call and timer while a group is in that
state is its row of the state table, :data:`coordinator.core.dispatch.TABLE`.
:func:`check_transition` is called on every state change, so a transition
missing from the table is a bug that raises before anything is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in the core, never a protocol outcome."""


class Empty:
    """No members (pending members of KIP-394 may exist); maybe checkpoints.

    - join: a dynamic member with an empty member id gets ``MEMBER_ID_REQUIRED``
      and becomes pending; a static member, or a pending member rejoining, is
      added and the group goes to PreparingRebalance (reason ``initial``) with
      the initial rebalance delay.
    - sync, heartbeat: ``UNKNOWN_MEMBER_ID`` (nobody is a member).
    - leave: pending members may leave; anyone else ``UNKNOWN_MEMBER_ID``.
    - commit: ``generation_id`` -1 is accepted (Kafka's "simple" commits);
      anything else fails member validation (``UNKNOWN_MEMBER_ID``).
    - fetch: the stored checkpoints.
    - delete (admin): allowed; the group goes Dead and is forgotten.
    """

    state = GroupState.EMPTY
    previous = frozenset({GroupState.PREPARING_REBALANCE})


class PreparingRebalance:
    """The join phase: waiting for every known member to (re)join.

    - join: parked until the phase completes: every member has a parked join
      and there is no pending member, or the rebalance timeout fired (members
      without a parked join are removed). A group that came from Empty waits
      the initial rebalance delay instead, extended while newcomers arrive.
    - sync: ``REBALANCE_IN_PROGRESS``.
    - heartbeat: ``REBALANCE_IN_PROGRESS`` (and the session is kept alive).
    - leave: members are removed; the barrier is re-checked.
    - commit: accepted from a member of the current (old) generation, so it can
      save progress before its resources move (Kafka).
    - completion: generation + 1, protocol chosen, leader kept or re-elected,
      record persisted, every parked join answered -> CompletingRebalance; or
      -> Empty when no member is left.
    """

    state = GroupState.PREPARING_REBALANCE
    previous = frozenset({GroupState.EMPTY, GroupState.STABLE,
                          GroupState.COMPLETING_REBALANCE})


class CompletingRebalance:
    """The sync phase: the generation is formed, waiting for the leader's assignment.

    - join: same metadata -> the current generation's answer at once (the
      member may have missed it); changed metadata or a new member -> rebalance.
      A known static member rejoining with the same metadata gets a new member
      id without a rebalance.
    - sync: parked; the leader's sync stores the assignment (persisted) and
      answers every parked sync -> Stable. Members that have not synced when
      the sync deadline (rebalance timeout) fires are removed and the group
      rebalances.
    - heartbeat: no error (the member is between its join and its sync).
    - leave, session expiry: rebalance; parked syncs get ``REBALANCE_IN_PROGRESS``.
    - commit: ``REBALANCE_IN_PROGRESS`` (Kafka: no commits before the assignment).
    """

    state = GroupState.COMPLETING_REBALANCE
    previous = frozenset({GroupState.PREPARING_REBALANCE})


class Stable:
    """A generation with its assignment.

    - join: the leader rejoining, a follower with changed metadata, or a new
      member -> rebalance; a follower with the same metadata gets the current
      generation at once; a known static member with the same metadata gets a
      new member id, no rebalance (KIP-345, KIP-814 ``skip_assignment``).
    - sync: the stored assignment at once.
    - heartbeat: no error; with ``wait_ms`` it is parked (long-poll) and
      answered early when a rebalance starts, the member is removed or fenced,
      or the resources epoch moves.
    - leave, session expiry, sync deadline: rebalance.
    - commit: accepted from a member of the current generation.
    """

    state = GroupState.STABLE
    previous = frozenset({GroupState.COMPLETING_REBALANCE})


class Dead:
    """The group is being deleted (admin delete of an Empty group, an Empty
    group whose retention expired -- ``--group-retention-ms``, KIP-211 -- or an
    Empty group that never formed a generation and holds nothing durable).

    A Dead group is removed from memory in the same ``handle`` call, so calls
    find no group (``UNKNOWN_MEMBER_ID``); were one to see it, join, sync,
    heartbeat, leave and commit answer ``COORDINATOR_NOT_AVAILABLE`` as Kafka's
    does. Kafka also moves loaded groups to Dead when their partition moves to
    another broker; a single coordinator never unloads, so here only Empty
    groups die.
    """

    state = GroupState.DEAD
    previous = frozenset({GroupState.EMPTY})


STATES = (Empty, PreparingRebalance, CompletingRebalance, Stable, Dead)

#: state -> the states it may be entered from.
VALID_PREVIOUS: Mapping[GroupState, frozenset[GroupState]] = {
    cls.state: cls.previous for cls in STATES
}


def check_transition(group_id: str, old: GroupState, new: GroupState) -> None:
    if old not in VALID_PREVIOUS[new]:
        raise IllegalTransition(f"group {group_id!r}: {old} -> {new} is not a valid transition")
