"""The member's driver without a runtime (sans-IO): what it sends on which
channel, when it gives a call up, what it does while a callback runs, how
it bounds a commit. ``GroupMember`` (asyncio) and the simulator perform
exactly these effects."""

from __future__ import annotations

import pytest

from client.errors import NotOwnedError
from client.member_state import (
    CallbackKind,
    InvokeListener,
    MemberConfig,
    MemberState,
    MemberStateMachine,
)
from client.member_state.driver import (
    Cancel,
    Channel,
    DriverEffect,
    MeasureLoad,
    MemberDriver,
    Send,
)
from protocol.messages import HeartbeatResponse, JoinResponse, SyncResponse
from protocol.resources import ResourceAssignment

SESSION = 1_000
HB = 300


def driver(measures_load: bool = False) -> MemberDriver:
    config = MemberConfig(group_id="g", sets=("s",), assignors=("cooperative-sticky",),
                          session_timeout_ms=SESSION, heartbeat_interval_ms=HB,
                          rebalance_timeout_ms=5_000)
    return MemberDriver(MemberStateMachine(config, rng=lambda: 0.5),
                        measures_load=measures_load)


def sends(effects: list[DriverEffect], channel: Channel) -> list[str]:
    return [e.call.api for e in effects if isinstance(e, Send) and e.channel is channel]


def stable_owner(d: MemberDriver, now: int) -> InvokeListener:
    """Join as a follower of generation 1 assigned s[0], s[1]; returns the
    ``on_assigned`` the driver asks for (not reported returned yet)."""
    assert sends(d.step(now), Channel.MAIN) == ["join"]
    d.answered(Channel.MAIN, now, JoinResponse(None, 1, "resources", "cooperative-sticky",
                                               "leader", "m1"))
    effects = d.step(now)
    assert sends(effects, Channel.MAIN) == ["sync"]
    side = d.in_flight(Channel.SIDE)
    if side is not None:  # the side channel heartbeats the new generation meanwhile
        d.answered(Channel.SIDE, now, HeartbeatResponse(None))
    assigned = ResourceAssignment(assigned={"s": [0, 1]}).encode()
    d.answered(Channel.MAIN, now, SyncResponse(None, "resources", "cooperative-sticky",
                                               assigned))
    effects = d.step(now)
    callback = effects[-1]
    assert isinstance(callback, InvokeListener) and callback.kind is CallbackKind.ASSIGNED
    # Until the runtime knows whether the callback awaits, nothing is due.
    assert d.wake_at is None
    return callback


def test_a_call_without_an_answer_within_its_timeout_is_given_up_and_retried() -> None:
    d = driver()
    effects = d.step(0)
    [send] = effects
    assert isinstance(send, Send) and send.channel is Channel.MAIN and send.call.api == "join"
    timeout = send.call.timeout_ms
    assert d.wake_at == timeout  # nothing else to wake for: no generation, no lease

    assert d.step(timeout - 1) == []  # a wake-up before the deadline changes nothing
    effects = d.step(timeout)
    assert effects == [Cancel(Channel.MAIN, "join", timed_out=True)]
    assert d.machine.last_error is not None and "no answer within" in d.machine.last_error
    # The step decided nothing after giving the call up: it is due again at
    # once, for the runtime to step once the cancellation is performed.
    assert d.wake_at == timeout
    effects = d.step(timeout)
    # Retried (after the machine's backoff, none for the first failure).
    if not sends(effects, Channel.MAIN):
        assert d.wake_at is not None and d.wake_at > timeout
        effects = d.step(d.wake_at)
    assert sends(effects, Channel.MAIN) == ["join"]


