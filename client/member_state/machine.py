"""The group member as a sans-IO state machine (docs/architecture.md practice 7).

No sockets, no asyncio, no clock: the driver (``client/member.py``) asks
:meth:`MemberStateMachine.next_action` what to do at time ``now_ms``, does
it, and reports back (:meth:`~MemberStateMachine.receive`,
:meth:`~MemberStateMachine.call_failed`,
:meth:`~MemberStateMachine.call_abandoned`,
:meth:`~MemberStateMachine.listener_done`). Actions are values
(:mod:`client.member_state.actions`):

- :class:`Call`: send one request (join, sync, heartbeat, leave, or the
  catalog read), bounded by ``timeout_ms``;
- :class:`InvokeListener`: run ``on_assigned`` / ``on_revoked`` / ``on_lost`` /
  ``on_standby_dropped`` (warm-ups, ``on_standby``, run beside the steps:
  :meth:`~MemberStateMachine.start_warmups`, :meth:`~MemberStateMachine.warmup_done`;
  the drain and the standbys are :mod:`client.member_state.handover`'s);
- :class:`Wait`: nothing to do until ``until_ms`` (or until the caller pokes
  the member: a subscription change, a commit's answer, ``close()``);
- :class:`Stop`: the member is done (closed, or failed with ``error``).

Exactly one action is outstanding at a time; the machine raises
``RuntimeError`` when the driver breaks that contract (a bug, never a
protocol outcome).

States follow Kafka's ``AbstractCoordinator.MemberState``:
JOINING (a join is due or in flight), SYNCING (the join phase completed; the
leader reads the catalog and assigns; everyone syncs), STABLE (heartbeating),
LEAVING, CLOSED, FAILED. Each of the first three is an object holding what
that state means (:mod:`client.member_state.states`).
Each state's step is an object of its own module, acting on what outlives
a state (:class:`~client.member_state.core.MemberCore`, which this machine
is): :class:`~client.member_state.joining.JoinStep`,
:class:`~client.member_state.syncing.SyncStep`,
:class:`~client.member_state.stable.StableStep`,
:class:`~client.member_state.closing.CloseStep`; the error table's actions
are :class:`~client.member_state.recovery.Recovery`'s, the side channel's
decisions :class:`~client.member_state.background.BackgroundHeartbeat`'s.

Protocol outcomes go through one table, :data:`ERROR_ACTIONS`, as Kafka's
client does (KIP-429, "For every consumer", step 1):

===========================  ===============================================
code                         action
===========================  ===============================================
REBALANCE_IN_PROGRESS        REJOIN: keep what is owned (cooperative), rejoin
ILLEGAL_GENERATION           RESET_GENERATION: ``on_lost`` everything, rejoin
UNKNOWN_MEMBER_ID            RESET_MEMBER: also forget the member id
MEMBER_ID_REQUIRED           SET_MEMBER_ID (join): take the id, join again
FENCED_INSTANCE_ID, ...      FATAL: ``on_lost`` everything, stop, raise
COORDINATOR_NOT_AVAILABLE,.. RETRY: same step again after backoff + jitter
===========================  ===============================================

The safety rule: a member never believes it owns a resource past the moment
the coordinator may have given it away, the end of its lease
(:mod:`client.member_state.lease`). When that moment passes, ``on_lost``
comes before anything else, and a join or sync in flight is abandoned for it
(``wants_interrupt``). The member keeps heartbeating while it rejoins, and
while a listener callback runs (Kafka's KIP-62 heartbeat thread), on a side channel
(:meth:`MemberStateMachine.background_heartbeat`;
:mod:`client.member_state.heartbeat`, which also says when a join or sync in
flight is one the coordinator is done with, and is sent again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from client.assignors import RebalanceProtocol
from client.errors import CommitFailedError, FatalMemberError
from client.member_state.actions import (
    Action,
    Call,
    CallbackKind,
    InvokeListener,
    MemberState,
    RebalanceEvent,
    Resource,
    Stop,
    Wait,
)
from client.member_state.background import BackgroundHeartbeat
from client.member_state.closing import CloseStep
from client.member_state.config import MemberConfig
from client.member_state.core import MemberCore, from_index_map, to_index_map
from client.member_state.joining import JoinStep
from client.member_state.main_channel import MainCall
from client.member_state.recovery import Recovery, with_api
from client.member_state.stable import StableStep
from client.member_state.states import Joining, Stable, Syncing
from client.member_state.syncing import SyncStep
from client.transport import CatalogResponse
from protocol.errors import ErrorCode
from protocol.messages import (
    Api,
    CommitRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinResponse,
    LeaveResponse,
    Scalar,
    SyncResponse,
)

__all__ = ["MemberStateMachine", "from_index_map", "to_index_map"]


class MemberStateMachine(MemberCore):
    """One group member's protocol logic. See the module docstring."""

    def __init__(self, config: MemberConfig, *,
                 rng: Callable[[], float] | None = None,
                 assignor_clock: Callable[[], int] | None = None,
                 incarnation: str | None = None) -> None:
        super().__init__(config, rng=rng, assignor_clock=assignor_clock,
                         incarnation=incarnation)
        self._recovery = Recovery(self)
        self._joining = JoinStep(self, self._recovery)
        self._syncing = SyncStep(self, self._recovery)
        self._stable = StableStep(self, self._recovery, self._syncing)
        self._closer = CloseStep(self)
        self._background = BackgroundHeartbeat(self, self._recovery)

    # ------------------------------------------------------------ queries

    @property
    def owned(self) -> frozenset[Resource]:
        """What the member owns as of the last step the driver ran."""
        return self._owned

    def owned_at(self, now_ms: int) -> frozenset[Resource]:
        """What the member may still believe it owns at ``now_ms``: nothing
        once the safety deadline has passed, even before the driver got to
        run ``on_lost`` (a process paused past its session, a busy loop)."""
        owned = self._owned
        deadline = self.safety_deadline_ms()
        if deadline is not None and now_ms >= deadline:
            return frozenset()
        return owned

    @property
    def standby(self) -> frozenset[Resource]:
        """The standbys of the last assignment: warmed, never owned."""
        return self._handover.standby

    @property
    def draining(self) -> bool:
        return self._handover.draining

    @property
    def drained(self) -> bool:
        """Draining and done: owns nothing (and, staying, the group knows it)."""
        return self._handover.drained(self._owned)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def rejoin_requested(self) -> bool:
        """Whether a rejoin was asked for and has not started yet."""
        return self._rejoin is not None

    def lease_expiry(self, now_ms: int) -> str:
        """Why the lease ended, once ``safety_deadline_ms()`` has passed: the
        bound that ran out, with its setting."""
        if self._lease.session_expired(now_ms):
            return (f"no successful heartbeat for a session timeout "
                    f"(session_timeout_ms={self.config.session_timeout_ms})")
        return (f"the rebalance outlasted the rebalance timeout "
                f"(rebalance_timeout_ms={self.config.rebalance_timeout_ms})")

    def drain_events(self) -> list[RebalanceEvent]:
        return self._rebalance.drain()

    def wants_interrupt(self, now_ms: int) -> bool:
        """Should the driver abandon the call in flight? Asked whenever the
        driver wakes: it was poked, a side-channel answer arrived, or the
        safety deadline (which it also waits for) passed."""
        main = self._in_flight
        if not isinstance(main, MainCall):
            return False
        if main.call.api == Api.LEAVE:
            return False
        if main.stale or self.state is MemberState.FAILED:
            return True
        if self._closing and not self._finishing_rebalance():
            return True
        deadline = self.safety_deadline_ms()
        if deadline is not None and now_ms >= deadline:
            # A join or sync may park for the whole rebalance timeout; the
            # safety rule cannot wait for it (on_lost comes first).
            return True
        if main.resend:
            return True  # its answer is lost: send it again
        if not main.call.interruptible:
            return False
        return bool(self._callbacks) or self._rejoin_due(now_ms)

    def _rejoin_due(self, now_ms: int) -> bool:
        return self._rejoin is not None and now_ms >= self._rejoin[0]

    # ------------------------------------------------------------ inputs from the caller

    def subscribe(self, now_ms: int, sets: Sequence[str]) -> bool:
        """Change the subscription; returns False when it is unchanged.

        KIP-429 step 1.1: revoke what is no longer subscribed (cooperative;
        an eager member revokes everything before it rejoins anyway), then
        rejoin with whatever is left as ``owned``.
        """
        self._check_open()
        if isinstance(sets, str):
            raise ValueError("sets must be a list of set names, not a string")
        new = tuple(dict.fromkeys(sets))
        if set(new) == set(self.sets):
            return False
        self.sets = new
        if self.protocol is RebalanceProtocol.COOPERATIVE:
            gone = frozenset(r for r in self._owned if r[0] not in new)
            if gone:
                self._callbacks.append(InvokeListener(CallbackKind.REVOKED, gone))
        self._request_rejoin(now_ms, "subscription changed")
        return True

    def report_load(self, now_ms: int, loads: Mapping[Resource, float]) -> bool:
        """The load the application measured on resources it owns (any one unit per
        group: requests/s, bytes/s, a CPU share), sent with the member's next join
        for load-aware assignors (docs/protocol.md, "What a member reports"). A
        report replaces the earlier one of each resource named; one of a resource
        not owned is ignored. When every owned resource has a load and their sum is
        outside the band the leader last gave (``Assignment.band``), the member
        rejoins, cooperatively, at most once per ``load_rejoin_interval_ms``.
        Returns whether it asked to rejoin."""
        return self._stable.report_load(now_ms, loads)

    def request_rejoin(self, now_ms: int, reason: str) -> None:
        self._check_open()
        self._request_rejoin(now_ms, reason)

    def drain(self, now_ms: int, *, leave: bool = True) -> None:
        """Hand everything over, then leave (``leave``) or stay idle: rejoin
        with ``draining``, keep serving what is owned until it is revoked, take
        nothing new (docs/protocol.md, "Drain")."""
        self._check_open()
        self._start_drain(now_ms, leave=leave, reason="the member drains")

    def close(self, leave: bool | None = None) -> None:
        """Start a clean shutdown: revoke what is owned, then leave the group
        (dynamic members; static ones stay so a restart gets everything back)."""
        self._closer.close(leave)

    def build_commit(self, checkpoints: Mapping[Resource, Scalar]) -> CommitRequest:
        """The commit request for ``checkpoints``; only owned resources may be
        committed (the coordinator would fence a zombie anyway, docs/protocol.md,
        "POST /v1/commit and POST /v1/fetch").
        Allowed while closing: ``on_revoked`` commits final positions then."""
        return self._stable.build_commit(checkpoints)

    def commit_result(self, now_ms: int, request: CommitRequest,
                      code: ErrorCode | None) -> CommitFailedError | None:
        """Feed a commit's outcome through the error table; return the
        exception for the caller (None on success)."""
        return self._stable.commit_result(now_ms, request, code)

    # ------------------------------------------------------------ the driver's loop

    def next_action(self, now_ms: int) -> Action:
        if self._in_flight is not None:
            raise RuntimeError(f"next_action with {self._outstanding()!r} still outstanding")
        if self.state in (MemberState.CLOSED, MemberState.FAILED) and not self._callbacks:
            return Stop(self.failure)
        # The safety rule comes before anything else.
        deadline = self.safety_deadline_ms()
        if deadline is not None and now_ms >= deadline:
            self._recovery.lose_all(self.lease_expiry(now_ms))
            self._request_rejoin(now_ms, "session timed out locally"
                                 if self._lease.session_expired(now_ms)
                                 else "rebalance timed out locally")
        if self._callbacks:
            callback = self._emit_callback()
            if callback is not None:
                return callback
        if self.state in (MemberState.CLOSED, MemberState.FAILED):
            return Stop(self.failure)
        if self._handover.leave and self.drained and not self._closing:
            self.close(leave=True)  # drained: everything was handed over
        if (self._closing and self.state is not MemberState.LEAVING
                and not self._finishing_rebalance()):
            return self._closer.step(now_ms)
        phase = self._phase
        if isinstance(phase, Stable):
            if self._rejoin is not None and now_ms >= self._rejoin[0]:
                self._enter_joining(now_ms, self._rejoin[1], at_ms=now_ms)
            else:
                return self._stable.step(now_ms)
        phase = self._phase
        if isinstance(phase, Joining):
            return self._joining.step(now_ms, phase)
        if isinstance(phase, Syncing):
            return self._syncing.step(now_ms, phase)
        raise RuntimeError(f"no action in state {self.state}")  # LEAVING is always in flight

    def receive(self, now_ms: int, response: object) -> None:
        main = self._take_call()
        call, sent = main.call, main.sent_ms
        # Any answer of the coordinator's restarts the backoff unless it says
        # "unavailable" (a catalog read's answer is always a success).
        self._schedule.answered(
            response.error if isinstance(response, (JoinResponse, SyncResponse, HeartbeatResponse,
                                                    LeaveResponse)) else None)
        if self._drop_stale(now_ms, main):
            return
        if call.api == Api.JOIN and isinstance(response, JoinResponse):
            self._joining.on_join(now_ms, sent, response)
        elif call.api == Api.SYNC and isinstance(response, SyncResponse):
            self._syncing.on_sync(now_ms, sent, response)
        elif (call.api == Api.HEARTBEAT and isinstance(response, HeartbeatResponse)
              and isinstance(call.request, HeartbeatRequest)):
            self._stable.on_heartbeat(now_ms, sent, call.request, response)
        elif call.api == Api.RESOURCES and isinstance(response, CatalogResponse):
            self._syncing.on_catalog(now_ms, response)
        elif call.api == Api.LEAVE and isinstance(response, LeaveResponse):
            self._finish_close()
        else:
            raise RuntimeError(f"response {type(response).__name__} to a {call.api} call")

    def call_failed(self, now_ms: int, error: Exception) -> None:
        """The call got no response: network, timeout, 5xx, or a fatal
        transport error (400: a bug; 401/403)."""
        main = self._take_call()
        if isinstance(error, FatalMemberError):
            self._recovery.fail(error)
            return
        if self._drop_stale(now_ms, main):
            return
        api = main.call.api
        self.last_error = with_api(api, str(error))
        if api == Api.LEAVE:
            # The session timeout will remove us; do not hang on close.
            self._finish_close()
            return
        self._recovery.retry_later(now_ms, api, str(error), sent_ms=main.sent_ms)

    def call_abandoned(self, now_ms: int) -> None:
        """The driver cancelled a call: a parked heartbeat when there is other
        work, any call for close() or when the safety deadline passed."""
        main = self._take_call()
        if self._drop_stale(now_ms, main):
            return
        if main.call.api == Api.HEARTBEAT:
            self._schedule.due_ms = now_ms
        elif self.state is MemberState.LEAVING:
            self._finish_close()
        else:
            # A join/sync abandoned because of close() (the close step
            # follows), the safety deadline (on_lost follows, then the same
            # step again: a join rebuilt owning nothing, a sync re-sent), or
            # because its answer is lost (the same step again at once).
            if main.resend:
                self.last_error = (f"{main.call.api}: no answer, and the coordinator's answers "
                                   f"to heartbeats show it answered or never got it; sent again")
            self._schedule.due_ms = now_ms

    def listener_done(self, now_ms: int) -> None:
        action = self._in_flight
        if not isinstance(action, InvokeListener):
            raise RuntimeError(f"listener_done with {self._outstanding()!r} outstanding")
        self._in_flight = None
        if action.kind is CallbackKind.REVOKED:
            # KIP-429: the assignment changes only after on_revoked returned,
            # so a commit from inside the callback is still accepted.
            self._owned = self._owned - action.resources
        elif action.kind is CallbackKind.ASSIGNED:
            self._rebalance.assigned(now_ms, self.generation_id)

    # ------------------------------------------------------------ warm-ups (beside the steps)

    def start_warmups(self) -> tuple[int, frozenset[Resource]]:
        """Standbys whose warm-up (``on_standby``) is to start now, beside the
        protocol steps; report each end with :meth:`warmup_done`."""
        if self._closing or self.state in (MemberState.CLOSED, MemberState.FAILED):
            return 0, frozenset()
        return self._handover.start_warmups()

    def warmup_done(self, now_ms: int, run: int, resources: frozenset[Resource], *,
                    failed: bool = False) -> None:
        """Warm-up ``run``, ``on_standby(resources)``, returned (``failed``:
        raised: not reported warm; the assignor moves them cold at its warm-up
        timeout)."""
        if (self._handover.warmed(run, resources, failed=failed) and not self._closing
                and self.protocol is RebalanceProtocol.COOPERATIVE
                and self.state not in (MemberState.CLOSED, MemberState.FAILED)):
            # Reported warm at a cooperative rejoin (an eager one would stop
            # all), once no warm-up of this member runs: one rebalance for a
            # batch of warm-ups, not one each (each rebalance may cut short
            # another member's sync, whose claims then go stale).
            self._request_rejoin(now_ms, "standby resources are warm")

    # ------------------------------------------------------------ the side channel (KIP-62)

    def background_heartbeat(self, now_ms: int) -> Call | Wait | None:
        """The heartbeat to send alongside the main channel while a rebalance
        is in progress (JOINING, SYNCING) or a listener callback runs (any
        state, closing included), as Kafka's heartbeat thread keeps
        heartbeating while the consumer rejoins or runs its rebalance listener
        (KIP-62): ``Call`` to send now, ``Wait`` until the next one is due,
        ``None`` when none applies (stable or closing with no callback
        running, no generation to heartbeat with). At most
        one is outstanding; report it with :meth:`background_received`,
        :meth:`background_failed` or :meth:`background_abandoned`
        (:mod:`client.member_state.heartbeat`)."""
        return self._background.heartbeat(now_ms)

    def background_received(self, now_ms: int, response: object) -> None:
        self._background.received(now_ms, response)

    def background_failed(self, now_ms: int, error: Exception) -> None:
        """A background heartbeat got no answer (network, timeout, 5xx). It
        proves nothing; the next one goes out after a short backoff. A fatal
        transport error (401/403) stops the member as on the main channel."""
        self._background.failed(now_ms, error)

    def background_abandoned(self, now_ms: int) -> None:
        """The driver cancelled the background heartbeat (it is stopping)."""
        self._background.abandoned(now_ms)
