"""The membership calls: join, sync, heartbeat, leave (docs/protocol.md, "Calls").

The handlers here are the cells of the state table
(:mod:`coordinator.core.dispatch`, which picks one by the group's state and
the call) plus the checks every state shares. Together they follow Kafka's
``GroupCoordinator.handle*`` (3.x) check for check, in the same order, so a
client sees the same error Kafka would give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from enum import Enum

from coordinator.core.commands import Heartbeat, Join, Leave, ReleaseHeartbeat, Sync
from coordinator.core.group import Group, Member
from coordinator.core.kernel import Kernel
from coordinator.core.rebalance import (
    after_removal,
    clear_sync_deadline,
    complete_sync,
    current_generation_reply,
    maybe_complete_join,
    prepare_rebalance,
    remove_member,
    replace_static_member,
)
from coordinator.core.records import MemberRecord
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    LeaveMemberResult,
    LeaveResponse,
    SyncResponse,
)
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import MemberMetadata
from protocol.resources import reports_draining as metadata_reports_draining
from protocol.validate import ValidationError

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


def owns_instance(member: Member, principal: str | None) -> bool:
    """May the caller ``principal`` (a token name; ``None``: authentication off) act
    for the static ``member`` by its instance id alone (a join with an empty member
    id, a leave by instance id)? Only the token that created the instance may; an
    instance created with authentication off (no owner) may be claimed by anyone."""
    owner = member.record.owner
    return principal is None or owner is None or owner == principal


def validate_member(g: Group, member_id: str, instance_id: str | None) -> ErrorCode | None:
    """Kafka's ``validateCurrentMember``: the instance id (if any) maps to ``member_id``,
    which is a member."""
    if instance_id is not None:
        current = g.static_members.get(instance_id)
        if current is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if current != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        return None
    return None if member_id in g.members else ErrorCode.UNKNOWN_MEMBER_ID


# ---------------------------------------------------------------- join


def join_group(k: Kernel, cmd: Join) -> Group | None:
    """The checks before any group state: session and rebalance timeout bounds, the
    group (created by a join with an empty member id, within the limits). ``None``:
    answered."""
    req = cmd.request
    rid = cmd.request_id
    cfg = k.config
    if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
        k.reply(rid, JoinResponse(
            ErrorCode.INVALID_SESSION_TIMEOUT, member_id=req.member_id,
            message=f"session_timeout_ms {req.session_timeout_ms} is outside this "
                    f"coordinator's allowed range {cfg.min_session_timeout_ms} to "
                    f"{cfg.max_session_timeout_ms} ms (its --min-session-timeout-ms and "
                    f"--max-session-timeout-ms)"))
        return None
    if req.rebalance_timeout_ms > cfg.max_rebalance_timeout_ms:
        # How long a parked join (and sync) may be held: bounded, so parked calls
        # drain and a limit they fill frees up. Kafka has no such bound and no
        # error code for it: INVALID_REQUEST (a 400) naming the field and the
        # range, as for any out-of-range field; nothing changes.
        k.reply(rid, JoinResponse(
            ErrorCode.INVALID_REQUEST, member_id=req.member_id,
            message=f"rebalance_timeout_ms: {req.rebalance_timeout_ms} is over the server's "
                    f"--max-rebalance-timeout-ms ({cfg.max_rebalance_timeout_ms}); allowed: "
                    f"0 to {cfg.max_rebalance_timeout_ms}"))
        return None
    g = k.groups.get(req.group_id)
    if g is not None:
        return g
    # Kafka: only a join with an empty member id creates the group.
    if req.member_id:
        k.reply(rid, JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id=req.member_id))
        return None
    if k.at_group_limit():
        # --max-groups: nothing is created; the client retries with backoff.
        k.refuse(rid, req.group_id, "max_groups",
                 JoinResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id))
        return None
    if k.over_group_quota(cmd.principal):
        # --max-groups-per-token: the same answer, for this token only.
        k.refuse(rid, req.group_id, "max_groups_per_token",
                 JoinResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id))
        return None
    return k.create_group(req.group_id, cmd.principal)


def join_dead(k: Kernel, g: Group, cmd: Join) -> None:
    k.reply(cmd.request_id, JoinResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                         member_id=cmd.request.member_id))


def join_admit(k: Kernel, g: Group, cmd: Join) -> tuple[bool, Member | None]:
    """The member this join speaks for, if the group knows it (by id, or by
    instance id), and whether the join passes the checks every live state
    shares (instance ownership, ``group_max_size``, protocols); a refused join
    is answered."""
    req = cmd.request
    rid = cmd.request_id
    known: Member | None
    if req.member_id:
        known = g.members.get(req.member_id)
    elif req.group_instance_id is not None:
        known = g.members.get(g.static_members.get(req.group_instance_id, ""))
    else:
        known = None
    if not req.member_id and known is not None and not owns_instance(known, cmd.principal):
        # Another token's static instance: no takeover, nothing changes.
        k.reply(rid, JoinResponse(ErrorCode.FENCED_INSTANCE_ID, member_id=req.member_id))
        return False, known
    same = known is not None and req.member_id and known.member_id == req.member_id
    last = known.record.join_sequence if known is not None else None
    if same and req.sequence is not None and last is not None and req.sequence <= last:
        # Sent before a join of this member that was already applied, and
        # delayed on the way (the member gave up on it, joined again and may
        # own an assignment since): applied now, it would count as the
        # member's rejoin -- for an eager member, as its word that it owns
        # nothing -- and a rebalance could give away what the member still
        # holds under a live lease. Not applied; the answer (which only a
        # closed connection would read) asks for a rejoin (docs/coordinator-semantics.md,
        # "The join sequence").
        k.reply(rid, JoinResponse(ErrorCode.REBALANCE_IN_PROGRESS, member_id=req.member_id))
        return False, known
    if not _accept_joining(k, g, known):
        _refuse_full(k, g, known, req.member_id, rid)
        return False, known
    if not g.supports(req.protocol_type, req.protocols, known):
        k.reply(rid, JoinResponse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=req.member_id))
        k.forget_if_vacant(g)
        return False, known
    if same and req.sequence is not None and known is not None:
        g.update_member(known, replace(known.record, join_sequence=req.sequence))
    return True, known


def _accept_joining(k: Kernel, g: Group, known: Member | None) -> bool:
    """Kafka's ``acceptJoiningMember`` (group_max_size); a known static instance counts
    as the member it replaces, so a full group still lets it come back."""
    limit = k.config.group_max_size
    if limit <= 0 or g.state in (EMPTY, DEAD):
        return True
    if g.state is PREPARING:
        # Counting rejoined members (not all members) lets newcomers displace
        # members that did not rejoin, as Kafka does.
        return (known is not None and known.join_request is not None) or \
            g.num_awaiting_join < limit
    return known is not None or len(g.members) < limit


def _refuse_full(k: Kernel, g: Group, known: Member | None, member_id: str, rid: int) -> None:
    if known is not None:
        remove_member(k, g, known, ErrorCode.GROUP_MAX_SIZE_REACHED)
        after_removal(k, g, "leave")
    elif member_id in g.pending:
        take_pending(k, g, member_id)
        maybe_complete_join(k, g)
    k.reply(rid, JoinResponse(ErrorCode.GROUP_MAX_SIZE_REACHED))
    k.forget_if_vacant(g)


def take_pending(k: Kernel, g: Group, member_id: str) -> None:
    """A KIP-394 pending member joins, leaves or is refused: it is pending no more."""
    k.drop_pending(g, member_id)


def require_member_id(k: Kernel, g: Group, cmd: Join) -> None:
    """KIP-394 (any live state): a dynamic member with an empty member id gets
    one minted now, and only counts once it rejoins with it; until then it is
    pending and expires after its session timeout."""
    new_id = cmd.new_member_id
    deadline = k.now + cmd.request.session_timeout_ms
    k.add_pending(g, new_id, deadline)
    k.reply(cmd.request_id, JoinResponse(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_id))


# -- a member joins the group (a new static member, or a pending one rejoining)


def _add_member(k: Kernel, g: Group, cmd: Join, member_id: str) -> Member:
    req = cmd.request
    member = Member.of(g.group_id, MemberRecord(
        member_id, req.group_instance_id, req.client_id or "", cmd.client_host,
        req.session_timeout_ms, req.rebalance_timeout_ms, req.protocols,
        owner=cmd.principal if req.group_instance_id is not None else None,
        incarnation=req.incarnation, incarnation_ms=req.incarnation_ms))
    g.add_member(member, req.protocol_type)
    k.park_join(g, member, cmd.request_id, cmd.principal)
    k.arm_session(g, member)
    return member


def add_to_empty(k: Kernel, g: Group, cmd: Join, member_id: str) -> None:
    _add_member(k, g, cmd, member_id)
    prepare_rebalance(k, g, "initial")
    maybe_complete_join(k, g)


def add_while_preparing(k: Kernel, g: Group, cmd: Join, member_id: str) -> None:
    _add_member(k, g, cmd, member_id)
    if g.initial_delay_remaining_ms is not None:
        g.new_member_added = True
    maybe_complete_join(k, g)


def add_to_generation(k: Kernel, g: Group, cmd: Join, member_id: str) -> None:
    """CompletingRebalance or Stable: a newcomer starts a rebalance."""
    _add_member(k, g, cmd, member_id)
    prepare_rebalance(k, g, "join")
    maybe_complete_join(k, g)


# -- a member rejoins with its member id


def _changed(member: Member, cmd: Join) -> bool:
    return member.record.protocols != cmd.request.protocols


def _rejoin_and_rebalance(k: Kernel, g: Group, cmd: Join, member: Member, reason: str) -> None:
    _update_member(g, member, cmd)
    k.park_join(g, member, cmd.request_id, cmd.principal)
    prepare_rebalance(k, g, reason)
    maybe_complete_join(k, g)


def _keep_join_sequence(k: Kernel, g: Group, cmd: Join) -> None:
    """A join answered from the current generation, with no group write of
    its own: the join sequence it advanced is written now (answered once it
    is durable), so a join the member gave up on before this one, delayed
    past a restart of the coordinator, is still refused (simulator seed
    6342355)."""
    if cmd.request.sequence is not None:
        k.persist(g.to_record())


def rejoin_empty(k: Kernel, g: Group, cmd: Join, member: Member) -> None:
    k.reply(cmd.request_id, JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID,
                                         member_id=cmd.request.member_id))


def rejoin_preparing(k: Kernel, g: Group, cmd: Join, member: Member) -> None:
    _update_member(g, member, cmd)
    k.park_join(g, member, cmd.request_id, cmd.principal)
    maybe_complete_join(k, g)


def rejoin_completing(k: Kernel, g: Group, cmd: Join, member: Member) -> None:
    if not _changed(member, cmd):
        # The member may have missed its join answer: give it again.
        _keep_join_sequence(k, g, cmd)
        k.reply(cmd.request_id, current_generation_reply(g, member))
        k.arm_session(g, member)
    else:
        _rejoin_and_rebalance(k, g, cmd, member, "metadata_change")


def rejoin_stable(k: Kernel, g: Group, cmd: Join, member: Member) -> None:
    changed = _changed(member, cmd)
    if not changed and member.member_id != g.leader:
        _keep_join_sequence(k, g, cmd)
        k.reply(cmd.request_id, current_generation_reply(g, member, with_members=False))
        k.arm_session(g, member)
    else:
        # Kafka: the leader rejoining forces a rebalance (how it reacts to
        # changes the metadata does not show, e.g. the resources epoch).
        _rejoin_and_rebalance(k, g, cmd, member, "metadata_change" if changed else "rejoin")


# -- KIP-345: a known instance id comes back with an empty member id


class StaticJoin(Enum):
    """What a join with an empty member id and a known instance id is, by the
    incarnations (v1.1; docs/coordinator-semantics.md, "Incarnations")."""

    #: the current member's own process again (a join it re-sent, or one delayed on
    #: the network): a join of the current member id; nothing is fenced.
    REPLAY = "replay"
    #: a process that started before the current member's: it was replaced, and is
    #: refused ``FENCED_INSTANCE_ID``; nothing changes.
    SUPERSEDED = "superseded"
    #: another process (or no incarnation on either side): Kafka's rule, the old
    #: member id fenced and a new one given.
    TAKEOVER = "takeover"


def static_join_kind(current: MemberRecord, req: JoinRequest) -> StaticJoin:
    """Compare a static join's incarnation with the current member's."""
    if req.incarnation is None or current.incarnation is None:
        return StaticJoin.TAKEOVER
    if req.incarnation == current.incarnation:
        return StaticJoin.REPLAY
    if (req.incarnation_ms is not None and current.incarnation_ms is not None
            and req.incarnation_ms < current.incarnation_ms):
        return StaticJoin.SUPERSEDED
    return StaticJoin.TAKEOVER


def _static_takeover(k: Kernel, g: Group, cmd: Join, old: Member) -> tuple[Member, bool]:
    """Fence the old member id and give the instance a new one; whether its
    subscription changed."""
    req = cmd.request
    changed = subscription_changed(req.protocol_type, old.record.protocols, req.protocols)
    member = replace_static_member(k, g, old, cmd.new_member_id)
    # The instance is the new process's now (a v1 client's join: no incarnation),
    # and so is the join sequence: a new process counts its joins from its own
    # start, and the old process's count would refuse them as late (simulator
    # seed 8024833).
    member.record = replace(member.record, incarnation=req.incarnation,
                            incarnation_ms=req.incarnation_ms, join_sequence=req.sequence)
    if member.record.owner is None:
        # An instance from before authentication was on: the first token claims it.
        member.record = replace(member.record, owner=cmd.principal)
    _update_member(g, member, cmd)
    k.arm_session(g, member)
    return member, changed


def static_rejoin_preparing(k: Kernel, g: Group, cmd: Join, old: Member) -> None:
    member, _ = _static_takeover(k, g, cmd, old)
    k.park_join(g, member, cmd.request_id, cmd.principal)
    maybe_complete_join(k, g)


def _static_rejoin_formed(k: Kernel, g: Group, cmd: Join, old: Member) -> Member | None:
    """The same metadata: no rebalance, the new member returned (the caller
    answers); changed: a rebalance, ``None``."""
    member, changed = _static_takeover(k, g, cmd, old)
    if changed:
        k.park_join(g, member, cmd.request_id, cmd.principal)
        prepare_rebalance(k, g, "static_change")
        maybe_complete_join(k, g)
        return None
    # Same metadata: no rebalance. The new member id must be durable before the
    # member uses it (a restart would otherwise not know it).
    k.persist(g.to_record())
    return member


def static_rejoin_completing(k: Kernel, g: Group, cmd: Join, old: Member) -> None:
    member = _static_rejoin_formed(k, g, cmd, old)
    if member is not None:
        # The leader's assignment for the old id will reach the new one
        # (Group.replaced); a returning leader must assign.
        k.reply(cmd.request_id, current_generation_reply(g, member))


def static_rejoin_stable(k: Kernel, g: Group, cmd: Join, old: Member) -> None:
    member = _static_rejoin_formed(k, g, cmd, old)
    if member is not None:
        # KIP-814: a returning leader gets the members but must not reassign.
        k.reply(cmd.request_id, current_generation_reply(
            g, member, skip_assignment=member.member_id == g.leader))


def subscription_changed(protocol_type: str, old: tuple[tuple[str, bytes], ...],
                         new: tuple[tuple[str, bytes], ...]) -> bool:
    """Whether a returning static member's subscription differs (KIP-345).

    Metadata is opaque, so in general any byte difference counts. For the
    embedded ``"resources"`` protocol the ``owned`` resources and their
    ``generation`` are ownership claims, not subscription: a restarted worker
    always comes back owning nothing, and counting that as a change would turn
    every static restart into a rebalance, the very thing static membership
    avoids. So are the ``load`` measured on what it owns, and the ``warm``
    standbys it had (a restart has none: the hand-over waits, as after any
    loss of warmth). What an assignor places by is compared: the protocol
    names, ``sets``, ``rack``, ``user_data``, ``capacity`` (unset is 1.0),
    ``draining``, and standbys newly ``warm`` (a hand-over can finish);
    undecodable metadata counts as changed.
    """
    if old == new:
        return False
    if protocol_type != RESOURCES or [n for n, _ in old] != [n for n, _ in new]:
        return True
    try:
        for (_, old_meta), (_, new_meta) in zip(old, new, strict=True):
            a, b = MemberMetadata.decode(old_meta), MemberMetadata.decode(new_meta)
            if _placed_by(a) != _placed_by(b):
                return True
            if any(set(idx) - set(a.warm.get(name, ())) for name, idx in b.warm.items()):
                return True
    except ValidationError:
        return True
    return False


def _placed_by(m: MemberMetadata) -> tuple[object, ...]:
    """What of a static member's subscription its assignor places by, but
    its claims (owned, generation, load) and its warm standbys."""
    capacity = 1.0 if m.capacity is None else m.capacity
    # Empty user_data is none: an assignor clears its echo with it (balanced,
    # once its hand-overs are over), and a restarted process sends none.
    return (sorted(m.sets), m.rack, m.user_data or None, capacity, m.draining)


def _update_member(g: Group, member: Member, cmd: Join) -> None:
    req = cmd.request
    record = replace(
        member.record, protocols=req.protocols, session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms, client_id=req.client_id or "",
        client_host=cmd.client_host)
    if record.drain_requested_ms is not None and reports_draining(g, record):
        # The member heard the operator: it drains now, nothing more to ask.
        record = replace(record, drain_requested_ms=None)
    g.update_member(member, record)


def reports_draining(g: Group, record: MemberRecord) -> bool:
    """Does the member's metadata say ``draining: true`` (v1.2)? Read from the
    metadata for the group's protocol, else (none chosen yet) its first one."""
    if g.protocol_type != RESOURCES or not record.protocols:
        return False
    metadata = next((data for name, data in record.protocols if name == g.protocol_name),
                    record.protocols[0][1])
    return metadata_reports_draining(metadata)


