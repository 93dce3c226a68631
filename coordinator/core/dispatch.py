"""The core's behaviour by group state and event, in one table (as h11 spells a
connection's): :data:`TABLE` says, for each :class:`GroupState` and each call
or timer, which handler runs and what comes of it.

A command first finds its group (a call for a group that does not exist is
answered here, before any state: there is no row for it); then the group's
state picks the cell. The handlers are in :mod:`~coordinator.core.membership`,
:mod:`~coordinator.core.checkpoints`, :mod:`~coordinator.core.admin`,
:mod:`~coordinator.core.operations` and :mod:`~coordinator.core.timers`; the
checks every state shares (member, generation, protocol, in Kafka's order) run
inside the handler, so each cell answers exactly what Kafka would. What does
not depend on the group's state (fetch, the catalog, cancelled and released
parked calls) is dispatched by :mod:`coordinator.core.coordinator` alone.

A join is split by what it speaks for, once the checks every live state
shares have passed (:func:`membership.join_admit`): a new member
(:attr:`Event.JOIN_NEW`), a member rejoining with its id
(:attr:`Event.REJOIN`) or a known static instance with an empty member id
(:attr:`Event.STATIC_REJOIN`). A static join whose incarnation (v1.1) is the
current member's is a replay of that member's own join and runs its
:attr:`Event.REJOIN` cell; one of a process that started before the current
member's is refused ``FENCED_INSTANCE_ID`` before any cell
(:func:`membership.static_join_kind`). Cells a state can never see (an Empty group has
no member to rejoin; a Dead group refuses every join before that) run
:func:`_impossible`, which raises: a core exception stops the server rather
than serve a half-changed state.

``docs/coordinator-semantics.md`` shows :func:`render_markdown` of this table
(tests/core/test_core_dispatch_table.py keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, NamedTuple

from coordinator.core import admin, checkpoints, membership, operations, timers
from coordinator.core.commands import (
    Commit,
    DeleteGroup,
    DrainMember,
    Heartbeat,
    Join,
    Leave,
    RemoveMember,
    ResetCheckpoints,
    Sync,
    TimerFired,
)
from coordinator.core.group import Group, TimerKind
from coordinator.core.kernel import Kernel
from coordinator.core.membership import StaticJoin, join_admit, require_member_id, take_pending
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.messages import JoinResponse

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


class Call(Enum):
    """The calls whose outcome depends on the group's state (the table's call columns).

    A plain :class:`Enum`, not a ``StrEnum``: ``Call.JOIN`` and ``TimerKind.JOIN``
    spell the same word and must stay two keys of a row."""

    #: any join, before what it speaks for is known.
    JOIN = "join"
    #: a static member unknown so far, or a KIP-394 pending member rejoining with its id.
    JOIN_NEW = "join: new member"
    #: a member rejoining with its member id.
    REJOIN = "join: member id"
    #: a known static instance id with an empty member id (KIP-345).
    STATIC_REJOIN = "join: instance id"
    SYNC = "sync"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    COMMIT = "commit"
    DELETE_GROUP = "delete group"
    REMOVE_MEMBER = "remove member"
    DRAIN_MEMBER = "drain member"
    RESET = "reset checkpoints"


Event = Call | TimerKind


class Rule(NamedTuple):
    """One cell: the handler that runs, and what comes of it (for people: the docs)."""

    handler: Callable[..., Any]
    result: str


def _impossible(k: Kernel, g: Group, *args: object) -> None:
    raise AssertionError(f"group {g.group_id!r}: the state table has no such event in "
                         f"{g.state.value}")


def _join(k: Kernel, g: Group, cmd: Join) -> None:
    """A live state: the shared checks, then the cell of what the join speaks for."""
    admitted, known = join_admit(k, g, cmd)
    if not admitted:
        return
    req = cmd.request
    if not req.member_id:
        if req.group_instance_id is None:
            require_member_id(k, g, cmd)
        elif known is not None:
            kind = membership.static_join_kind(known.record, req)
            if kind is StaticJoin.TAKEOVER:
                _STATIC_REJOIN[g.state](k, g, cmd, known)
            elif kind is StaticJoin.REPLAY:
                # The current member's own process: a join of its member id.
                _REJOIN[g.state](k, g, cmd, known)
            else:
                # A process older than the current member's (it was replaced): nothing changes.
                k.reply(cmd.request_id, JoinResponse(ErrorCode.FENCED_INSTANCE_ID,
                                                     member_id=req.member_id))
        else:
            # A static member unknown so far joins at once (no MEMBER_ID_REQUIRED step).
            _JOIN_NEW[g.state](k, g, cmd, cmd.new_member_id)
        return
    member_id = req.member_id
    if member_id in g.pending and req.group_instance_id is None:
        take_pending(k, g, member_id)
        _JOIN_NEW[g.state](k, g, cmd, member_id)
        return
    error = membership.validate_member(g, member_id, req.group_instance_id)
    if error is not None:
        k.reply(cmd.request_id, JoinResponse(error, member_id=member_id))
        return
    _REJOIN[g.state](k, g, cmd, g.members[member_id])


_NEVER_JOIN = Rule(_impossible, "cannot happen: a Dead group refuses the join first")
_NO_MEMBERS = Rule(_impossible, "cannot happen: an Empty group has no members")
_STALE = Rule(timers.stale, "stale firing: ignored")
_SESSION = Rule(timers.session_expired,
                "a member parked in join or sync is re-armed; else it is removed "
                "(`session_expiry`): Stable and CompletingRebalance rebalance, "
                "PreparingRebalance re-checks its barrier")
_PENDING = Rule(timers.pending_expired,
                "the pending member is dropped; the barrier is re-checked; a vacant group "
                "is forgotten")
_HELD = Rule(timers.heartbeat_held,
             "the parked long-poll is answered without error, the session re-armed "
             "(parked only in Stable; leaving Stable answers them)")
_LEAVE = Rule(membership.leave,
              "each listed member (or pending member) removed; then one rebalance for the "
              "batch (`leave`) from Stable or CompletingRebalance, the barrier re-checked "
              "in PreparingRebalance")
_REMOVE = Rule(operations.remove_one_member,
               "the member is removed as by a session expiry (`admin_removal`)")
_DRAIN = Rule(operations.drain_member,
              "the member (by id, else instance id) is asked to drain: `drain: true` in its "
              "heartbeat answers until it rejoins draining or leaves; written with the group "
              "in Stable and CompletingRebalance")
_REFUSE_DELETE = Rule(admin.refuse_delete, "`NON_EMPTY_GROUP`")
_REFUSE_RESET = Rule(operations.refuse_reset, "`NON_EMPTY_GROUP`, naming the state")
_ADMIT_JOIN = ("checks (instance owner, `group_max_size`, protocols); a dynamic member "
               "with an empty id: `MEMBER_ID_REQUIRED`, pending (KIP-394); a known "
               "instance with an empty id: the current member's incarnation (v1.1) is "
               "its replay, the member-id cell; an older process's: "
               "`FENCED_INSTANCE_ID`, nothing changes; else one of the join cells below")

#: group state -> event -> what runs and what comes of it.
TABLE: Mapping[GroupState, Mapping[Event, Rule]] = {
    EMPTY: {
        Call.JOIN: Rule(_join, _ADMIT_JOIN),
        Call.JOIN_NEW: Rule(membership.add_to_empty,
                            "added, parked -> PreparingRebalance (`initial`), with the "
                            "initial rebalance delay"),
        Call.REJOIN: Rule(membership.rejoin_empty, "`UNKNOWN_MEMBER_ID`"),
        Call.STATIC_REJOIN: _NO_MEMBERS,
        Call.SYNC: Rule(membership.sync_refused(ErrorCode.UNKNOWN_MEMBER_ID),
                        "`UNKNOWN_MEMBER_ID`"),
        Call.HEARTBEAT: Rule(membership.heartbeat_empty, "`UNKNOWN_MEMBER_ID`"),
        Call.LEAVE: _LEAVE,
        Call.COMMIT: Rule(checkpoints.commit_gate_empty,
                          "simple commits (generation -1) accepted; else `UNKNOWN_MEMBER_ID`"),
        Call.DELETE_GROUP: Rule(admin.delete_empty_group,
                                "-> Dead, forgotten with its checkpoints (`GroupDeleted`)"),
        Call.REMOVE_MEMBER: Rule(operations.remove_one_member, "`UNKNOWN_MEMBER_ID` (none)"),
        Call.DRAIN_MEMBER: Rule(operations.drain_member, "`UNKNOWN_MEMBER_ID` (none)"),
        Call.RESET: Rule(operations.reset_empty, "checkpoints written (or a dry run)"),
        TimerKind.SESSION: _SESSION,
        TimerKind.PENDING: _PENDING,
        TimerKind.JOIN: _STALE,
        TimerKind.SYNC: _STALE,
        TimerKind.HEARTBEAT: _HELD,
        TimerKind.RETENTION: Rule(timers.retention_expired,
                                  "KIP-211: -> Dead with its checkpoints, unless renewed or "
                                  "a pending member may still join"),
    },
    PREPARING: {
        Call.JOIN: Rule(_join, _ADMIT_JOIN),
        Call.JOIN_NEW: Rule(membership.add_while_preparing,
                            "added, parked until the barrier (extends the initial delay)"),
        Call.REJOIN: Rule(membership.rejoin_preparing,
                          "metadata updated, parked until the barrier"),
        Call.STATIC_REJOIN: Rule(membership.static_rejoin_preparing,
                                 "old id fenced, new id parked until the barrier"),
        Call.SYNC: Rule(membership.sync_refused(ErrorCode.REBALANCE_IN_PROGRESS),
                        "`REBALANCE_IN_PROGRESS`"),
        Call.HEARTBEAT: Rule(membership.heartbeat_preparing,
                             "`REBALANCE_IN_PROGRESS` (the session re-armed)"),
        Call.LEAVE: _LEAVE,
        Call.COMMIT: Rule(checkpoints.commit_gate_member,
                          "accepted from the current (old) generation; session re-armed"),
        Call.DELETE_GROUP: _REFUSE_DELETE,
        Call.REMOVE_MEMBER: _REMOVE,
        Call.DRAIN_MEMBER: _DRAIN,
        Call.RESET: _REFUSE_RESET,
        TimerKind.SESSION: _SESSION,
        TimerKind.PENDING: _PENDING,
        TimerKind.JOIN: Rule(timers.join_deadline,
                             "initial delay extended while newcomers arrive; else members "
                             "without a parked join removed -> CompletingRebalance (or Empty)"),
        TimerKind.SYNC: _STALE,
        TimerKind.HEARTBEAT: _HELD,
        TimerKind.RETENTION: _STALE,
    },
    COMPLETING: {
        Call.JOIN: Rule(_join, _ADMIT_JOIN),
        Call.JOIN_NEW: Rule(membership.add_to_generation, "added -> rebalance (`join`)"),
        Call.REJOIN: Rule(membership.rejoin_completing,
                          "same metadata: the current generation at once; changed: "
                          "rebalance (`metadata_change`)"),
        Call.STATIC_REJOIN: Rule(membership.static_rejoin_completing,
                                 "old id fenced; same metadata: new id persisted, the current "
                                 "generation; changed: rebalance (`static_change`)"),
        Call.SYNC: Rule(membership.sync_completing,
                        "parked; the leader's sync stores the assignment -> Stable"),
        Call.HEARTBEAT: Rule(membership.heartbeat_completing, "no error (session re-armed)"),
        Call.LEAVE: _LEAVE,
        Call.COMMIT: Rule(checkpoints.commit_gate_completing, "`REBALANCE_IN_PROGRESS`"),
        Call.DELETE_GROUP: _REFUSE_DELETE,
        Call.REMOVE_MEMBER: _REMOVE,
        Call.DRAIN_MEMBER: _DRAIN,
        Call.RESET: _REFUSE_RESET,
        TimerKind.SESSION: _SESSION,
        TimerKind.PENDING: _PENDING,
        TimerKind.JOIN: _STALE,
        TimerKind.SYNC: Rule(timers.sync_deadline,
                             "members that did not sync removed -> rebalance (`sync_timeout`)"),
        TimerKind.HEARTBEAT: _HELD,
        TimerKind.RETENTION: _STALE,
    },
    STABLE: {
        Call.JOIN: Rule(_join, _ADMIT_JOIN),
        Call.JOIN_NEW: Rule(membership.add_to_generation, "added -> rebalance (`join`)"),
        Call.REJOIN: Rule(membership.rejoin_stable,
                          "unchanged follower: the current generation at once; the leader or "
                          "changed metadata: rebalance (`rejoin`, `metadata_change`)"),
        Call.STATIC_REJOIN: Rule(membership.static_rejoin_stable,
                                 "old id fenced; same metadata: new id persisted, the "
                                 "current generation (a leader: `skip_assignment`, KIP-814); "
                                 "changed: rebalance (`static_change`)"),
        Call.SYNC: Rule(membership.sync_stable, "the stored assignment at once"),
        Call.HEARTBEAT: Rule(membership.heartbeat_stable,
                             "no error; with `wait_ms` parked (long-poll, at most half the "
                             "session)"),
        Call.LEAVE: _LEAVE,
        Call.COMMIT: Rule(checkpoints.commit_gate_member,
                          "accepted from the current generation; session re-armed"),
        Call.DELETE_GROUP: _REFUSE_DELETE,
        Call.REMOVE_MEMBER: _REMOVE,
        Call.DRAIN_MEMBER: _DRAIN,
        Call.RESET: _REFUSE_RESET,
        TimerKind.SESSION: _SESSION,
        TimerKind.PENDING: _PENDING,
        TimerKind.JOIN: _STALE,
        TimerKind.SYNC: Rule(timers.sync_deadline,
                             "members that did not sync (after the leader's) removed -> "
                             "rebalance (`sync_timeout`)"),
        TimerKind.HEARTBEAT: _HELD,
        TimerKind.RETENTION: _STALE,
    },
    DEAD: {
        Call.JOIN: Rule(membership.join_dead, "`COORDINATOR_NOT_AVAILABLE`"),
        Call.JOIN_NEW: _NEVER_JOIN,
        Call.REJOIN: _NEVER_JOIN,
        Call.STATIC_REJOIN: _NEVER_JOIN,
        Call.SYNC: Rule(membership.sync_dead, "`COORDINATOR_NOT_AVAILABLE`"),
        Call.HEARTBEAT: Rule(membership.heartbeat_dead, "`COORDINATOR_NOT_AVAILABLE`"),
        Call.LEAVE: Rule(membership.leave_dead, "`COORDINATOR_NOT_AVAILABLE`"),
        Call.COMMIT: Rule(checkpoints.commit_gate_dead, "`COORDINATOR_NOT_AVAILABLE`"),
        Call.DELETE_GROUP: _REFUSE_DELETE,
        Call.REMOVE_MEMBER: Rule(operations.remove_member_dead, "`UNKNOWN_GROUP`"),
        Call.DRAIN_MEMBER: Rule(operations.drain_dead, "`UNKNOWN_GROUP`"),
        Call.RESET: Rule(operations.reset_dead, "`UNKNOWN_GROUP`"),
        TimerKind.SESSION: _STALE,
        TimerKind.PENDING: _STALE,
        TimerKind.JOIN: _STALE,
        TimerKind.SYNC: _STALE,
        TimerKind.HEARTBEAT: _STALE,
        TimerKind.RETENTION: _STALE,
    },
}

EVENTS: tuple[Event, ...] = (*Call, *TimerKind)


def _column(event: Event) -> dict[GroupState, Callable[..., Any]]:
    """One event's handlers by state, looked up once per command."""
    return {state: row[event].handler for state, row in TABLE.items()}


