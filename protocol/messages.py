"""Requests and responses of every protocol call (docs/protocol.md, "Calls").

Each message is a frozen dataclass with ``from_wire(obj)`` (validates a decoded
msgpack map, raising :class:`ValidationError` naming the field) and
``to_wire()`` (the map to encode). Both the server and the client use them, so
the two sides can never disagree on a field's name or type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Self

from protocol.errors import ErrorCode
from protocol.limits import (
    MAX_FETCH_CHECKPOINTS,
    MAX_GENERATION_ID,
    MAX_HEARTBEAT_WAIT_MS,
    MAX_NAME_LENGTH,
    MAX_PROTOCOLS_PER_JOIN,
    MAX_RESOURCE_INDEX,
    MAX_TIMEOUT_MS,
)
from protocol.validate import (
    Fields,
    Scalar,
    ValidationError,
    check_int,
    check_pair,
    check_string,
    check_value,
)

__all__ = [
    "Api",
    "CommitRequest",
    "CommitResponse",
    "FetchRequest",
    "FetchResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JoinMember",
    "JoinRequest",
    "JoinResponse",
    "LeaveMember",
    "LeaveMemberResult",
    "LeaveRequest",
    "LeaveResponse",
    "NotCoordinatorAnswer",
    "Request",
    "Response",
    "Scalar",
    "SyncAssignment",
    "SyncRequest",
    "SyncResponse",
    "ValidationError",
]

Checkpoint = tuple[str, int, Scalar]
ResourceKey = tuple[str, int]


def _err(value: ErrorCode | None) -> str | None:
    return None if value is None else value.value


def _generation(f: Fields) -> int:
    return f.integer("generation_id", lo=-1, hi=MAX_GENERATION_ID)


# ---------------------------------------------------------------- join


class Api(enum.StrEnum):
    """The protocol calls by their wire names: ``POST /v1/<api>``; ``resources`` is
    the catalog read (``GET /v1/resources``), which a leader makes like a call."""

    JOIN = "join"
    SYNC = "sync"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    COMMIT = "commit"
    FETCH = "fetch"
    #: v1.1: which coordinator serves a group (any coordinator answers).
    FIND_COORDINATOR = "find_coordinator"
    RESOURCES = "resources"


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    client_id: str | None = None
    reason: str | None = None
    #: v1.1 (docs/coordinator-semantics.md, "Incarnations"): the sending process's
    #: incarnation, an opaque id
    #: it draws once and sends on every join of its life, and the wall-clock ms at
    #: which that process started. Only with ``group_instance_id``; absent: v1.
    incarnation: str | None = None
    incarnation_ms: int | None = None
    #: v1.1 (docs/coordinator-semantics.md, "The join sequence"): the member's own count of its
    #: joins, increasing. A join of a known member arriving after a later join
    #: of that member was applied (delayed on the network after the member gave
    #: up on it) is not applied. Absent: no such check (v1 clients).
    sequence: int | None = None

    API = Api.JOIN

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        raw = f.items("protocols", max_items=MAX_PROTOCOLS_PER_JOIN) or []
        if not raw:
            raise ValidationError("protocols", "must list at least one protocol")
        protocols: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for i, entry in enumerate(raw):
            pair = check_pair(entry, f"protocols[{i}]", 2)
            name = check_string(pair[0], f"protocols[{i}][0]") or ""
            if not isinstance(pair[1], bytes):
                raise ValidationError(f"protocols[{i}][1]", "expected bytes (metadata)")
            if name in seen:
                raise ValidationError(f"protocols[{i}][0]", f"protocol {name!r} listed twice")
            seen.add(name)
            protocols.append((name, pair[1]))
        instance_id = f.opt_string("group_instance_id")
        incarnation = f.opt_string("incarnation")
        incarnation_ms = f.integer("incarnation_ms", lo=0, hi=2**63 - 1, required=False) \
            if f.raw("incarnation_ms") is not None else None
        if incarnation is not None and instance_id is None:
            raise ValidationError("incarnation", "only a static member (group_instance_id) "
                                  "has an incarnation")
        if incarnation_ms is not None and incarnation is None:
            raise ValidationError("incarnation_ms", "only with incarnation")
        sequence = f.integer("sequence", lo=0, hi=2**63 - 1, required=False) \
            if f.raw("sequence") is not None else None
        return cls(
            group_id=f.string("group_id"),
            member_id=f.string("member_id", allow_empty=True),
            protocol_type=f.string("protocol_type"),
            protocols=tuple(protocols),
            session_timeout_ms=f.integer("session_timeout_ms", lo=0, hi=MAX_TIMEOUT_MS),
            rebalance_timeout_ms=f.integer("rebalance_timeout_ms", lo=0, hi=MAX_TIMEOUT_MS),
            group_instance_id=instance_id,
            client_id=f.opt_string("client_id"),
            reason=f.reason(),
            incarnation=incarnation,
            incarnation_ms=incarnation_ms,
            sequence=sequence,
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "group_instance_id": self.group_instance_id,
            "protocol_type": self.protocol_type,
            "protocols": [[name, meta] for name, meta in self.protocols],
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "client_id": self.client_id,
            "reason": self.reason,
        }
        # Sent only when set: a v1 coordinator ignores unknown fields anyway.
        if self.incarnation is not None:
            wire["incarnation"] = self.incarnation
        if self.incarnation_ms is not None:
            wire["incarnation_ms"] = self.incarnation_ms
        if self.sequence is not None:
            wire["sequence"] = self.sequence
        return wire


@dataclass(frozen=True, slots=True)
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResponse:
    error: ErrorCode | None
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[JoinMember, ...] = ()
    #: KIP-814: the leader is a returning static member and the group's
    #: assignment still holds; it must not run the assignor, only sync.
    skip_assignment: bool = False
    #: with an error, what is wrong when the code alone does not say it: the field
    #: and the limit with ``INVALID_REQUEST`` (sent as a 400's body), the allowed
    #: range with ``INVALID_SESSION_TIMEOUT``; sent only when set.
    message: str = ""

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        members = []
        for i, m in enumerate(f.items("members", required=False) or []):
            mf = Fields(m, f"members[{i}]")
            members.append(JoinMember(mf.string("member_id"), mf.opt_string("group_instance_id"),
                                      mf.binary("metadata")))
        message = f.raw("message")
        return cls(
            error=ErrorCode.parse(f.error()),
            generation_id=f.integer("generation_id", lo=-1, hi=MAX_GENERATION_ID,
                                    required=False, default=-1),
            protocol_type=f.opt_string("protocol_type"),
            protocol_name=f.opt_string("protocol_name"),
            leader=f.string("leader", required=False, allow_empty=True),
            member_id=f.string("member_id", required=False, allow_empty=True),
            members=tuple(members),
            skip_assignment=f.raw("skip_assignment") is True,
            message=message if isinstance(message, str) else "",
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "error": _err(self.error),
            "skip_assignment": self.skip_assignment,
            "generation_id": self.generation_id,
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "leader": self.leader,
            "member_id": self.member_id,
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "metadata": m.metadata}
                for m in self.members
            ],
        }
        if self.message:
            wire["message"] = self.message
        return wire


# ---------------------------------------------------------------- sync


@dataclass(frozen=True, slots=True)
class SyncAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    member_id: str
    generation_id: int
    assignments: tuple[SyncAssignment, ...] = ()
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None

    API = Api.SYNC

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        assignments = []
        seen: set[str] = set()
        for i, a in enumerate(f.items("assignments", required=False) or []):
            af = Fields(a, f"assignments[{i}]")
            member_id = af.string("member_id")
            if member_id in seen:
                raise ValidationError(f"assignments[{i}].member_id",
                                      f"member {member_id!r} assigned twice")
            seen.add(member_id)
            assignments.append(SyncAssignment(member_id, af.binary("assignment")))
        return cls(
            group_id=f.string("group_id"),
            member_id=f.string("member_id"),
            generation_id=_generation(f),
            assignments=tuple(assignments),
            group_instance_id=f.opt_string("group_instance_id"),
            protocol_type=f.opt_string("protocol_type"),
            protocol_name=f.opt_string("protocol_name"),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "generation_id": self.generation_id,
            "group_instance_id": self.group_instance_id,
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "assignments": [
                {"member_id": a.member_id, "assignment": a.assignment} for a in self.assignments
            ],
        }


@dataclass(frozen=True, slots=True)
class SyncResponse:
    error: ErrorCode | None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""
    resources_epoch: int = 0

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        return cls(
            error=ErrorCode.parse(f.error()),
            protocol_type=f.opt_string("protocol_type"),
            protocol_name=f.opt_string("protocol_name"),
            assignment=f.binary("assignment", required=False),
            resources_epoch=f.integer("resources_epoch", lo=0, hi=2**63 - 1, required=False),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": _err(self.error),
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "assignment": self.assignment,
            "resources_epoch": self.resources_epoch,
        }


# ---------------------------------------------------------------- heartbeat


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None = None
    wait_ms: int = 0

    API = Api.HEARTBEAT

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        # The most frequent request (every member, every few seconds): a
        # well-formed one is checked here in one pass, field for field the same
        # rules as below; anything else takes the general path, which names the
        # field at fault (tests/protocol/test_protocol_heartbeat_wire.py holds
        # the two paths to the same answers).
        if type(obj) is dict:
            group_id = obj.get("group_id")
            member_id = obj.get("member_id")
            generation_id = obj.get("generation_id")
            instance_id = obj.get("group_instance_id")
            wait_ms = obj.get("wait_ms")
            # isprintable() is False for every character check_name refuses (and
            # for a few it accepts, which the general path then sorts out).
            if (type(group_id) is str and 0 < len(group_id) <= MAX_NAME_LENGTH
                    and group_id.isprintable()
                    and type(member_id) is str and 0 < len(member_id) <= MAX_NAME_LENGTH
                    and member_id.isprintable()
                    and type(generation_id) is int
                    and -1 <= generation_id <= MAX_GENERATION_ID
                    and (instance_id is None or (type(instance_id) is str
                                                 and 0 < len(instance_id) <= MAX_NAME_LENGTH
                                                 and instance_id.isprintable()))
                    and (wait_ms is None or (type(wait_ms) is int
                                             and 0 <= wait_ms <= MAX_HEARTBEAT_WAIT_MS))):
                return cls(group_id, member_id, generation_id, instance_id, wait_ms or 0)
        return cls._from_fields(obj)

    @classmethod
    def _from_fields(cls, obj: object) -> Self:
        f = Fields(obj)
        return cls(
            group_id=f.string("group_id"),
            member_id=f.string("member_id"),
            generation_id=_generation(f),
            group_instance_id=f.opt_string("group_instance_id"),
            wait_ms=f.integer("wait_ms", lo=0, hi=MAX_HEARTBEAT_WAIT_MS, required=False),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "generation_id": self.generation_id,
            "group_instance_id": self.group_instance_id,
            "wait_ms": self.wait_ms,
        }


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error: ErrorCode | None
    resources_epoch: int = 0
    #: v1.2: an operator asked this member to drain (hand its resources over,
    #: then leave). Sent only when true, so other answers keep their bytes.
    drain: bool = False

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        return cls(ErrorCode.parse(f.error()),
                   f.integer("resources_epoch", lo=0, hi=2**63 - 1, required=False),
                   f.flag("drain"))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"error": _err(self.error),
                                "resources_epoch": self.resources_epoch}
        if self.drain:
            wire["drain"] = True
        return wire


# ---------------------------------------------------------------- leave


@dataclass(frozen=True, slots=True)
class LeaveMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveRequest:
    group_id: str
    members: tuple[LeaveMember, ...]

    API = Api.LEAVE

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        raw = f.items("members") or []
        if not raw:
            raise ValidationError("members", "must list at least one member")
        members = []
        for i, m in enumerate(raw):
            mf = Fields(m, f"members[{i}]")
            instance = mf.opt_string("group_instance_id")
            # Kafka (KIP-345): a static member may leave by instance id alone.
            member_id = mf.string("member_id", allow_empty=instance is not None)
            members.append(LeaveMember(member_id, instance, mf.reason()))
        return cls(group_id=f.string("group_id"), members=tuple(members))

    def to_wire(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "reason": m.reason}
                for m in self.members
            ],
        }


@dataclass(frozen=True, slots=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode | None


@dataclass(frozen=True, slots=True)
class LeaveResponse:
    error: ErrorCode | None
    members: tuple[LeaveMemberResult, ...] = ()

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        members = []
        for i, m in enumerate(f.items("members", required=False) or []):
            mf = Fields(m, f"members[{i}]")
            members.append(LeaveMemberResult(mf.string("member_id", allow_empty=True),
                                             mf.opt_string("group_instance_id"),
                                             ErrorCode.parse(mf.error())))
        return cls(ErrorCode.parse(f.error()), tuple(members))

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": _err(self.error),
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "error": _err(m.error)}
                for m in self.members
            ],
        }


# ---------------------------------------------------------------- checkpoints


def _resource_key(value: object, field: str) -> ResourceKey:
    pair = check_pair(value, field, 2)
    return (check_string(pair[0], f"{field}[0]") or "",
            check_int(pair[1], f"{field}[1]", lo=0, hi=MAX_RESOURCE_INDEX))


def _checkpoint(value: object, field: str) -> Checkpoint:
    triple = check_pair(value, field, 3)
    return (check_string(triple[0], f"{field}[0]") or "",
            check_int(triple[1], f"{field}[1]", lo=0, hi=MAX_RESOURCE_INDEX),
            check_value(triple[2], f"{field}[2]"))


@dataclass(frozen=True, slots=True)
class CommitRequest:
    group_id: str
    member_id: str
    generation_id: int
    checkpoints: tuple[Checkpoint, ...]
    group_instance_id: str | None = None
    #: v1.1 extension (docs/coordinator-semantics.md): the member's own count of its
    #: commits, increasing. A commit arriving after a later one of the same member
    #: was applied (it was delayed on the network after the member gave up on it)
    #: is not applied. Absent: no such check (v1 clients, simple commits).
    sequence: int | None = None

    API = Api.COMMIT

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        raw = f.items("checkpoints") or []
        sequence = f.integer("sequence", lo=0, hi=2**63 - 1, required=False) \
            if f.raw("sequence") is not None else None
        return cls(
            group_id=f.string("group_id"),
            member_id=f.string("member_id"),
            generation_id=_generation(f),
            checkpoints=tuple(_checkpoint(c, f"checkpoints[{i}]") for i, c in enumerate(raw)),
            group_instance_id=f.opt_string("group_instance_id"),
            sequence=sequence,
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "generation_id": self.generation_id,
            "group_instance_id": self.group_instance_id,
            "checkpoints": [list(c) for c in self.checkpoints],
        }
        if self.sequence is not None:
            wire["sequence"] = self.sequence
        return wire


@dataclass(frozen=True, slots=True)
class CommitResponse:
    error: ErrorCode | None
    #: what is wrong, naming the field or the limit, with ``INVALID_REQUEST``
    #: (sent as a 400's body) and ``CHECKPOINT_LIMIT_REACHED``; else empty.
    message: str = ""

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        message = f.raw("message")
        return cls(ErrorCode.parse(f.error()), message if isinstance(message, str) else "")

    def to_wire(self) -> dict[str, Any]:
        if self.message:
            return {"error": _err(self.error), "message": self.message}
        return {"error": _err(self.error)}


def _cursor(f: Fields) -> tuple[bool, ResourceKey | None]:
    """``after`` of a fetch: absent or nil (v1, not paged), ``[]`` (the first page),
    or ``[set, index]`` (the page after that resource)."""
    raw = f.raw("after")
    if raw is None:
        return False, None
    if isinstance(raw, list) and not raw:
        return True, None
    return True, _resource_key(raw, "after")


@dataclass(frozen=True, slots=True)
class FetchRequest:
    group_id: str
    resources: tuple[ResourceKey, ...] | None = None
    #: v1.1 paging (only with ``resources`` absent): ``paged`` asks for one page of
    #: at most MAX_FETCH_CHECKPOINTS checkpoints, those sorted after ``after``
    #: (``None``: from the first); the answer's ``next`` is the following ``after``.
    paged: bool = False
    after: ResourceKey | None = None

    API = Api.FETCH

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        raw = f.items("resources", required=False, nullable=True,
                      max_items=MAX_FETCH_CHECKPOINTS)
        resources = (None if raw is None else
                     tuple(_resource_key(r, f"resources[{i}]") for i, r in enumerate(raw)))
        paged, after = _cursor(f)
        if paged and resources is not None:
            raise ValidationError("after", "pages only a fetch of every checkpoint "
                                  "(resources absent); a list of resources is answered whole")
        return cls(group_id=f.string("group_id"), resources=resources, paged=paged, after=after)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "group_id": self.group_id,
            "resources": None if self.resources is None else [list(r) for r in self.resources],
        }
        if self.paged:
            wire["after"] = [] if self.after is None else list(self.after)
        return wire


@dataclass(frozen=True, slots=True)
class FetchResponse:
    error: ErrorCode | None
    checkpoints: tuple[Checkpoint, ...] = field(default=())
    #: v1.1, paged fetches: the ``after`` of the next page; ``None`` when this
    #: page ends the listing.
    next: ResourceKey | None = None
    #: with ``INVALID_REQUEST`` (sent as a 400's body): what is wrong.
    message: str = ""

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        raw = f.items("checkpoints", required=False) or []
        cursor = f.raw("next")
        return cls(ErrorCode.parse(f.error()),
                   tuple(_checkpoint(c, f"checkpoints[{i}]") for i, c in enumerate(raw)),
                   None if cursor is None else _resource_key(cursor, "next"))

    def to_wire(self) -> dict[str, Any]:
        wire = {"error": _err(self.error), "checkpoints": [list(c) for c in self.checkpoints],
                "next": None if self.next is None else list(self.next)}
        if self.message:
            wire["message"] = self.message
        return wire


# ---------------------------------------------------------------- find_coordinator


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest:
    """v1.1: which coordinator owns ``group_id`` (any coordinator answers, any group)."""

    group_id: str

    API = Api.FIND_COORDINATOR

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        return cls(group_id=Fields(obj).string("group_id"))

    def to_wire(self) -> dict[str, Any]:
        return {"group_id": self.group_id}


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse:
    """``url``: the owner's advertised URL; ``partition``: the group's partition.

    ``COORDINATOR_NOT_AVAILABLE`` (``url`` empty) while no coordinator owns it.
    """

    error: ErrorCode | None
    url: str = ""
    partition: int = 0

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        f = Fields(obj)
        url = f.raw("url")
        return cls(ErrorCode.parse(f.error()), url if isinstance(url, str) else "",
                   f.integer("partition", lo=0, hi=2**31 - 1, required=False))

    def to_wire(self) -> dict[str, Any]:
        return {"error": _err(self.error), "url": self.url, "partition": self.partition}


@dataclass(frozen=True, slots=True)
class NotCoordinatorAnswer:
    """What a coordinator answers any protocol call for a group it does not serve
    (v1.1): ``NOT_COORDINATOR`` with the owner's ``url`` when known, or
    ``COORDINATOR_LOAD_IN_PROGRESS`` while it loads the group's partition.

    Sent instead of the call's own response (the call changed nothing), so a
    client reads ``error`` (and ``url``) before it parses the call's fields.
    """

    error: ErrorCode
    url: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"error": self.error.value, "url": self.url}


#: The field in which a listener's 404 for a call it does not serve names
#: itself (:data:`ADMIN_LISTENER` or :data:`PROTOCOL_LISTENER`): a client
#: pointed at the other port says so instead of retrying or printing a bare 404.
LISTENER_FIELD = "listener"
ADMIN_LISTENER = "admin"
PROTOCOL_LISTENER = "protocol"


Request = (JoinRequest | SyncRequest | HeartbeatRequest | LeaveRequest | CommitRequest
           | FetchRequest)
Response = (JoinResponse | SyncResponse | HeartbeatResponse | LeaveResponse | CommitResponse
            | FetchResponse)

#: ``/v1/<api>`` -> (request type, response type)
APIS: dict[Api, tuple[type[Any], type[Any]]] = {
    Api.JOIN: (JoinRequest, JoinResponse),
    Api.SYNC: (SyncRequest, SyncResponse),
    Api.HEARTBEAT: (HeartbeatRequest, HeartbeatResponse),
    Api.LEAVE: (LeaveRequest, LeaveResponse),
    Api.COMMIT: (CommitRequest, CommitResponse),
    Api.FETCH: (FetchRequest, FetchResponse),
    Api.FIND_COORDINATOR: (FindCoordinatorRequest, FindCoordinatorResponse),
}