# ---------------------------------------------------------------- sync


def sync_unknown_group(k: Kernel, cmd: Sync) -> None:
    k.reply(cmd.request_id, k.sync_error(ErrorCode.UNKNOWN_MEMBER_ID))


def sync_dead(k: Kernel, g: Group, cmd: Sync) -> None:
    k.reply(cmd.request_id, k.sync_error(ErrorCode.COORDINATOR_NOT_AVAILABLE))


def _sync_member(k: Kernel, g: Group, cmd: Sync) -> Member | None:
    """The checks every live state shares: member, generation, protocol; a
    failed check is answered (``None``)."""
    req = cmd.request
    error = validate_member(g, req.member_id, req.group_instance_id)
    if error is None and req.generation_id != g.generation_id:
        error = ErrorCode.ILLEGAL_GENERATION
    if error is None and (
            (req.protocol_type is not None and req.protocol_type != g.protocol_type)
            or (req.protocol_name is not None and req.protocol_name != g.protocol_name)):
        error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    if error is not None:
        k.reply(cmd.request_id, k.sync_error(error))
        return None
    return g.members[req.member_id]


def sync_refused(error: ErrorCode) -> Callable[[Kernel, Group, Sync], None]:
    """A state without a generation to sync to: the shared checks, then ``error``."""
    def refuse(k: Kernel, g: Group, cmd: Sync) -> None:
        if _sync_member(k, g, cmd) is not None:
            k.reply(cmd.request_id, k.sync_error(error))
    refuse.__name__ = refuse.__qualname__ = f"sync_refused({error.name})"
    return refuse


