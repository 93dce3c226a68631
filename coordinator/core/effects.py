"""Effects: what the core asks the runtime to do, as plain values.

``GroupCoordinator.handle`` returns a list of effects in order. The runtime
writes every :class:`Persist` of the call in one storage transaction, and sends
every :class:`Reply` only after the writes it depends on are committed
(docs/architecture.md practice 5: reply after commit): those of its group and of the
catalog, whenever emitted, and those its own command emitted before it.
Timers are keyed by strings: arming a key again replaces its deadline;
cancelling an unknown key is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.records import Record
from protocol.errors import ErrorCode
from protocol.messages import Response
from protocol.validate import Scalar


@dataclass(frozen=True, slots=True)
class AdminResult:
    """The answer to an admin command: ``error`` is ``None`` on success."""

    error: ErrorCode | None
    resources_epoch: int = 0
    #: False when the named object (a resource set, or a group for
    #: ``DeleteGroup``, whose ``error`` is then ``UNKNOWN_GROUP``) does not exist: HTTP 404.
    found: bool = True
    #: with ``error`` ``INVALID_REQUEST``: what is wrong, naming the field (HTTP 400 message).
    message: str = ""
    #: ``ResetCheckpoints``: the checkpoints it concerns, before and after (after: a
    #: deleted one is absent), each ``(set, index, value)`` sorted by resource.
    before: tuple[tuple[str, int, Scalar], ...] = ()
    after: tuple[tuple[str, int, Scalar], ...] = ()
    #: ``DrainMember``: the member it named (its member id and instance id), and
    #: whether that member already reports ``draining`` (then nothing was asked).
    member_id: str = ""
    group_instance_id: str | None = None
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    request_id: int
    response: Response | AdminResult


@dataclass(frozen=True, slots=True)
class Persist:
    record: Record


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    key: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: str


@dataclass(frozen=True, slots=True)
class GroupStateChanged:
    """A group changed state: one log line, and the groups-by-state gauge."""

    group_id: str
    old_state: str | None  # None: the group was just created
    new_state: str
    generation_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class RebalanceCompleted:
    """A generation got its assignment (for the duration histogram)."""

    group_id: str
    generation_id: int
    duration_ms: int
    member_count: int


@dataclass(frozen=True, slots=True)
class MemberExpired:
    """A member's session timed out (for the session-expiries counter)."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class DrainRequested:
    """An operator asked a member to drain, and it was not asked yet (for the
    drain-requests counter and one log line)."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class RequestRefused:
    """A request was refused by a server limit (``reason``: e.g. ``"max_groups"``).

    The runtime counts it (``groupcoord_requests_refused_total``) and logs a
    warning now and then; the refusal itself is the ``Reply`` next to it.
    """

    group_id: str
    reason: str


Effect = (Reply | Persist | ScheduleTimer | CancelTimer | GroupStateChanged
          | RebalanceCompleted | MemberExpired | DrainRequested | RequestRefused)
