"""Protocol error codes (docs/protocol.md, "Error codes"); meanings are Kafka's."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """A protocol outcome carried in a response's ``error`` field.

    Success is ``error: null`` on the wire (``None`` in Python), never a code.
    """

    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    ILLEGAL_GENERATION = "ILLEGAL_GENERATION"
    REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
    MEMBER_ID_REQUIRED = "MEMBER_ID_REQUIRED"
    INCONSISTENT_GROUP_PROTOCOL = "INCONSISTENT_GROUP_PROTOCOL"
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    FENCED_INSTANCE_ID = "FENCED_INSTANCE_ID"
    INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
    UNKNOWN_GROUP = "UNKNOWN_GROUP"
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
    COORDINATOR_LOAD_IN_PROGRESS = "COORDINATOR_LOAD_IN_PROGRESS"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"
    #: v1.1, several coordinators: the call reached a coordinator that does not own
    #: the group's partition; the answer's ``url`` names the owner when known.
    #: Nothing was changed; ask ``find_coordinator`` and retry there (Kafka's).
    NOT_COORDINATOR = "NOT_COORDINATOR"
    GROUP_AUTHORIZATION_FAILED = "GROUP_AUTHORIZATION_FAILED"
    INVALID_REQUEST = "INVALID_REQUEST"
    #: v1.1: a commit would take its group over a checkpoint cap
    #: (``--max-checkpoints-per-group``, ``--max-checkpoint-bytes-per-group``);
    #: nothing was written. Not Kafka's (it has no such cap).
    CHECKPOINT_LIMIT_REACHED = "CHECKPOINT_LIMIT_REACHED"
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"

    @classmethod
    def parse(cls, value: object) -> ErrorCode | None:
        """Decode a wire ``error`` field; ``None`` is success.

        An unknown code (a newer server) becomes ``UNKNOWN_SERVER_ERROR`` so an
        older client still reacts to it, as Kafka's clients do.
        """
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                return cls.UNKNOWN_SERVER_ERROR
        return cls.UNKNOWN_SERVER_ERROR
