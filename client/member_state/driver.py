"""The member's driver as a sans-IO step object.

:class:`MemberDriver` decides what the member does around its state machine:
which call to send on which channel, when a call in flight is given up (its
timeout, or the machine wanting it interrupted), when the side channel's
heartbeat is due (KIP-62), which listener callback to run, when to look
again, when to stop. It reads no clock and awaits nothing: its runtime feeds
it the time and what happened (a call answered or failed, a callback
returned, a wake-up) and performs the effects it returns, in order:

=================  ==========================================================
effect             the runtime
=================  ==========================================================
:class:`Send`      sends ``call`` on ``channel`` (the main call, or the side
                   channel's heartbeat; at most one of each is in flight)
:class:`Cancel`    stops waiting for the call on ``channel``; ``timed_out``:
                   it got no answer within its timeout (a router looks for
                   the coordinator again). A step that gives a call up
                   decides nothing after it: outside a callback it returns
                   due at once (``wake_at`` is its own time)
``InvokeListener`` runs that listener callback (always the last effect of a
                   step) and reports its return with
                   :meth:`MemberDriver.callback_returned`; while a callback
                   that awaits runs, it steps the driver at once, then at
                   each ``wake_at`` and side-channel answer
:class:`MeasureLoad` asks the application for the load of ``resources``
                   (what the member owns; the member's load callback) and
                   reports it with :meth:`MemberDriver.load_measured`
:class:`StartWarmup` runs ``on_standby`` beside the steps (the driver does not
                   wait for it) and reports its end with
                   :meth:`MemberDriver.warmup_done`
:class:`Stopped`   the member stopped (``error``: the fatal one)
=================  ==========================================================

After each step the runtime waits until :attr:`MemberDriver.wake_at` (on
the member's clock; ``None``: no deadline), an answer on a channel, or a
poke (``close``, ``subscribe``, a commit's answer), whichever comes first,
and steps again; at once when ``wake_at`` is not after the step's time. Its
runtime is ``GroupMember`` (:mod:`client.member`, asyncio), which the
deterministic simulator (``tests/sim/member.py``) runs too.

Why a cancellation ends its step: the runtime performs a ``Cancel`` by
waiting for the call to wind down (and a router hears of a timeout only
after that), so other tasks of the application run meanwhile. The step
that follows decides with the cancellation done, and a callback it ends
with (whose ``on_assigned`` resources are owned from that step on) starts
with nothing run in between: no task sees a resource in ``assignment``
before ``on_assigned`` has been called with it.

While a callback runs, a step runs only the side channel (its heartbeat, in
every state, closing included): an ``async`` callback keeps the member's
session; a plain-function one blocks its runtime, and the heartbeats with it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    FatalMemberError,
    NotOwnedError,
)
from client.member_state.actions import (
    Call,
    InvokeListener,
    MemberState,
    Resource,
    Stop,
    Wait,
)
from client.member_state.machine import MemberStateMachine
from protocol.errors import ErrorCode
from protocol.messages import Api, CommitRequest, Scalar

__all__ = ["Cancel", "Channel", "DriverEffect", "MeasureLoad", "MemberDriver", "Send",
           "StartWarmup", "Stopped"]

#: steps of one wake-up before the driver calls it a livelock (each one sends,
#: gives up or answers something; a handful is the most a real wake-up takes).
_MAX_STEPS = 1_000


class Channel(enum.Enum):
    #: the machine's own call: join, sync, heartbeat when stable, leave, ...
    MAIN = "main"
    #: the side channel's heartbeat while the member rebalances or a callback runs.
    SIDE = "side"


@dataclass(frozen=True, slots=True)
class Send:
    channel: Channel
    call: Call


@dataclass(frozen=True, slots=True)
class Cancel:
    channel: Channel
    api: Api
    #: no answer within the call's timeout (else: the machine abandoned it).
    timed_out: bool


@dataclass(frozen=True, slots=True)
class Stopped:
    error: FatalMemberError | None


@dataclass(frozen=True, slots=True)
class MeasureLoad:
    """Measure the load of ``resources`` (what the member owns) now: once a
    heartbeat interval while the member is stable, when it has a load
    callback. The answer goes to :meth:`MemberDriver.load_measured`."""
    resources: frozenset[Resource]


@dataclass(frozen=True, slots=True)
class StartWarmup:
    """Run ``on_standby(resources)`` beside the member's steps (it may take as
    long as warming takes); report its end with :meth:`MemberDriver.warmup_done`,
    giving back ``run``."""

    resources: frozenset[Resource]
    #: which warm-up this is (a standby dropped and offered again is warmed by
    #: a new one; the end of the old one does not count for it).
    run: int


DriverEffect = Send | Cancel | InvokeListener | MeasureLoad | StartWarmup | Stopped


class MemberDriver:
    """One member's driver decisions (see the module docstring)."""

    __slots__ = ("_callback", "_load_due", "_main", "_main_deadline", "_measures_load",
                 "_measuring", "_side", "_side_deadline", "_stopped", "machine", "wake_at")

    def __init__(self, machine: MemberStateMachine, *, measures_load: bool = False) -> None:
        self.machine = machine
        #: the runtime has a load callback: ask it (MeasureLoad) each interval.
        self._measures_load = measures_load
        #: when the next MeasureLoad is due (None: not stable, or not measuring).
        self._load_due: int | None = None
        #: a MeasureLoad not answered yet.
        self._measuring = False
        #: the latest the runtime steps again (the member's clock; None: never).
        self.wake_at: int | None = None
        self._main: Call | None = None
        self._main_deadline = 0
        self._side: Call | None = None
        self._side_deadline = 0
        self._callback: InvokeListener | None = None
        self._stopped = False

    @property
    def callback(self) -> InvokeListener | None:
        """The listener callback running (its return not reported yet)."""
        return self._callback

    @property
    def stopped(self) -> bool:
        return self._stopped

    def in_flight(self, channel: Channel) -> Call | None:
        return self._main if channel is Channel.MAIN else self._side

    # ------------------------------------------------------------ what happened

    def answered(self, channel: Channel, now_ms: int, response: object) -> None:
        """The call on ``channel`` was answered."""
        if channel is Channel.MAIN:
            self._main = None
            self.machine.receive(now_ms, response)
        else:
            self._side = None
            self.machine.background_received(now_ms, response)

    def failed(self, channel: Channel, now_ms: int, error: Exception) -> None:
        """The call on ``channel`` failed (``GroupCoordError``; a runtime
        turns anything else a transport raised into a
        ``CoordinatorUnavailableError``)."""
        if channel is Channel.MAIN:
            self._main = None
            self.machine.call_failed(now_ms, error)
        else:
            self._side = None
            self.machine.background_failed(now_ms, error)

    def load_measured(self, now_ms: int, loads: Mapping[Resource, float] | None) -> bool:
        """The answer to the latest ``MeasureLoad``: the loads measured (the
        machine's ``report_load``, which raises ``ValueError`` on a load that
        is not a finite number >= 0), or None (the callback failed). One that
        comes after the member started closing (or stopped) is dropped.
        Returns whether the member rejoins for it."""
        self._measuring = False
        machine = self.machine
        if loads is None or machine.closing or machine.failure is not None \
                or machine.state is MemberState.CLOSED:
            return False
        return machine.report_load(now_ms, loads)

    def callback_returned(self, now_ms: int) -> None:
        """The callback of the latest ``InvokeListener`` returned (or raised)."""
        self._callback = None
        self.machine.listener_done(now_ms)

    def warmup_done(self, now_ms: int, warmup: StartWarmup, *, failed: bool = False) -> None:
        """The warm-up of a :class:`StartWarmup` returned (``failed``: raised).
        The runtime steps the driver next (a rejoin to report them warm)."""
        self.machine.warmup_done(now_ms, warmup.run, warmup.resources, failed=failed)

    def abandon(self, now_ms: int) -> list[DriverEffect]:
        """The runtime goes away (its task cancelled, a crash): stop waiting
        for whatever is in flight."""
        effects: list[DriverEffect] = []
        if self._main is not None:
            effects.append(Cancel(Channel.MAIN, self._main.api, timed_out=False))
            self._main = None
        self._abandon_side(now_ms, effects)
        self._stopped = True
        self.wake_at = None
        return effects

    # ------------------------------------------------------------ commits

    def commit_call(self, now_ms: int, checkpoints: Mapping[Resource, Scalar],
                    timeout_ms: int) -> tuple[CommitRequest, int]:
        """The commit of ``checkpoints`` to send now and how long to wait for
        its answer: ``timeout_ms``, bounded by the safety deadline (past it
        the coordinator may have handed the resources on, so a commit, e.g.
        the final one in ``on_revoked``, must not keep the caller believing
        it owns them any longer). Built at sending time, so ownership and
        generation are those of now. Raises what ``build_commit`` raises, or
        ``NotOwnedError`` (nothing is to be sent) once the deadline has
        passed."""
        request = self.machine.build_commit(checkpoints)
        deadline = self.machine.safety_deadline_ms()
        if deadline is not None:
            timeout_ms = min(timeout_ms, deadline - now_ms)
            if timeout_ms <= 0:
                raise NotOwnedError(sorted(checkpoints), (
                    f"its safety deadline passed {now_ms - deadline} ms ago: "
                    f"{self.machine.lease_expiry(now_ms)}, so the group may have given "
                    f"them to another member; nothing was sent"))
        return request, timeout_ms

    def commit_answered(self, now_ms: int, request: CommitRequest,
                        code: ErrorCode | None) -> CommitFailedError | None:
        """A commit's answer (its error code, or None); returns the error the
        committer gets. The runtime steps the driver next: the answer may
        have changed what the machine wants (a rejoin)."""
        return self.machine.commit_result(now_ms, request, code)

    # ------------------------------------------------------------ deciding

    def step(self, now_ms: int) -> list[DriverEffect]:
        """What to do at ``now_ms``; sets :attr:`wake_at`."""
        effects: list[DriverEffect] = []
        if self._stopped:
            self.wake_at = None
            return effects
        machine = self.machine
        # Warm-ups start beside the steps: an assignment delivered since the
        # last step may have given standbys.
        run, warmups = machine.start_warmups()
        if warmups:
            effects.append(StartWarmup(warmups, run))
        for _ in range(_MAX_STEPS):
            side_due = self._service_side(now_ms, effects)
            if self._callback is not None:
                # Only the side channel runs; when nothing applies to it, it
                # looks again an interval later.
                self._wake(now_ms, side_due if side_due is not None
                           else now_ms + machine.config.timing.heartbeat_interval_ms)
                return effects
            if any(isinstance(e, Cancel) for e in effects):
                # Decided in a step of its own, once the runtime has given the
                # call up (module docstring: why a cancellation ends its step).
                self.wake_at = now_ms
                return effects
            main = self._main
            if main is not None:
                if machine.wants_interrupt(now_ms):
                    # A poke (close, a revocation, a rejoin), a side-channel
                    # answer that reset the member, or the safety deadline.
                    self._main = None
                    effects.append(Cancel(Channel.MAIN, main.api, timed_out=False))
                    machine.call_abandoned(now_ms)
                    continue
                if now_ms >= self._main_deadline:
                    self._main = None
                    effects.append(Cancel(Channel.MAIN, main.api, timed_out=True))
                    machine.call_failed(now_ms, CoordinatorUnavailableError(
                        f"{main.api}: no answer within {main.timeout_ms} ms"))
                    continue
                self._wake(now_ms, _earliest(self._main_deadline, side_due,
                                             machine.safety_deadline_ms(),
                                             self._service_load(now_ms, effects)))
                return effects
            action = machine.next_action(now_ms)
            if isinstance(action, Call):
                self._main = action
                self._main_deadline = now_ms + action.timeout_ms
                effects.append(Send(Channel.MAIN, action))
                continue
            if isinstance(action, InvokeListener):
                # Last: the runtime runs it; a callback that awaits (a coroutine)
                # has the runtime step the driver meanwhile, at once and then
                # at each wake_at (the side channel only); a plain function
                # blocks, and steps nothing until it returns.
                self._callback = action
                self.wake_at = None
                effects.append(action)
                return effects
            if isinstance(action, Wait):
                self._wake(now_ms, _earliest(action.until_ms, side_due,
                                             self._service_load(now_ms, effects)))
                return effects
            assert isinstance(action, Stop)
            self._abandon_side(now_ms, effects)
            self._stopped = True
            self.wake_at = None
            effects.append(Stopped(action.error))
            return effects
        raise RuntimeError(f"the member driver did not settle in {_MAX_STEPS} steps at "
                           f"{now_ms} ms (state {machine.state.value})")

    def _wake(self, now_ms: int, at_ms: int | None) -> None:
        # At least 1 ms on: a deadline already due is handled by the next
        # step, never by spinning.
        self.wake_at = None if at_ms is None else max(at_ms, now_ms + 1)

    def _service_side(self, now_ms: int, effects: list[DriverEffect]) -> int | None:
        """Give up the side channel's heartbeat past its timeout, send the
        next one when due; returns when to look again (None: nothing is
        scheduled)."""
        machine = self.machine
        side = self._side
        if side is not None:
            if now_ms < self._side_deadline:
                return self._side_deadline
            self._side = None
            effects.append(Cancel(Channel.SIDE, side.api, timed_out=True))
            machine.background_failed(now_ms, CoordinatorUnavailableError(
                "heartbeat: no answer in time"))
        action = machine.background_heartbeat(now_ms)
        if isinstance(action, Call):
            self._side = action
            self._side_deadline = now_ms + action.timeout_ms
            effects.append(Send(Channel.SIDE, action))
            return self._side_deadline
        if isinstance(action, Wait):
            return action.until_ms
        return None

    def _service_load(self, now_ms: int, effects: list[DriverEffect]) -> int | None:
        """Ask for a measurement (``MeasureLoad``) one heartbeat interval
        after the member became stable and each interval after that, one at
        a time; returns when the next one is due (None: not now stable)."""
        machine = self.machine
        if not self._measures_load or machine.state is not MemberState.STABLE \
                or machine.closing:
            self._load_due = None
            return None
        interval = machine.config.timing.heartbeat_interval_ms
        if self._load_due is None:
            self._load_due = now_ms + interval
        if self._measuring:
            return None
        if now_ms < self._load_due:
            return self._load_due
        self._load_due = now_ms + interval
        owned = machine.owned
        if owned:
            self._measuring = True
            effects.append(MeasureLoad(owned))
        return self._load_due

    def _abandon_side(self, now_ms: int, effects: list[DriverEffect]) -> None:
        side, self._side = self._side, None
        if side is not None:
            effects.append(Cancel(Channel.SIDE, side.api, timed_out=False))
            self.machine.background_abandoned(now_ms)


def _earliest(*times: int | None) -> int | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
