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

import math
import random
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from client.assignors import Assignor, RebalanceProtocol, get_assignor
from client.errors import (
    CommitFailedError,
    FatalMemberError,
    MemberClosedError,
    NotOwnedError,
    RebalanceInProgressError,
    fatal_error_for,
)
from client.leader import AssignmentFailed, perform_assignment
from client.member_state.actions import (
    COMMIT_CONTENT_ERRORS,
    ERROR_ACTIONS,
    Action,
    Call,
    CallbackKind,
    ErrorAction,
    InvokeListener,
    MemberState,
    RebalanceEvent,
    RebalanceLog,
    Resource,
    Stop,
    UnknownSets,
    Wait,
)
from client.member_state.config import MemberConfig, choose_protocol
from client.member_state.handover import Handover
from client.member_state.heartbeat import SideChannel
from client.member_state.lease import Lease
from client.member_state.main_channel import MainCall, Schedule
from client.member_state.states import Ended, Joining, Phase, Stable, Syncing
from client.transport import CatalogRequest, CatalogResponse
from protocol.errors import ErrorCode
from protocol.messages import (
    Api,
    CommitRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinMember,
    JoinRequest,
    JoinResponse,
    LeaveMember,
    LeaveRequest,
    LeaveResponse,
    Scalar,
    SyncAssignment,
    SyncRequest,
    SyncResponse,
)
from protocol.resources import PROTOCOL_TYPE, MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError

__all__ = ["MemberStateMachine", "from_index_map", "to_index_map"]


def _with_api(api: str, reason: str) -> str:
    """``"api: reason"``, unless the reason names the call already (the
    transport's errors do: ``join: ClientConnectorError: ...``)."""
    return reason if reason.startswith(f"{api}:") else f"{api}: {reason}"


