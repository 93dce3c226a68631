"""One group's in-memory state (Kafka's ``GroupMetadata`` and ``MemberMetadata``).

Plain bookkeeping, no effects: :mod:`coordinator.core.rebalance` and the state
table's handlers (:mod:`coordinator.core.dispatch`) decide *when* things
change; this module owns the derived counters (members awaiting join,
per-protocol support counts, the static-instance map) and keeps them
consistent so the hot paths stay O(1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from coordinator.core.protocol_selection import candidates, select_protocol, supports_any
from coordinator.core.records import GroupRecord, MemberRecord
from coordinator.core.states import GroupState
from coordinator.core.views import GroupSummary, GroupView

Protocols = tuple[tuple[str, bytes], ...]


class TimerKind(enum.StrEnum):
    """What a core timer is for (``TimerTarget.kind``; ``dispatch.handle_timer``
    dispatches on it and the group's state, ``dispatch.TABLE``). A timer's *key*
    stays a string, ``"{kind}:{ids}"``: the runtime keys its timers by it, and as
    group and member ids may hold any character the core never parses a key
    (``Kernel.timers`` maps it to its target)."""

    #: ``session:{group}:{member}``: the member's session timeout.
    SESSION = "session"
    #: ``pending:{group}:{member}``: a KIP-394 pending member's deadline to join.
    PENDING = "pending"
    #: ``join:{group}``: the join phase's deadline.
    JOIN = "join"
    #: ``sync:{group}``: the deadline of the generation's syncs.
    SYNC = "sync"
    #: ``heartbeat:{request_id}``: a parked long-poll heartbeat's hold.
    HEARTBEAT = "heartbeat"
    #: ``retention:{group}``: an Empty group's retention (KIP-211).
    RETENTION = "retention"


# The keys spell their kind's value as a literal (a parked long-poll builds two
# keys; a literal costs nothing); tests/core/test_core_timer_kinds.py checks
# that every key starts with its target's kind.


def session_key(group_id: str, member_id: str) -> str:
    return f"session:{group_id}:{member_id}"


def pending_key(group_id: str, member_id: str) -> str:
    return f"pending:{group_id}:{member_id}"


def join_key(group_id: str) -> str:
    return f"join:{group_id}"


def sync_key(group_id: str) -> str:
    return f"sync:{group_id}"


def heartbeat_key(request_id: int) -> str:
    return f"heartbeat:{request_id}"


@dataclass(slots=True, eq=False)
class Member:
    """A member as the core holds it: its record (the durable fields, spelled once
    in :class:`MemberRecord`) and what lives only in memory.

    The record is frozen: a change of a durable field makes a new record
    (:meth:`Group.update_member`, :meth:`set_assignment`), so ``to_record`` and
    the admin view hand out the record itself.
    """

    record: MemberRecord
    session_key: str
    #: request ids of this member's parked calls.
    join_request: int | None = None
    sync_request: int | None = None
    heartbeats: set[int] = field(default_factory=set)
    session_deadline_ms: int = 0
    #: the ``sequence`` of this member's last applied commit (-1: none yet); a
    #: commit carrying one not above it arrived late and is not applied. Stored
    #: with the checkpoints the commit wrote; a load gives it back
    #: (``coordinator._restore_commit_sequences``).
    commit_sequence: int = -1

    @classmethod
    def of(cls, group_id: str, record: MemberRecord) -> Member:
        return cls(record, session_key(group_id, record.member_id))

    @property
    def member_id(self) -> str:
        """The record's (a shorthand: the id is what everything keys a member by)."""
        return self.record.member_id

    @property
    def assignment(self) -> bytes | None:
        """The record's: as the leader sent it for the current generation; None until then."""
        return self.record.assignment

    def set_assignment(self, assignment: bytes | None) -> None:
        if assignment is not self.record.assignment:
            self.record = replace(self.record, assignment=assignment)

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.record.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.record.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id!r} does not support {protocol!r}")


