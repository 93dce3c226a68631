"""Operators' actions on one group: remove a member, ask one to drain, reset checkpoints.

Kafka's ``kafka-consumer-groups --remove-members`` and ``--reset-offsets``,
for generic resources (docs/protocol.md, "Admin additions"), and v1.2's drain
request (docs/protocol.md, "Drain"). All run in the
serial apply like every other command, so the state they check (the member
is there, the group is Empty) is the state they change.

A reset is refused with ``NON_EMPTY_GROUP`` unless the group is Empty:
members would otherwise keep committing over it, or act on a value that
moved under them (Kafka refuses an active group the same way). A dry run
computes the same before/after and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from coordinator.core.admin import unknown_group
from coordinator.core.checkpoint_store import Checkpoint
from coordinator.core.checkpoints import (
    Refusal,
    admit,
    value_problem,
)
from coordinator.core.commands import DrainMember, RemoveMember, ResetCheckpoints
from coordinator.core.effects import AdminResult, DrainRequested
from coordinator.core.group import Group
from coordinator.core.kernel import Kernel
from coordinator.core.membership import reports_draining
from coordinator.core.rebalance import after_removal, remove_member
from coordinator.core.records import CheckpointMeta, CheckpointsWritten
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.validate import Scalar
from protocol.validate import value_problem as storable_problem


def remove_member_dead(k: Kernel, g: Group, cmd: RemoveMember) -> None:
    unknown_group(k, cmd.request_id)


def reset_dead(k: Kernel, g: Group, cmd: ResetCheckpoints) -> None:
    unknown_group(k, cmd.request_id)


def remove_one_member(k: Kernel, g: Group, cmd: RemoveMember) -> None:
    member = g.members.get(cmd.member_id)
    if member is None:
        k.reply(cmd.request_id, AdminResult(ErrorCode.UNKNOWN_MEMBER_ID, k.resources_epoch,
                                            found=False))
        return
    # The member learns it is gone as any removed member does: its next call
    # (or the parked one, now) answers UNKNOWN_MEMBER_ID and it rejoins.
    remove_member(k, g, member, ErrorCode.UNKNOWN_MEMBER_ID)
    after_removal(k, g, "admin_removal")
    k.forget_if_vacant(g)
    k.reply(cmd.request_id, AdminResult(None, k.resources_epoch))


def drain_dead(k: Kernel, g: Group, cmd: DrainMember) -> None:
    unknown_group(k, cmd.request_id, cmd.group_id)


def drain_member(k: Kernel, g: Group, cmd: DrainMember) -> None:
    """Ask a member to drain (docs/protocol.md, "Drain"): its heartbeat answers
    say ``drain: true`` until it rejoins ``draining`` or leaves.

    The request is part of the member's record, written with the group at once
    when the group's durable record is its state in memory (Stable,
    CompletingRebalance), else with the generation the rebalance under way
    forms. A request for a member that asked already, or that is draining
    already, changes nothing."""
    rid = cmd.request_id
    member = g.members.get(cmd.member)
    if member is None and cmd.member in g.static_members:
        member = g.members[g.static_members[cmd.member]]
    if member is None:
        k.reply(rid, AdminResult(
            ErrorCode.UNKNOWN_MEMBER_ID, k.resources_epoch, found=False,
            message=f"group {g.group_id!r} has no member {cmd.member!r} (neither a member "
                    f"id nor a static member's instance id)"))
        return
    record = member.record
    if g.protocol_type != RESOURCES:
        k.reply(rid, AdminResult(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL, k.resources_epoch,
            message=f"group {g.group_id!r} speaks protocol type {g.protocol_type!r}: only "
                    f"members of a {RESOURCES!r} group can drain (remove the member instead)"))
        return
    draining = reports_draining(g, record)
    if not draining and record.drain_requested_ms is None:
        g.update_member(member, replace(record, drain_requested_ms=k.now))
        k.emit(DrainRequested(g.group_id, member.member_id))
        if g.state is GroupState.STABLE or g.state is GroupState.COMPLETING_REBALANCE:
            k.persist(g.to_record())
        # A parked long-poll is answered now: the member hears it at once.
        if member.heartbeats:
            k.answer_heartbeats(member, None)
            k.arm_session(g, member)
    k.reply(rid, AdminResult(None, k.resources_epoch, member_id=member.member_id,
                             group_instance_id=record.group_instance_id, draining=draining))


def _is_integer(value: Scalar) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_reset(k: Kernel, g: Group, cmd: ResetCheckpoints) -> None:
    """A group with members (or a rebalance under way) is not reset."""
    k.reply(cmd.request_id, AdminResult(
        ErrorCode.NON_EMPTY_GROUP, k.resources_epoch,
        message=f"group {cmd.group_id!r} is {g.state.value} with {len(g.members)} "
                f"member(s): a reset needs an Empty group (stop its members first)"))


def reset_empty(k: Kernel, g: Group, cmd: ResetCheckpoints) -> None:
    rid = cmd.request_id
    store = k.checkpoints.get(cmd.group_id)
    values = {} if store is None else store.values
    chosen = None if cmd.resources is None else set(cmd.resources)
    after: dict[tuple[str, int], Scalar]
    if cmd.values is not None:
        after = {(s, i): v for s, i, v in cmd.values if chosen is None or (s, i) in chosen}
        targets = sorted(after)
    else:
        targets = sorted(values) if chosen is None else sorted(chosen)
        if cmd.has_value:
            after = dict.fromkeys(targets, cmd.to_value)
        elif cmd.delete:
            after = dict.fromkeys(targets)
        else:
            assert cmd.shift_by is not None
            problem = _shift_problem(values, targets)
            if problem is not None:
                k.reply(rid, AdminResult(ErrorCode.INVALID_REQUEST, k.resources_epoch,
                                         message=f"shift_by: {problem}"))
                return
            after = {r: values[r] + cmd.shift_by for r in targets}  # type: ignore[operator]
            for (s, i), value in after.items():
                # The result must be a value the store holds, like any commit's.
                problem = storable_problem(value)
                if problem is not None:
                    k.reply(rid, AdminResult(
                        ErrorCode.INVALID_REQUEST, k.resources_epoch,
                        message=f"shift_by: ({s!r}, {i}) at {values[(s, i)]!r} shifted by "
                                f"{cmd.shift_by}: {problem}; nothing was changed"))
                    return
    changes: tuple[Checkpoint, ...] = tuple((s, i, after[(s, i)]) for s, i in targets)
    # A reset writes what a commit would: the same value, catalog and cap checks.
    problem = value_problem(k, changes, "resources")
    admitted = (Refusal(ErrorCode.INVALID_REQUEST, problem) if problem is not None
                else admit(k, g, cmd.group_id, changes, "resources"))
    if isinstance(admitted, Refusal):
        k.reply(rid, AdminResult(admitted.error, k.resources_epoch, message=admitted.message))
        return
    before = tuple((s, i, values[(s, i)]) for s, i in targets if (s, i) in values)
    result = tuple(c for c in changes if c[2] is not None)
    if not cmd.dry_run and changes:
        k.write_checkpoints(cmd.group_id, admitted, CheckpointMeta(k.now, None, -1))
        k.persist(CheckpointsWritten(cmd.group_id, changes, k.now))
    k.reply(rid, AdminResult(None, k.resources_epoch, before=before, after=result))


def _shift_problem(store: Mapping[tuple[str, int], Scalar],
                   targets: list[tuple[str, int]]) -> str | None:
    missing = [r for r in targets if r not in store]
    if missing:
        s, i = missing[0]
        return (f"{len(missing)} resource(s) have no checkpoint to shift, e.g. ({s!r}, {i}); "
                f"set them with to_value")
    bad = [r for r in targets if not _is_integer(store[r])]
    if bad:
        s, i = bad[0]
        return (f"{len(bad)} checkpoint(s) are not integers, e.g. ({s!r}, {i}) = "
                f"{store[(s, i)]!r}; shift_by needs integer checkpoints")
    return None
