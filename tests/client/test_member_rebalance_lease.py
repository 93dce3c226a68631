"""The safety rule during a rebalance, sans-IO on a fake clock (KIP-62 model).

The member keeps heartbeating while it rejoins (the side channel), and what
it owns ends at the earliest of ``anchor + session`` and the rebalance
bound: ``settled + rebalance_timeout`` while joining (``settled``: send time
of the last answer proving no join phase was in progress), ``first join
sent + rebalance_timeout`` while syncing. Chaos scenario this pins down:
tests/client/test_member_handover_deadlines.py (a cooperative member whose join is
lost).
"""

from __future__ import annotations

import pytest

from client.errors import CoordinatorUnavailableError, FencedInstanceIdError, NotOwnedError
from client.member_state import (
    Call,
    CallbackKind,
    InvokeListener,
    MemberConfig,
    MemberState,
    MemberStateMachine,
    Stop,
    Wait,
)
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    SyncRequest,
    SyncResponse,
)
from protocol.resources import MemberMetadata, ResourceAssignment

SESSION = 1_000
HB = 300
RT = 5_000

Res = set[tuple[str, int]]


def make(**kw: object) -> MemberStateMachine:
    settings: dict[str, object] = dict(group_id="g", sets=["s"],
                                       assignors=("cooperative-sticky",),
                                       session_timeout_ms=SESSION, heartbeat_interval_ms=HB,
                                       rebalance_timeout_ms=RT)
    settings.update(kw)
    return MemberStateMachine(MemberConfig(**settings), rng=lambda: 0.5)  # type: ignore[arg-type]


def res(*indexes: int) -> Res:
    return {("s", i) for i in indexes}


def assignment(*indexes: int) -> bytes:
    return ResourceAssignment(assigned={"s": list(indexes)} if indexes else {}).encode()


def expect_call(m: MemberStateMachine, now: int, api: str) -> Call:
    action = m.next_action(now)
    assert isinstance(action, Call), action
    assert action.api == api, action
    return action


def expect_callback(m: MemberStateMachine, now: int, kind: CallbackKind, resources: Res) -> None:
    action = m.next_action(now)
    assert isinstance(action, InvokeListener), action
    assert action.kind is kind, action
    assert set(action.resources) == resources
    m.listener_done(now)


def bg_call(m: MemberStateMachine, now: int) -> HeartbeatRequest:
    action = m.background_heartbeat(now)
    assert isinstance(action, Call), action
    assert action.api == "heartbeat"
    assert isinstance(action.request, HeartbeatRequest)
    assert action.request.wait_ms == 0  # answered at once
    return action.request


