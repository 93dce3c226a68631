"""Commands: everything that can change the coordinator's state.

The runtime turns each HTTP request and each timer firing into one command
and applies it with ``GroupCoordinator.handle(now_ms, command)``. Commands
that expect an answer carry a ``request_id`` minted by the runtime; the answer
comes back as a :class:`~coordinator.core.effects.Reply` with that id, either
in the same ``handle`` call or a later one (a parked join, sync or heartbeat).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.catalog import Placement, Weights, Zones
from protocol.messages import (
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    SyncRequest,
)
from protocol.validate import Scalar


@dataclass(frozen=True, slots=True)
class Join:
    request_id: int
    request: JoinRequest
    #: the caller's address, shown by the admin API.
    client_host: str
    #: a fresh member id minted by the runtime (>= 128 random bits); the core is
    #: deterministic, so randomness comes in with the command. Used only when
    #: the join needs a new member id.
    new_member_id: str
    #: the caller's token name (authentication on), else ``None``: it owns the
    #: static instance and the group this join may create, and a parked join counts
    #: towards its share of the parked requests (docs/operations.md, Limits).
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Sync:
    request_id: int
    request: SyncRequest
    #: the caller's token name, else ``None``: a parked sync counts towards its
    #: token's share of the parked requests (``--max-parked-per-token``).
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    request_id: int
    request: HeartbeatRequest


@dataclass(frozen=True, slots=True)
class Leave:
    request_id: int
    request: LeaveRequest
    #: the caller's token name, else ``None``: only the owner of a static
    #: instance may remove it by instance id.
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    request_id: int
    request: CommitRequest
    #: the caller's token name, else ``None``: owns a group a simple commit creates.
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Fetch:
    request_id: int
    request: FetchRequest


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Admin: ``DELETE /v1/groups/{group_id}``; replies an :class:`AdminResult`."""

    request_id: int
    group_id: str


@dataclass(frozen=True, slots=True)
class PutResource:
    """Admin: ``PUT /v1/resources/{name}``; replies an :class:`AdminResult`.

    ``weights`` and ``zones`` ``None``: not given, the set keeps what it has
    (:func:`protocol.catalog.put_placement`)."""

    request_id: int
    name: str
    partitions: int
    weights: Weights | None = None
    zones: Zones | None = None


@dataclass(frozen=True, slots=True)
class DeleteResource:
    """Admin: ``DELETE /v1/resources/{name}``; replies an :class:`AdminResult`."""

    request_id: int
    name: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer armed by :class:`ScheduleTimer` reached its deadline.

    The runtime delivers it only if the timer was not cancelled or re-armed
    since; the core still checks its own state, so a stale firing is harmless.
    """

    key: str


@dataclass(frozen=True, slots=True)
class ReleaseHeartbeat:
    """Answer the oldest parked (long-poll) heartbeat now, without error.

    The runtime sends it when ``--max-parked-requests`` is reached and a join or
    sync would need the place: a long-poll is only a wait, which its member simply
    repeats, while a refused join stalls a whole group. No-op when none is parked.
    """


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The caller of a parked request went away (connection closed).

    The core forgets the parked request; for a parked join or sync the member
    stays in the group (Kafka keeps it until its timeout expires).
    """

    request_id: int




@dataclass(frozen=True, slots=True)
class RemoveMember:
    """Admin: ``DELETE /v1/groups/{group_id}/members/{member_id}`` (Kafka's
    ``--remove-members``); replies an :class:`AdminResult`."""

    request_id: int
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class DrainMember:
    """Admin: ``POST /v1/groups/{group_id}/members/{member}/drain`` (v1.2,
    docs/protocol.md, "Drain"); replies an :class:`AdminResult` naming the member.

    ``member`` is a member id or, failing that, a static member's instance id
    (Kafka's tools name static members by instance id)."""

    request_id: int
    group_id: str
    member: str


@dataclass(frozen=True, slots=True)
class ResetCheckpoints:
    """Admin: ``POST /v1/groups/{group_id}/checkpoints/reset``; replies an
    :class:`AdminResult` with the checkpoints before and after.

    Exactly one way is set: ``to_value`` (``has_value``), ``shift_by``,
    ``delete`` or ``values``. ``resources`` ``None``: every checkpoint of the
    group (with ``values``: the resources the values name).
    """

    request_id: int
    group_id: str
    dry_run: bool
    resources: tuple[tuple[str, int], ...] | None
    has_value: bool = False
    to_value: Scalar = None
    shift_by: int | None = None
    delete: bool = False
    values: tuple[tuple[str, int, Scalar], ...] | None = None


@dataclass(frozen=True, slots=True)
class AdoptCatalog:
    """Several coordinators: the catalog as it is in the shared database, already
    durable (changed through any coordinator). Applied when ``resources_epoch`` is
    newer than the core's; writes nothing, replies nothing."""

    catalog: tuple[tuple[str, int], ...]
    resources_epoch: int
    #: the weights and zones of the sets whose placement is not the default.
    placement: tuple[tuple[str, Placement], ...] = ()


#: the commands a caller waits for an answer to: each carries the ``request_id`` its
#: runtime minted (``Runtime.new_request_id``).
CallCommand = (Join | Sync | Heartbeat | Leave | Commit | Fetch | DeleteGroup | PutResource
               | DeleteResource | RemoveMember | DrainMember | ResetCheckpoints)
Command = CallCommand | TimerFired | Cancelled | ReleaseHeartbeat | AdoptCatalog


def command_group(command: Command) -> str | None:
    """The group a command's answer speaks for (``None``: none, e.g. a catalog change;
    a timer's or a cancellation's group is known only to the core)."""
    match command:
        case Join(request=r) | Heartbeat(request=r) | Sync(request=r) | Leave(request=r) \
                | Commit(request=r) | Fetch(request=r):
            return r.group_id
        case DeleteGroup(group_id=group_id) | RemoveMember(group_id=group_id) \
                | DrainMember(group_id=group_id) | ResetCheckpoints(group_id=group_id):
            return group_id
    return None
