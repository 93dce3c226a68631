"""What the member's steps share: the membership, what is owned, the channels.

:class:`MemberCore` is the part of :class:`~client.member_state.machine.MemberStateMachine`
that outlives any one state: the membership (member id, generation, leader),
what is owned and the callbacks queued about it, the main call
(:mod:`client.member_state.main_channel`), the side channel
(:mod:`client.member_state.heartbeat`), the lease
(:mod:`client.member_state.lease`), the rejoin asked for, the load reported,
the hand-over (:mod:`client.member_state.handover`) and the close. It holds
the moves every step makes the same way: send a call, ask for a rejoin,
enter JOINING, run the next queued callback. The per-state steps
(:mod:`~client.member_state.joining`, :mod:`~client.member_state.syncing`,
:mod:`~client.member_state.stable`, :mod:`~client.member_state.closing`),
the error table (:mod:`~client.member_state.recovery`) and the side channel's
decisions (:mod:`~client.member_state.background`) each act on it.
"""

from __future__ import annotations

import random
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from client.assignors import Assignor, get_assignor
from client.errors import FatalMemberError, MemberClosedError
from client.member_state.actions import (
    Call,
    CallbackKind,
    InvokeListener,
    MemberState,
    RebalanceLog,
    Resource,
    Wait,
)
from client.member_state.config import MemberConfig, choose_protocol
from client.member_state.handover import Handover
from client.member_state.heartbeat import SideChannel
from client.member_state.lease import Lease
from client.member_state.main_channel import MainCall, Schedule
from client.member_state.states import Ended, Joining, Phase, Syncing
from protocol.messages import Api, HeartbeatResponse

__all__ = ["MemberCore", "from_index_map", "to_index_map"]


def to_index_map(resources: Iterable[Resource]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, i in resources:
        out.setdefault(name, []).append(i)
    for v in out.values():
        v.sort()
    return out


def from_index_map(assigned: Mapping[str, Sequence[int]]) -> frozenset[Resource]:
    return frozenset((name, i) for name, idx in assigned.items() for i in idx)


class MemberCore:
    """The member's state shared by its steps (see the module docstring);
    :class:`~client.member_state.machine.MemberStateMachine` is one."""

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
        #: standbys to warm, and the drain (client/member_state/handover.py).
        self._handover = Handover()
        # ---- closing / failure
        self._closing = False
        #: side-channel heartbeats sent before the close (_finishing_join).
        self._close_heartbeats = 0
        #: closing: the join in flight may be abandoned (_finishing_join).
        self._join_released = False
        self._leave_on_close = (config.leave_on_close if config.leave_on_close is not None
                                else config.group_instance_id is None)
        self.failure: FatalMemberError | None = None
        #: the latest non-fatal problem (an assignor's broken rule, ...), for logs.
        self.last_error: str | None = None

    @property
    def state(self) -> MemberState:
        return self._phase.state

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader_id

    def safety_deadline_ms(self) -> int | None:
        """When the member must stop believing it owns anything (or None).
        See :mod:`client.member_state.lease`: the session bound and the
        rebalance bound."""
        return self._lease_end_now() if self._owned else None

    def _not_due_yet(self, now_ms: int) -> Wait | None:
        """Before the scheduled step (``_schedule.due_ms``): wait until it, or
        until the safety deadline if that comes first. None once it is due."""
        due = self._schedule.due_ms
        if now_ms >= due:
            return None
        deadline = self.safety_deadline_ms()
        return Wait(due if deadline is None else min(due, deadline))

    def _lease_end_now(self) -> int | None:
        """The lease's end whether or not anything is owned (the heartbeat
        timings keep the membership itself too), None before any proof."""
        phase = self._phase
        base = phase.base_ms if isinstance(phase, Syncing) else self._lease.settled_ms
        return self._lease.end(base)

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

    def _start_drain(self, now_ms: int, *, leave: bool, reason: str) -> None:
        if self._handover.start_drain(leave):
            self._request_rejoin(now_ms, reason)

    def _drain_asked(self, now_ms: int, resp: HeartbeatResponse) -> None:
        """An operator asked the coordinator to drain this member (the admin
        drain route): it drains, then leaves."""
        if resp.drain and not self._closing:
            self._start_drain(now_ms, leave=True, reason="the coordinator asked to drain")

    def _check_open(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._closing or self.state is MemberState.CLOSED:
            raise MemberClosedError("the member is closed")

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

    def _mark_stale(self) -> None:
        if isinstance(self._in_flight, MainCall):
            self._in_flight.stale = True

    def _drop_stale(self, now_ms: int, main: MainCall) -> bool:
        if not main.stale:
            return False
        self._schedule.due_ms = now_ms
        return True

    def _finish_close(self) -> None:
        self._phase = Ended(MemberState.CLOSED)