_JOIN = _column(Call.JOIN)
_JOIN_NEW = _column(Call.JOIN_NEW)
_REJOIN = _column(Call.REJOIN)
_STATIC_REJOIN = _column(Call.STATIC_REJOIN)
_SYNC = _column(Call.SYNC)
_HEARTBEAT = _column(Call.HEARTBEAT)
_LEAVE_BY_STATE = _column(Call.LEAVE)
_COMMIT_GATES: Mapping[GroupState, checkpoints.Gate] = _column(Call.COMMIT)
_DELETE = _column(Call.DELETE_GROUP)
_REMOVE_BY_STATE = _column(Call.REMOVE_MEMBER)
_DRAIN_BY_STATE = _column(Call.DRAIN_MEMBER)
_RESET = _column(Call.RESET)
_TIMERS: dict[TimerKind, dict[GroupState, timers.OnTimer]] = {
    kind: _column(kind) for kind in TimerKind}


# ---------------------------------------------------------------- the entries


def handle_join(k: Kernel, cmd: Join) -> None:
    g = membership.join_group(k, cmd)
    if g is not None:
        _JOIN[g.state](k, g, cmd)


def handle_sync(k: Kernel, cmd: Sync) -> None:
    g = k.groups.get(cmd.request.group_id)
    if g is None:
        membership.sync_unknown_group(k, cmd)
    else:
        _SYNC[g.state](k, g, cmd)