def test_while_a_callback_runs_only_the_side_channel_heartbeats() -> None:
    d = driver()
    callback = stable_owner(d, 0)
    assert d.callback == callback
    # The callback awaits: the runtime steps the driver at once, then when it
    # says; it wakes for the side channel only.
    now = 0
    effects = d.step(now)
    assert sends(effects, Channel.MAIN) == []
    if sends(effects, Channel.SIDE):
        d.answered(Channel.SIDE, now, HeartbeatResponse(None))
    side_sent = 0
    while now < 3 * SESSION:
        assert d.wake_at is not None and d.wake_at > now
        now = d.wake_at
        effects = d.step(now)
        assert sends(effects, Channel.MAIN) == []
        assert not [e for e in effects if isinstance(e, InvokeListener)]
        if sends(effects, Channel.SIDE):
            side_sent += 1
            d.answered(Channel.SIDE, now, HeartbeatResponse(None))
    # One every interval, and each answer renews the lease the member works under.
    assert side_sent >= 3 * SESSION // HB - 1
    assert d.machine.owned_at(now) == {("s", 0), ("s", 1)}

    d.callback_returned(now)
    assert d.callback is None
    assert d.machine.state is MemberState.STABLE
    effects = d.step(now)
    assert sends(effects, Channel.MAIN) == ["heartbeat"]


def test_a_side_heartbeat_without_an_answer_in_time_is_given_up() -> None:
    d = driver()
    stable_owner(d, 0)
    now = 0
    d.step(now)
    while d.in_flight(Channel.SIDE) is None:
        assert d.wake_at is not None
        now = d.wake_at
        d.step(now)
    sent_at = now
    deadline = d.wake_at
    assert deadline is not None and deadline > sent_at
    effects = d.step(deadline)
    assert Cancel(Channel.SIDE, "heartbeat", timed_out=True) in effects


def test_a_commit_is_bounded_by_the_safety_deadline_and_not_sent_past_it() -> None:
    d = driver()
    stable_owner(d, 0)
    d.callback_returned(0)
    deadline = d.machine.safety_deadline_ms()
    assert deadline is not None
    request, timeout = d.commit_call(deadline - 50, {("s", 0): 7}, 30_000)
    assert timeout == 50
    assert request.generation_id == 1
    _, timeout = d.commit_call(0, {("s", 0): 7}, 10)
    assert timeout == 10
    with pytest.raises(NotOwnedError, match="safety deadline passed"):
        d.commit_call(deadline, {("s", 0): 8}, 30_000)


def test_a_stop_ends_the_side_channel_and_stepping() -> None:
    d = driver()
    stable_owner(d, 0)
    d.callback_returned(0)
    d.machine.close(leave=False)
    effects = d.step(1)
    kinds = [e.kind for e in effects if isinstance(e, InvokeListener)]
    assert kinds == [CallbackKind.REVOKED]
    d.callback_returned(2)
    effects = d.step(2)
    assert d.stopped
    assert d.in_flight(Channel.SIDE) is None and d.in_flight(Channel.MAIN) is None
    assert d.wake_at is None
    assert d.step(3) == []


def test_a_load_measurement_is_asked_for_each_interval_while_stable_one_at_a_time() -> None:
    """With a load callback, the driver asks for the owned resources' loads
    one heartbeat interval after the member is stable and each interval
    after that; never a second while one is unanswered; never without a
    load callback."""
    for measures in (False, True):
        d = driver(measures_load=measures)
        stable_owner(d, 0)
        d.callback_returned(0)
        asked: list[int] = []
        now = 0
        while now < 5 * HB:
            for e in d.step(now):
                if isinstance(e, Send):  # the coordinator answers at once
                    d.answered(e.channel, now, HeartbeatResponse(None))
                if isinstance(e, MeasureLoad):
                    assert e.resources == {("s", 0), ("s", 1)}
                    asked.append(now)
                    if len(asked) == 2:
                        continue  # left unanswered: no third while it is
                    d.load_measured(now, {r: 1.0 for r in e.resources})
            assert d.wake_at is not None
            now = d.wake_at
        assert asked == ([] if not measures else [HB, 2 * HB]), asked
