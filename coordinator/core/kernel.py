"""The coordinator's whole state and the primitives that emit effects.

One :class:`Kernel` lives inside a :class:`~coordinator.core.coordinator.GroupCoordinator`.
Each ``handle`` call sets ``now`` and an empty effect list (``begin``), runs
one handler, and takes the list (``take``). Everything that changes state and
must be seen by the runtime (a reply, a timer, a record, a state change) goes
through a method here, so the bookkeeping behind it (the parked-request index,
the timer targets, the awaiting-join counter) cannot drift.

Timers are addressed by key. The kernel keeps ``key -> TimerTarget`` instead of
parsing keys, because group and member ids may contain any character.
"""

from __future__ import annotations

from typing import NamedTuple

from coordinator.core.checkpoint_store import CheckpointStore, Plan
from coordinator.core.config import CoreConfig
from coordinator.core.effects import (
    AdminResult,
    CancelTimer,
    Effect,
    GroupStateChanged,
    Persist,
    Reply,
    RequestRefused,
    ScheduleTimer,
)
from coordinator.core.group import Group, Member, TimerKind, heartbeat_key, pending_key
from coordinator.core.health import GroupHealth
from coordinator.core.records import (
    CatalogChanged,
    CheckpointMeta,
    CheckpointsWritten,
    GroupOwner,
    GroupRecord,
    Record,
)
from coordinator.core.states import GroupState, check_transition
from protocol.catalog import DEFAULT_PLACEMENT, Placement
from protocol.errors import ErrorCode
from protocol.messages import HeartbeatResponse, JoinResponse, Response, SyncResponse

#: looked up once: an enum member's attribute lookup costs about half a
#: microsecond on CPython 3.11, and every parked long-poll builds a target.
_SESSION_TIMER = TimerKind.SESSION
_HEARTBEAT_TIMER = TimerKind.HEARTBEAT


def retention_key(group_id: str) -> str:
    return f"retention:{group_id}"


class TimerTarget(NamedTuple):
    kind: TimerKind
    group_id: str
    #: the member id (session, pending) or "" (join, sync, heartbeat).
    member_id: str = ""
    #: the parked request id (heartbeat), else -1.
    request_id: int = -1


class Parked(NamedTuple):
    #: "join", "sync" or "heartbeat".
    kind: str
    group_id: str
    member_id: str
    #: the caller's token name (a join or sync with authentication on), else ``None``.
    principal: str | None = None


