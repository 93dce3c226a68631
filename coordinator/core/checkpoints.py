"""Generation-fenced checkpoints: commit and fetch (Kafka's OffsetCommit / OffsetFetch).

Checkpoints live in memory (``Kernel.checkpoints``: group ->
:class:`~coordinator.core.checkpoint_store.CheckpointStore`), restored from the
snapshot, and every accepted commit is persisted as one
:class:`CheckpointsWritten` record before its reply.

A commit is accepted or refused whole, before anything changes
(docs/coordinator-semantics.md, "Checkpoint limits"): a value over
``max_checkpoint_value_bytes`` or, in a group of
``protocol_type`` ``"resources"``, a set that is not in the catalog or an index
beyond its partitions is ``INVALID_REQUEST`` (HTTP 400, the message names the
field); a commit that would take its group over ``max_checkpoints_per_group``
or ``max_checkpoint_bytes_per_group``, or the token that created the group over
``max_checkpoint_bytes_per_token`` (``Kernel.owned_bytes``, the bytes of all the
groups it created), is ``CHECKPOINT_LIMIT_REACHED``. A fetch
answers at most ``MAX_FETCH_CHECKPOINTS`` checkpoints: more are read in pages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from coordinator.core.checkpoint_store import Checkpoint, CheckpointStore, Plan
from coordinator.core.commands import Commit, Fetch
from coordinator.core.group import Group
from coordinator.core.kernel import Kernel
from coordinator.core.membership import validate_member
from coordinator.core.records import CheckpointMeta, CheckpointsWritten
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode
from protocol.limits import MAX_FETCH_CHECKPOINTS
from protocol.messages import CommitRequest, CommitResponse, FetchResponse
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.validate import value_problem as storable_problem
from protocol.validate import value_size

_EMPTY = CheckpointStore()


#: a commit's member check in one group state (the state table's commit column):
#: the error, or ``None`` when the committer may commit now.
Gate = Callable[[Group, CommitRequest, bool], ErrorCode | None]


def handle_commit(k: Kernel, cmd: Commit, gates: Mapping[GroupState, Gate]) -> None:
    req = cmd.request
    rid = cmd.request_id
    # Kafka's "simple" commit: no group management (generation -1, no instance id).
    simple = req.generation_id < 0 and req.group_instance_id is None
    invalid = value_problem(k, req.checkpoints)
    if invalid is not None:
        k.reply(rid, CommitResponse(ErrorCode.INVALID_REQUEST, invalid))
        return
    g = k.groups.get(req.group_id)
    if g is None:
        if not simple:
            # docs/protocol.md, "Error codes": a protocol call for a group that does not exist
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
        # A group created by this commit has no protocol type: only the caps apply.
        admitted = admit(k, None, req.group_id, req.checkpoints, creator=cmd.principal)
        if isinstance(admitted, Refusal):
            k.reply(rid, CommitResponse(admitted.error, admitted.message))
            return
        plan: Plan | None = admitted
        g = k.create_group(req.group_id, cmd.principal)
    else:
        error = gates[g.state](g, req, simple)
        if error is not None:
            k.reply(rid, CommitResponse(error))
            return
        plan = None
        member = g.members.get(req.member_id)
        if req.sequence is not None and member is not None \
                and req.sequence <= member.commit_sequence:
            # Sent before a commit of this member that was already applied, and
            # delayed on the way (the member gave up on it and went on): its values
            # are older than what is stored, so it is not applied. It is answered
            # without an error (as Kafka's idempotent producer treats a duplicate
            # sequence), which only the abandoned call's closed connection reads:
            # the client sends one commit at a time, and its caller was told this
            # one timed out. docs/coordinator-semantics.md, "The commit sequence".
            k.reply(rid, CommitResponse(None))
            return
        if req.checkpoints:
            admitted = admit(k, g, req.group_id, req.checkpoints)
            if isinstance(admitted, Refusal):
                k.reply(rid, CommitResponse(admitted.error, admitted.message))
                return
            plan = admitted
        if req.sequence is not None and member is not None:
            member.commit_sequence = req.sequence
        if g.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE) \
                and req.member_id in g.members:
            # Kafka: a commit also counts as a sign of life.
            k.arm_session(g, g.members[req.member_id])
    if plan is not None:
        _note_progress(k, req.group_id, plan)
        # The sequence is stored with the values (docs/coordinator-semantics.md,
        # "The commit sequence"): a load gives it back to the member
        # (_restore_groups), so a commit delayed across a restart, a hand-off or a
        # reload is still known to be late.
        k.write_checkpoints(req.group_id, plan,
                            CheckpointMeta(k.now, req.member_id, req.generation_id,
                                           req.sequence))
        k.persist(CheckpointsWritten(req.group_id, tuple(req.checkpoints), k.now,
                                     req.member_id, req.generation_id, req.sequence))
    k.reply(rid, CommitResponse(None))
    k.forget_if_vacant(g)
    if req.checkpoints and g.generation_id == 0 and g.state is GroupState.EMPTY \
            and req.group_id in k.groups:
        # KIP-211: checkpoints of a group that never formed a generation (simple
        # commits) expire group_retention_ms after the last commit; a group that had
        # members counts from when it became Empty (Kernel.transition).
        k.renew_retention(req.group_id)


# The gates, Kafka's OffsetCommit checks by state.


def _committer_error(g: Group, req: CommitRequest) -> ErrorCode | None:
    # A zombie (stale generation, removed or fenced member) cannot
    # overwrite the new owner's progress: same checks as heartbeat.
    error = validate_member(g, req.member_id, req.group_instance_id)
    if error is None and req.generation_id != g.generation_id:
        error = ErrorCode.ILLEGAL_GENERATION
    return error


def commit_gate_dead(g: Group, req: CommitRequest, simple: bool) -> ErrorCode | None:
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def commit_gate_empty(g: Group, req: CommitRequest, simple: bool) -> ErrorCode | None:
    """Simple commits only (Kafka's generation -1); a member's commit finds no member."""
    if simple:
        return None
    error = _committer_error(g, req)
    return ErrorCode.UNKNOWN_MEMBER_ID if error is None else error


def commit_gate_member(g: Group, req: CommitRequest, simple: bool) -> ErrorCode | None:
    """PreparingRebalance (the old generation saves its progress before its
    resources move) and Stable: a member of the current generation commits."""
    return _committer_error(g, req)


def commit_gate_completing(g: Group, req: CommitRequest, simple: bool) -> ErrorCode | None:
    """No commits between the generation and its assignment (Kafka)."""
    error = _committer_error(g, req)
    return ErrorCode.REBALANCE_IN_PROGRESS if error is None else error


def value_problem(k: Kernel, checkpoints: Sequence[Checkpoint],
                  field: str = "checkpoints") -> str | None:
    """A value the store cannot hold (:func:`protocol.validate.value_problem`: the
    edge refuses those already; an operator's reset computes new ones), or one over
    ``max_checkpoint_value_bytes`` (Kafka's offset.metadata.max.bytes)."""
    limit = k.config.max_checkpoint_value_bytes
    for i, (_set, _index, value) in enumerate(checkpoints):
        problem = storable_problem(value)
        if problem is not None:
            return f"{field}[{i}][2]: {problem}"
        if limit > 0 and (type(value) is str or type(value) is bytes) \
                and (size := value_size(value)) > limit:
            return (f"{field}[{i}][2]: a value of {size} bytes is over "
                    f"--max-checkpoint-value-bytes ({limit})")
    return None


class Refusal(NamedTuple):
    """Why checkpoints are not admitted: the code and a message naming the problem."""

    error: ErrorCode
    message: str


def admit(k: Kernel, g: Group | None, group_id: str, checkpoints: Sequence[Checkpoint],
          field: str = "checkpoints", creator: str | None = None) -> Refusal | Plan:
    """The refusal of writing ``checkpoints`` to ``g`` (``None``: a group the write
    would create, by the token ``creator``), or the plan to apply when they are
    admitted. Nothing is changed either way. Commits and operators' resets go
    through the same checks."""
    if g is not None and g.protocol_type == RESOURCES:
        # The embedded protocol's resources are the catalog's: refuse what no
        # member can own. Deleting (value None) is always allowed, so checkpoints
        # left by a set since removed or shrunk can be cleared.
        catalog = k.catalog
        for i, (resource_set, index, value) in enumerate(checkpoints):
            if value is None:
                continue
            partitions = catalog.get(resource_set)
            if partitions is None:
                return Refusal(ErrorCode.INVALID_REQUEST,
                               f"{field}[{i}][0]: resource set {resource_set!r} is "
                               "not in the catalog")
            if index >= partitions:
                return Refusal(ErrorCode.INVALID_REQUEST,
                               f"{field}[{i}][1]: index {index} is beyond resource "
                               f"set {resource_set!r} ({partitions} partitions: "
                               f"0..{partitions - 1})")
    max_count = k.config.max_checkpoints_per_group
    max_bytes = k.config.max_checkpoint_bytes_per_group
    store = k.checkpoints.get(group_id, _EMPTY)
    plan = store.plan(checkpoints)
    count, nbytes = plan.total, plan.nbytes
    # Only growth is refused: a group over a cap lowered since can still shrink.
    if 0 < max_count < count and count > len(store):
        return Refusal(ErrorCode.CHECKPOINT_LIMIT_REACHED,
                       f"group {group_id!r} would hold {count} checkpoints, over "
                       f"--max-checkpoints-per-group ({max_count}); nothing was written")
    if 0 < max_bytes < nbytes and nbytes > store.nbytes:
        return Refusal(ErrorCode.CHECKPOINT_LIMIT_REACHED,
                       f"group {group_id!r} would hold {nbytes} bytes of checkpoints, "
                       f"over --max-checkpoint-bytes-per-group ({max_bytes}); "
                       "nothing was written")
    owner = creator if g is None else g.owner
    budget = k.config.max_checkpoint_bytes_per_token
    growth = nbytes - store.nbytes
    if owner is not None and budget > 0 and growth > 0:
        held = k.owned_bytes.get(owner, 0)
        if held + growth > budget:
            return Refusal(ErrorCode.CHECKPOINT_LIMIT_REACHED,
                           f"token {owner!r} holds {held} bytes of checkpoints in the groups "
                           f"it created; this write to group {group_id!r} would add {growth}, "
                           f"over --max-checkpoint-bytes-per-token ({budget}); nothing was "
                           "written")
    return plan


def _note_progress(k: Kernel, group_id: str, plan: Plan) -> None:
    """Health (health.py): the group committed, and whether an integer went backwards."""
    health = k.health_of(group_id)
    health.committed(k.now)
    for key, old, new in plan.rewound:
        health.rewound(k.now, key, old, new)


def handle_fetch(k: Kernel, cmd: Fetch) -> None:
    """Kafka answers fetches whatever the group's state; an unknown group has none.

    With ``resources`` absent every checkpoint is returned, sorted by (set,
    index): in pages of at most ``MAX_FETCH_CHECKPOINTS`` when asked (``after``,
    v1.1), else in one answer, which a group holding more refuses with
    ``INVALID_REQUEST`` (a v1 client could not tell a partial answer from a
    whole one). With a list, those that exist, in the order asked.
    """
    req = cmd.request
    store = k.checkpoints.get(req.group_id, _EMPTY)
    if req.resources is not None:
        values = store.values
        found = tuple((s, i, values[(s, i)]) for s, i in req.resources if (s, i) in values)
        k.reply(cmd.request_id, FetchResponse(None, found))
    elif req.paged:
        page, cursor = store.page(req.after, MAX_FETCH_CHECKPOINTS)
        k.reply(cmd.request_id, FetchResponse(None, tuple(page), cursor))
    elif len(store) > MAX_FETCH_CHECKPOINTS:
        k.reply(cmd.request_id, FetchResponse(
            ErrorCode.INVALID_REQUEST,
            message=f"after: group {req.group_id!r} holds {len(store)} checkpoints, more than "
                    f"one answer carries ({MAX_FETCH_CHECKPOINTS}); read them in pages: send "
                    "after: [] and then each answer's next (docs/protocol.md, "
                    "'Additions of this release')"))
    else:
        page, _ = store.page(None, MAX_FETCH_CHECKPOINTS)
        k.reply(cmd.request_id, FetchResponse(None, tuple(page)))
