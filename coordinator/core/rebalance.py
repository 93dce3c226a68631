"""A group's rebalance life cycle (Kafka's prepareRebalance / onCompleteJoin / propagateAssignment).

Functions of ``(kernel, group, ...)`` shared by the call handlers and the timer
handlers: starting a rebalance, the join barrier, forming a generation,
storing the leader's assignment, removing and replacing members.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.core.effects import RebalanceCompleted
from coordinator.core.group import Group, Member, TimerKind
from coordinator.core.kernel import Kernel, TimerTarget
from coordinator.core.records import JournalEntry, journal_member
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.messages import JoinMember, JoinResponse, SyncAssignment, SyncResponse

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE


def maybe_prepare_rebalance(k: Kernel, g: Group, reason: str) -> None:
    """Start a rebalance unless one is already in its join phase (Kafka's ``canRebalance``)."""
    if g.state in (EMPTY, STABLE, COMPLETING):
        prepare_rebalance(k, g, reason)


def prepare_rebalance(k: Kernel, g: Group, reason: str) -> None:
    """Enter PreparingRebalance and arm the join deadline."""
    if g.state is COMPLETING:
        # The generation will never get its assignment: parked syncs must rejoin.
        for member in g.members.values():
            k.answer_sync(member, k.sync_error(ErrorCode.REBALANCE_IN_PROGRESS))
    elif g.state is STABLE:
        # Long-polling heartbeats learn of the rebalance at once (docs/protocol.md,
        # "POST /v1/heartbeat").
        for member in g.members.values():
            if member.heartbeats:
                k.answer_heartbeats(member, ErrorCode.REBALANCE_IN_PROGRESS)
    clear_sync_deadline(k, g)
    # The journal records why an episode started: a rebalance restarted from
    # CompletingRebalance continues the episode that left Stable/Empty.
    if g.state in (EMPTY, STABLE) or g.rebalance_reason is None:
        g.rebalance_reason = reason
        g.rebalance_started_ms = k.now
    from_empty = g.state is EMPTY
    g.rebalance_timeout_ms = rebalance_timeout(k, g)
    k.transition(g, PREPARING, reason)
    delay = k.config.initial_rebalance_delay_ms
    if from_empty and delay > 0:
        # Kafka's InitialDelayedJoin: wait `delay` for more joiners, extended by
        # `delay` (at most) each time a newcomer arrived, within the rebalance timeout.
        g.initial_delay_remaining_ms = max(g.rebalance_timeout_ms - delay, 0)
        g.new_member_added = False
        set_join_deadline(k, g, k.now + delay)
    else:
        g.initial_delay_remaining_ms = None
        set_join_deadline(k, g, k.now + g.rebalance_timeout_ms)


def rebalance_timeout(k: Kernel, g: Group) -> int:
    """The group's rebalance timeout (Kafka: its members' largest), within
    ``max_rebalance_timeout_ms``: a join asking more is refused, and a member
    restored from before a lower limit was set is held no longer either."""
    return min(g.max_rebalance_timeout(), k.config.max_rebalance_timeout_ms)


def set_join_deadline(k: Kernel, g: Group, deadline_ms: int) -> None:
    g.join_deadline_ms = deadline_ms
    k.arm(g.join_key, deadline_ms, TimerTarget(TimerKind.JOIN, g.group_id))


def clear_sync_deadline(k: Kernel, g: Group) -> None:
    g.pending_sync.clear()
    g.sync_deadline_ms = None
    k.disarm(g.sync_key)


def maybe_complete_join(k: Kernel, g: Group) -> None:
    """The join barrier: all members rejoined, none pending (not during the initial delay)."""
    if g.state is PREPARING and g.initial_delay_remaining_ms is None and g.all_joined():
        complete_join(k, g)


def complete_join(k: Kernel, g: Group) -> None:
    """Form the next generation from the members that rejoined (Kafka's ``onCompleteJoin``)."""
    k.disarm(g.join_key)
    g.join_deadline_ms = None
    g.initial_delay_remaining_ms = None
    for member in [m for m in g.members.values() if m.join_request is None]:
        remove_member(k, g, member, ErrorCode.UNKNOWN_MEMBER_ID)
    g.generation_id += 1
    if not g.members:
        g.protocol_name = None
        g.leader = None
        g.rebalance_reason = None
        k.transition(g, EMPTY, "all_members_left")
        k.persist(g.to_record())
        return
    g.protocol_name = g.select_protocol()
    if g.leader not in g.members:
        # Keep the previous leader if it rejoined, else the longest-standing member.
        g.leader = next(iter(g.members))
    g.previous_generation_members = g.generation_members
    g.generation_members = tuple(g.members)
    g.replaced.clear()
    for member in g.members.values():
        member.set_assignment(None)
    k.transition(g, COMPLETING, "join_complete")
    k.persist(g.to_record())
    protocol = g.protocol_name
    leader_view = tuple(JoinMember(m.member_id, m.record.group_instance_id,
                                   m.metadata_for(protocol))
                        for m in g.members.values())
    for member in g.members.values():
        k.answer_join(g, member, JoinResponse(
            None, g.generation_id, g.protocol_type, protocol, g.leader, member.member_id,
            leader_view if member.member_id == g.leader else ()))
        k.arm_session(g, member)
    # Sync deadline (Kafka 3.x pending-sync expiry): whoever has not synced
    # within the rebalance timeout is removed, so the group cannot hang here.
    g.pending_sync = set(g.members)
    g.rebalance_timeout_ms = rebalance_timeout(k, g)
    g.sync_deadline_ms = k.now + g.rebalance_timeout_ms
    k.arm(g.sync_key, g.sync_deadline_ms, TimerTarget(TimerKind.SYNC, g.group_id))


def current_generation_reply(g: Group, member: Member, *, skip_assignment: bool = False,
                             with_members: bool | None = None) -> JoinResponse:
    """A join answered at once with the generation in place (Kafka: rejoin without a change)."""
    protocol = g.protocol_name
    leader_view: tuple[JoinMember, ...] = ()
    show = member.member_id == g.leader if with_members is None else with_members
    if show and protocol is not None:
        leader_view = tuple(JoinMember(m.member_id, m.record.group_instance_id,
                                       m.metadata_for(protocol))
                            for m in g.members.values())
    return JoinResponse(None, g.generation_id, g.protocol_type, protocol, g.leader or "",
                        member.member_id, leader_view, skip_assignment)


def complete_sync(k: Kernel, g: Group, assignments: tuple[SyncAssignment, ...]) -> None:
    """The leader's assignment arrived: persist it, journal it, answer every parked sync."""
    given: dict[str, bytes] = {}
    for entry in assignments:
        member_id = g.replaced.get(entry.member_id, entry.member_id)
        if member_id in g.members:
            given[member_id] = entry.assignment
    for member in g.members.values():
        # docs/protocol.md, "POST /v1/sync": a member missing from the leader's list
        # gets an empty assignment.
        member.set_assignment(given.get(member.member_id, b""))
    k.transition(g, STABLE, "assignment_received")
    k.persist(g.to_record())
    current = tuple(g.members)
    previous = set(g.previous_generation_members)
    now_set = set(current)
    started = g.rebalance_started_ms
    k.persist(JournalEntry(
        g.group_id, g.generation_id, g.protocol_type, g.protocol_name, g.leader,
        tuple(journal_member(m.record) for m in g.members.values()),
        tuple(mid for mid in current if mid not in previous),
        tuple(mid for mid in g.previous_generation_members if mid not in now_set),
        g.rebalance_reason or "join", started, k.now,
        {m.member_id: m.assignment or b"" for m in g.members.values()}))
    k.emit(RebalanceCompleted(g.group_id, g.generation_id, k.now - started, len(g.members)))
    g.rebalance_reason = None
    for member in g.members.values():
        if member.sync_request is not None:
            k.answer_sync(member, SyncResponse(None, g.protocol_type, g.protocol_name,
                                               member.assignment or b"", k.resources_epoch))
            k.arm_session(g, member)
    if not g.pending_sync:
        clear_sync_deadline(k, g)


def remove_member(k: Kernel, g: Group, member: Member, error: ErrorCode) -> None:
    """Drop a member: its parked calls get ``error``, its timer is cancelled.

    The caller decides what the group does next (:func:`after_removal`).
    """
    k.answer_all_parked(g, member, error)
    g.detach(member)
    k.disarm(member.session_key)


def after_removal(k: Kernel, g: Group, reason: str) -> None:
    """Kafka's ``removeMemberAndUpdateGroup`` tail: rebalance, or re-check the barrier."""
    if g.state in (STABLE, COMPLETING):
        prepare_rebalance(k, g, reason)
    maybe_complete_join(k, g)


def replace_static_member(k: Kernel, g: Group, old: Member, new_member_id: str) -> Member:
    """KIP-345: a known instance id rejoined with an empty member id; fence the old id.

    The new member inherits the old one's place, protocols, assignment and
    leadership. The old id's parked calls are answered ``FENCED_INSTANCE_ID``.
    """
    k.answer_all_parked(g, old, ErrorCode.FENCED_INSTANCE_ID)
    new = Member.of(g.group_id, replace(old.record, member_id=new_member_id))
    g.replace_member_id(old, new)
    k.disarm(old.session_key)
    return new
