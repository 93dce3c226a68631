"""The exceptions a worker can see from the client library.

Exceptions are translated at the boundary only (docs/architecture.md practice 7, the
httpx model): the transport turns network and HTTP failures into
:class:`CoordinatorUnavailableError` / :class:`InvalidRequestError`, the
member turns protocol error codes into the classes below. Inside the member
state machine a protocol outcome is an :class:`~protocol.errors.ErrorCode`
value, never an exception.

Hierarchy::

    GroupCoordError
    ├── CoordinatorUnavailableError      retriable: network, 5xx, timeout
    │   └── NotCoordinatorError          v1.1: that coordinator does not serve the group (yet)
    ├── CommitFailedError                a commit was refused (carries the code)
    │   └── RebalanceInProgressError     ... because a rebalance is running (or ran since)
    ├── NotOwnedError                    committing a resource the member does not own
    ├── MemberClosedError                the member is closed
    └── FatalMemberError                 the member stopped for good (carries the code)
        ├── FencedInstanceIdError        KIP-345: another instance took our group_instance_id
        ├── InconsistentGroupProtocolError
        ├── GroupMaxSizeReachedError
        ├── InvalidSessionTimeoutError
        ├── GroupAuthorizationFailedError
        ├── TLSVerificationError         the coordinator's certificate could not be verified
        ├── WrongListenerError           the URL is the admin port, not the protocol port
        └── InvalidRequestError          the server could not understand a request (a bug)
"""

from __future__ import annotations

from protocol.errors import ErrorCode

__all__ = [
    "CommitFailedError",
    "CoordinatorUnavailableError",
    "FatalMemberError",
    "FencedInstanceIdError",
    "GroupAuthorizationFailedError",
    "GroupCoordError",
    "GroupMaxSizeReachedError",
    "InconsistentGroupProtocolError",
    "InvalidRequestError",
    "InvalidSessionTimeoutError",
    "MemberClosedError",
    "NotCoordinatorError",
    "NotOwnedError",
    "RebalanceInProgressError",
    "TLSVerificationError",
    "WrongListenerError",
    "fatal_error_for",
]


class GroupCoordError(Exception):
    """Base class of every error the client library raises on purpose."""


class CoordinatorUnavailableError(GroupCoordError):
    """The coordinator could not be reached or answered 5xx; retriable.

    ``http_status``: the HTTP status when the coordinator answered one (a 5xx,
    or 404 from a server that does not have the call), else ``None``; ``url``:
    the coordinator that failed (credentials left out), when one did (``None``
    when every URL of a list was tried)."""

    def __init__(self, message: str, *, http_status: int | None = None,
                 url: str | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.url = url


class NotCoordinatorError(CoordinatorUnavailableError):
    """v1.1, several coordinators: the call reached a coordinator that does not
    serve its group (``NOT_COORDINATOR``; ``owner_url`` names the owner when
    that coordinator knows it) or is still loading the group's partition
    (``COORDINATOR_LOAD_IN_PROGRESS``). Nothing was changed there; the call
    may be sent again, to the owner. Retriable, like any unavailability: a
    router (:class:`client.transport.CoordinatorRouter`) follows it."""

    def __init__(self, message: str, code: ErrorCode, owner_url: str = "",
                 url: str | None = None) -> None:
        super().__init__(message, url=url)
        self.code = code
        self.owner_url = owner_url


class NotOwnedError(GroupCoordError):
    """A commit named resources the member does not own (docs/protocol.md,
    "POST /v1/commit and POST /v1/fetch": only the owner's progress counts);
    nothing was sent. ``reason``, when given, says why it no longer owns them (its
    safety deadline passed)."""

    def __init__(self, resources: list[tuple[str, int]], reason: str | None = None) -> None:
        shown = ", ".join(f"{s}[{i}]" for s, i in resources[:10])
        more = f" and {len(resources) - 10} more" if len(resources) > 10 else ""
        super().__init__(f"this member does not own {shown}{more}"
                         + (f": {reason}" if reason else ""))
        self.resources = resources
        self.reason = reason


class MemberClosedError(GroupCoordError):
    """The member was closed; it can no longer commit or subscribe."""


class CommitFailedError(GroupCoordError):
    """The coordinator refused a commit with ``code`` (a stale generation or an
    unknown member: this member no longer owns what it tried to commit)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or f"commit refused: {code.value}")
        self.code = code


class RebalanceInProgressError(CommitFailedError):
    """A commit arrived while the group rebalances (``REBALANCE_IN_PROGRESS``:
    the member rejoins), or was refused for a generation the member has left
    or is leaving (``ILLEGAL_GENERATION`` while it rejoins or after: its
    membership is untouched); the caller may commit again once the rebalance
    completes (Kafka's RebalanceInProgressException)."""


class FatalMemberError(GroupCoordError):
    """The member stopped and will not rejoin by itself; ``code`` says why."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class FencedInstanceIdError(FatalMemberError):
    """KIP-345: another process joined with this ``group_instance_id``; this one
    is a zombie and must stop."""

    code = ErrorCode.FENCED_INSTANCE_ID


class InconsistentGroupProtocolError(FatalMemberError):
    """None of this member's assignors (or its protocol type) is supported by the
    rest of the group."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class GroupMaxSizeReachedError(FatalMemberError):
    """The group is full (``--group-max-size``)."""

    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class InvalidSessionTimeoutError(FatalMemberError):
    """``session_timeout_ms`` is outside the coordinator's allowed range."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class GroupAuthorizationFailedError(FatalMemberError):
    """Missing or wrong credentials, or a group outside the caller's grant."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class TLSVerificationError(FatalMemberError):
    """The coordinator's TLS certificate could not be verified (unknown CA, wrong
    host name, expired): a setting to fix (``ca_file=``), not a fault that
    retrying heals, so the member stops instead of retrying forever. The code
    is ``COORDINATOR_NOT_AVAILABLE``: no trusted coordinator was reached."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class WrongListenerError(FatalMemberError):
    """The member's URL reached the coordinator's admin listener (``--admin-port``),
    which serves no protocol call: a setting to fix, so the member stops instead
    of retrying. The code is ``COORDINATOR_NOT_AVAILABLE``: no coordinator's
    protocol listener was reached."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class InvalidRequestError(FatalMemberError):
    """The coordinator could not understand a request (HTTP 400/413/415): a bug
    or a version mismatch, never fixed by retrying."""

    code = ErrorCode.INVALID_REQUEST


_FATAL_CLASSES: dict[ErrorCode, type[FatalMemberError]] = {
    ErrorCode.FENCED_INSTANCE_ID: FencedInstanceIdError,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: InconsistentGroupProtocolError,
    ErrorCode.GROUP_MAX_SIZE_REACHED: GroupMaxSizeReachedError,
    ErrorCode.INVALID_SESSION_TIMEOUT: InvalidSessionTimeoutError,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: GroupAuthorizationFailedError,
    ErrorCode.INVALID_REQUEST: InvalidRequestError,
}


def fatal_error_for(code: ErrorCode, api: str, detail: str = "") -> FatalMemberError:
    """The exception a fatal protocol outcome of call ``api`` becomes."""
    cls = _FATAL_CLASSES.get(code, FatalMemberError)
    text = f"{api}: {code.value}" + (f" ({detail})" if detail else "")
    return cls(text, code)
