"""One object per rebalancing state, holding only what that state means.

The machine is in exactly one state (:class:`~client.member_state.actions.MemberState`);
JOINING, SYNCING and STABLE carry data, made fresh when the state is entered
and dropped when it is left, so no field outlives the state it belongs to.
LEAVING, CLOSED and FAILED carry none (:class:`Ended`). What outlives a
state lives on :class:`~client.member_state.core.MemberCore`: the
membership (member id, generation, leader), what is owned, the lease
(:mod:`client.member_state.lease`), the main call
(:mod:`client.member_state.main_channel`) and the side channel
(:mod:`client.member_state.heartbeat`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from client.member_state.actions import MemberState
from client.transport import CatalogResponse
from protocol.messages import JoinMember, SyncRequest, SyncResponse

__all__ = ["Ended", "Joining", "Phase", "Stable", "Syncing"]


@dataclass(slots=True)
class Joining:
    """A join is due or in flight."""

    state: ClassVar[MemberState] = MemberState.JOINING
    #: why: sent as the join's ``reason``, logged with the rebalance.
    reason: str
    #: send time of the first join since the last successful one (the
    #: generation it leads to formed after it: the sync deadline's base).
    first_sent_ms: int | None = None


@dataclass(slots=True)
class Syncing:
    """The join phase completed; the leader reads the catalog and assigns;
    every member syncs."""

    state: ClassVar[MemberState] = MemberState.SYNCING
    #: the rebalance bound's base while syncing: the sync deadline is no
    #: earlier than this + the rebalance timeout (client/member_state/lease.py).
    base_ms: int
    #: the members the join answer listed (the leader's only).
    members: tuple[JoinMember, ...] = ()
    #: KIP-814: the leader need not assign (the group kept an earlier assignment).
    skip_assignment: bool = False
    #: the leader's catalog read, then the sync request built from it (sent
    #: again as is when the sync is retried).
    catalog: CatalogResponse | None = None
    request: SyncRequest | None = None
    #: a sync answer read too late to trust, until a heartbeat confirms it.
    pending: SyncResponse | None = None


@dataclass(slots=True)
class Stable:
    """Assigned; heartbeating (a long-poll held up to an interval)."""

    state: ClassVar[MemberState] = MemberState.STABLE
    #: the leader's: the catalog epoch this generation's assignment covers
    #: (a later epoch in a heartbeat's answer makes the leader rejoin). None
    #: for followers.
    assigned_epoch: int | None = None
    #: this member revoked resources for a hand-over and has not rejoined
    #: since (KIP-429: its rejoin starts the follow-up rebalance that
    #: completes it), so closing must leave even if static.
    handover_pending: bool = False


@dataclass(frozen=True, slots=True)
class Ended:
    """LEAVING, CLOSED or FAILED: nothing to hold."""

    state: MemberState


Phase = Joining | Syncing | Stable | Ended