class Kernel:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        #: group id -> its checkpoints (a group without any has no entry).
        self.checkpoints: dict[str, CheckpointStore] = {}
        self.catalog: dict[str, int] = {}
        #: the weights and zones of the catalog's sets whose placement is not the default.
        self.placement: dict[str, Placement] = {}
        self.resources_epoch = 0
        self.timers: dict[str, TimerTarget] = {}
        self.parked: dict[int, Parked] = {}
        #: token name -> its parked joins and syncs (``--max-parked-per-token``; a
        #: long-poll heartbeat is not counted: a join or sync takes its place).
        self.parked_by: dict[str, int] = {}
        #: parked heartbeats only (answered all at once when the resources epoch moves).
        self.heartbeats: dict[int, Parked] = {}
        #: Empty group id -> when it and its checkpoints expire (KIP-211; timers.py).
        self.retention: dict[str, int] = {}
        #: token name -> groups held that it created (``Group.owner``).
        self.owned_groups: dict[str, int] = {}
        #: token name -> bytes of checkpoints (``CheckpointStore.nbytes``) held in the
        #: groups it created: what ``max_checkpoint_bytes_per_token`` is checked against.
        self.owned_bytes: dict[str, int] = {}
        #: group id -> what its health is computed from (health.py); dropped with the group.
        self.health: dict[str, GroupHealth] = {}
        self.now = 0
        self.out: list[Effect] = []

    def begin(self, now_ms: int) -> None:
        self.now = now_ms
        self.out = []

    def take(self) -> list[Effect]:
        out, self.out = self.out, []
        return out

    # ------------------------------------------------------------ plain effects

    def reply(self, request_id: int, response: Response | AdminResult) -> None:
        self.out.append(Reply(request_id, response))

    def persist(self, record: Record) -> None:
        if type(record) is GroupRecord or type(record) is CheckpointsWritten:
            # A group's owner is written with its first durable record: a group
            # that is never persisted (a stray first join) costs no write.
            group = self.groups.get(record.group_id)
            if group is not None and not group.owner_persisted:
                group.owner_persisted = True
                assert group.owner is not None
                self.out.append(Persist(GroupOwner(group.group_id, group.owner)))
        self.out.append(Persist(record))

    def emit(self, effect: Effect) -> None:
        self.out.append(effect)

    def arm(self, key: str, deadline_ms: int, target: TimerTarget) -> None:
        self.timers[key] = target
        self.out.append(ScheduleTimer(key, deadline_ms))

    def disarm(self, key: str) -> None:
        if self.timers.pop(key, None) is not None:
            self.out.append(CancelTimer(key))

    # ------------------------------------------------------------ the catalog

    def set_catalog(self, catalog: dict[str, int], resources_epoch: int,
                    placement: dict[str, Placement] | None = None) -> None:
        """Take a whole catalog at its epoch (restore, or a newer shared one), with the
        placement of its sets that have one. The kernel owns ``resources_epoch``: this
        and :meth:`change_catalog` write it."""
        self.catalog = catalog
        self.placement = {name: p for name, p in (placement or {}).items()
                          if name in catalog and not p.is_default}
        self.resources_epoch = resources_epoch

    def change_catalog(self, name: str, partitions: int | None,
                       placement: Placement = DEFAULT_PLACEMENT) -> None:
        """Create, resize, re-weigh or (``partitions`` ``None``) delete a resource set:
        a new epoch, persisted."""
        self.resources_epoch += 1
        if partitions is None:
            del self.catalog[name]
        else:
            self.catalog[name] = partitions
        if partitions is None or placement.is_default:
            self.placement.pop(name, None)
        else:
            self.placement[name] = placement
        self.persist(CatalogChanged(name, partitions, self.resources_epoch, placement))

    # ------------------------------------------------------------ groups

    def at_group_limit(self) -> bool:
        """Whether creating one more group would exceed ``max_groups`` (0: unlimited)."""
        limit = self.config.max_groups
        return limit > 0 and len(self.groups) >= limit

    def over_group_quota(self, principal: str | None) -> bool:
        """Whether ``principal`` holds ``max_groups_per_token`` groups it created
        (0: unlimited; no principal, i.e. authentication off: never)."""
        limit = self.config.max_groups_per_token
        return (limit > 0 and principal is not None
                and self.owned_groups.get(principal, 0) >= limit)

    def refuse(self, request_id: int, group_id: str, reason: str, response: Response) -> None:
        """Answer a request refused by a server limit, and say so (metric, log)."""
        self.out.append(RequestRefused(group_id, reason))
        self.reply(request_id, response)

    def create_group(self, group_id: str, owner: str | None = None) -> Group:
        group = Group(group_id, self.now, owner)
        self.add_group(group)
        self.out.append(GroupStateChanged(group_id, None, GroupState.EMPTY.value, 0, "created"))
        return group

    def add_group(self, group: Group) -> None:
        self.groups[group.group_id] = group
        owner = group.owner
        if owner is not None:
            self.owned_groups[owner] = self.owned_groups.get(owner, 0) + 1
            # On restore the checkpoints are loaded before their groups: count them now.
            store = self.checkpoints.get(group.group_id)
            if store is not None:
                self._charge(owner, store.nbytes)

    def _charge(self, owner: str, nbytes: int) -> None:
        """Add ``nbytes`` (negative: release) to what ``owner``'s groups hold."""
        held = self.owned_bytes.get(owner, 0) + nbytes
        if held:
            self.owned_bytes[owner] = held
        else:
            del self.owned_bytes[owner]

    def write_checkpoints(self, group_id: str, plan: Plan, meta: CheckpointMeta) -> None:
        """Apply an admitted plan (``checkpoints.admit``) to a held group's checkpoints,
        and charge the change of its bytes to the group's creator."""
        store = self.checkpoints.get(group_id)
        if store is None:
            store = self.checkpoints[group_id] = CheckpointStore()
        owner = self.groups[group_id].owner
        if owner is not None and plan.nbytes != store.nbytes:
            self._charge(owner, plan.nbytes - store.nbytes)
        store.apply(plan, meta)
        if not store.values:
            del self.checkpoints[group_id]

    def transition(self, group: Group, new: GroupState, reason: str) -> None:
        old = group.state
        check_transition(group.group_id, old, new)
        group.state = new
        group.state_timestamp_ms = self.now
        self.out.append(GroupStateChanged(group.group_id, old.value, new.value,
                                          group.generation_id, reason))
        if new is GroupState.PREPARING_REBALANCE and old is not new:
            self.health_of(group.group_id).rebalance_started(self.now, self.config)
        # KIP-211: retention counts from the moment a group becomes Empty, and
        # stops when a member joins (or the group dies).
        if new is GroupState.EMPTY:
            self.arm_retention(group.group_id, self.now)
        elif old is GroupState.EMPTY:
            self.disarm_retention(group.group_id)

    def health_of(self, group_id: str) -> GroupHealth:
        found = self.health.get(group_id)
        if found is None:
            found = self.health[group_id] = GroupHealth()
        return found

    def arm_retention(self, group_id: str, since_ms: int) -> None:
        """Expire an Empty group ``group_retention_ms`` after ``since_ms`` (0: never)."""
        retention_ms = self.config.group_retention_ms
        if retention_ms <= 0:
            return
        deadline = since_ms + retention_ms
        self.retention[group_id] = deadline
        self.arm(retention_key(group_id), deadline, TimerTarget(TimerKind.RETENTION, group_id))

    def renew_retention(self, group_id: str) -> None:
        """Restart an Empty group's retention from now (a commit to a group without a
        generation). An armed timer is not re-armed: its firing finds the later
        deadline and re-arms then (timers.py), so a busy committer costs no timer churn."""
        if group_id in self.retention:
            self.retention[group_id] = self.now + self.config.group_retention_ms
        else:
            self.arm_retention(group_id, self.now)

    def extend_retention(self, group_id: str, deadline_ms: int) -> None:
        """Move an armed retention to a later deadline (the kernel owns ``retention``)."""
        self.retention[group_id] = deadline_ms
        self.arm(retention_key(group_id), deadline_ms, TimerTarget(TimerKind.RETENTION, group_id))

    def disarm_retention(self, group_id: str) -> None:
        if self.retention.pop(group_id, None) is not None:
            self.disarm(retention_key(group_id))

    def drop_group(self, group: Group, reason: str) -> None:
        """Empty -> Dead, and forget it with its checkpoints (the caller persists, if needed)."""
        self.transition(group, GroupState.DEAD, reason)
        for member_id in group.pending:
            self.disarm(pending_key(group.group_id, member_id))
        group.pending.clear()
        del self.groups[group.group_id]
        self.health.pop(group.group_id, None)
        owner = group.owner
        store = self.checkpoints.pop(group.group_id, None)
        if owner is not None:
            left = self.owned_groups[owner] - 1
            if left:
                self.owned_groups[owner] = left
            else:
                del self.owned_groups[owner]
            if store is not None:
                self._charge(owner, -store.nbytes)

    def evict(self, group_id: str) -> None:
        """Forget everything held of one group, whatever it holds: a handler that
        raised may have changed part of it (coordinator.py, ``handle``). Its
        record, checkpoints, health and retention go; its timers are disarmed;
        its parked calls are forgotten unanswered (the runtime answers them).
        Nothing is persisted: what is durable is what the group is reloaded from."""
        self.groups.pop(group_id, None)
        self.checkpoints.pop(group_id, None)
        self.health.pop(group_id, None)
        self.retention.pop(group_id, None)
        for key in [key for key, target in self.timers.items() if target.group_id == group_id]:
            self.disarm(key)
        for request_id in [rid for rid, p in self.parked.items() if p.group_id == group_id]:
            self._unpark(request_id)
            self.heartbeats.pop(request_id, None)
        # Each token's groups and checkpoint bytes counted again from the groups left:
        # the counts may be what was half-changed.
        owned: dict[str, int] = {}
        held: dict[str, int] = {}
        for group in self.groups.values():
            owner = group.owner
            if owner is not None:
                owned[owner] = owned.get(owner, 0) + 1
                store = self.checkpoints.get(group.group_id)
                if store is not None and store.nbytes:
                    held[owner] = held.get(owner, 0) + store.nbytes
        self.owned_groups = owned
        self.owned_bytes = held

    def forget_if_vacant(self, group: Group) -> None:
        """Drop an Empty group that never formed a generation and holds nothing.

        Such a group was never persisted (records are written from generation 1
        on), so forgetting it keeps memory bounded under stray first joins.
        """
        if (group.state is GroupState.EMPTY and group.generation_id == 0 and not group.members
                and not group.pending and group.group_id not in self.checkpoints
                and group.group_id in self.groups):
            self.drop_group(group, "vacant")

    # ------------------------------------------------------------ pending members (KIP-394)

    def add_pending(self, group: Group, member_id: str, deadline_ms: int) -> None:
        """A member id minted by ``MEMBER_ID_REQUIRED``: pending until it joins or
        ``deadline_ms``. The kernel owns ``Group.pending`` and its timers."""
        group.pending[member_id] = deadline_ms
        self.arm(pending_key(group.group_id, member_id), deadline_ms,
                 TimerTarget(TimerKind.PENDING, group.group_id, member_id))

    def drop_pending(self, group: Group, member_id: str) -> None:
        """It joined, left, was refused or expired: pending no more."""
        del group.pending[member_id]
        self.disarm(pending_key(group.group_id, member_id))

    # ------------------------------------------------------------ sessions

    def arm_session(self, group: Group, member: Member) -> None:
        """(Re)start a member's session timeout from now (Kafka's completeAndScheduleNext...)."""
        deadline = self.now + member.record.session_timeout_ms
        member.session_deadline_ms = deadline
        key = member.session_key
        if key not in self.timers:
            self.timers[key] = TimerTarget(_SESSION_TIMER, group.group_id, member.member_id)
        self.out.append(ScheduleTimer(key, deadline))

    # ------------------------------------------------------------ parked calls

    def _park(self, request_id: int, parked: Parked) -> None:
        self.parked[request_id] = parked
        principal = parked.principal
        if principal is not None:
            self.parked_by[principal] = self.parked_by.get(principal, 0) + 1

    def _unpark(self, request_id: int) -> Parked | None:
        """Forget a parked call (``None``: it was not parked)."""
        parked = self.parked.pop(request_id, None)
        principal = None if parked is None else parked.principal
        if principal is not None:
            left = self.parked_by[principal] - 1
            if left:
                self.parked_by[principal] = left
            else:
                del self.parked_by[principal]
        return parked

    def park_join(self, group: Group, member: Member, request_id: int,
                  principal: str | None) -> None:
        """Park a member's join until the barrier; ``principal``: the caller's token
        (counted in ``parked_by``). At most one per member: a newer join of the
        member (a retry on a new connection, or a client sending joins in a loop)
        takes the place of the parked one, which is answered
        ``REBALANCE_IN_PROGRESS`` at once (Kafka's ``ClassicGroup.updateMember``
        also keeps one join future per member, but drops the replaced one
        unanswered)."""
        if member.join_request is not None:
            self.answer_join(group, member, JoinResponse(ErrorCode.REBALANCE_IN_PROGRESS,
                                                         member_id=member.member_id))
        group.set_join_request(member, request_id)
        self._park(request_id, Parked("join", group.group_id, member.member_id, principal))

    def answer_join(self, group: Group, member: Member, response: JoinResponse) -> None:
        request_id = member.join_request
        if request_id is None:
            return
        group.set_join_request(member, None)
        self._unpark(request_id)
        self.reply(request_id, response)

    def park_sync(self, group: Group, member: Member, request_id: int,
                  principal: str | None) -> None:
        if member.sync_request is not None:
            self.answer_sync(member, self.sync_error(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_request = request_id
        self._park(request_id, Parked("sync", group.group_id, member.member_id, principal))

    def answer_sync(self, member: Member, response: SyncResponse) -> None:
        request_id = member.sync_request
        if request_id is None:
            return
        member.sync_request = None
        self._unpark(request_id)
        self.reply(request_id, response)

    def sync_error(self, error: ErrorCode) -> SyncResponse:
        return SyncResponse(error, resources_epoch=self.resources_epoch)

    def park_heartbeat(self, group: Group, member: Member, request_id: int, hold_ms: int) -> None:
        # At most one parked heartbeat per member: a newer one supersedes the
        # older, which is answered now (without error: the member is fine), as
        # a newer join supersedes a parked one. One member cannot fill
        # --max-parked-requests with long-polls.
        self.answer_heartbeats(member, None)
        member.heartbeats.add(request_id)
        # No principal: long-polls are not counted per token (the hot path stays inline).
        parked = Parked("heartbeat", group.group_id, member.member_id)
        self.parked[request_id] = parked
        self.heartbeats[request_id] = parked
        self.arm(heartbeat_key(request_id), self.now + hold_ms,
                 TimerTarget(_HEARTBEAT_TIMER, group.group_id, request_id=request_id))

    def answer_heartbeat(self, member: Member, request_id: int, error: ErrorCode | None) -> None:
        member.heartbeats.discard(request_id)
        del self.parked[request_id]
        del self.heartbeats[request_id]
        self.disarm(heartbeat_key(request_id))
        self.reply(request_id, self.heartbeat_response(member, error))

    def heartbeat_response(self, member: Member, error: ErrorCode | None) -> HeartbeatResponse:
        """A heartbeat answer to a member the group holds: ``drain: true`` while an
        operator's drain request is pending (docs/protocol.md, "Drain"), on every
        answer that leaves the member in its group (no error, or a rebalance)."""
        drain = member.record.drain_requested_ms is not None and (
            error is None or error is ErrorCode.REBALANCE_IN_PROGRESS)
        return HeartbeatResponse(error, self.resources_epoch, drain)

    def answer_heartbeats(self, member: Member, error: ErrorCode | None) -> None:
        for request_id in list(member.heartbeats):
            self.answer_heartbeat(member, request_id, error)

    def cancel_parked(self, request_id: int) -> tuple[Group, Member, str] | None:
        """Forget a parked call whose caller went away, unanswered; returns the group,
        the member and the call's kind (``None``: not parked, e.g. answered already)."""
        parked = self._unpark(request_id)
        if parked is None:
            return None
        group = self.groups[parked.group_id]
        member = group.members[parked.member_id]
        if parked.kind == "join":
            group.set_join_request(member, None)
        elif parked.kind == "sync":
            member.sync_request = None
        else:
            member.heartbeats.discard(request_id)
            del self.heartbeats[request_id]
            self.disarm(heartbeat_key(request_id))
        return group, member, parked.kind

    def answer_all_parked(self, group: Group, member: Member, error: ErrorCode) -> None:
        """Answer every parked call of a member that is being removed or fenced."""
        self.answer_join(group, member, JoinResponse(error, member_id=member.member_id))
        self.answer_sync(member, self.sync_error(error))
        self.answer_heartbeats(member, error)
