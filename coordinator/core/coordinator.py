"""``GroupCoordinator``: the pure group state machine (docs/architecture.md, "The shape").

``handle(now_ms, command) -> list[Effect]`` applies one command atomically;
``restore(snapshot, now_ms)`` rebuilds the state from storage; the other
methods are read-only views for the admin API and metrics. No clock, no
randomness, no I/O: time comes in as ``now_ms`` and new member ids with the
``Join`` command, so equal inputs always give equal effects.

Effect order is part of the contract: every ``Persist`` a reply depends on
comes before that ``Reply`` in the list (the runtime replies only after the
writes emitted before it by the same command, and every uncommitted write of
its group or the catalog, are committed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator.core import admin, checkpoints, dispatch, membership, timers
from coordinator.core.checkpoint_store import CheckpointStore
from coordinator.core.commands import (
    AdoptCatalog,
    Cancelled,
    Command,
    Commit,
    DeleteGroup,
    DeleteResource,
    DrainMember,
    Fetch,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    ReleaseHeartbeat,
    RemoveMember,
    ResetCheckpoints,
    Sync,
    TimerFired,
    command_group,
)
from coordinator.core.config import CoreConfig
from coordinator.core.effects import Effect
from coordinator.core.group import Group
from coordinator.core.health import HEALTHY, Health, assess
from coordinator.core.kernel import Kernel
from coordinator.core.rebalance import prepare_rebalance
from coordinator.core.records import CheckpointMeta, Snapshot
from coordinator.core.states import GroupState
from coordinator.core.views import DrainCounts, GroupSummary, GroupView
from protocol.catalog import Placement
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.validate import Scalar

_HANDLERS: dict[type[Any], Callable[[Kernel, Any], None]] = {
    # By the group's state: the state table (dispatch.TABLE).
    Join: dispatch.handle_join,
    Sync: dispatch.handle_sync,
    Heartbeat: dispatch.handle_heartbeat,
    Leave: dispatch.handle_leave,
    Commit: dispatch.handle_commit,
    DeleteGroup: dispatch.handle_delete_group,
    RemoveMember: dispatch.handle_remove_member,
    DrainMember: dispatch.handle_drain_member,
    ResetCheckpoints: dispatch.handle_reset,
    TimerFired: dispatch.handle_timer,
    # Whatever the group's state.
    Fetch: checkpoints.handle_fetch,
    PutResource: admin.handle_put_resource,
    DeleteResource: admin.handle_delete_resource,
    Cancelled: timers.handle_cancelled,
    ReleaseHeartbeat: membership.handle_release_heartbeat,
    AdoptCatalog: admin.handle_adopt_catalog,
}


class GroupCoordinator:
    def __init__(self, config: CoreConfig) -> None:
        if not 0 < config.min_session_timeout_ms <= config.max_session_timeout_ms:
            raise ValueError("session timeouts: need 0 < min_session_timeout_ms <= "
                             f"max_session_timeout_ms, got {config.min_session_timeout_ms} and "
                             f"{config.max_session_timeout_ms}")
        if config.initial_rebalance_delay_ms < 0:
            raise ValueError("initial_rebalance_delay_ms: must be >= 0, got "
                             f"{config.initial_rebalance_delay_ms}")
        if config.group_max_size < 0:
            raise ValueError(f"group_max_size: must be >= 0, got {config.group_max_size}")
        if config.max_groups < 0:
            raise ValueError(f"max_groups: must be >= 0, got {config.max_groups}")
        if config.max_groups_per_token < 0:
            raise ValueError("max_groups_per_token: must be >= 0, got "
                             f"{config.max_groups_per_token}")
        for name in ("max_checkpoints_per_group", "max_checkpoint_bytes_per_group",
                     "max_checkpoint_bytes_per_token", "max_checkpoint_value_bytes"):
            if getattr(config, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(config, name)}")
        if config.group_retention_ms < 0:
            raise ValueError(f"group_retention_ms: must be >= 0, got {config.group_retention_ms}")
        self._k = Kernel(config)

    @property
    def config(self) -> CoreConfig:
        return self._k.config

    def handle(self, now_ms: int, command: Command) -> list[Effect]:
        """Apply one command; returns the effects in the order the runtime must execute them.

        A handler that raises may have changed part of the state it was changing:
        its effects are dropped and :class:`CoreFailure` names the group whose
        state that was (``None``: state of no one group, e.g. the catalog), for
        the runtime to evict and reload that group alone (:meth:`evict_group`,
        :meth:`restore_group`).
        """
        kind = type(command)
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise TypeError(f"not a command: {command!r}")
        k = self._k
        k.begin(now_ms)
        # A timer's and a cancellation's group are known before the handler runs
        # (it forgets them); every other command names its group.
        owner: str | None = None
        if kind is TimerFired:
            target = k.timers.get(command.key)  # type: ignore[union-attr]
            owner = None if target is None else target.group_id
        elif kind is Cancelled:
            parked = k.parked.get(command.request_id)  # type: ignore[union-attr]
            owner = None if parked is None else parked.group_id
        try:
            handler(k, command)
        except Exception as exc:
            k.take()
            group_id = owner if kind is TimerFired or kind is Cancelled \
                else command_group(command)
            raise CoreFailure(group_id, command, exc) from exc
        return k.take()

    def evict_group(self, group_id: str, now_ms: int) -> list[Effect]:
        """Forget one group entirely (after a :class:`CoreFailure`, or a write of it
        that failed: memory may be ahead of what is durable for it); returns the
        timers to cancel. Its parked calls are forgotten unanswered: the runtime
        answers them. Other groups are untouched."""
        k = self._k
        k.begin(now_ms)
        k.evict(group_id)
        return k.take()

    def restore_group(self, snapshot: Snapshot, now_ms: int) -> list[Effect]:
        """Bring back evicted groups from their durable state (``snapshot`` holds their
        rows only, as ``Storage.load_group`` reads them), as :meth:`restore` does at
        start; the catalog stays as it is. Returns the timers to arm."""
        k = self._k
        present = [r.group_id for r in snapshot.groups if r.group_id in k.groups]
        present += [gid for gid in snapshot.checkpoints if gid in k.groups]
        if present:
            raise RuntimeError(f"restore_group: group {present[0]!r} is still held "
                               f"(evict it first)")
        k.begin(now_ms)
        _restore_groups(k, snapshot, now_ms)
        return k.take()

    def restore(self, snapshot: Snapshot, now_ms: int) -> list[Effect]:
        """Rebuild from storage (docs/protocol.md, "Durability"); returns the timers to arm.

        Stable groups resume as they were with every session re-armed from
        ``now_ms``; a group persisted mid-rebalance (CompletingRebalance)
        restarts its rebalance (PreparingRebalance, reason ``restart``); Empty
        groups stay Empty, with their retention (KIP-211) re-armed from the
        persisted time they became Empty (the record's ``state_timestamp_ms``)
        or, for groups known only by their checkpoints, from their last commit
        (``Snapshot.last_commit_ms``; ``now_ms`` when unknown, e.g. rows written
        before schema version 2). A retention already over fires at once.
        Only a fresh coordinator can be restored.
        """
        k = self._k
        if k.groups or k.catalog or k.checkpoints or k.resources_epoch:
            raise RuntimeError("restore() needs a fresh GroupCoordinator")
        k.begin(now_ms)
        k.set_catalog(dict(snapshot.catalog), snapshot.resources_epoch, dict(snapshot.placement))
        _restore_groups(k, snapshot, now_ms)
        return k.take()

    # ------------------------------------------------------------ read-only views

    def list_groups(self) -> list[GroupSummary]:
        return [self._k.groups[gid].summary() for gid in sorted(self._k.groups)]

    def group_ids(self) -> list[str]:
        return sorted(self._k.groups)

    def group_summary(self, group_id: str) -> GroupSummary | None:
        group = self._k.groups.get(group_id)
        return None if group is None else group.summary()

    def describe_group(self, group_id: str) -> GroupView | None:
        group = self._k.groups.get(group_id)
        return None if group is None else group.view()

    def health(self, group_id: str, now_ms: int) -> Health:
        """The group's health at ``now_ms`` (coordinator/core/health.py)."""
        k = self._k
        group = k.groups.get(group_id)
        if group is None:
            return HEALTHY
        return assess(k.health.get(group_id), now_ms, k.config,
                      has_members=bool(group.members),
                      keeps_checkpoints=group_id in k.checkpoints)

    def catalog(self) -> dict[str, int]:
        return dict(self._k.catalog)

    def catalog_placement(self) -> dict[str, Placement]:
        """The weights and zones of the catalog's sets that are not the default."""
        return dict(self._k.placement)

    @property
    def resources_epoch(self) -> int:
        return self._k.resources_epoch

    def state_counts(self) -> dict[str, int]:
        """Groups by state, every state present (zeros included) for a stable gauge."""
        counts = {state.value: 0 for state in GroupState}
        for group in self._k.groups.values():
            counts[group.state.value] += 1
        return counts

    def member_count(self) -> int:
        return sum(len(group.members) for group in self._k.groups.values())

    def drain_counts(self) -> DrainCounts:
        """Members draining, and asked to drain but not draining yet (metrics)."""
        draining = requested = 0
        for group in self._k.groups.values():
            if group.protocol_type != RESOURCES:
                continue
            for member in group.members.values():
                if membership.reports_draining(group, member.record):
                    draining += 1
                elif member.record.drain_requested_ms is not None:
                    requested += 1
        return DrainCounts(draining, requested)

    def checkpoints(self, group_id: str) -> dict[tuple[str, int], Scalar]:
        """A copy of a group's checkpoints (for tests and the admin API)."""
        store = self._k.checkpoints.get(group_id)
        return {} if store is None else dict(store.values)

    def checkpoint_meta(self, group_id: str) -> dict[tuple[str, int], CheckpointMeta]:
        """Who wrote each of a group's checkpoints and when, where known (admin API)."""
        store = self._k.checkpoints.get(group_id)
        return {} if store is None else dict(store.meta)

    def pending_member_count(self, group_id: str) -> int:
        group = self._k.groups.get(group_id)
        return 0 if group is None else len(group.pending)

    def parked_request_count(self) -> int:
        """Parked joins, syncs and heartbeats (a gauge for the runtime)."""
        return len(self._k.parked)

    def parked_by(self, principal: str) -> int:
        """Parked joins and syncs of one token (``--max-parked-per-token``)."""
        return self._k.parked_by.get(principal, 0)


class CoreFailure(Exception):
    """A handler raised: the state of ``group_id`` (``None``: of no one group) may be
    half-changed, and nothing the command emitted was kept."""

    def __init__(self, group_id: str | None, command: Command, cause: Exception) -> None:
        whose = f"group {group_id!r}" if group_id is not None else "no single group"
        super().__init__(f"the core failed on {type(command).__name__} ({whose}): {cause!r}")
        self.group_id = group_id
        self.command = command
        self.cause = cause


def _restore_groups(k: Kernel, snapshot: Snapshot, now_ms: int) -> None:
    """The groups of ``snapshot`` (every group at start, or the ones reloaded), as
    :meth:`GroupCoordinator.restore` describes."""
    loaded = {gid: CheckpointStore(values, snapshot.checkpoint_meta.get(gid))
              for gid, values in snapshot.checkpoints.items() if values}
    k.checkpoints.update(loaded)
    for gid in loaded:
        # Health: a group's last commit is known from storage, else "now".
        k.health_of(gid).committed(snapshot.last_commit_ms.get(gid, now_ms))
    for record in snapshot.groups:
        if record.state == GroupState.DEAD.value:
            continue
        group = Group.from_record(record)
        _restore_owner(group, snapshot)
        _restore_commit_sequences(group, snapshot)
        k.add_group(group)
        if not group.members:
            # Empty: it became Empty when this record was written.
            k.arm_retention(group.group_id, record.state_timestamp_ms or now_ms)
            continue
        for member in group.members.values():
            k.arm_session(group, member)
        if record.state == GroupState.STABLE.value:
            group.state = GroupState.STABLE
        else:
            # The assignment never arrived (or the state is not one that is
            # persisted): restart the rebalance so members rejoin (seed 004,
            # "Handling Coordinator Failures", case 2).
            group.state = GroupState.COMPLETING_REBALANCE
            prepare_rebalance(k, group, "restart")
    # Checkpoints of a group without a record (simple commits) come back
    # as an Empty group, as Kafka loads offsets-only groups.
    for group_id in loaded:
        if group_id not in k.groups:
            group = Group(group_id, now_ms)
            _restore_owner(group, snapshot)
            k.add_group(group)
            k.arm_retention(group_id, snapshot.last_commit_ms.get(group_id, now_ms))


def _restore_commit_sequences(group: Group, snapshot: Snapshot) -> None:
    """Each member's ``commit_sequence``: the largest ``sequence`` among the
    checkpoints it wrote (stored with them), so that a commit it sent before one
    already applied, delayed across this load, is still not applied.

    Within a generation only a resource's owner commits it (a late commit of an
    older generation is refused by its generation), and a reset needs the group
    Empty; so a member's last commit is among the checkpoints it still holds
    unless that commit only deleted checkpoints."""
    if not group.members:
        return
    meta = snapshot.checkpoint_meta.get(group.group_id)
    if not meta:
        return
    members = group.members
    for written in meta.values():
        if written.sequence is None:
            continue
        member = members.get(written.member_id) if written.member_id is not None else None
        if member is not None and written.sequence > member.commit_sequence:
            member.commit_sequence = written.sequence


def _restore_owner(group: Group, snapshot: Snapshot) -> None:
    """The group's creator as persisted (``GroupOwner``), already on disk."""
    group.owner = snapshot.owners.get(group.group_id)
    group.owner_persisted = True