def handle_heartbeat(k: Kernel, cmd: Heartbeat) -> None:
    g = k.groups.get(cmd.request.group_id)
    if g is None:
        membership.heartbeat_unknown_group(k, cmd)
    else:
        _HEARTBEAT[g.state](k, g, cmd)


def handle_leave(k: Kernel, cmd: Leave) -> None:
    g = k.groups.get(cmd.request.group_id)
    if g is None:
        membership.leave_unknown_group(k, cmd)
    else:
        _LEAVE_BY_STATE[g.state](k, g, cmd)


def handle_commit(k: Kernel, cmd: Commit) -> None:
    checkpoints.handle_commit(k, cmd, _COMMIT_GATES)


def handle_delete_group(k: Kernel, cmd: DeleteGroup) -> None:
    g = k.groups.get(cmd.group_id)
    if g is None:
        admin.unknown_group(k, cmd.request_id)
    else:
        _DELETE[g.state](k, g, cmd)


def handle_remove_member(k: Kernel, cmd: RemoveMember) -> None:
    g = k.groups.get(cmd.group_id)
    if g is None:
        admin.unknown_group(k, cmd.request_id)
    else:
        _REMOVE_BY_STATE[g.state](k, g, cmd)


def handle_drain_member(k: Kernel, cmd: DrainMember) -> None:
    g = k.groups.get(cmd.group_id)
    if g is None:
        admin.unknown_group(k, cmd.request_id, cmd.group_id)
    else:
        _DRAIN_BY_STATE[g.state](k, g, cmd)


def handle_reset(k: Kernel, cmd: ResetCheckpoints) -> None:
    g = k.groups.get(cmd.group_id)
    if g is None:
        admin.unknown_group(k, cmd.request_id)
    else:
        _RESET[g.state](k, g, cmd)


def handle_timer(k: Kernel, cmd: TimerFired) -> None:
    found = timers.fired_target(k, cmd)
    if found is not None:
        g, target = found
        _TIMERS[target.kind][g.state](k, g, cmd.key, target)


# ---------------------------------------------------------------- the docs


def handler_name(rule: Rule) -> str:
    handler = rule.handler
    module = getattr(handler, "__module__", "").rsplit(".", 1)[-1]
    return f"{module}.{handler.__name__}"


def render_markdown() -> str:
    """The table as docs/coordinator-semantics.md shows it: one table per state."""
    lines: list[str] = []
    for state, row in TABLE.items():
        lines += [f"**{state.value}**", "", "| event | handler | result |", "|---|---|---|"]
        for event in EVENTS:
            rule = row[event]
            kind = "timer " if isinstance(event, TimerKind) else ""
            lines.append(f"| {kind}{event.value} | `{handler_name(rule)}` | {rule.result} |")
        lines.append("")
    return "\n".join(lines)