def owner_rejoining(*indexes: int) -> MemberStateMachine:
    """Generation 1 owning ``indexes`` (sync sent at 0); a no-error heartbeat
    sent at 100 (so settled = 100); the heartbeat sent at 400 learns of a
    rebalance; the join goes out at 410 and stays in flight."""
    m = make()
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    m.receive(0, SyncResponse(None, "resources", "cooperative-sticky", assignment(*indexes)))
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(*indexes))
    expect_call(m, 100, "heartbeat")
    m.receive(400, HeartbeatResponse(None))  # held 300 ms: no rebalance up to then
    expect_call(m, 400, "heartbeat")
    m.receive(405, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    join = expect_call(m, 410, "join")
    assert isinstance(join.request, JoinRequest)
    assert MemberMetadata.decode(join.request.protocols[0][1]).owned == {"s": list(indexes)}
    assert m.state is MemberState.JOINING
    return m


# ---------------------------------------------------------------- joining


def test_heartbeats_continue_during_a_join_with_the_old_generation() -> None:
    m = owner_rejoining(0, 1)
    # the next one is due an interval after the last heartbeat was sent (400)
    assert m.background_heartbeat(410) == Wait(400 + HB)
    req = bg_call(m, 700)
    assert (req.member_id, req.generation_id) == ("m1", 1)
    # only one at a time
    try:
        m.background_heartbeat(700)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a second background heartbeat while one is outstanding")
    m.background_received(705, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    # REBALANCE_IN_PROGRESS proved contact at 700: the session bound moved on;
    # the rebalance bound (settled 100 + RT) did not
    assert m.safety_deadline_ms() == 700 + SESSION
    now = 700
    while now + HB < 100 + RT:  # a long join phase: heartbeats keep the session alive
        now += HB
        req = bg_call(m, now)
        m.background_received(now + 5, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        assert not m.wants_interrupt(now + 5)
        assert m.safety_deadline_ms() == min(now + SESSION, 100 + RT)
    assert now > 700 + 4 * SESSION  # far longer than a session without losing anything
    assert m.safety_deadline_ms() == 100 + RT  # now the rebalance bound is the earlier one
    assert m.owned == frozenset(res(0, 1))


def test_no_background_heartbeat_outside_a_rebalance_or_without_a_generation() -> None:
    m = make()
    expect_call(m, 0, "join")
    assert m.background_heartbeat(0) is None  # a new member: nothing to heartbeat with
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    assert isinstance(m.background_heartbeat(HB), Call)  # syncing: yes, with generation 1
    m.background_received(HB, HeartbeatResponse(None))
    m.receive(HB, SyncResponse(None, assignment=assignment(0)))
    expect_callback(m, HB, CallbackKind.ASSIGNED, res(0))
    assert m.state is MemberState.STABLE
    assert m.background_heartbeat(10 * HB) is None  # stable: the main channel heartbeats


def test_a_lost_join_loses_everything_at_the_rebalance_bound() -> None:
    m = owner_rejoining(0, 1, 2)
    bound = 100 + RT  # settled at 100: the coordinator's join deadline is later
    now = 410
    while True:  # the join never comes back; the coordinator keeps answering heartbeats
        now += HB
        if now >= bound:
            break
        bg_call(m, now)
        m.background_received(now + 5, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        assert not m.wants_interrupt(now + 5)
        assert m.safety_deadline_ms() == min(now + SESSION, bound)
    assert m.safety_deadline_ms() == bound
    assert not m.wants_interrupt(bound - 1)
    assert m.wants_interrupt(bound)  # the driver wakes at the deadline and abandons the join
    m.call_abandoned(bound)
    # on_lost before anything else
    action = m.next_action(bound)
    assert isinstance(action, InvokeListener) and action.kind is CallbackKind.LOST
    assert set(action.resources) == res(0, 1, 2)
    assert m.owned == frozenset()
    m.listener_done(bound)
    assert m.last_error is not None and "rebalance timeout" in m.last_error
    # then it joins again, claiming nothing
    join = expect_call(m, bound, "join")
    assert isinstance(join.request, JoinRequest)
    assert MemberMetadata.decode(join.request.protocols[0][1]).owned == {}


def test_a_lost_join_without_heartbeat_answers_loses_at_the_session_bound() -> None:
    m = owner_rejoining(0)
    # every background heartbeat fails too (partitioned): the session bound,
    # anchored at the REBALANCE_IN_PROGRESS heartbeat sent at 400, comes first
    now = 410
    while now + HB < 400 + SESSION:
        now += HB
        bg_call(m, now)
        m.background_failed(now + 50, CoordinatorUnavailableError("partitioned"))
    assert m.safety_deadline_ms() == 400 + SESSION
    assert m.wants_interrupt(400 + SESSION)
    m.call_abandoned(400 + SESSION)
    expect_callback(m, 400 + SESSION, CallbackKind.LOST, res(0))


def test_a_healthy_long_barrier_shorter_than_the_bound_keeps_everything() -> None:
    m = owner_rejoining(0, 1)
    now = 410
    end_of_join_phase = 100 + RT - 200  # just inside the bound
    while now + HB < end_of_join_phase:
        now += HB
        bg_call(m, now)
        m.background_received(now + 5, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        assert not m.wants_interrupt(now + 5)
    m.receive(end_of_join_phase,
              JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    assert m.state is MemberState.SYNCING
    # the sync phase has its own bound: the join's send time + RT; the
    # session bound is anchored at the last heartbeat
    assert m.safety_deadline_ms() == min(now + SESSION, 410 + RT)
    sync = expect_call(m, end_of_join_phase, "sync")
    assert isinstance(sync.request, SyncRequest)
    # heartbeats go on with the new generation while the sync is parked
    req = bg_call(m, end_of_join_phase + HB)
    assert req.generation_id == 2
    m.background_received(end_of_join_phase + HB + 5, HeartbeatResponse(None))
    done = end_of_join_phase + HB + 50
    m.receive(done, SyncResponse(None, assignment=assignment(0, 1, 3)))
    # no on_lost, no on_revoked: only what was added
    expect_callback(m, done, CallbackKind.ASSIGNED, res(3))
    assert m.owned == frozenset(res(0, 1, 3))
    assert m.state is MemberState.STABLE
    assert m.safety_deadline_ms() == end_of_join_phase + HB + SESSION  # the heartbeat's send


# ---------------------------------------------------------------- syncing


def test_a_lost_sync_loses_everything_at_its_bound_and_is_sent_again() -> None:
    m = owner_rejoining(0, 1)
    m.receive(600, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    sync = expect_call(m, 600, "sync")
    bound = 410 + RT  # the join was sent at 410: the sync deadline is no earlier
    assert m.safety_deadline_ms() == 410 + SESSION  # the join's send time is the anchor
    now = 600
    resent = 0
    while now + HB < bound:  # the sync never comes back; heartbeats say no error
        now += HB
        req = bg_call(m, now)
        assert req.generation_id == 2
        m.background_received(now + 5, HeartbeatResponse(None))
        if m.wants_interrupt(now + 5):
            # The heartbeats show the coordinator is done with the sync
            # (the call was lost on a hung connection): it is sent again, and lost again.
            m.call_abandoned(now + 5)
            assert expect_call(m, now + 5, "sync").request == sync.request
            resent += 1
    assert resent >= 1
    assert m.safety_deadline_ms() == bound
    assert not m.wants_interrupt(bound - 1)
    assert m.wants_interrupt(bound)
    m.call_abandoned(bound)
    expect_callback(m, bound, CallbackKind.LOST, res(0, 1))
    again = expect_call(m, bound, "sync")  # a repeated sync gets the stored assignment
    assert again.request == sync.request


def test_the_sync_bound_counts_from_the_first_join_of_the_rebalance() -> None:
    m = owner_rejoining(0)
    # the join sent at 410 got no answer (it may have reached the coordinator)
    m.call_failed(900, CoordinatorUnavailableError("connection reset"))
    # sent again at once: the backoff counts from the failed join's start
    expect_call(m, 900, "join")
    m.receive(901, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    # the generation may have formed on the first join: its send time counts
    assert m.safety_deadline_ms() == min(900 + SESSION, 410 + RT)


# ---------------------------------------------------------------- answers to heartbeats


def test_an_answer_to_a_superseded_generation_is_ignored() -> None:
    m = owner_rejoining(0, 1)
    req = bg_call(m, 700)
    assert req.generation_id == 1
    # the join phase completes; the join answer is read first
    m.receive(710, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    # the generation-1 heartbeat reached the coordinator after generation 2 formed
    m.background_received(712, HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION))
    assert m.generation_id == 2
    assert m.owned == frozenset(res(0, 1))
    assert m.state is MemberState.SYNCING
    expect_call(m, 712, "sync")


def test_illegal_generation_while_the_join_is_in_flight_waits_for_the_join() -> None:
    m = owner_rejoining(0, 1)
    bg_call(m, 700)
    # the heartbeat's answer overtook the join's: generation 2 formed with us
    m.background_received(712, HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION))
    assert m.owned == frozenset(res(0, 1))
    assert not m.wants_interrupt(712)
    m.receive(713, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 713, "sync")


def test_unknown_member_during_a_join_loses_everything_and_drops_the_join() -> None:
    m = owner_rejoining(0, 1)
    bg_call(m, 700)
    m.background_received(705, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    assert m.member_id == "" and m.generation_id == -1
    assert m.wants_interrupt(705)
    # the join's answer comes in anyway before the driver cancels it: it is
    # about a member id we no longer have and is dropped
    m.receive(706, JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    expect_callback(m, 706, CallbackKind.LOST, res(0, 1))
    join = expect_call(m, 706, "join")
    assert isinstance(join.request, JoinRequest)
    assert join.request.member_id == ""
    assert m.background_heartbeat(2_000) is None  # nothing to heartbeat with now


def test_fenced_during_a_sync_is_fatal() -> None:
    m = owner_rejoining(0)
    m.receive(600, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 600, "sync")
    bg_call(m, 900)
    m.background_received(905, HeartbeatResponse(ErrorCode.FENCED_INSTANCE_ID))
    assert m.wants_interrupt(905)
    m.call_abandoned(905)
    expect_callback(m, 905, CallbackKind.LOST, res(0))
    stop = m.next_action(905)
    assert isinstance(stop, Stop) and isinstance(stop.error, FencedInstanceIdError)


def test_a_no_error_answer_while_joining_moves_the_rebalance_bound() -> None:
    # a member that rejoins on its own (here: a delayed rebalance it asked
    # for) before the coordinator started anything
    m = owner_rejoining(0)
    bg_call(m, 1_000)
    m.background_received(1_005, HeartbeatResponse(None))  # our join not processed yet
    assert m.safety_deadline_ms() == min(1_000 + SESSION, 1_000 + RT)


# ---------------------------------------------------------------- the bound while stable


def test_a_paused_stable_member_loses_at_the_rebalance_bound_when_it_is_shorter() -> None:
    # rebalance timeout below the session timeout: a rebalance started right
    # after our last heartbeat removes us at its join deadline, before our
    # session would expire
    m = make(session_timeout_ms=10_000, heartbeat_interval_ms=300, rebalance_timeout_ms=2_000)
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    m.receive(0, SyncResponse(None, assignment=assignment(4)))
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(4))
    expect_call(m, 0, "heartbeat")
    m.receive(300, HeartbeatResponse(None))
    assert m.safety_deadline_ms() == 0 + 2_000
    expect_callback(m, 2_500, CallbackKind.LOST, res(4))  # paused until 2 500


# ---------------------------------------------------------------- while a callback runs


def _stable_in_callback(*indexes: int) -> tuple[MemberStateMachine, InvokeListener]:
    """Generation 1 owning ``indexes`` (sync sent at 0), its on_assigned running."""
    m = make()
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    m.receive(0, SyncResponse(None, assignment=assignment(*indexes)))
    action = m.next_action(0)
    assert isinstance(action, InvokeListener) and action.kind is CallbackKind.ASSIGNED
    return m, action


def test_heartbeats_continue_while_the_close_revokes_and_keep_the_final_commit() -> None:
    # close() while stable: on_revoked(everything) runs for several sessions
    # (a slow worker); the side channel's answers keep the lease, so its
    # final commit is still built (and the coordinator still takes it).
    m, _ = _stable_in_callback(0, 1)
    m.listener_done(0)
    m.close()
    revoke = m.next_action(10)
    assert isinstance(revoke, InvokeListener) and revoke.kind is CallbackKind.REVOKED
    now = 10
    while now < 4 * SESSION:
        now += HB
        req = bg_call(m, now)
        assert (req.member_id, req.generation_id) == ("m1", 1)
        m.background_received(now + 5, HeartbeatResponse(None))
        assert m.safety_deadline_ms() == now + SESSION  # settled at the heartbeat's send
    assert m.revoking(res(0))
    commit = m.build_commit({("s", 0): 1, ("s", 1): 2})
    assert commit.generation_id == 1
    m.listener_done(now)
    assert m.owned == frozenset()
    expect_call(m, now, "leave")


def test_a_rebalance_seen_during_a_callback_keeps_the_rebalance_bound_then_rejoins() -> None:
    # REBALANCE_IN_PROGRESS proves the member known (its session), not that the
    # coordinator waits for it: the rebalance bound still runs from the last
    # answer that saw no rebalance (the sync, sent at 0).
    m, _ = _stable_in_callback(0)
    now = 0
    while now + HB < RT - SESSION:
        now += HB
        bg_call(m, now)
        m.background_received(now + 5, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        assert m.safety_deadline_ms() == min(now + SESSION, 0 + RT)
    m.listener_done(now)
    # the callback returned: the member rejoins at once, still owning its resource
    join = expect_call(m, now, "join")
    assert isinstance(join.request, JoinRequest)
    assert MemberMetadata.decode(join.request.protocols[0][1]).owned == {"s": [0]}


def test_an_error_seen_during_a_callback_refuses_its_final_commit() -> None:
    # The group removed the member while its on_revoked ran: what it revokes
    # may be someone else's already, so its final commit is refused, saying why.
    m, _ = _stable_in_callback(0, 1)
    m.listener_done(0)
    m.close()
    m.next_action(10)  # on_revoked(everything)
    bg_call(m, 10 + HB)
    m.background_received(10 + HB + 5, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    assert m.generation_id == -1
    with pytest.raises(NotOwnedError, match=r"does not own s\[0\]: the member left the "
                                            r"group .*UNKNOWN_MEMBER_ID"):
        m.build_commit({("s", 0): 1})
    m.listener_done(20 + HB)
    assert m.owned == frozenset()
    # nothing to leave with: the member id is gone
    assert isinstance(m.next_action(20 + HB), Stop)


def test_closing_with_a_join_in_flight_waits_for_the_side_channel_to_release_it() -> None:
    m = owner_rejoining(0, 1)
    early = bg_call(m, 700)  # sent before the close: its answer says nothing of it
    m.close()
    assert not m.wants_interrupt(705)  # the join may be answered (a generation with us)
    m.background_received(710, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    assert early.generation_id == 1 and not m.wants_interrupt(710)
    bg_call(m, 710)  # due at once after the close
    # ILLEGAL_GENERATION: the join phase completed with our join; its answer is coming
    m.background_received(715, HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION))
    assert not m.wants_interrupt(715) and m.owned == frozenset(res(0, 1))
    bg_call(m, 710 + HB)
    # REBALANCE_IN_PROGRESS: still waiting for rejoins, so our join is parked
    m.background_received(715 + HB, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    assert m.wants_interrupt(715 + HB)
    m.call_abandoned(715 + HB)
    revoke = m.next_action(715 + HB)  # then the close revokes in generation 1
    assert isinstance(revoke, InvokeListener) and revoke.kind is CallbackKind.REVOKED
    assert m.build_commit({("s", 0): 1}).generation_id == 1


def test_closing_with_a_join_in_flight_takes_its_answer_and_syncs_before_revoking() -> None:
    m = owner_rejoining(0, 1)
    m.close()
    m.receive(500, JoinResponse(None, 2, "resources", "cooperative-sticky", "leader", "m1"))
    sync = expect_call(m, 500, "sync")  # the close waits for the new generation
    assert isinstance(sync.request, SyncRequest) and sync.request.generation_id == 2
    assert not m.wants_interrupt(505)
    m.receive(600, SyncResponse(None, assignment=assignment(0, 2)))
    # The close's on_revoked: everything it owned (1 moves away, nobody else's in
    # generation 2 yet), in generation 2; nothing new taken on (2), no on_assigned.
    revoke = m.next_action(600)
    assert isinstance(revoke, InvokeListener) and revoke.kind is CallbackKind.REVOKED
    assert set(revoke.resources) == res(0, 1)
    assert m.build_commit({("s", 0): 1, ("s", 1): 1}).generation_id == 2
    m.listener_done(600)
    assert m.owned == frozenset()
    expect_call(m, 600, "leave")