def sync_completing(k: Kernel, g: Group, cmd: Sync) -> None:
    member = _sync_member(k, g, cmd)
    if member is None:
        return
    k.park_sync(g, member, cmd.request_id, cmd.principal)
    g.pending_sync.discard(member.member_id)
    if member.member_id == g.leader:
        complete_sync(k, g, cmd.request.assignments)


def sync_stable(k: Kernel, g: Group, cmd: Sync) -> None:
    """The stored assignment (also what a member re-sending its sync after a
    coordinator restart gets, docs/protocol.md, "Durability")."""
    member = _sync_member(k, g, cmd)
    if member is None:
        return
    g.pending_sync.discard(member.member_id)
    if not g.pending_sync and g.sync_deadline_ms is not None:
        clear_sync_deadline(k, g)
    k.reply(cmd.request_id, SyncResponse(None, g.protocol_type, g.protocol_name,
                                         member.assignment or b"", k.resources_epoch))
    k.arm_session(g, member)


# ---------------------------------------------------------------- heartbeat
#
# O(1): a few dict lookups, one timer re-arm, one reply (or one parked entry).


def heartbeat_unknown_group(k: Kernel, cmd: Heartbeat) -> None:
    k.reply(cmd.request_id, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID, k.resources_epoch))


def heartbeat_dead(k: Kernel, g: Group, cmd: Heartbeat) -> None:
    k.reply(cmd.request_id, HeartbeatResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                              k.resources_epoch))


