"""Admin commands: delete a group, and the resource catalog (docs/protocol.md, "Admin (JSON)").

The catalog is one for the whole coordinator (each set's partitions, and its
weights and zones when they are not the default); every change bumps
``resources_epoch``, which heartbeat and sync responses carry. The coordinator
never rebalances on a catalog change: the leader rejoins when it sees the
epoch move. Parked (long-poll) heartbeats are answered at once with the new
epoch so leaders learn of it without waiting out their poll.
"""

from __future__ import annotations

from coordinator.core.commands import AdoptCatalog, DeleteGroup, DeleteResource, PutResource
from coordinator.core.effects import AdminResult
from coordinator.core.group import Group
from coordinator.core.kernel import Kernel
from coordinator.core.records import GroupDeleted
from protocol.catalog import DEFAULT_PLACEMENT, Placement, put_placement
from protocol.errors import ErrorCode
from protocol.limits import MAX_NAME_LENGTH, MAX_PARTITIONS
from protocol.validate import ValidationError, control_character_problem


def unknown_group(k: Kernel, request_id: int, group_id: str | None = None) -> None:
    """``UNKNOWN_GROUP``; given ``group_id``, the message names it."""
    k.reply(request_id, AdminResult(
        ErrorCode.UNKNOWN_GROUP, k.resources_epoch, found=False,
        message="" if group_id is None else f"no group {group_id!r}"))


def delete_empty_group(k: Kernel, g: Group, cmd: DeleteGroup) -> None:
    delete_group(k, g, "deleted")
    k.reply(cmd.request_id, AdminResult(None, k.resources_epoch))


def refuse_delete(k: Kernel, g: Group, cmd: DeleteGroup) -> None:
    """Only an Empty group can be deleted (Kafka's ``NON_EMPTY_GROUP``)."""
    k.reply(cmd.request_id, AdminResult(ErrorCode.NON_EMPTY_GROUP, k.resources_epoch))


def delete_group(k: Kernel, g: Group, reason: str) -> None:
    """Empty -> Dead, durably: the group's record, generations and checkpoints go
    (Kafka deletes a group's offsets with it); the rebalance journal stays."""
    k.persist(GroupDeleted(g.group_id))
    k.drop_group(g, reason)


def _invalid(k: Kernel, request_id: int, message: str) -> None:
    k.reply(request_id, AdminResult(ErrorCode.INVALID_REQUEST, k.resources_epoch,
                                    message=message))


def resource_problem(name: object, partitions: object) -> str | None:
    """What is wrong with a ``PUT /v1/resources/{name}`` (``partitions`` ``None``: a
    delete, only the name is checked), naming the field; ``None`` when it is fine."""
    problem = _name_problem(name)
    if problem is not None or partitions is None:
        return problem
    if isinstance(partitions, bool) or not isinstance(partitions, int) \
            or not 1 <= partitions <= MAX_PARTITIONS:
        return f"partitions: must be an integer in 1..{MAX_PARTITIONS}, got {partitions!r}"
    return None


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "name: must be a non-empty string"
    if len(name) > MAX_NAME_LENGTH:
        return f"name: longer than {MAX_NAME_LENGTH} characters ({len(name)})"
    problem = control_character_problem(name)
    return None if problem is None else f"name: {problem}"


def handle_put_resource(k: Kernel, cmd: PutResource) -> None:
    problem = resource_problem(cmd.name, cmd.partitions)
    if problem is not None:
        _invalid(k, cmd.request_id, problem)
        return
    current = k.placement.get(cmd.name, DEFAULT_PLACEMENT)
    try:
        placement = put_placement(current, cmd.partitions, cmd.weights, cmd.zones)
    except ValidationError as exc:
        _invalid(k, cmd.request_id, str(exc))
        return
    if k.catalog.get(cmd.name) != cmd.partitions or placement != current:
        _change_catalog(k, cmd.name, cmd.partitions, placement)
    # An unchanged PUT is idempotent: same epoch, nothing written.
    k.reply(cmd.request_id, AdminResult(None, k.resources_epoch))


def handle_delete_resource(k: Kernel, cmd: DeleteResource) -> None:
    if cmd.name not in k.catalog:
        k.reply(cmd.request_id, AdminResult(None, k.resources_epoch, found=False))
        return
    _change_catalog(k, cmd.name, None)
    k.reply(cmd.request_id, AdminResult(None, k.resources_epoch))


def _change_catalog(k: Kernel, name: str, partitions: int | None,
                    placement: Placement = DEFAULT_PLACEMENT) -> None:
    k.change_catalog(name, partitions, placement)
    _wake_parked_heartbeats(k)


def handle_adopt_catalog(k: Kernel, cmd: AdoptCatalog) -> None:
    """Several coordinators: take the shared database's catalog if it is newer."""
    if cmd.resources_epoch <= k.resources_epoch:
        return
    k.set_catalog(dict(cmd.catalog), cmd.resources_epoch, dict(cmd.placement))
    _wake_parked_heartbeats(k)


def _wake_parked_heartbeats(k: Kernel) -> None:
    # Parked heartbeats answer at once with the new epoch (after the write, if any).
    for request_id, parked in list(k.heartbeats.items()):
        group = k.groups[parked.group_id]
        member = group.members[parked.member_id]
        k.answer_heartbeat(member, request_id, None)
        k.arm_session(group, member)
