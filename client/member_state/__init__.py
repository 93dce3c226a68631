"""The group member as a sans-IO state machine (docs/architecture.md practice 7).

The driver (:class:`~client.member_state.driver.MemberDriver`, itself sans-IO,
run by ``client/member.py`` on asyncio, which the simulator's
``tests/sim/member.py`` runs on a simulated clock and network) asks
:meth:`MemberStateMachine.next_action` what to do at time ``now_ms``, turns
it into effects for its runtime and reports the outcomes back; see
:mod:`client.member_state.machine`. The package:

=================  ==========================================================
module             holds
=================  ==========================================================
``actions``        the states, the actions (``Call``, ``InvokeListener``,
                   ``Wait``, ``Stop``), the rebalance events and
                   ``RebalanceLog``, the error table ``ERROR_ACTIONS``
``config``         ``MemberConfig`` (checked when built) and the protocol
                   choice (KIP-429)
``lease``          ``Lease``: the safety lease, until when the member may
                   believe it owns its resources (the timing rule that keeps
                   it renewable is ``client/lease.py``)
``heartbeat``      ``SideChannel``: the background heartbeat (KIP-62), and
                   the rule for a join or sync the coordinator is done with
``main_channel``   ``MainCall``: the call in flight and what the side channel
                   learnt about it; ``Schedule``: when the next request is
                   due, the retry backoff
``states``         ``Joining``, ``Syncing``, ``Stable``: one object per
                   state, holding only what that state means
``handover``       ``Handover``: the standbys to warm up (beside the steps) and
                   the drain (docs/protocol.md, "Drain")
``core``           ``MemberCore``: what outlives a state (the membership,
                   what is owned, the channels, the lease, the rejoin asked
                   for) and the moves every step shares
``joining``        ``JoinStep``: the join request and its answer
``syncing``        ``SyncStep``: the leader's catalog read and assignment,
                   the sync, the assignment delivered
``stable``         ``StableStep``: the heartbeat long-poll, commits, load
                   reports
``closing``        ``CloseStep``: the final revocation, the leave
``recovery``       ``Recovery``: the error table's actions (rejoin, reset,
                   retry after a backoff, fail)
``background``     ``BackgroundHeartbeat``: the side channel's heartbeats and
                   what their answers mean
``machine``        ``MemberStateMachine``: the public surface; dispatches to
                   the step of the current state
``driver``         ``MemberDriver``: the decisions around the machine (the
                   main call and the side channel's heartbeat, their
                   timeouts, the callbacks, when to look again) as effects
=================  ==========================================================
"""

from client.member_state.actions import (
    ERROR_ACTIONS,
    Action,
    Call,
    CallbackKind,
    ErrorAction,
    InvokeListener,
    MemberState,
    RebalanceCompleted,
    RebalanceEvent,
    RebalanceFailed,
    RebalanceStarted,
    Resource,
    Stop,
    UnknownSets,
    Wait,
)
from client.member_state.config import MemberConfig, choose_protocol
from client.member_state.machine import MemberStateMachine, from_index_map, to_index_map

__all__ = [
    "ERROR_ACTIONS",
    "Action",
    "Call",
    "CallbackKind",
    "ErrorAction",
    "InvokeListener",
    "MemberConfig",
    "MemberState",
    "MemberStateMachine",
    "RebalanceCompleted",
    "RebalanceEvent",
    "RebalanceFailed",
    "RebalanceStarted",
    "Resource",
    "Stop",
    "UnknownSets",
    "Wait",
    "choose_protocol",
    "from_index_map",
    "to_index_map",
]