def _heartbeat_member(k: Kernel, g: Group, cmd: Heartbeat) -> Member | None:
    """Member and generation checks; a failed one is answered (``None``)."""
    req = cmd.request
    error = validate_member(g, req.member_id, req.group_instance_id)
    if error is None and req.generation_id != g.generation_id:
        error = ErrorCode.ILLEGAL_GENERATION
    if error is not None:
        k.reply(cmd.request_id, HeartbeatResponse(error, k.resources_epoch))
        return None
    return g.members[req.member_id]


def heartbeat_empty(k: Kernel, g: Group, cmd: Heartbeat) -> None:
    if _heartbeat_member(k, g, cmd) is not None:
        k.reply(cmd.request_id, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID,
                                                  k.resources_epoch))


def heartbeat_preparing(k: Kernel, g: Group, cmd: Heartbeat) -> None:
    member = _heartbeat_member(k, g, cmd)
    if member is not None:
        k.arm_session(g, member)
        k.reply(cmd.request_id, k.heartbeat_response(member, ErrorCode.REBALANCE_IN_PROGRESS))


def heartbeat_completing(k: Kernel, g: Group, cmd: Heartbeat) -> None:
    member = _heartbeat_member(k, g, cmd)
    if member is not None:
        k.arm_session(g, member)
        k.reply(cmd.request_id, k.heartbeat_response(member, None))