class Group:
    """A group: members in join order (dict order), its generation and rebalance bookkeeping."""

    def __init__(self, group_id: str, now_ms: int, owner: str | None = None) -> None:
        self.group_id = group_id
        #: the token name whose request created the group (--max-groups-per-token).
        self.owner = owner
        #: whether a GroupOwner record for ``owner`` was written (Kernel.persist).
        self.owner_persisted = owner is None
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        #: group_instance_id -> its current member id (KIP-345).
        self.static_members: dict[str, str] = {}
        #: KIP-394 pending member id -> expiry deadline (ms).
        self.pending: dict[str, int] = {}
        # Counters derived from the members, owned here: add_member, detach,
        # update_member and set_join_request are their only writers.
        #: protocol name -> number of members supporting it.
        self.protocol_counts: dict[str, int] = {}
        #: members with a parked join (Kafka's numMembersAwaitingJoin).
        self.num_awaiting_join = 0
        self.join_key = join_key(group_id)
        self.sync_key = sync_key(group_id)
        # -- the join phase (PreparingRebalance)
        self.join_deadline_ms: int | None = None
        #: not None while the initial rebalance delay runs (Kafka's InitialDelayedJoin):
        #: how much of the rebalance timeout is left for extensions.
        self.initial_delay_remaining_ms: int | None = None
        self.new_member_added = False
        self.rebalance_timeout_ms = 0
        #: why the current rebalance episode started, and when (for the journal).
        self.rebalance_reason: str | None = None
        self.rebalance_started_ms = 0
        # -- the sync phase (CompletingRebalance, and Stable until everyone synced)
        self.pending_sync: set[str] = set()
        self.sync_deadline_ms: int | None = None
        #: member ids replaced by a static rejoin during this generation: old -> new,
        #: so the leader's assignment for the old id reaches the new one.
        self.replaced: dict[str, str] = {}
        #: member ids of the current / previous generation as formed (journal joined/left).
        self.generation_members: tuple[str, ...] = ()
        self.previous_generation_members: tuple[str, ...] = ()

    # ------------------------------------------------------------ membership

    def add_member(self, member: Member, protocol_type: str | None) -> None:
        if not self.members:
            # Kafka: the first member fixes the protocol type (an Empty group takes any).
            self.protocol_type = protocol_type
        record = member.record
        self.members[record.member_id] = member
        if record.group_instance_id is not None:
            self.static_members[record.group_instance_id] = record.member_id
        self._count(record.protocols, +1)
        if member.join_request is not None:
            self.num_awaiting_join += 1

    def detach(self, member: Member) -> None:
        """Remove a member's bookkeeping (its parked calls must be answered already)."""
        record = member.record
        del self.members[record.member_id]
        instance_id = record.group_instance_id
        if instance_id is not None and self.static_members.get(instance_id) == record.member_id:
            del self.static_members[instance_id]
        self._count(record.protocols, -1)
        if member.join_request is not None:
            self.num_awaiting_join -= 1
        self.pending_sync.discard(member.member_id)
        if self.leader == member.member_id:
            self.leader = None

    def set_join_request(self, member: Member, request_id: int | None) -> None:
        """Park (an id) or unpark (``None``) a member's join: the one writer of
        ``Member.join_request`` once the member is in the group, so
        ``num_awaiting_join`` (owned here) cannot drift from it."""
        if member.join_request is None:
            if request_id is not None:
                self.num_awaiting_join += 1
        elif request_id is None:
            self.num_awaiting_join -= 1
        member.join_request = request_id

    def update_member(self, member: Member, record: MemberRecord) -> None:
        """Give ``member`` a changed record (same member id and instance id),
        keeping the per-protocol counts."""
        old = member.record
        assert (record.member_id, record.group_instance_id) == \
            (old.member_id, old.group_instance_id)
        if record.protocols != old.protocols:
            self._count(old.protocols, -1)
            self._count(record.protocols, +1)
        member.record = record

    def replace_member_id(self, old: Member, new: Member) -> None:
        """Swap ``old`` for ``new`` in place (same position, protocols, instance id)."""
        self.members = {(new.member_id if mid == old.member_id else mid):
                        (new if mid == old.member_id else m)
                        for mid, m in self.members.items()}
        instance_id = new.record.group_instance_id
        if instance_id is not None:
            self.static_members[instance_id] = new.member_id
        if self.leader == old.member_id:
            self.leader = new.member_id
        if old.member_id in self.pending_sync:
            self.pending_sync.discard(old.member_id)
            self.pending_sync.add(new.member_id)
        for prior, current in self.replaced.items():
            if current == old.member_id:
                self.replaced[prior] = new.member_id
        self.replaced[old.member_id] = new.member_id

    def _count(self, protocols: Protocols, delta: int) -> None:
        counts = self.protocol_counts
        for name, _ in protocols:
            value = counts.get(name, 0) + delta
            if value:
                counts[name] = value
            else:
                counts.pop(name, None)

    # ------------------------------------------------------------ protocol

    def supports(self, protocol_type: str, protocols: Protocols,
                 replacing: Member | None) -> bool:
        """Kafka's ``supportsProtocols``, comparing a rejoining member with the others."""
        others = len(self.members) - (1 if replacing is not None else 0)
        if others <= 0:
            return True
        if protocol_type != self.protocol_type:
            return False
        own = replacing.protocol_names() if replacing is not None else ()
        return supports_any(self.protocol_counts, len(self.members),
                            (name for name, _ in protocols), own)

    def select_protocol(self) -> str:
        return select_protocol((m.protocol_names() for m in self.members.values()),
                               candidates(self.protocol_counts, len(self.members)))

    def max_rebalance_timeout(self) -> int:
        return max((m.record.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        """Kafka's ``hasAllMembersJoined``: the join barrier of the normal (non-initial) phase."""
        return self.num_awaiting_join == len(self.members) and not self.pending

    # ------------------------------------------------------------ records and views

    def to_record(self) -> GroupRecord:
        return GroupRecord(self.group_id, self.state.value, self.generation_id,
                           self.protocol_type, self.protocol_name, self.leader,
                           tuple(m.record for m in self.members.values()),
                           self.state_timestamp_ms)

    @classmethod
    def from_record(cls, rec: GroupRecord) -> Group:
        group = cls(rec.group_id, rec.state_timestamp_ms)
        group.generation_id = rec.generation_id
        group.protocol_type = rec.protocol_type
        if rec.state == GroupState.EMPTY.value or not rec.members:
            return group
        group.protocol_name = rec.protocol_name
        for mrec in rec.members:
            group.add_member(Member.of(rec.group_id, mrec), rec.protocol_type)
        group.leader = rec.leader if rec.leader in group.members else None
        group.generation_members = tuple(group.members)
        return group

    def summary(self) -> GroupSummary:
        return GroupSummary(self.group_id, self.state.value, self.protocol_type,
                            self.protocol_name, self.generation_id, len(self.members))

    def view(self) -> GroupView:
        return GroupView(
            self.group_id, self.state.value, self.protocol_type, self.protocol_name,
            self.generation_id, self.leader, tuple(m.record for m in self.members.values()))
