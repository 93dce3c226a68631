"""groupcoord client library: a group member and the assignors.

``GroupMember`` (asyncio) and ``BlockingGroupMember`` (its own thread) join a
group on the coordinator, run the leader-side assignment with the assignors of
``client.assignors``, and call a ``RebalanceListener`` as resources come and
go (KIP-429 semantics). See docs/client.md.
"""

from client.blocking import BlockingGroupMember
from client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    FatalMemberError,
    FencedInstanceIdError,
    GroupAuthorizationFailedError,
    GroupCoordError,
    GroupMaxSizeReachedError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    MemberClosedError,
    NotCoordinatorError,
    NotOwnedError,
    RebalanceInProgressError,
    TLSVerificationError,
    WrongListenerError,
)
from client.listener import RebalanceListener, Resource
from client.member import GroupMember

__all__ = [
    "BlockingGroupMember",
    "CommitFailedError",
    "CoordinatorUnavailableError",
    "FatalMemberError",
    "FencedInstanceIdError",
    "GroupAuthorizationFailedError",
    "GroupCoordError",
    "GroupMaxSizeReachedError",
    "GroupMember",
    "InconsistentGroupProtocolError",
    "InvalidRequestError",
    "InvalidSessionTimeoutError",
    "MemberClosedError",
    "NotCoordinatorError",
    "NotOwnedError",
    "RebalanceInProgressError",
    "RebalanceListener",
    "Resource",
    "TLSVerificationError",
    "WrongListenerError",
]