def heartbeat_stable(k: Kernel, g: Group, cmd: Heartbeat) -> None:
    # The hot path: the checks of _heartbeat_member inline.
    req = cmd.request
    rid = cmd.request_id
    error = validate_member(g, req.member_id, req.group_instance_id)
    if error is None and req.generation_id != g.generation_id:
        error = ErrorCode.ILLEGAL_GENERATION
    if error is None:
        member = g.members[req.member_id]
        k.arm_session(g, member)
        if req.wait_ms > 0:
            # Long-poll: held at most half the session timeout, so the
            # member's next heartbeat still comes well before expiry.
            hold = min(req.wait_ms, member.record.session_timeout_ms // 2)
            if hold > 0:
                k.park_heartbeat(g, member, rid, hold)
                return
        if member.record.drain_requested_ms is not None:
            # An operator asked this member to drain (docs/protocol.md, "Drain").
            k.reply(rid, HeartbeatResponse(None, k.resources_epoch, True))
            return
    k.reply(rid, HeartbeatResponse(error, k.resources_epoch))


def handle_release_heartbeat(k: Kernel, cmd: ReleaseHeartbeat) -> None:
    """Answer the oldest parked heartbeat now, as if its hold had run out."""
    for request_id, parked in k.heartbeats.items():
        g = k.groups[parked.group_id]
        member = g.members[parked.member_id]
        k.answer_heartbeat(member, request_id, None)
        k.arm_session(g, member)
        return


# ---------------------------------------------------------------- leave


def leave_unknown_group(k: Kernel, cmd: Leave) -> None:
    k.reply(cmd.request_id, LeaveResponse(None, tuple(
        LeaveMemberResult(m.member_id, m.group_instance_id, ErrorCode.UNKNOWN_MEMBER_ID)
        for m in cmd.request.members)))


def leave_dead(k: Kernel, g: Group, cmd: Leave) -> None:
    k.reply(cmd.request_id, LeaveResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))