def to_index_map(resources: Iterable[Resource]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, i in resources:
        out.setdefault(name, []).append(i)
    for v in out.values():
        v.sort()
    return out


def from_index_map(assigned: Mapping[str, Sequence[int]]) -> frozenset[Resource]:
    return frozenset((name, i) for name, idx in assigned.items() for i in idx)


class MemberStateMachine:
    """One group member's protocol logic. See the module docstring."""

    def __init__(self, config: MemberConfig, *,
                 rng: Callable[[], float] | None = None,
                 assignor_clock: Callable[[], int] | None = None,
                 incarnation: str | None = None) -> None:
        """``assignor_clock``: the time handed to the leader's assignor as
        ``now_ms`` (wall-clock milliseconds: incremental-cooperative keeps
        absolute deadlines in ``user_data``, read by whichever member leads
        next); None hands it the machine's own ``now_ms``.

        ``incarnation``: this process's id on a static member's joins (v1.1,
        docs/client.md, "Incarnation"); None draws one (16 random bytes, hex).
        Its start time is ``assignor_clock()`` now (None: not sent)."""
        self.config = config
        #: a static member's joins carry both, so the coordinator can tell a late
        #: join of this process, or of an older one, from a newer process's.
        self.incarnation = incarnation or secrets.token_hex(16)
        self.incarnation_ms = assignor_clock() if assignor_clock is not None else None
        self._timing = config.timing
        self._assignor_clock = assignor_clock
        self._assignors: dict[str, Assignor] = {
            name: get_assignor(name, **dict(config.assignor_settings.get(name, {})))
            for name in config.assignors
        }
        self.protocol = choose_protocol(self._assignors.values())
        # ---- the state, and what only it means
        self._phase: Phase = Joining("initial join")
        # ---- the membership (kept while rejoining: the side channel uses it)
        self.sets: tuple[str, ...] = tuple(config.sets)
        self.member_id = ""
        self.generation_id = -1
        self.protocol_name: str | None = None
        self.leader_id = ""
        self.last_resources_epoch = 0
        # ---- what is owned
        #: immutable, replaced on change: a thread may read it while the
        #: driver changes it (BlockingGroupMember.assignment).
        self._owned: frozenset[Resource] = frozenset()
        self._owned_generation = -1
        #: the protocol (assignor) of the last assignment received and its
        #: user_data: echoed in that protocol's metadata at the next join, so
        #: an assignor keeps state between rounds without keeping any itself
        #: (incremental-cooperative, KIP-415).
        self._echo: tuple[str | None, bytes] | None = None
        self._callbacks: deque[InvokeListener] = deque()
        # ---- the leader's
        #: the catalog epoch the assignment of the latest generation this
        #: member led covers (set by its plan, or by what a KIP-814 sync
        #: without assigning delivered).
        self._assigned_epoch: int | None = None
        #: the leader's last plan left subscribed resources to nobody (they are
        #: being revoked by their owners), and no assignment was delivered since:
        #: it rejoins once that generation is Stable.
        self._followup_needed = False
        # ---- the channels, the lease, the rebalance in progress
        #: the main channel's outstanding action (a call, or a listener).
        self._in_flight: MainCall | InvokeListener | None = None
        self._schedule = Schedule(config.retry_backoff_ms, config.retry_backoff_max_ms,
                                  rng or random.random)
        self._side = SideChannel()
        self._lease = Lease(self._timing)
        #: a rejoin asked for (subscription change, catalog change, a delayed
        #: rebalance, a hand-over): not before ``at_ms``, for ``reason``.
        self._rejoin: tuple[int, str] | None = None
        #: the application's measured load per owned resource (report_load); what
        #: the member no longer owns is dropped with each new assignment.
        self._loads: dict[Resource, float] = {}
        #: the load range the leader last gave (Assignment.band), None: none given.
        self._band: tuple[float, float] | None = None
        #: when a load report last made the member rejoin.
        self._load_rejoin_ms: int | None = None
        self._rebalance = RebalanceLog()
        #: set names already reported missing from the catalog (UnknownSets).
        self._unknown_sets_reported: set[str] = set()
        #: standbys to warm, and the drain (client/member_state/handover.py).
        self._handover = Handover()
        # ---- closing / failure
        self._closing = False
        #: side-channel heartbeats sent before the close (_finishing_join).
        self._close_heartbeats = 0
        #: closing: the join in flight may be abandoned (_finishing_join).
        self._join_released = False
        #: the ``sequence`` of the last commit built (CommitRequest.sequence).
        self._commit_sequence = -1
        #: the ``sequence`` of the last join built (JoinRequest.sequence).
        self._join_sequence = -1
        self._leave_on_close = (config.leave_on_close if config.leave_on_close is not None
                                else config.group_instance_id is None)
        self.failure: FatalMemberError | None = None
        #: the latest non-fatal problem (an assignor's broken rule, ...), for logs.
        self.last_error: str | None = None

    # ------------------------------------------------------------ queries

    @property
    def state(self) -> MemberState:
        return self._phase.state

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
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader_id

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def rejoin_requested(self) -> bool:
        """Whether a rejoin was asked for and has not started yet."""
        return self._rejoin is not None

    def safety_deadline_ms(self) -> int | None:
        """When the member must stop believing it owns anything (or None).
        See :mod:`client.member_state.lease`: the session bound and the
        rebalance bound."""
        return self._lease_end_now() if self._owned else None

    def _lease_end_now(self) -> int | None:
        """The lease's end whether or not anything is owned (the heartbeat
        timings keep the membership itself too), None before any proof."""
        phase = self._phase
        base = phase.base_ms if isinstance(phase, Syncing) else self._lease.settled_ms
        return self._lease.end(base)

    def lease_expiry(self, now_ms: int) -> str:
        """Why the lease ended, once ``safety_deadline_ms()`` has passed: the
        bound that ran out, with its setting."""
        if self._lease.session_expired(now_ms):
            return (f"no successful heartbeat for a session timeout "
                    f"(session_timeout_ms={self.config.session_timeout_ms})")
        return (f"the rebalance outlasted the rebalance timeout "
                f"(rebalance_timeout_ms={self.config.rebalance_timeout_ms})")

    @property
    def callback_running(self) -> InvokeListener | None:
        """The listener callback the driver is running, if any."""
        action = self._in_flight
        return action if isinstance(action, InvokeListener) else None

    def revoking(self, resources: Iterable[Resource]) -> bool:
        """Whether ``on_revoked`` is running for some of ``resources``: a
        commit of them is a final one (no later commit will carry them)."""
        action = self.callback_running
        return (action is not None and action.kind is CallbackKind.REVOKED
                and not action.resources.isdisjoint(resources))

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

    def _finishing_rebalance(self) -> bool:
        """Closing while the sync or the join in flight goes on (see both)."""
        return self._finishing_sync() or self._finishing_join()

    def _finishing_join(self) -> bool:
        """Closing with a join in flight while owning something: the join goes
        on until the side channel shows it is not answered yet.

        Once the group's join phase completed with this join, its answer is
        on the way and the generation the member has is gone: abandoned then,
        the close's final commits would all be refused. Parked instead (the
        group waits for other members), abandoning it is what keeps them: the
        coordinator drops a parked join whose connection closes, and the group
        waits for this member in its generation, whose commits it takes. So
        a side-channel heartbeat goes out at the close; answered
        REBALANCE_IN_PROGRESS (the join phase goes on) or without error (no
        join phase: the join has not arrived), or not answered at all, the
        join is abandoned; answered ILLEGAL_GENERATION (a generation formed
        with this join), the join's answer is awaited, then the sync
        (:meth:`_finishing_sync`). Bounded by the safety deadline like any
        join."""
        main = self._in_flight
        return (self._closing and not self._join_released and bool(self._owned)
                and isinstance(self._phase, Joining) and isinstance(main, MainCall)
                and main.call.api == Api.JOIN)

    def _finishing_sync(self) -> bool:
        """Closing while SYNCING and owning something: the sync goes on.

        The coordinator refuses commits while it waits for the leader's sync
        (CompletingRebalance), and commits of the previous generation from
        then on: had the member abandoned its sync, the final commits of the
        close's ``on_revoked`` would all be refused. A sync is answered as
        soon as the leader's arrives (the leader's at once), so the close waits
        for it, bounded like any sync by the safety deadline; then the close
        revokes everything in the new generation, whose commits are taken."""
        phase = self._phase
        return (self._closing and bool(self._owned) and isinstance(phase, Syncing)
                and phase.pending is None)

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
        self._check_open()
        for resource, load in loads.items():
            if isinstance(load, bool) or not isinstance(load, int | float) \
                    or not math.isfinite(load) or load < 0:
                raise ValueError(f"load of {resource}: expected a finite number >= 0, "
                                 f"got {load!r}")
        for resource, load in loads.items():
            if resource in self._owned:
                self._loads[resource] = float(load)
        band = self._band
        if band is None or self._rejoin is not None or not self._owned \
                or any(r not in self._loads for r in self._owned):
            return False
        total = sum(self._loads[r] for r in self._owned)
        if band[0] <= total <= band[1]:
            return False
        last = self._load_rejoin_ms
        if last is not None and now_ms - last < self.config.load_rejoin_interval_ms:
            return False
        self._load_rejoin_ms = now_ms
        self._request_rejoin(now_ms, f"measured load {total:g} outside the band "
                                     f"[{band[0]:g}, {band[1]:g}]")
        return True

    def _reported_load(self) -> dict[str, dict[int, float]]:
        """The measured loads of what the member owns, by set, for its metadata."""
        out: dict[str, dict[int, float]] = {}
        for (name, index), load in self._loads.items():
            if (name, index) in self._owned:
                out.setdefault(name, {})[index] = load
        return out

    def request_rejoin(self, now_ms: int, reason: str) -> None:
        self._check_open()
        self._request_rejoin(now_ms, reason)

    def drain(self, now_ms: int, *, leave: bool = True) -> None:
        """Hand everything over, then leave (``leave``) or stay idle: rejoin
        with ``draining``, keep serving what is owned until it is revoked, take
        nothing new (docs/protocol.md, "Drain")."""
        self._check_open()
        self._start_drain(now_ms, leave=leave, reason="the member drains")

    def _start_drain(self, now_ms: int, *, leave: bool, reason: str) -> None:
        if self._handover.start_drain(leave):
            self._request_rejoin(now_ms, reason)

    def close(self, leave: bool | None = None) -> None:
        """Start a clean shutdown: revoke what is owned, then leave the group
        (dynamic members; static ones stay so a restart gets everything back)."""
        if self.state in (MemberState.CLOSED, MemberState.FAILED):
            return
        self._closing = True
        if leave is not None:
            self._leave_on_close = leave
        # A join in flight waits for a side-channel answer to a heartbeat sent
        # from now on (_finishing_join): the next one goes at once.
        self._close_heartbeats = self._side.sent_count
        self._side.next_ms = 0

    def build_commit(self, checkpoints: Mapping[Resource, Scalar]) -> CommitRequest:
        """The commit request for ``checkpoints``; only owned resources may be
        committed (the coordinator would fence a zombie anyway, docs/protocol.md,
        "POST /v1/commit and POST /v1/fetch").
        Allowed while closing: ``on_revoked`` commits final positions then."""
        if self.failure is not None:
            raise self.failure
        if self.state is MemberState.CLOSED:
            raise MemberClosedError("the member is closed")
        not_owned = sorted(r for r in checkpoints if r not in self._owned)
        if not_owned:
            raise NotOwnedError(not_owned)
        if self.generation_id < 0 or not self.member_id:
            if self.revoking(checkpoints) and self.last_error is not None:
                # Out of the group while on_revoked ran (a heartbeat's answer):
                # no later generation will take this commit.
                raise NotOwnedError(not_owned or sorted(checkpoints), (
                    f"the member left the group while on_revoked ran ({self.last_error}), "
                    f"so the group may have given them to another member; nothing was sent"))
            raise RebalanceInProgressError(ErrorCode.REBALANCE_IN_PROGRESS,
                                           "commit: the member has not joined a generation yet")
        # Increasing over the member's whole life (rejoins included): a commit the
        # member gave up on that reaches the coordinator after a later one is not
        # applied over it (docs/client.md, "Commits").
        self._commit_sequence += 1
        return CommitRequest(
            group_id=self.config.group_id, member_id=self.member_id,
            generation_id=self.generation_id, group_instance_id=self.config.group_instance_id,
            checkpoints=tuple((s, i, v) for (s, i), v in sorted(
                checkpoints.items(), key=lambda kv: kv[0])),
            sequence=self._commit_sequence,
        )

    def _next_join_sequence(self) -> int:
        """Increasing over the member's whole life, one per join sent (a join
        sent again included): a join the member gave up on that reaches the
        coordinator after a later one is not applied (docs/client.md, "A call
        the coordinator is done with"; docs/coordinator-semantics.md, "The join
        sequence")."""
        self._join_sequence += 1
        return self._join_sequence

    def commit_result(self, now_ms: int, request: CommitRequest,
                      code: ErrorCode | None) -> CommitFailedError | None:
        """Feed a commit's outcome through the error table; return the
        exception for the caller (None on success)."""
        if code is None:
            return None
        stale = (request.generation_id != self.generation_id
                 or request.member_id != self.member_id)
        action = ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if code in COMMIT_CONTENT_ERRORS:
            # Refused for what it carries (a resource the catalog no longer has,
            # a value over a limit): that commit fails, the membership is fine,
            # as Kafka's per-partition OffsetCommit errors leave the consumer be.
            # A catalog shrink can refuse a commit of a resource the member
            # still owns until the rebalance it starts (simulator seed 1554).
            return CommitFailedError(code)
        # Kafka's consumer acts on a generation error only if the generation is
        # unchanged since the commit was sent (generationUnchanged()). Here also
        # only while STABLE: a member that is rebalancing (its join or sync in
        # flight) learns where it stands from that call, and a commit sent
        # after its own join is refused as soon as the join phase completes
        # (simulator seed 121489, docs/client.md "A commit racing a rebalance").
        rebalancing = self.state in (MemberState.JOINING, MemberState.SYNCING)
        if not stale and self.state is MemberState.STABLE and action is not ErrorAction.RETRY:
            self._apply(now_ms, Api.COMMIT, code, action)
        if self._closing and code in (ErrorCode.REBALANCE_IN_PROGRESS,
                                      ErrorCode.ILLEGAL_GENERATION):
            # No "commit again": a closing member does not rejoin.
            return CommitFailedError(
                code, f"commit refused: {code.value} (generation {request.generation_id}): "
                      f"the group was rebalancing when the member closed, and a closing "
                      f"member does not rejoin, so the checkpoint was not stored")
        if code is ErrorCode.REBALANCE_IN_PROGRESS:
            return RebalanceInProgressError(code)
        if code is ErrorCode.ILLEGAL_GENERATION and (stale or rebalancing):
            # About a generation the member has left or is leaving, not a loss
            # of what it owns: Kafka raises RebalanceInProgressException here
            # ("commit again once the rebalance completes").
            return RebalanceInProgressError(
                code, f"commit refused: {code.value} (generation {request.generation_id}; "
                      f"the member has rebalanced since, or is rebalancing: commit again "
                      f"once the rebalance completes)")
        return CommitFailedError(code)

    # ------------------------------------------------------------ the driver's loop

    def next_action(self, now_ms: int) -> Action:
        if self._in_flight is not None:
            raise RuntimeError(f"next_action with {self._outstanding()!r} still outstanding")
        if self.state in (MemberState.CLOSED, MemberState.FAILED) and not self._callbacks:
            return Stop(self.failure)
        # The safety rule comes before anything else.
        deadline = self.safety_deadline_ms()
        if deadline is not None and now_ms >= deadline:
            self._lose_all(self.lease_expiry(now_ms))
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
            return self._close_step(now_ms)
        phase = self._phase
        if isinstance(phase, Stable):
            if self._rejoin is not None and now_ms >= self._rejoin[0]:
                self._enter_joining(now_ms, self._rejoin[1], at_ms=now_ms)
            else:
                return self._stable_step(now_ms)
        phase = self._phase
        if isinstance(phase, Joining):
            return self._joining_step(now_ms, phase)
        if isinstance(phase, Syncing):
            return self._syncing_step(now_ms, phase)
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
            self._on_join(now_ms, sent, response)
        elif call.api == Api.SYNC and isinstance(response, SyncResponse):
            self._on_sync(now_ms, sent, response)
        elif (call.api == Api.HEARTBEAT and isinstance(response, HeartbeatResponse)
              and isinstance(call.request, HeartbeatRequest)):
            self._on_heartbeat(now_ms, sent, call.request, response)
        elif call.api == Api.RESOURCES and isinstance(response, CatalogResponse):
            self._on_catalog(now_ms, response)
        elif call.api == Api.LEAVE and isinstance(response, LeaveResponse):
            self._finish_close()
        else:
            raise RuntimeError(f"response {type(response).__name__} to a {call.api} call")

    def call_failed(self, now_ms: int, error: Exception) -> None:
        """The call got no response: network, timeout, 5xx, or a fatal
        transport error (400: a bug; 401/403)."""
        main = self._take_call()
        if isinstance(error, FatalMemberError):
            self._fail(error)
            return
        if self._drop_stale(now_ms, main):
            return
        api = main.call.api
        self.last_error = _with_api(api, str(error))
        if api == Api.LEAVE:
            # The session timeout will remove us; do not hang on close.
            self._finish_close()
            return
        self._retry_later(now_ms, api, str(error), sent_ms=main.sent_ms)

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

    def start_warmups(self) -> frozenset[Resource]:
        """Standbys whose warm-up (``on_standby``) is to start now, beside the
        protocol steps; report each end with :meth:`warmup_done`."""
        if self._closing or self.state in (MemberState.CLOSED, MemberState.FAILED):
            return frozenset()
        return self._handover.start_warmups()

    def warmup_done(self, now_ms: int, resources: frozenset[Resource], *,
                    failed: bool = False) -> None:
        """``on_standby(resources)`` returned (``failed``: raised: not reported
        warm; the assignor moves them cold at its warm-up timeout)."""
        if (self._handover.warmed(resources, failed=failed) and not self._closing
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
        side = self._side
        if side.call is not None:
            raise RuntimeError(f"background_heartbeat with {side.call!r} still outstanding")
        if not self._bg_applies():
            return None
        if now_ms < side.next_ms:
            return Wait(side.next_ms)
        request = HeartbeatRequest(self.config.group_id, self.member_id, self.generation_id,
                                   self.config.group_instance_id, 0)
        # Answered at once (wait_ms 0), so within reply_ms on a healthy
        # network; a later answer is not waited for (the timing rule).
        timeout = self._timing.heartbeat_timeout_ms(now_ms, 0, self._lease_end_now())
        call = Call(Api.HEARTBEAT, request, timeout, interruptible=True)
        side.sent(call, now_ms, self._timing.heartbeat_interval_ms)
        return call

    def background_received(self, now_ms: int, response: object) -> None:
        call = self._side.take()
        if not isinstance(response, HeartbeatResponse):
            raise RuntimeError(f"response {type(response).__name__} to a background heartbeat")
        # The coordinator answers: whatever the answer is about, it is there.
        self._schedule.answered(response.error)
        request = call.request
        assert isinstance(request, HeartbeatRequest)
        sent = self._side.sent_ms
        if (request.member_id != self.member_id or request.generation_id != self.generation_id
                or self.state not in (MemberState.JOINING, MemberState.SYNCING,
                                      MemberState.STABLE)):
            # Superseded: the join answer gave a new generation (or the member
            # id was reset) since it was sent; an answer about an older
            # generation says nothing about this one (an old-generation
            # ILLEGAL_GENERATION must not reset a member that just joined).
            # A closing member's answers (it heartbeats while it finishes a join
            # or sync, or while on_revoked runs) count as ever: they renew its
            # lease, or tell it that what it revokes may be someone else's.
            return
        code = response.error
        main = self._in_flight
        if isinstance(main, MainCall):
            main.watch(now_ms, sent, code, self._timing.reply_ms)
        if code is None or code is ErrorCode.REBALANCE_IN_PROGRESS:
            self._coordinator_answered(now_ms)
        if code is not ErrorCode.ILLEGAL_GENERATION:
            # Sent after the close: the join is parked or has not arrived (or the
            # coordinator cannot tell), not answered; abandoning it keeps the
            # group in our generation.
            self._release_join()
        if code is None:
            # The coordinator was in CompletingRebalance or Stable with our
            # generation: we are known, and no join phase was in progress.
            self._lease.settled(sent)
            self.last_resources_epoch = max(self.last_resources_epoch, response.resources_epoch)
            self._drain_asked(now_ms, response)
            return
        action = ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if action is ErrorAction.REJOIN:
            # PreparingRebalance re-armed our session: we are known. We are
            # rejoining already (or our sync will be told to rejoin); a stable
            # member heartbeating during a callback rejoins once it returned.
            self._lease.known(sent)
            if self.state is MemberState.STABLE and not self._closing:
                self._request_rejoin(now_ms, f"heartbeat: {code.value}")
            return
        if action is ErrorAction.RETRY:
            self._side.next_ms = now_ms + min(self.config.retry_backoff_ms,
                                              self._timing.heartbeat_interval_ms)
            return
        if (code is ErrorCode.ILLEGAL_GENERATION and self.state is MemberState.JOINING
                and isinstance(main, MainCall) and main.call.api == Api.JOIN):
            # Member validation passed, so the coordinator formed a newer
            # generation *with us* (a member that did not rejoin is removed,
            # and answered UNKNOWN_MEMBER_ID): the join phase completed and
            # our join's answer is on its way. That generation was assigned
            # from the claims our join carried, so nothing we own moved;
            # the join's answer decides, and the rule's bounds hold meanwhile.
            return
        self._apply_side(now_ms, code, action)

    def _drain_asked(self, now_ms: int, resp: HeartbeatResponse) -> None:
        """An operator asked the coordinator to drain this member (the admin
        drain route): it drains, then leaves."""
        if resp.drain and not self._closing:
            self._start_drain(now_ms, leave=True, reason="the coordinator asked to drain")

    def _release_join(self) -> None:
        """A side-channel outcome other than ILLEGAL_GENERATION, to a heartbeat
        sent since the close: the join in flight may go (_finishing_join)."""
        if self._finishing_join() and self._side.sent_count > self._close_heartbeats:
            self._join_released = True

    def _coordinator_answered(self, now_ms: int) -> None:
        """The coordinator answers again: a join, sync or catalog read waiting
        out the backoff of a failure to reach it goes now (the member would
        otherwise sit out up to ``retry_backoff_max_ms`` holding nothing while
        the coordinator, answered by its heartbeats, counts it as a member
        holding its resources: simulator seed 737)."""
        schedule = self._schedule
        if schedule.retry_pending and self._in_flight is None and schedule.due_ms > now_ms:
            schedule.retry_pending = False
            schedule.attempts = 0
            schedule.due_ms = now_ms

    def background_failed(self, now_ms: int, error: Exception) -> None:
        """A background heartbeat got no answer (network, timeout, 5xx). It
        proves nothing; the next one goes out after a short backoff. A fatal
        transport error (401/403) stops the member as on the main channel."""
        self._side.take()
        self._release_join()  # no answer: waiting on the join gains nothing
        if isinstance(error, FatalMemberError):
            if self.state not in (MemberState.CLOSED, MemberState.FAILED):
                self._mark_stale()
                self._fail(error)
            return
        self._side.next_ms = now_ms + min(self.config.retry_backoff_ms,
                                          self._timing.heartbeat_interval_ms)

    def background_abandoned(self, now_ms: int) -> None:
        """The driver cancelled the background heartbeat (it is stopping)."""
        self._side.take()

    def _bg_applies(self) -> bool:
        phase = self._phase
        if self.failure is not None or not isinstance(phase, (Joining, Syncing, Stable)):
            return False
        if not self.member_id or self.generation_id < 0:
            return False  # nothing to heartbeat with (a new or reset member)
        if isinstance(phase, Syncing) and phase.pending is not None:
            return False  # the main channel is verifying a late sync answer by heartbeat
        main = self._in_flight
        if isinstance(main, InvokeListener):
            # A listener callback holds the main channel: the side channel keeps
            # the member's session (Kafka's heartbeat thread runs while
            # onPartitionsRevoked does), in every state and while closing, so a
            # slow on_revoked, or the close's after the rebalance's, can still
            # commit at its end. A rebalance the coordinator starts meanwhile is
            # still bounded by the rebalance timeout (the lease's rebalance bound).
            return True
        if isinstance(phase, Stable) or (self._closing and not self._finishing_rebalance()):
            return False  # the main channel heartbeats; a closing member leaves
        return not (isinstance(main, MainCall) and main.call.api == Api.HEARTBEAT)

    def _apply_side(self, now_ms: int, code: ErrorCode, action: ErrorAction) -> None:
        """The table's action for a background heartbeat's answer: like the
        main channel's, and the join or sync in flight is abandoned (its
        answer would be about a member or generation we no longer have)."""
        self._mark_stale()
        self._fail_rebalance(now_ms, f"heartbeat: {code.value}")
        if action is ErrorAction.FATAL:
            self._fail(fatal_error_for(code, Api.HEARTBEAT))
            return
        # RESET_GENERATION, RESET_MEMBER, SET_MEMBER_ID (KIP-429 step 1.4)
        self._lose_all(f"heartbeat: {code.value}")
        self.generation_id = -1
        self._owned_generation = -1
        if action is not ErrorAction.RESET_GENERATION:
            self.member_id = ""
            if isinstance(self._phase, Joining):
                self._phase.first_sent_ms = None
        self._enter_joining(now_ms, f"heartbeat: {code.value}", at_ms=now_ms)

    def _mark_stale(self) -> None:
        if isinstance(self._in_flight, MainCall):
            self._in_flight.stale = True

    def _drop_stale(self, now_ms: int, main: MainCall) -> bool:
        if not main.stale:
            return False
        self._schedule.due_ms = now_ms
        return True

    # ------------------------------------------------------------ steps

    def _emit_callback(self) -> InvokeListener | None:
        """The next queued callback with something left to say; ``None`` when every
        queued one is about resources no longer owned (revoked or lost since)."""
        while self._callbacks:
            action = self._callbacks.popleft()
            if action.kind is CallbackKind.ASSIGNED:
                # The assignment is ours when on_assigned runs (Kafka updates
                # the subscription state before calling the listener).
                self._owned = self._owned | action.resources
                self._in_flight = action
                return action
            if action.kind is CallbackKind.STANDBY_DROPPED:
                dropped = self._handover.live(action)
                if dropped is None:
                    continue
                self._in_flight = dropped
                return dropped
            live = action.resources & self._owned
            if not live:
                continue
            if action.kind is CallbackKind.LOST:
                # Lost resources are gone already: no commit may claim them.
                self._owned = self._owned - live
            action = InvokeListener(action.kind, frozenset(live))
            self._in_flight = action
            return action
        return None

    def _revoke_owned(self) -> InvokeListener:
        """Queue on_revoked for everything owned (non-empty) and emit what comes first."""
        self._callbacks.append(InvokeListener(CallbackKind.REVOKED, frozenset(self._owned)))
        callback = self._emit_callback()
        assert callback is not None  # the revocation just queued is live
        return callback

    def _close_step(self, now_ms: int) -> Action:
        if self._owned:
            # Kafka's onLeavePrepare: a member with a valid generation revokes.
            return self._revoke_owned()
        dropped = self._handover.close()
        if dropped is not None:
            self._in_flight = dropped
            return dropped
        # A static member stays in the group when it closes (a restart gets its
        # assignment back without a rebalance), except in the middle of a hand-over
        # it started: it revoked resources and its rejoin was to start the follow-up
        # rebalance that gives them to their new owner. Without that rebalance they
        # would belong to nobody (its restart would get its stored assignment back),
        # so it leaves, which starts it (simulator seeds 700838430, 700838624).
        phase = self._phase
        handover = isinstance(phase, Stable) and phase.handover_pending
        if (self._leave_on_close or handover) and self.member_id:
            self._phase = Ended(MemberState.LEAVING)
            request = LeaveRequest(self.config.group_id, (LeaveMember(
                self.member_id, self.config.group_instance_id, "the member is closing"),))
            # Waiting longer than a session for the leave gains nothing: the
            # session timeout removes the member by then anyway.
            timeout = min(self.config.request_timeout_ms, self.config.session_timeout_ms)
            return self._send(now_ms, Call(Api.LEAVE, request, timeout))
        self._finish_close()
        return Stop(None)

    def _stable_step(self, now_ms: int) -> Action:
        due = self._schedule.due_ms
        wake = [due]
        if self._rejoin is not None:
            wake.append(self._rejoin[0])
        deadline = self.safety_deadline_ms()
        if deadline is not None:
            wake.append(deadline)
        if now_ms < due:
            return Wait(min(wake))
        # The timing rule (client/lease.py): held at most an interval, and
        # never so long that the answer, and one retry after it, could come
        # after the lease's end; awaited reply_ms past the hold.
        end = self._lease_end_now()
        wait_ms = self._timing.hold_ms(now_ms, end)
        if self._rejoin is not None:
            wait_ms = max(0, min(wait_ms, self._rejoin[0] - now_ms))
        timeout = self._timing.heartbeat_timeout_ms(now_ms, wait_ms, end)
        request = HeartbeatRequest(self.config.group_id, self.member_id, self.generation_id,
                                   self.config.group_instance_id, wait_ms)
        # Should this heartbeat start a rebalance, the side channel carries on
        # one interval later.
        self._side.next_ms = now_ms + self._timing.heartbeat_interval_ms
        return self._send(now_ms, Call(Api.HEARTBEAT, request, timeout, interruptible=True))

    def _joining_step(self, now_ms: int, phase: Joining) -> Action:
        due = self._schedule.due_ms
        if now_ms < due:
            deadline = self.safety_deadline_ms()
            return Wait(due if deadline is None else min(due, deadline))
        if self.protocol is RebalanceProtocol.EAGER and self._owned:
            # KIP-429, eager: on_revoked on the full set before the join.
            return self._revoke_owned()
        self._rejoin = None
        if self._rebalance.started_ms is None:
            self._rebalance.start(now_ms, phase.reason)
        static = self.config.group_instance_id is not None
        request = JoinRequest(
            group_id=self.config.group_id, member_id=self.member_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=self._join_protocols(),
            session_timeout_ms=self.config.session_timeout_ms,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            group_instance_id=self.config.group_instance_id,
            client_id=self.config.client_id, reason=phase.reason,
            incarnation=self.incarnation if static else None,
            incarnation_ms=self.incarnation_ms if static else None,
            sequence=self._next_join_sequence(),
        )
        self._handover.join_built()
        if phase.first_sent_ms is None:
            phase.first_sent_ms = now_ms
        return self._send(now_ms, Call(Api.JOIN, request, self._rebalance_call_timeout()))

    def _join_protocols(self) -> tuple[tuple[str, bytes], ...]:
        """Each protocol's metadata: the same subscription and claims; the
        protocol of the last assignment carries that assignment's
        ``user_data`` back, the others ``config.user_data``."""
        def metadata(user_data: bytes | None) -> bytes:
            return MemberMetadata(
                sets=self.sets,
                owned=to_index_map(self._owned),
                generation=self._owned_generation if self._owned else -1,
                rack=self.config.rack,
                user_data=user_data,
                capacity=self.config.capacity,
                load=self._reported_load(),
                warm=to_index_map(self._handover.warm),
                draining=self._handover.draining,
            ).encode()

        plain = metadata(self.config.user_data)
        if self._echo is None:
            return tuple((name, plain) for name in self.config.assignors)
        echoed, user_data = self._echo
        return tuple(
            (name, metadata(user_data) if name == echoed else plain)
            for name in self.config.assignors)

    def _syncing_step(self, now_ms: int, phase: Syncing) -> Action:
        due = self._schedule.due_ms
        if now_ms < due:
            deadline = self.safety_deadline_ms()
            return Wait(due if deadline is None else min(due, deadline))
        if phase.pending is not None:
            request = HeartbeatRequest(self.config.group_id, self.member_id, self.generation_id,
                                       self.config.group_instance_id, 0)
            # Not held, so awaited the reply allowance as every heartbeat is
            # (the timing rule), then retried: an answer read a lease after its
            # send could not be trusted anyway, and one lost on a hung
            # connection must not keep the member out of the group for
            # request_timeout_ms (simulator seed 217816: 30 s, with the
            # group converged without it meanwhile).
            timeout = self._timing.heartbeat_timeout_ms(now_ms, 0, None)
            return self._send(now_ms, Call(Api.HEARTBEAT, request, timeout))
        needs_assignment = self.is_leader and not phase.skip_assignment
        if needs_assignment and phase.request is None:
            if phase.catalog is None:
                return self._send(now_ms, Call(Api.RESOURCES, CatalogRequest(),
                                               self.config.request_timeout_ms))
            phase.request = self._leader_sync_request(now_ms, phase, phase.catalog)
        if phase.request is None:
            phase.request = SyncRequest(
                self.config.group_id, self.member_id, self.generation_id, (),
                self.config.group_instance_id, PROTOCOL_TYPE, self.protocol_name)
        return self._send(now_ms, Call(Api.SYNC, phase.request, self._rebalance_call_timeout()))

    def _leader_sync_request(self, now_ms: int, phase: Syncing,
                             catalog: CatalogResponse) -> SyncRequest:
        name = self.protocol_name or ""
        assignor = self._assignors.get(name)
        members = phase.members
        if assignor is None:
            failure = f"the group chose protocol {name!r}, which this member does not have"
            assignments: dict[str, ResourceAssignment] = {
                m.member_id: ResourceAssignment(error=failure) for m in members}
        else:
            try:
                clock = self._assignor_clock
                result = perform_assignment(assignor, catalog.resources, members,
                                            now_ms=now_ms if clock is None else clock(),
                                            placement=catalog.placement)
            except AssignmentFailed as exc:
                failure = str(exc)
                assignments = {m.member_id: ResourceAssignment(error=failure)
                               for m in members}
            else:
                # Each member's assignment says which catalog epoch it covers:
                # a later leader process that syncs without assigning (KIP-814)
                # rejoins when the catalog moved since.
                assignments = {m: replace(a, resources_epoch=catalog.resources_epoch)
                               for m, a in result.assignments.items()}
                failure = "; ".join(result.undecodable.values())
                self._report_unknown_sets(now_ms, result.unknown_sets, catalog)
                self._followup_needed = _leaves_resources_unassigned(
                    catalog.resources, members, assignments)
                if self._followup_needed:
                    # So does the plan: a later process of this static leader,
                    # which syncs without assigning (KIP-814), starts the
                    # follow-up that this process (maybe the revoker) may not
                    # live to start (simulator seeds 75664, 76088, 91962).
                    assignments = {m: replace(a, followup=True)
                                   for m, a in assignments.items()}
        if failure:
            self.last_error = failure
        self._assigned_epoch = catalog.resources_epoch
        return SyncRequest(
            self.config.group_id, self.member_id, self.generation_id,
            tuple(SyncAssignment(m, a.encode()) for m, a in sorted(assignments.items())),
            self.config.group_instance_id, PROTOCOL_TYPE, self.protocol_name)

    def _report_unknown_sets(self, now_ms: int, unknown: Mapping[str, tuple[str, ...]],
                             catalog: CatalogResponse) -> None:
        """An :class:`UnknownSets` event for the set names not reported yet."""
        new = {m: tuple(n for n in sets if n not in self._unknown_sets_reported)
               for m, sets in sorted(unknown.items())}
        members = tuple((m, sets) for m, sets in new.items() if sets)
        if not members:
            return
        self._unknown_sets_reported.update(n for _, sets in members for n in sets)
        self._rebalance.unknown_sets(
            UnknownSets(now_ms, members, tuple(sorted(catalog.resources))))

    # ------------------------------------------------------------ responses

    def _on_join(self, now_ms: int, sent_ms: int, resp: JoinResponse) -> None:
        if resp.error is ErrorCode.MEMBER_ID_REQUIRED:
            # docs/protocol.md, "POST /v1/join": a dynamic member's first join gets its id this way;
            # owned is empty at this point, join again at once.
            if resp.member_id:
                self.member_id = resp.member_id
            self._schedule.due_ms = now_ms
            return
        if resp.error is not None:
            self._apply(now_ms, Api.JOIN, resp.error, detail=resp.message)
            return
        # The coordinator restarts our session timer when the join phase
        # completes, which is no earlier than when we sent the join.
        self._lease.known(sent_ms)
        # The generation formed after the join that put us in it reached the
        # coordinator; that may be an earlier join of ours than this one (a
        # join whose answer we never read, answered now "current generation"
        # at once), so the sync deadline is no earlier than the first join's
        # send time + the rebalance timeout.
        phase = self._phase
        first = phase.first_sent_ms if isinstance(phase, Joining) else None
        self.member_id = resp.member_id or self.member_id
        self.generation_id = resp.generation_id
        if self._owned:
            # Kafka's rule: claims carry the join's generation. This join claimed
            # all we own, so that generation gave none of it away (what is
            # claimed is withheld): still ours if our sync is cut short. At the
            # older generation it went stale and moved cold (docs/benchmarks.md).
            self._owned_generation = resp.generation_id
        self.protocol_name = resp.protocol_name
        self.leader_id = resp.leader
        self._phase = Syncing(base_ms=sent_ms if first is None else min(first, sent_ms),
                              members=resp.members, skip_assignment=resp.skip_assignment)
        self._schedule.due_ms = now_ms

    def _on_catalog(self, now_ms: int, resp: CatalogResponse) -> None:
        if isinstance(self._phase, Syncing):
            self._phase.catalog = resp
        self._schedule.due_ms = now_ms

    def _on_sync(self, now_ms: int, sent_ms: int, resp: SyncResponse) -> None:
        if resp.error is not None:
            self._apply(now_ms, Api.SYNC, resp.error)
            return
        self.last_resources_epoch = max(self.last_resources_epoch, resp.resources_epoch)
        phase = self._phase
        assert isinstance(phase, Syncing)  # a sync in flight outside SYNCING is stale
        if now_ms >= self._lease.end_if_settled(sent_ms):
            # The lease this answer would start is over already: the answer
            # was read a session timeout after our last proven contact (the
            # process was paused, or the answer sat in its socket), or a
            # rebalance timeout after the sync went out. The coordinator may
            # have removed us meanwhile and given these resources to someone
            # else (chaos seed 0). Nothing is delivered until a heartbeat of
            # this generation, sent now, succeeds; the safety rule treats
            # what we own as lost first. (Background heartbeats during a
            # slow sync keep the anchor fresh, so a slow leader alone does
            # not trigger this.)
            phase.pending = resp
            self._schedule.due_ms = now_ms
            return
        self._deliver(now_ms, phase, resp, sent_ms)

    def _deliver(self, now_ms: int, phase: Syncing, resp: SyncResponse, proof_ms: int) -> None:
        # The coordinator answered a sync (or a heartbeat after it) sent at
        # proof_ms: we were a member then, and the join phase was over.
        self._lease.settled(proof_ms)
        stable = Stable()
        self._phase = stable
        self._schedule.due_ms = now_ms  # start the heartbeat long-poll at once
        try:
            assignment = ResourceAssignment.decode(resp.assignment)
        except ValidationError as exc:
            assignment = ResourceAssignment(error=f"assignment undecodable: {exc}")
        if assignment.error is not None:
            # The leader could not assign (a broken assignor, our metadata
            # unreadable): keep what we own (it was validly ours and is still
            # claimed in our metadata), count a failed rebalance, retry.
            self.last_error = f"rebalance failed: {assignment.error}"
            self._fail_rebalance(now_ms, self.last_error)
            self._request_rejoin(now_ms, "previous rebalance failed",
                                 self._schedule.backoff_ms())
            return
        if assignment.user_data is not None:
            # The assignor owns its protocol's user_data from now on
            # (docs/client.md): echoed at the next join.
            self._echo = (self.protocol_name, assignment.user_data)
        new = from_index_map(assignment.assigned)
        self._band = assignment.band
        self._loads = {r: v for r, v in self._loads.items() if r in new}
        revoked = frozenset(self._owned - new)
        added = frozenset(new - self._owned)
        if self._closing:
            # The sync was finished for the generation the close's final commits
            # need (_finishing_sync), nothing more: nothing new is taken on (no
            # on_assigned while closing, as Kafka's consumer does not poll then),
            # and the close revokes everything owned, in this generation. What
            # moves away is nobody else's in it (a cooperative assignor withholds
            # a resource its owner still claims), and moves once the member left;
            # a static member leaves for that too (_close_step).
            stable.handover_pending = bool(revoked)
            self._owned_generation = self.generation_id
            self._rebalance.forget_assignment()
            return
        if revoked:
            # Eager members own nothing here; a cooperative member gives up
            # what moves and rejoins at once so the follow-up rebalance can
            # hand it to its new owner (KIP-429 step 3.3).
            self._callbacks.append(InvokeListener(CallbackKind.REVOKED, revoked))
            self._request_rejoin(now_ms, "revoked resources move to their new owner")
            stable.handover_pending = True
        self._owned_generation = self.generation_id
        self._callbacks.append(InvokeListener(CallbackKind.ASSIGNED, added))
        self._rebalance.assignment_delivered()
        # Never standby while owned, now or until on_revoked returns.
        dropped = self._handover.assigned(new | self._owned, from_index_map(assignment.standby))
        if dropped is not None:
            self._callbacks.append(dropped)
        if assignment.delay_ms > 0:
            # Deferred imbalance resolution (KIP-415 / incremental cooperative).
            self._request_rejoin(now_ms, "assignor asked for a delayed rebalance",
                                 assignment.delay_ms)
        if self.is_leader and phase.skip_assignment and assignment.followup:
            # Assigned by an earlier leader process (KIP-814) whose plan left
            # resources to nobody: it may have been the revoker itself, and died
            # before its follow-up join (a new process owns nothing, so it
            # revokes nothing and would never rejoin).
            self._followup_needed = True
        if self.is_leader and self._followup_needed and not revoked \
                and assignment.delay_ms <= 0:
            # KIP-429's follow-up rebalance is started by the members that revoke;
            # a revoker that stops before it rejoins (closed, crashed, a static
            # member restarted: it gets its stored assignment back without a
            # rebalance) would leave what it revoked to nobody. The leader, which
            # planned the hand-over, starts the follow-up itself (simulator seeds
            # 700838430, 700838624).
            self._request_rejoin(now_ms, "resources revoked in this rebalance move to "
                                         "their new owner")
        self._followup_needed = False
        if self.is_leader:
            if phase.skip_assignment or self._assigned_epoch is None:
                # Assigned by an earlier leader process (KIP-814): from the
                # epoch its assignment carries (older leaders' carry none:
                # then the sync's epoch, and a catalog change made meanwhile
                # waits for the next rebalance).
                self._assigned_epoch = (assignment.resources_epoch
                                        if assignment.resources_epoch is not None
                                        else resp.resources_epoch)
            if resp.resources_epoch > self._assigned_epoch:
                self._request_rejoin(now_ms, "resource catalog changed during the rebalance")

    def _on_heartbeat(self, now_ms: int, sent_ms: int, request: HeartbeatRequest,
                      resp: HeartbeatResponse) -> None:
        if (request.member_id != self.member_id
                or request.generation_id != self.generation_id):
            # A commit's refusal reset the member while this was in flight:
            # the answer is about a generation we no longer have.
            self._schedule.due_ms = now_ms
            return
        if resp.error is not None:
            if resp.error is ErrorCode.REBALANCE_IN_PROGRESS:
                # The coordinator re-armed our session: proven contact.
                self._lease.known(sent_ms)
            self._apply(now_ms, Api.HEARTBEAT, resp.error)
            return
        self._lease.settled(sent_ms)
        phase = self._phase
        if isinstance(phase, Syncing) and phase.pending is not None:
            # We are still in this generation as of the heartbeat's send time.
            if now_ms >= self._timing.end(sent_ms, sent_ms):
                self._schedule.due_ms = now_ms  # late again: check again
                return
            self._deliver(now_ms, phase, phase.pending, sent_ms)
            return
        self._schedule.due_ms = max(now_ms, sent_ms + self._timing.heartbeat_interval_ms)
        self.last_resources_epoch = max(self.last_resources_epoch, resp.resources_epoch)
        self._drain_asked(now_ms, resp)
        if (self.is_leader and self._assigned_epoch is not None
                and resp.resources_epoch > self._assigned_epoch):
            # docs/protocol.md, "Admin (JSON)": the coordinator does not rebalance on catalog
            # changes; the leader rejoins so the new catalog is assigned.
            self._request_rejoin(now_ms, "resource catalog changed")

    # ------------------------------------------------------------ the error table

    def _apply(self, now_ms: int, api: Api, code: ErrorCode,
               action: ErrorAction | None = None, detail: str = "") -> None:
        """React to ``code`` answered to ``api``; ``detail``: the coordinator's
        message, if it sent one (a fatal error carries it)."""
        action = action or ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if action is not ErrorAction.RETRY:
            # The coordinator answered: the backoff grows only while it is
            # unreachable or unavailable (simulator seed 1424).
            self._schedule.attempts = 0
        in_rebalance = api in (Api.JOIN, Api.SYNC)
        if in_rebalance and action is not ErrorAction.RETRY:
            self._fail_rebalance(now_ms, f"{api}: {code.value}")
        if action is ErrorAction.REJOIN:
            self._enter_joining(now_ms, f"{api}: {code.value}",
                                at_ms=now_ms + (self._schedule.backoff_ms()
                                                if api == Api.JOIN else 0))
        elif action in (ErrorAction.RESET_GENERATION, ErrorAction.RESET_MEMBER,
                        ErrorAction.SET_MEMBER_ID):
            # KIP-429 step 1.4: we are out of the generation; whatever we own
            # may be someone else's already.
            self._lose_all(f"{api}: {code.value}")
            self.generation_id = -1
            self._owned_generation = -1
            if action is not ErrorAction.RESET_GENERATION:
                self.member_id = ""
            self._enter_joining(now_ms, f"{api}: {code.value}",
                                at_ms=now_ms + (self._schedule.backoff_ms()
                                                if api == Api.JOIN else 0))
        elif action is ErrorAction.FATAL:
            self._fail(fatal_error_for(code, api, detail))
        else:
            self._retry_later(now_ms, api, code.value)

    def _retry_later(self, now_ms: int, api: Api, reason: str,
                     sent_ms: int | None = None) -> None:
        # The same step again after a backoff: a join is rebuilt, a sync is
        # re-sent as is (the coordinator answers a repeated sync with the
        # stored assignment, docs/protocol.md, "Durability"), a heartbeat is retried.
        # The backoff spaces attempts: it counts from the failed call's start
        # (``sent_ms``, as gRPC's connection backoff does), so a call that
        # timed out after waiting longer than the backoff goes again at once.
        # A join lost on the network is only known lost at its timeout (the
        # rebalance timeout + 5 s); waiting out a backoff of up to
        # retry_backoff_max_ms after that kept a member that owns nothing out
        # of its group past the convergence bound at short sessions
        # (simulator seed 415932).
        if api in (Api.JOIN, Api.SYNC, Api.RESOURCES):
            self._fail_rebalance(now_ms, _with_api(api, reason), retriable=True)
        schedule = self._schedule
        if api == Api.HEARTBEAT and self.state is MemberState.STABLE:
            # A failed heartbeat is retried no later than a healthy member's
            # next one (the backoff capped at the interval), as Kafka's
            # defaults have it (retry.backoff.max.ms 1 s, heartbeat.interval.ms
            # 3 s) and as the side channel probes while rejoining: with short
            # sessions the capped backoff (1 s) is several sessions, and a
            # member that owns nothing (so no on_lost moves it to JOINING)
            # came back that late after the coordinator did, and cost the group
            # a rebalance after it had converged (simulator seeds 113568,
            # 126479). Timing rule 4: the retry still renews the lease if it can.
            backoff = min(schedule.backoff_ms(), self._timing.heartbeat_interval_ms)
            schedule.due_ms = self._timing.retry_at(now_ms, backoff, self._lease_end_now())
            return
        start = now_ms if sent_ms is None else min(sent_ms, now_ms)
        schedule.due_ms = max(now_ms, start + schedule.backoff_ms())
        # Waiting out a backoff for want of a coordinator: an answer on the
        # side channel ends it (background_received).
        schedule.retry_pending = True

    # ------------------------------------------------------------ helpers

    def _send(self, now_ms: int, call: Call) -> Call:
        self._schedule.retry_pending = False
        self._in_flight = MainCall(call, now_ms)
        return call

    def _take_call(self) -> MainCall:
        main = self._in_flight
        if not isinstance(main, MainCall):
            raise RuntimeError(f"no call outstanding (have {main!r})")
        self._in_flight = None
        return main

    def _outstanding(self) -> Call | InvokeListener | None:
        main = self._in_flight
        return main.call if isinstance(main, MainCall) else main

    def _rebalance_call_timeout(self) -> int:
        # Kafka: a join may park for the whole rebalance timeout.
        return self.config.rebalance_timeout_ms + max(5_000, self.config.session_timeout_ms)

    def _request_rejoin(self, now_ms: int, reason: str, delay_ms: int = 0) -> None:
        at = now_ms + max(0, delay_ms)
        if self._rejoin is None or at < self._rejoin[0]:
            self._rejoin = (at, reason)  # the reason of the rejoin that comes first

    def _enter_joining(self, now_ms: int, reason: str, *, at_ms: int) -> None:
        phase = self._phase
        if not isinstance(phase, Joining) or self._rebalance.started_ms is None:
            self._rebalance.start(now_ms, reason)
        if isinstance(phase, Joining):
            phase.reason = reason  # still the first join's send time
        else:
            self._phase = Joining(reason)
        self._rejoin = None
        self._schedule.due_ms = at_ms
        self._rebalance.forget_assignment()

    def _fail_rebalance(self, now_ms: int, reason: str, *, retriable: bool = False) -> None:
        self._rebalance.fail(now_ms, reason, retriable=retriable,
                             syncing=self.state is MemberState.SYNCING)

    def _lose_all(self, reason: str) -> None:
        # Losing everything supersedes whatever callbacks were pending: a
        # revocation of something lost, or an assignment of a generation we
        # are no longer part of.
        self._callbacks.clear()
        self._rebalance.forget_assignment()
        # Out of the group (or no longer sure to be in it): the assignor's
        # state we carried belongs to a membership we lost, like what we own.
        self._echo = None
        if self._owned:
            self._callbacks.append(InvokeListener(CallbackKind.LOST, frozenset(self._owned)))
        self.last_error = reason

    def _fail(self, error: FatalMemberError) -> None:
        self._lose_all(str(error))
        self.failure = error
        self._phase = Ended(MemberState.FAILED)
        self._rejoin = None

    def _finish_close(self) -> None:
        self._phase = Ended(MemberState.CLOSED)

    def _check_open(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._closing or self.state is MemberState.CLOSED:
            raise MemberClosedError("the member is closed")


def _leaves_resources_unassigned(catalog: Mapping[str, int], members: Sequence[JoinMember],
                                 assignments: Mapping[str, ResourceAssignment]) -> bool:
    """Whether a plan gives some resource of a set that a member subscribes to to
    nobody (cooperative: it is being revoked by its owner, and moves in the
    follow-up rebalance)."""
    subscribed: set[str] = set()
    for m in members:
        try:
            subscribed.update(MemberMetadata.decode(m.metadata).sets)
        except ValidationError:
            continue
    assigned = {(name, i) for a in assignments.values() for name, idx in a.assigned.items()
                for i in idx}
    return any((name, i) not in assigned for name in subscribed if name in catalog
               for i in range(catalog[name]))
