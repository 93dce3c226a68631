"""Generation-fenced checkpoints: commit and fetch (Kafka's OffsetCommit / OffsetFetch).

Checkpoints live in memory (``Kernel.checkpoints``: group -> (set, index) ->
value), restored from the snapshot, and every accepted commit is persisted as
one :class:`CheckpointsWritten` record before its reply.
"""

from __future__ import annotations

from coordinator.core.commands import Commit, Fetch
from coordinator.core.kernel import Kernel
from coordinator.core.membership import validate_member
from coordinator.core.records import CheckpointsWritten
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.messages import CommitResponse, FetchResponse
from protocol.validate import Scalar

Checkpoint = tuple[str, int, Scalar]


def handle_commit(k: Kernel, cmd: Commit) -> None:
    req = cmd.request
    rid = cmd.request_id
    # Kafka's "simple" commit: no group management (generation -1, no instance id).
    simple = req.generation_id < 0 and req.group_instance_id is None
    g = k.groups.get(req.group_id)
    if g is None:
        if not simple:
            # PROTOCOL.md: a protocol call for a group that does not exist
            # answers UNKNOWN_MEMBER_ID (Kafka says ILLEGAL_GENERATION here).
            k.reply(rid, CommitResponse(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        if not req.checkpoints:
            k.reply(rid, CommitResponse(None))
            return
        if k.at_group_limit():
            # --max-groups bounds every way a group comes to be held, simple commits included.
            k.refuse(rid, req.group_id, "max_groups",
                     CommitResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if k.over_group_quota(cmd.principal):
            k.refuse(rid, req.group_id, "max_groups_per_token",
                     CommitResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        g = k.create_group(req.group_id, cmd.principal)
    state = g.state
    error: ErrorCode | None = None
    if state is GroupState.DEAD:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    elif not (simple and state is GroupState.EMPTY):
        # A zombie (stale generation, removed or fenced member) cannot
        # overwrite the new owner's progress: same checks as heartbeat.
        error = validate_member(g, req.member_id, req.group_instance_id)
        if error is None and req.generation_id != g.generation_id:
            error = ErrorCode.ILLEGAL_GENERATION
        if error is None:
            if state is GroupState.COMPLETING_REBALANCE:
                error = ErrorCode.REBALANCE_IN_PROGRESS
            elif state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                # Kafka: a commit also counts as a sign of life.
                k.arm_session(g, g.members[req.member_id])
            else:
                error = ErrorCode.UNKNOWN_MEMBER_ID
    if error is not None:
        k.reply(rid, CommitResponse(error))
        return
    if req.checkpoints:
        apply_checkpoints(k, req.group_id, req.checkpoints)
        k.persist(CheckpointsWritten(req.group_id, tuple(req.checkpoints), k.now))
    k.reply(rid, CommitResponse(None))
    k.forget_if_vacant(g)
    if req.checkpoints and g.generation_id == 0 and g.state is GroupState.EMPTY \
            and req.group_id in k.groups:
        # KIP-211: checkpoints of a group that never formed a generation (simple
        # commits) expire group_retention_ms after the last commit; a group that had
        # members counts from when it became Empty (Kernel.transition).
        k.renew_retention(req.group_id)


def apply_checkpoints(k: Kernel, group_id: str, checkpoints: tuple[Checkpoint, ...]) -> None:
    store = k.checkpoints.setdefault(group_id, {})
    for resource_set, index, value in checkpoints:
        if value is None:
            store.pop((resource_set, index), None)
        else:
            store[(resource_set, index)] = value
    if not store:
        del k.checkpoints[group_id]


def handle_fetch(k: Kernel, cmd: Fetch) -> None:
    """Kafka answers fetches whatever the group's state; an unknown group has none.

    With ``resources`` absent every checkpoint is returned, sorted by
    (set, index); with a list, those that exist, in the order asked.
    """
    req = cmd.request
    store = k.checkpoints.get(req.group_id, {})
    found: tuple[Checkpoint, ...]
    if req.resources is None:
        found = tuple((s, i, store[(s, i)]) for s, i in sorted(store))
    else:
        found = tuple((s, i, store[(s, i)]) for s, i in req.resources if (s, i) in store)
    k.reply(cmd.request_id, FetchResponse(None, found))