def leave(k: Kernel, g: Group, cmd: Leave) -> None:
    """Every live state: each listed member (or pending member) is removed, then
    one rebalance for the batch (``after_removal``: Stable and
    CompletingRebalance rebalance, PreparingRebalance re-checks its barrier)."""
    req = cmd.request
    rid = cmd.request_id
    removed_member = False
    removed_pending = False
    results: list[LeaveMemberResult] = []
    for entry in req.members:
        error: ErrorCode | None = None
        if not entry.member_id:
            # KIP-345: a static member (or an admin) may leave by instance id alone.
            current = (g.static_members.get(entry.group_instance_id)
                       if entry.group_instance_id is not None else None)
            if current is None:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            elif not owns_instance(g.members[current], cmd.principal):
                # Another token's static instance: it stays (Kafka answers a
                # leave whose instance id maps elsewhere FENCED_INSTANCE_ID).
                error = ErrorCode.FENCED_INSTANCE_ID
            else:
                remove_member(k, g, g.members[current], ErrorCode.UNKNOWN_MEMBER_ID)
                removed_member = True
        elif entry.member_id in g.pending:
            take_pending(k, g, entry.member_id)
            removed_pending = True
        else:
            error = validate_member(g, entry.member_id, entry.group_instance_id)
            if error is None:
                remove_member(k, g, g.members[entry.member_id], ErrorCode.UNKNOWN_MEMBER_ID)
                removed_member = True
        results.append(LeaveMemberResult(entry.member_id, entry.group_instance_id, error))
    # One rebalance for the whole batch (docs/protocol.md, "POST /v1/leave").
    if removed_member:
        after_removal(k, g, "leave")
    elif removed_pending:
        maybe_complete_join(k, g)
    k.forget_if_vacant(g)
    k.reply(rid, LeaveResponse(None, tuple(results)))
