"""What the member machine says to its driver, and the table it reacts by.

- the states (:class:`MemberState`, Kafka's ``AbstractCoordinator.MemberState``);
- the actions, values the driver performs one at a time: :class:`Call`,
  :class:`InvokeListener`, :class:`Wait`, :class:`Stop`;
- the rebalance events the driver turns into metrics and logs, and the
  :class:`RebalanceLog` that produces them;
- :data:`ERROR_ACTIONS`, the one table from a protocol outcome to the
  member's reaction (KIP-429, "For every consumer", step 1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from client.errors import FatalMemberError
from protocol.errors import ErrorCode
from protocol.messages import Api

__all__ = [
    "COMMIT_CONTENT_ERRORS",
    "ERROR_ACTIONS",
    "Action",
    "Call",
    "CallbackKind",
    "ErrorAction",
    "InvokeListener",
    "MemberState",
    "RebalanceCompleted",
    "RebalanceEvent",
    "RebalanceFailed",
    "RebalanceLog",
    "RebalanceStarted",
    "Resource",
    "Stop",
    "Wait",
]

Resource = tuple[str, int]


class MemberState(enum.Enum):
    JOINING = "joining"
    SYNCING = "syncing"
    STABLE = "stable"
    LEAVING = "leaving"
    CLOSED = "closed"
    FAILED = "failed"


class CallbackKind(enum.StrEnum):
    ASSIGNED = "assigned"
    REVOKED = "revoked"
    LOST = "lost"
    #: v1.2: standbys no longer wanted (not owned either). Their warm-up,
    #: ``on_standby``, runs beside the steps (driver.StartWarmup), not as one.
    STANDBY_DROPPED = "standby_dropped"


class ErrorAction(enum.Enum):
    REJOIN = "rejoin"
    RESET_GENERATION = "reset_generation"
    RESET_MEMBER = "reset_member"
    SET_MEMBER_ID = "set_member_id"
    RETRY = "retry"
    FATAL = "fatal"


#: The one table from a protocol outcome to the member's reaction.
ERROR_ACTIONS: dict[ErrorCode, ErrorAction] = {
    ErrorCode.REBALANCE_IN_PROGRESS: ErrorAction.REJOIN,
    ErrorCode.ILLEGAL_GENERATION: ErrorAction.RESET_GENERATION,
    ErrorCode.UNKNOWN_MEMBER_ID: ErrorAction.RESET_MEMBER,
    # Protocol calls answer UNKNOWN_MEMBER_ID for a group that does not exist;
    # should UNKNOWN_GROUP ever come back, it means the same thing.
    ErrorCode.UNKNOWN_GROUP: ErrorAction.RESET_MEMBER,
    ErrorCode.MEMBER_ID_REQUIRED: ErrorAction.SET_MEMBER_ID,
    ErrorCode.FENCED_INSTANCE_ID: ErrorAction.FATAL,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: ErrorAction.FATAL,
    ErrorCode.GROUP_MAX_SIZE_REACHED: ErrorAction.FATAL,
    ErrorCode.INVALID_SESSION_TIMEOUT: ErrorAction.FATAL,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: ErrorAction.FATAL,
    ErrorCode.INVALID_REQUEST: ErrorAction.FATAL,
    ErrorCode.NON_EMPTY_GROUP: ErrorAction.FATAL,  # an admin-only code: a server bug
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: ErrorAction.RETRY,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: ErrorAction.RETRY,
    # v1.1: the transport follows it to the group's coordinator
    # (client.transport.CoordinatorRouter); should it reach the machine, the
    # step is retried, the membership kept.
    ErrorCode.NOT_COORDINATOR: ErrorAction.RETRY,
    ErrorCode.UNKNOWN_SERVER_ERROR: ErrorAction.RETRY,
    # Only a commit gets it (a group's checkpoint cap): that commit fails with
    # CommitFailedError; the membership is not touched.
    ErrorCode.CHECKPOINT_LIMIT_REACHED: ErrorAction.RETRY,
}


#: a commit's outcomes about what the commit carries, not about the member.
COMMIT_CONTENT_ERRORS = frozenset({ErrorCode.INVALID_REQUEST,
                                   ErrorCode.CHECKPOINT_LIMIT_REACHED})


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Call:
    api: Api
    request: object
    timeout_ms: int
    #: a parked heartbeat may be abandoned when there is other work to do;
    #: joins and syncs only by ``close()``.
    interruptible: bool = False


@dataclass(frozen=True, slots=True)
class InvokeListener:
    kind: CallbackKind
    resources: frozenset[Resource]


@dataclass(frozen=True, slots=True)
class Wait:
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class Stop:
    error: FatalMemberError | None


Action = Call | InvokeListener | Wait | Stop


# ---------------------------------------------------------------- events (for metrics)


@dataclass(frozen=True, slots=True)
class RebalanceStarted:
    at_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class RebalanceCompleted:
    at_ms: int
    latency_ms: int
    generation_id: int


@dataclass(frozen=True, slots=True)
class RebalanceFailed:
    at_ms: int
    reason: str
    #: the same step is retried after a backoff (the coordinator was not
    #: reachable or not available); the driver reports those with backoff.
    retriable: bool = False


@dataclass(frozen=True, slots=True)
class UnknownSets:
    """As leader, this member found subscriptions to resource sets the catalog
    does not have: nothing of them is assigned. Each set name is reported once
    per member process."""

    at_ms: int
    #: (member id, the sets it subscribes to that the catalog lacks), by member id.
    members: tuple[tuple[str, tuple[str, ...]], ...]
    #: the catalog's set names.
    known: tuple[str, ...]


RebalanceEvent = RebalanceStarted | RebalanceCompleted | RebalanceFailed | UnknownSets


class RebalanceLog:
    """The rebalance a member is in, as the metrics see it: started (a join
    is due), failed, or completed (when ``on_assigned`` for the assignment
    that ended it returns). Events queue until the driver drains them."""

    __slots__ = ("_complete_on_assigned", "_events", "started_ms")

    def __init__(self) -> None:
        #: when the rebalance in progress started (None: none is).
        self.started_ms: int | None = None
        #: the next ``on_assigned`` to return completes it.
        self._complete_on_assigned = False
        self._events: list[RebalanceEvent] = []

    def start(self, now_ms: int, reason: str) -> None:
        self._events.append(RebalanceStarted(now_ms, reason))
        self.started_ms = now_ms

    def fail(self, now_ms: int, reason: str, *, retriable: bool, syncing: bool) -> None:
        if self.started_ms is not None or syncing:
            self._events.append(RebalanceFailed(now_ms, reason, retriable))
        self.started_ms = None

    def unknown_sets(self, event: UnknownSets) -> None:
        self._events.append(event)

    def assignment_delivered(self) -> None:
        self._complete_on_assigned = True

    def forget_assignment(self) -> None:
        """The assignment delivered is superseded (lost, or a rejoin began)."""
        self._complete_on_assigned = False

    def assigned(self, now_ms: int, generation_id: int) -> None:
        """``on_assigned`` returned."""
        if not self._complete_on_assigned:
            return
        self._complete_on_assigned = False
        started, self.started_ms = self.started_ms, None
        self._events.append(RebalanceCompleted(
            now_ms, now_ms - started if started is not None else 0, generation_id))

    def drain(self) -> list[RebalanceEvent]:
        events, self._events = self._events, []
        return events
