"""The member state machine without a network (sans-IO): every error code's
action, eager and cooperative flows, the safety rule on a fake clock."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from client.assignors import Assignment, RebalanceProtocol, Subscription
from client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    FatalMemberError,
    FencedInstanceIdError,
    GroupMaxSizeReachedError,
    InconsistentGroupProtocolError,
    MemberClosedError,
    NotOwnedError,
    RebalanceInProgressError,
)
from client.member_state import (
    ERROR_ACTIONS,
    Call,
    CallbackKind,
    ErrorAction,
    InvokeListener,
    MemberConfig,
    MemberState,
    MemberStateMachine,
    RebalanceCompleted,
    RebalanceFailed,
    Stop,
    Wait,
)
from client.transport import CatalogResponse
from protocol import codec
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinMember,
    JoinRequest,
    JoinResponse,
    LeaveRequest,
    LeaveResponse,
    SyncRequest,
    SyncResponse,
)
from protocol.resources import MemberMetadata, ResourceAssignment

SESSION = 1_000
HB = 300


def make(assignors: Sequence[str] = ("cooperative-sticky",), **kw: object) -> MemberStateMachine:
    settings: dict[str, object] = dict(group_id="g", sets=["s"], assignors=tuple(assignors),
                                       session_timeout_ms=SESSION, heartbeat_interval_ms=HB,
                                       rebalance_timeout_ms=5_000)
    settings.update(kw)
    return MemberStateMachine(MemberConfig(**settings), rng=lambda: 0.5)  # type: ignore[arg-type]


def expect_call(m: MemberStateMachine, now: int, api: str) -> Call:
    action = m.next_action(now)
    assert isinstance(action, Call), action
    assert action.api == api, action
    return action


def expect_callback(m: MemberStateMachine, now: int, kind: CallbackKind,
                    resources: set[tuple[str, int]]) -> None:
    action = m.next_action(now)
    assert isinstance(action, InvokeListener), action
    assert action.kind is kind
    assert set(action.resources) == resources
    m.listener_done(now)


def res(*indexes: int, name: str = "s") -> set[tuple[str, int]]:
    return {(name, i) for i in indexes}


def assignment(*indexes: int, delay_ms: int = 0, error: str | None = None) -> bytes:
    assigned = {"s": list(indexes)} if indexes else {}
    return ResourceAssignment(assigned=assigned, delay_ms=delay_ms, error=error).encode()


def join_as_follower(m: MemberStateMachine, now: int, *indexes: int,
                     generation: int = 1, member_id: str = "m1") -> None:
    """Drive a member from JOINING to STABLE owning ``indexes``."""
    expect_call(m, now, "join")
    m.receive(now, JoinResponse(None, generation, "resources", m.config.assignors[0], "leader",
                                member_id))
    expect_call(m, now, "sync")
    m.receive(now, SyncResponse(None, "resources", m.config.assignors[0], assignment(*indexes)))
    added = res(*indexes) - set(m.owned)
    # cooperative: revocations first; here the caller owns nothing new to revoke
    expect_callback(m, now, CallbackKind.ASSIGNED, added)
    assert m.state is MemberState.STABLE


def plan_as_leader(m: MemberStateMachine, now: int, generation: int,
                   members: tuple[JoinMember, ...], catalog: dict[str, int],
                   epoch: int = 3) -> SyncRequest:
    """``m`` (member id m1) joins, is made the leader of ``generation`` with
    ``members``, reads the catalog and sends its plan: the sync request."""
    expect_call(m, now, "join")
    m.receive(now + 1, JoinResponse(None, generation, "resources", "cooperative-sticky",
                                    "m1", "m1", members))
    expect_call(m, now + 1, "resources")
    m.receive(now + 2, CatalogResponse(epoch, catalog))
    sync = expect_call(m, now + 2, "sync")
    assert isinstance(sync.request, SyncRequest)
    return sync.request


def metadata_of(call: Call) -> MemberMetadata:
    assert isinstance(call.request, JoinRequest)
    return MemberMetadata.decode(call.request.protocols[0][1])


# ---------------------------------------------------------------- joining


def test_first_join_takes_the_member_id_and_joins_again_at_once() -> None:
    m = make()
    first = expect_call(m, 0, "join")
    assert isinstance(first.request, JoinRequest)
    assert first.request.member_id == ""
    assert first.request.protocol_type == "resources"
    m.receive(5, JoinResponse(ErrorCode.MEMBER_ID_REQUIRED, member_id="m-new"))
    again = expect_call(m, 5, "join")
    assert isinstance(again.request, JoinRequest)
    assert again.request.member_id == "m-new"
    assert not any(isinstance(e, RebalanceFailed) for e in m.drain_events())


def test_follower_syncs_without_assignments_then_heartbeats_with_long_poll() -> None:
    m = make()
    expect_call(m, 0, "join")
    m.receive(10, JoinResponse(None, 3, "resources", "cooperative-sticky", "other", "m1"))
    sync = expect_call(m, 10, "sync")
    assert isinstance(sync.request, SyncRequest)
    assert sync.request.assignments == ()
    assert sync.request.generation_id == 3
    m.receive(20, SyncResponse(None, "resources", "cooperative-sticky", assignment(0, 1)))
    expect_callback(m, 20, CallbackKind.ASSIGNED, res(0, 1))
    assert m.owned == frozenset(res(0, 1))
    hb = expect_call(m, 20, "heartbeat")
    assert isinstance(hb.request, HeartbeatRequest)
    assert hb.request.wait_ms == HB  # the coordinator answers at once when a rebalance starts
    assert hb.interruptible
    assert hb.timeout_ms <= SESSION  # bounded by the safety deadline


def test_leader_reads_the_catalog_assigns_and_validates() -> None:
    m = make(assignors=("range",))
    expect_call(m, 0, "join")
    meta = MemberMetadata(sets=("s",)).encode()
    members = (JoinMember("m1", None, meta), JoinMember("m2", None, meta))
    m.receive(5, JoinResponse(None, 1, "resources", "range", "m1", "m1", members))
    assert m.is_leader
    expect_call(m, 5, "resources")
    m.receive(6, CatalogResponse(7, {"s": 4}))
    sync = expect_call(m, 6, "sync")
    assert isinstance(sync.request, SyncRequest)
    got = {a.member_id: ResourceAssignment.decode(a.assignment) for a in sync.request.assignments}
    assert set(got) == {"m1", "m2"}
    all_assigned = [i for a in got.values() for i in a.assigned.get("s", [])]
    assert sorted(all_assigned) == [0, 1, 2, 3]
    m.receive(7, SyncResponse(None, assignment=sync.request.assignments[0].assignment,
                              resources_epoch=7))
    expect_callback(m, 7, CallbackKind.ASSIGNED, res(*got["m1"].assigned["s"]))


class _GreedyCooperative:
    """A 'cooperative' assignor that breaks KIP-429: it moves owned resources."""

    name = "cooperative-sticky"
    protocols = (RebalanceProtocol.COOPERATIVE,)

    def assign(self, resources: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        first = sorted(subscriptions)[0]
        return {m: Assignment({"s": list(range(resources["s"]))} if m == first else {})
                for m in subscriptions}


def test_leader_fails_the_rebalance_loudly_when_the_assignor_breaks_a_rule() -> None:
    m = make()
    m._assignors["cooperative-sticky"] = _GreedyCooperative()
    expect_call(m, 0, "join")
    owner = MemberMetadata(sets=("s",), owned={"s": [0, 1]}, generation=4).encode()
    members = (JoinMember("a", None, MemberMetadata(sets=("s",)).encode()),
               JoinMember("b", None, owner))
    m.receive(1, JoinResponse(None, 5, "resources", "cooperative-sticky", "a", "a", members))
    expect_call(m, 1, "resources")
    m.receive(2, CatalogResponse(1, {"s": 2}))
    sync = expect_call(m, 2, "sync")
    assert isinstance(sync.request, SyncRequest)
    decoded = [ResourceAssignment.decode(a.assignment) for a in sync.request.assignments]
    assert all(d.error and "broke a rule" in d.error for d in decoded)
    assert all(not d.assigned for d in decoded)  # nothing handed out: no double ownership
    assert m.last_error and "broke a rule" in m.last_error
    m.receive(3, SyncResponse(None, assignment=sync.request.assignments[0].assignment))
    events = m.drain_events()
    assert any(isinstance(e, RebalanceFailed) for e in events)
    assert not any(isinstance(e, RebalanceCompleted) for e in events)
    # no on_assigned for a failed rebalance; the member rejoins after a backoff
    action = m.next_action(3)
    assert isinstance(action, Call) and action.api == "heartbeat"
    m.call_abandoned(3)
    assert isinstance(m.next_action(3), Call)
    m.call_abandoned(3)
    expect_call(m, 1_000, "join")


def test_static_leader_with_skip_assignment_syncs_without_assignments() -> None:
    m = make(group_instance_id="i-1")
    join = expect_call(m, 0, "join")
    assert isinstance(join.request, JoinRequest)
    assert join.request.group_instance_id == "i-1"
    members = (JoinMember("m1", "i-1", MemberMetadata(sets=("s",)).encode()),)
    m.receive(1, JoinResponse(None, 2, "resources", "cooperative-sticky", "m1", "m1", members,
                              skip_assignment=True))
    sync = expect_call(m, 1, "sync")  # no catalog read, no assignor run
    assert isinstance(sync.request, SyncRequest)
    assert sync.request.assignments == ()
    m.receive(2, SyncResponse(None, assignment=assignment(0, 1, 2), resources_epoch=4))
    expect_callback(m, 2, CallbackKind.ASSIGNED, res(0, 1, 2))


def test_static_leader_with_skip_assignment_rejoins_for_a_catalog_change_made_meanwhile() -> None:
    """Simulator seed 184: the leader process died, the catalog changed, a new
    process of the static leader came back (KIP-814, skip_assignment) and
    took the sync's epoch as its baseline: nobody ever assigned the new
    resources. The assignment carries the epoch it was computed from."""
    m = make(group_instance_id="i-1")
    expect_call(m, 0, "join")
    members = (JoinMember("m1", "i-1", MemberMetadata(sets=("s",)).encode()),)
    m.receive(1, JoinResponse(None, 2, "resources", "cooperative-sticky", "m1", "m1", members,
                              skip_assignment=True))
    expect_call(m, 1, "sync")
    assigned_at_3 = codec.encode({"v": 1, "assigned": {"s": [0, 1, 2]}, "resources_epoch": 3})
    m.receive(2, SyncResponse(None, assignment=assigned_at_3, resources_epoch=4))
    expect_callback(m, 2, CallbackKind.ASSIGNED, res(0, 1, 2))
    expect_call(m, 2, "join")


def test_a_leaders_plan_that_leaves_resources_to_nobody_says_so_in_every_assignment() -> None:
    """The plan of a cooperative hand-over gives what moves to nobody until the
    follow-up rebalance; every assignment of that plan carries ``followup``,
    so a later process of this static leader knows the follow-up is due."""
    owner = MemberMetadata(sets=("s",), owned={"s": [0, 1, 2, 3]}, generation=1).encode()
    members = (JoinMember("m1", "i-1", owner),
               JoinMember("m2", "i-2", MemberMetadata(sets=("s",)).encode()))
    plan = plan_as_leader(make(group_instance_id="i-1"), 0, 2, members, {"s": 4})
    got = {a.member_id: codec.decode(a.assignment) for a in plan.assignments}
    assert len(got["m1"]["assigned"]["s"]) == 2 and not got["m2"]["assigned"]  # 2 move
    assert all(a.get("followup") is True for a in got.values())
    # a plan that assigns everything is not marked
    members = (JoinMember("m1", "i-1", MemberMetadata(sets=("s",)).encode()),
               JoinMember("m2", "i-2", MemberMetadata(sets=("s",)).encode()))
    plan = plan_as_leader(make(group_instance_id="i-1"), 0, 1, members, {"s": 4})
    assert not any("followup" in codec.decode(a.assignment) for a in plan.assignments)


@pytest.mark.parametrize("followup", [True, False])
def test_a_returning_static_leader_starts_the_follow_up_its_earlier_process_planned(
        followup: bool) -> None:
    """Simulator seeds 75664, 76088, 91962: a static cooperative leader planned a
    hand-over, revoked its own share of it and crashed before its follow-up
    join; its next process came back (KIP-814, skip_assignment) to its stored
    assignment, owning nothing, so revoking nothing: nobody rejoined and what
    it had revoked stayed unowned in a Stable group. The plan's ``followup``
    mark makes the returning leader start the follow-up rebalance."""
    m = make(group_instance_id="i-1")
    expect_call(m, 0, "join")
    members = (JoinMember("m5", "i-1", MemberMetadata(sets=("s",)).encode()),
               JoinMember("m3", "i-2", MemberMetadata(sets=("s",)).encode()))
    m.receive(1, JoinResponse(None, 3, "resources", "cooperative-sticky", "m5", "m5", members,
                              skip_assignment=True))
    expect_call(m, 1, "sync")
    stored: dict[str, object] = {"v": 1, "assigned": {"s": [0, 1]}, "resources_epoch": 4}
    if followup:
        stored["followup"] = True
    m.receive(2, SyncResponse(None, assignment=codec.encode(stored), resources_epoch=4))
    expect_callback(m, 2, CallbackKind.ASSIGNED, res(0, 1))
    expect_call(m, 2, "join" if followup else "heartbeat")


def test_protocol_choice_follows_kafka() -> None:
    assert make(("cooperative-sticky",)).protocol is RebalanceProtocol.COOPERATIVE
    assert make(("range", "cooperative-sticky")).protocol is RebalanceProtocol.EAGER
    assert make(("range",)).protocol is RebalanceProtocol.EAGER


def test_join_lists_every_assignor_in_preference_order() -> None:
    m = make(("range", "cooperative-sticky"))
    join = expect_call(m, 0, "join")
    assert isinstance(join.request, JoinRequest)
    assert [name for name, _ in join.request.protocols] == ["range", "cooperative-sticky"]


# ---------------------------------------------------------------- the error table


def test_every_error_code_has_an_action() -> None:
    assert set(ERROR_ACTIONS) == set(ErrorCode)


def _stable_owner(assignors: Sequence[str] = ("cooperative-sticky",)) -> MemberStateMachine:
    m = make(assignors)
    join_as_follower(m, 0, 0, 1)
    expect_call(m, 0, "heartbeat")
    return m


def test_rebalance_in_progress_cooperative_keeps_what_it_owns() -> None:
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    join = expect_call(m, 10, "join")  # no callback before the join
    meta = metadata_of(join)
    assert meta.owned == {"s": [0, 1]}
    assert meta.generation == 1
    assert m.owned == frozenset(res(0, 1))


def test_rebalance_in_progress_eager_revokes_everything_before_joining() -> None:
    m = _stable_owner(("range",))
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_callback(m, 10, CallbackKind.REVOKED, res(0, 1))
    join = expect_call(m, 11, "join")
    assert metadata_of(join).owned == {}
    assert metadata_of(join).generation == -1
    assert m.owned == frozenset()


@pytest.mark.parametrize("code,keeps_member_id", [
    (ErrorCode.ILLEGAL_GENERATION, True),
    (ErrorCode.UNKNOWN_MEMBER_ID, False),
])
@pytest.mark.parametrize("api", ["heartbeat", "sync"])
def test_reset_codes_lose_everything_and_rejoin_with_nothing(
        code: ErrorCode, keeps_member_id: bool, api: str) -> None:
    m = _stable_owner()
    if api == "sync":
        m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        expect_call(m, 10, "join")
        m.receive(11, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
        expect_call(m, 11, "sync")
        m.receive(12, SyncResponse(code))
    else:
        m.receive(12, HeartbeatResponse(code))
    expect_callback(m, 12, CallbackKind.LOST, res(0, 1))
    assert m.owned == frozenset()
    join = expect_call(m, 12, "join")
    assert isinstance(join.request, JoinRequest)
    assert join.request.member_id == ("m1" if keeps_member_id else "")
    assert metadata_of(join).owned == {}
    assert m.generation_id == -1


@pytest.mark.parametrize("code,cls", [
    (ErrorCode.FENCED_INSTANCE_ID, FencedInstanceIdError),
    (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, InconsistentGroupProtocolError),
    (ErrorCode.GROUP_MAX_SIZE_REACHED, GroupMaxSizeReachedError),
])
def test_fatal_codes_lose_everything_and_stop_with_the_error(
        code: ErrorCode, cls: type[FatalMemberError]) -> None:
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(code))
    expect_callback(m, 10, CallbackKind.LOST, res(0, 1))
    stop = m.next_action(10)
    assert isinstance(stop, Stop)
    assert isinstance(stop.error, cls)
    assert stop.error.code is code
    assert m.state is MemberState.FAILED
    with pytest.raises(cls):
        m.build_commit({})
    assert isinstance(m.next_action(20), Stop)  # stays stopped


def test_fatal_code_on_the_first_join_stops_without_callbacks() -> None:
    m = make()
    expect_call(m, 0, "join")
    m.receive(1, JoinResponse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
    stop = m.next_action(1)
    assert isinstance(stop, Stop) and isinstance(stop.error, InconsistentGroupProtocolError)


@pytest.mark.parametrize("code", [ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                  ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                  ErrorCode.UNKNOWN_SERVER_ERROR])
def test_retriable_codes_retry_the_same_step_after_backoff(code: ErrorCode) -> None:
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(code))
    wait = m.next_action(10)
    assert isinstance(wait, Wait)
    assert wait.until_ms is not None and 10 + 80 <= wait.until_ms <= 10 + 120  # 100 ms +-20%
    expect_call(m, wait.until_ms, "heartbeat")
    assert m.owned == frozenset(res(0, 1))  # nothing lost yet


def fail_joins(m: MemberStateMachine, now: int, times: int,
               error: str = "connection refused") -> int:
    """Fail ``times`` joins in a row, each retried when the backoff says (the
    backoff grows toward its cap); returns when the next join is due."""
    for _ in range(times):
        expect_call(m, now, "join")
        m.call_failed(now, CoordinatorUnavailableError(error))
        wait = m.next_action(now)
        assert isinstance(wait, Wait) and wait.until_ms is not None
        now = wait.until_ms
    return now


def join_due(m: MemberStateMachine, now: int) -> int:
    """When the next join goes: ``now`` if it goes at once."""
    action = m.next_action(now)
    if isinstance(action, Call):
        assert action.api == "join", action
        return now
    assert isinstance(action, Wait) and action.until_ms is not None, action
    return action.until_ms


def test_join_retries_with_exponential_backoff_and_jitter() -> None:
    draws = iter([0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5])
    m = MemberStateMachine(MemberConfig("g", ["s"], session_timeout_ms=SESSION,
                                        heartbeat_interval_ms=HB, retry_backoff_ms=100,
                                        retry_backoff_max_ms=400), rng=lambda: next(draws))
    now = 0
    delays = []
    for _ in range(5):
        expect_call(m, now, "join")
        m.call_failed(now, CoordinatorUnavailableError("connection refused"))
        wait = m.next_action(now)
        assert isinstance(wait, Wait) and wait.until_ms is not None
        delays.append(wait.until_ms - now)
        now = wait.until_ms
    assert delays == [80, 240, 400, 400, 400]  # 100*0.8, 200*1.2, then capped at 400


def test_a_coordinator_answering_the_side_channel_ends_the_join_backoff() -> None:
    """Simulator seed 737: the coordinator was down, the member's lease ran
    out and its join failed after a run of failures, so the retry waited out
    a full backoff while its background heartbeats were answered: the
    coordinator kept it as a member and nobody owned its resources. An answer
    proves the coordinator is back: the join goes at once."""
    m = make(retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    join_as_follower(m, 0, 0, 1)
    hb = expect_call(m, 0, "heartbeat")
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    now = 10
    for _ in range(4):  # failures in a row: the backoff grows to its cap
        expect_call(m, now, "join")
        m.call_failed(now, CoordinatorUnavailableError("connection refused"))
        wait = m.next_action(now)
        assert isinstance(wait, Wait) and wait.until_ms is not None
        retry_at = wait.until_ms
        if _ < 3:
            now = retry_at
    bg = m.background_heartbeat(now)
    if isinstance(bg, Wait) and bg.until_ms is not None:
        now = bg.until_ms
        bg = m.background_heartbeat(now)
    assert isinstance(bg, Call) and bg.api == "heartbeat", (bg, hb)
    assert retry_at > now + 100  # the backoff is not over
    m.background_received(now + 5, HeartbeatResponse(None))
    expect_call(m, now + 5, "join")


def test_a_protocol_answer_restarts_the_backoff_from_its_base() -> None:
    """Simulator seed 1424: after a run of connection failures a join was
    answered UNKNOWN_MEMBER_ID, and the rejoin still waited the capped
    backoff (1 s, several session timeouts) although the coordinator had just
    answered; the group converged, then rebalanced again for it long after
    the faults. The backoff grows only while the coordinator is unreachable
    or unavailable; an answer restarts it from ``retry_backoff_ms``."""
    m = make(retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    now = fail_joins(m, 0, 5, "connection reset")
    expect_call(m, now, "join")
    m.receive(now, JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id="m1"))
    wait = m.next_action(now)
    assert isinstance(wait, Wait) and wait.until_ms is not None
    assert wait.until_ms - now <= 120  # retry_backoff_ms with its jitter


def test_a_first_joins_member_id_answer_restarts_the_backoff() -> None:
    """Simulator seed 85751: a member's calls failed while its coordinator
    was down (the backoff grew to its cap); it came back, was answered
    MEMBER_ID_REQUIRED, and its join was then lost to a partition. Without a
    generation it has no side channel, so it learned of the loss only when
    the partition healed, and the retry waited the capped backoff (1 s, more
    than three sessions there) although the coordinator had answered since:
    the group converged without it, then rebalanced again for it, past the
    bound. MEMBER_ID_REQUIRED is an answer like any other."""
    m = make(retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    now = fail_joins(m, 0, 6)
    expect_call(m, now, "join")
    m.receive(now + 5, JoinResponse(ErrorCode.MEMBER_ID_REQUIRED, member_id="m1"))
    now += 5
    expect_call(m, now, "join")
    now += 500  # the partition heals
    m.call_failed(now, CoordinatorUnavailableError("connection reset"))
    # retry_backoff_ms with its jitter from the join's start: already over.
    assert join_due(m, now) == now


def test_a_call_that_timed_out_has_waited_out_its_backoff() -> None:
    """Simulator seed 415932: a member without a generation (no side channel)
    had its join lost on a hung connection after a run of failures; it knew
    only at the join's timeout (rebalance timeout + 5 s), then still waited
    the backoff (about 1 s, its cap, more than two sessions there) and joined
    past the convergence bound. The backoff spaces attempts, counted from the
    failed call's start: a call that failed at once still backs off."""
    m = make(retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    now = fail_joins(m, 0, 6)
    join = expect_call(m, now, "join")
    assert join.timeout_ms is not None and join.timeout_ms > 1_000
    now += join.timeout_ms
    m.call_failed(now, CoordinatorUnavailableError("join: no answer within the call's timeout"))
    expect_call(m, now, "join")  # at once
    m.call_failed(now + 3, CoordinatorUnavailableError("connection refused"))
    wait = m.next_action(now + 3)
    assert isinstance(wait, Wait) and wait.until_ms is not None
    assert wait.until_ms - now >= 800  # the capped backoff, from the failed call's start


def test_a_side_channel_answer_restarts_the_backoff() -> None:
    """The same on the side channel: a rejoining member whose joins failed
    is answered UNKNOWN_MEMBER_ID by its background heartbeat (it was
    removed meanwhile) and joins anew at once; a failure of that join backs
    off from ``retry_backoff_ms``, not from the exponent the outage left."""
    m = make(session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
             retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    join_as_follower(m, 0, 0, 1)
    expect_call(m, 0, "heartbeat")
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    now = fail_joins(m, 10, 6)
    join = expect_call(m, now, "join")
    bg = m.background_heartbeat(now)
    if isinstance(bg, Wait) and bg.until_ms is not None:
        now = bg.until_ms
        bg = m.background_heartbeat(now)
    assert isinstance(bg, Call) and bg.api == "heartbeat", (bg, join)
    m.background_received(now + 5, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    now += 5
    m.call_failed(now, CoordinatorUnavailableError("connection reset"))  # the abandoned join
    expect_callback(m, now, CallbackKind.LOST, {("s", 0), ("s", 1)})
    expect_call(m, now, "join")  # a new member's join, at once
    m.call_failed(now + 500, CoordinatorUnavailableError("connection reset"))
    now += 500
    # retry_backoff_ms with its jitter from the join's start: already over.
    assert join_due(m, now) == now


def test_failed_heartbeats_are_retried_at_least_once_an_interval() -> None:
    """Simulator seeds 113568 and 126479: a stable member owning nothing (so
    no on_lost moves it to JOINING when its lease runs out) heartbeated into
    a coordinator that was down; the failures grew its backoff to the cap
    (1 s, three sessions there), so it came back a second after the
    coordinator did and cost the group a rebalance after it had converged.
    A failed heartbeat is retried no later than a healthy one would be sent."""
    m = make(session_timeout_ms=300, rebalance_timeout_ms=300, heartbeat_interval_ms=60,
             retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    join_as_follower(m, 0)  # owns nothing
    assert m.owned == frozenset()
    now, sends = 0, []
    while now < 3_000:
        action = m.next_action(now)
        if isinstance(action, Wait):
            assert action.until_ms is not None
            now = max(now + 1, action.until_ms)
            continue
        assert isinstance(action, Call) and action.api == "heartbeat", action
        sends.append(now)
        now += 2
        m.call_failed(now, CoordinatorUnavailableError("heartbeat: connection refused"))
    assert m.state is MemberState.STABLE  # nothing to lose: it goes on heartbeating
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert len(sends) > 30 and max(gaps) <= 60 + 2, gaps
    # The coordinator is back: the next heartbeat's answer tells the member where it stands.
    expect_call(m, now + 60, "heartbeat")
    m.receive(now + 62, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    expect_call(m, now + 62, "join")


def test_transport_fatal_error_stops_the_member() -> None:
    from client.errors import InvalidRequestError
    m = make()
    expect_call(m, 0, "join")
    m.call_failed(1, InvalidRequestError("join: HTTP 400: protocols: missing field"))
    stop = m.next_action(1)
    assert isinstance(stop, Stop) and isinstance(stop.error, InvalidRequestError)


# ---------------------------------------------------------------- the safety rule


def test_no_heartbeat_for_a_session_timeout_loses_everything_first() -> None:
    m = make()
    join_as_follower(m, 0, 0, 1, 2)
    hb = expect_call(m, 100, "heartbeat")  # sent at 100
    m.receive(350, HeartbeatResponse(None))  # received much later: the anchor is the send time
    assert m.safety_deadline_ms() == 100 + SESSION
    now = 400
    while True:
        action = m.next_action(now)
        if isinstance(action, InvokeListener):
            break
        if isinstance(action, Call):
            assert action.timeout_ms <= 100 + SESSION - now  # never waits past the deadline
            m.call_failed(now + action.timeout_ms if action.timeout_ms < 50 else now + 50,
                          CoordinatorUnavailableError("partitioned"))
            now += 50
        else:
            assert isinstance(action, Wait) and action.until_ms is not None
            assert action.until_ms <= 100 + SESSION
            now = action.until_ms
    assert action.kind is CallbackKind.LOST
    assert set(action.resources) == res(0, 1, 2)
    assert now >= 100 + SESSION
    assert now < 100 + SESSION + 150  # promptly
    assert m.owned == frozenset()  # gone before the callback even runs
    m.listener_done(now)
    assert hb.api == "heartbeat"
    # then it tries to get back in, owning nothing
    while not isinstance(action := m.next_action(now), Call) or action.api != "join":
        if isinstance(action, Call):
            m.call_failed(now, CoordinatorUnavailableError("partitioned"))
        elif isinstance(action, Wait) and action.until_ms is not None:
            now = action.until_ms
    assert metadata_of(action).owned == {}


def test_a_paused_member_loses_everything_before_sending_anything() -> None:
    m = make()
    join_as_follower(m, 0, 5)
    expect_call(m, 0, "heartbeat")
    m.receive(1, HeartbeatResponse(None))
    # The process was paused (GC, SIGSTOP) for longer than the session timeout.
    expect_callback(m, 5_000, CallbackKind.LOST, res(5))


def test_the_rule_holds_while_a_join_is_in_flight() -> None:
    m = make()
    join_as_follower(m, 0, 0, 1)
    expect_call(m, 0, "heartbeat")
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 500, "join")
    # no longer suspended (the join may never have reached the coordinator):
    # the REBALANCE_IN_PROGRESS answer sent at 0 proved contact
    assert m.safety_deadline_ms() == 0 + SESSION
    assert m.wants_interrupt(SESSION)  # the driver abandons the join for on_lost
    m.receive(900, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    assert m.safety_deadline_ms() == 500 + SESSION  # anchored at the join's send time
    assert m.state is MemberState.SYNCING
    expect_call(m, 1_400, "sync")
    m.receive(1_410, SyncResponse(None, assignment=assignment(0, 1)))
    expect_callback(m, 1_410, CallbackKind.ASSIGNED, set())
    assert m.owned == frozenset(res(0, 1))
    assert m.safety_deadline_ms() == 1_400 + SESSION  # the sync's send time


# ------------------------------------------------ a call the coordinator is done with


def _side_channel(m: MemberStateMachine, now: int) -> tuple[int, Call]:
    """The next background heartbeat: (its send time, the call)."""
    bg = m.background_heartbeat(now)
    if isinstance(bg, Wait):
        assert bg.until_ms is not None
        now = max(now, bg.until_ms)
        bg = m.background_heartbeat(now)
    assert isinstance(bg, Call) and bg.api == "heartbeat", bg
    return now, bg


def _answers_until_resent(m: MemberStateMachine, start: int, answer: HeartbeatResponse,
                          limit: int = 10) -> int:
    """Answer side-channel heartbeats with ``answer`` (10 ms round trips) until the
    machine wants the call in flight abandoned; returns when (or fails)."""
    now = start
    for _ in range(limit):
        now, _bg = _side_channel(m, now)
        now += 10
        m.background_received(now, answer)
        if m.wants_interrupt(now):
            return now
    raise AssertionError(f"the call in flight was never abandoned ({limit} answers)")


def test_a_join_lost_while_heartbeats_show_no_rebalance_is_sent_again() -> None:
    """Simulator seed 374 (a call lost on a hung connection): an eager
    member's join is lost on a connection that hangs; its side-channel
    heartbeats are answered without error (the coordinator never saw the
    join, so no rebalance began), so the coordinator keeps it as a member
    holding its assignment while it owns nothing, for the call's timeout
    (rebalance + max(5000, session) = 10 s here). Two such answers a reply
    allowance apart show the join will not be answered: it is sent again."""
    m = _stable_owner(("range",))
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_callback(m, 10, CallbackKind.REVOKED, res(0, 1))
    join = expect_call(m, 10, "join")
    assert join.timeout_ms == 5_000 + 5_000
    reply_ms = m.config.timing.reply_ms
    # One answer is not enough: the join's own answer may still be on its way.
    now, _bg = _side_channel(m, 10)
    m.background_received(now + 10, HeartbeatResponse(None))
    assert not m.wants_interrupt(now + 10)
    resent_at = _answers_until_resent(m, now + 10, HeartbeatResponse(None))
    assert resent_at >= now + 10 + reply_ms
    assert resent_at < 10 + 1_000  # well before the call's 10 s timeout
    m.call_abandoned(resent_at)
    again = expect_call(m, resent_at, "join")
    # The same join (same member, claims, generation) under the next sequence.
    assert again.request == replace(join.request, sequence=join.request.sequence + 1)
    assert "sent again" in (m.last_error or "")
    # The second join is watched afresh: one answer does not abandon it.
    now, _bg = _side_channel(m, resent_at)
    m.background_received(now + 10, HeartbeatResponse(None))
    assert not m.wants_interrupt(now + 10)


def test_a_join_whose_answer_is_lost_after_the_generation_formed_is_sent_again() -> None:
    """The join reached the coordinator and the join phase completed with
    the member (its heartbeats of the old generation are answered
    ILLEGAL_GENERATION, which it ignores while its join is in flight), but
    the join's answer is lost: sent again, the coordinator answers it at once
    with the current generation (membership.py, CompletingRebalance)."""
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    join = expect_call(m, 10, "join")
    resent_at = _answers_until_resent(m, 10, HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION))
    assert m.state is MemberState.JOINING and m.owned == frozenset(res(0, 1))
    m.call_abandoned(resent_at)
    again = expect_call(m, resent_at, "join").request
    assert again == replace(join.request, sequence=join.request.sequence + 1)


def test_a_sync_whose_answer_is_lost_is_sent_again() -> None:
    """Simulator seed 1774: a follower's sync was answered (the group went
    Stable) but the answer was lost; its side-channel heartbeats of the new
    generation were answered without error. Sent again, the coordinator
    answers with the stored assignment."""
    m = make()
    expect_call(m, 0, "join")
    m.receive(5, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    sync = expect_call(m, 5, "sync")
    resent_at = _answers_until_resent(m, 5, HeartbeatResponse(None))
    m.call_abandoned(resent_at)
    assert expect_call(m, resent_at, "sync").request == sync.request
    m.receive(resent_at + 10, SyncResponse(None, "resources", "cooperative-sticky",
                                           assignment(0, 1)))
    expect_callback(m, resent_at + 10, CallbackKind.ASSIGNED, res(0, 1))
    assert m.state is MemberState.STABLE


def test_a_sync_overtaken_by_a_rebalance_is_sent_again() -> None:
    """REBALANCE_IN_PROGRESS while a sync is in flight: a parked sync was
    answered so when the rebalance began, a later one is answered so at once;
    if that answer is lost the sync is sent again (and answered so)."""
    m = make()
    expect_call(m, 0, "join")
    m.receive(5, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 5, "sync")
    resent_at = _answers_until_resent(m, 5, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    m.call_abandoned(resent_at)
    expect_call(m, resent_at, "sync")
    m.receive(resent_at + 10, SyncResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, resent_at + 10, "join")


def test_a_join_the_coordinator_holds_is_never_sent_again() -> None:
    """REBALANCE_IN_PROGRESS while a join is in flight says nothing about the
    join (it may be parked for the whole rebalance timeout); an answer to a
    heartbeat sent before the join says nothing either; and an answer that
    no longer shows the coordinator done with the join starts the count
    again (the slow join arrived and began a rebalance)."""
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    before, _bg = _side_channel(m, 10)  # sent before the join
    expect_call(m, before + 1, "join")
    m.background_received(before + 50, HeartbeatResponse(None))
    now = before + 50
    for _ in range(5):
        now, _bg = _side_channel(m, now)
        now += 10
        m.background_received(now, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        assert not m.wants_interrupt(now)
    reply_ms = m.config.timing.reply_ms
    for answer in (None, ErrorCode.REBALANCE_IN_PROGRESS, None):
        now, _bg = _side_channel(m, now + reply_ms)
        now += 10
        m.background_received(now, HeartbeatResponse(answer))
        assert not m.wants_interrupt(now)
    assert now < m.config.rebalance_timeout_ms  # all inside the safety bound


def test_a_join_answer_read_after_the_session_timeout_loses_first() -> None:
    m = make()
    join_as_follower(m, 0, 0, 1)
    expect_call(m, 0, "heartbeat")
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 10, "join")
    # paused with the answer in the socket: the coordinator may have expired
    # us since it completed the join phase
    m.receive(3_000, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_callback(m, 3_000, CallbackKind.LOST, res(0, 1))


# ---------------------------------------------------------------- cooperative flows


def test_cooperative_revokes_exactly_what_moves_then_assigns_then_rejoins_at_once() -> None:
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 10, "join")
    m.receive(11, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, 11, "sync")
    m.receive(12, SyncResponse(None, assignment=assignment(0, 3)))
    # KIP-429 3.3/3.4: on_revoked(only what moves), then on_assigned(only what is new)
    action = m.next_action(12)
    assert isinstance(action, InvokeListener) and action.kind is CallbackKind.REVOKED
    assert set(action.resources) == res(1)
    assert ("s", 1) in m.owned  # still owned while on_revoked runs: it may commit
    m.build_commit({("s", 1): b"x"})
    m.listener_done(13)
    assert ("s", 1) not in m.owned
    expect_callback(m, 13, CallbackKind.ASSIGNED, res(3))
    join = expect_call(m, 14, "join")  # the follow-up rebalance, at once
    assert metadata_of(join).owned == {"s": [0, 3]}
    assert metadata_of(join).generation == 2


def test_on_assigned_is_called_on_every_completed_rebalance_even_if_empty() -> None:
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 10, "join")
    m.receive(11, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, 11, "sync")
    m.receive(12, SyncResponse(None, assignment=assignment(0, 1)))
    expect_callback(m, 30, CallbackKind.ASSIGNED, set())
    completed = [e for e in m.drain_events() if isinstance(e, RebalanceCompleted)]
    assert completed[-1].latency_ms == 30 - 10  # includes the callback time
    expect_call(m, 30, "heartbeat")


def test_eager_gets_full_sets_in_kip429_order() -> None:
    m = _stable_owner(("range",))
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_callback(m, 10, CallbackKind.REVOKED, res(0, 1))
    expect_call(m, 10, "join")
    m.receive(11, JoinResponse(None, 2, "resources", "range", "x", "m1"))
    expect_call(m, 11, "sync")
    m.receive(12, SyncResponse(None, assignment=assignment(1, 2)))
    expect_callback(m, 12, CallbackKind.ASSIGNED, res(1, 2))  # everything, overlap included
    expect_call(m, 12, "heartbeat")  # no follow-up rebalance in eager


def test_delay_ms_makes_the_member_rejoin_after_the_delay() -> None:
    m = make(("incremental-cooperative",))
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "incremental-cooperative", "x", "m1"))
    expect_call(m, 0, "sync")
    m.receive(0, SyncResponse(None, assignment=assignment(0, delay_ms=500)))
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0))
    hb = expect_call(m, 0, "heartbeat")
    assert isinstance(hb.request, HeartbeatRequest)
    assert hb.request.wait_ms == HB
    m.receive(300, HeartbeatResponse(None))
    hb = expect_call(m, 300, "heartbeat")
    assert isinstance(hb.request, HeartbeatRequest)
    assert hb.request.wait_ms == 200  # no longer than the delay
    m.receive(500, HeartbeatResponse(None))
    join = expect_call(m, 500, "join")
    assert metadata_of(join).owned == {"s": [0]}


def test_leader_rejoins_when_the_catalog_epoch_moves_followers_do_not() -> None:
    leader = make()
    expect_call(leader, 0, "join")
    members = (JoinMember("m1", None, MemberMetadata(sets=("s",)).encode()),)
    leader.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "m1", "m1",
                                   members))
    expect_call(leader, 0, "resources")
    leader.receive(0, CatalogResponse(3, {"s": 2}))
    sync = expect_call(leader, 0, "sync")
    assert isinstance(sync.request, SyncRequest)
    # Each assignment carries the catalog epoch it was computed from.
    assert ResourceAssignment.decode(sync.request.assignments[0].assignment).resources_epoch == 3
    leader.receive(0, SyncResponse(None, assignment=sync.request.assignments[0].assignment,
                                   resources_epoch=3))
    expect_callback(leader, 0, CallbackKind.ASSIGNED, res(0, 1))
    expect_call(leader, 0, "heartbeat")
    leader.receive(100, HeartbeatResponse(None, resources_epoch=3))
    expect_call(leader, 300, "heartbeat")
    leader.receive(310, HeartbeatResponse(None, resources_epoch=4))
    expect_call(leader, 310, "join")

    follower = _stable_owner()
    follower.receive(10, HeartbeatResponse(None, resources_epoch=99))
    expect_call(follower, 300, "heartbeat")


def test_leader_rejoins_when_the_catalog_changed_during_the_rebalance() -> None:
    m = make()
    expect_call(m, 0, "join")
    members = (JoinMember("m1", None, MemberMetadata(sets=("s",)).encode()),)
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "m1", "m1", members))
    expect_call(m, 0, "resources")
    m.receive(0, CatalogResponse(3, {"s": 2}))
    sync = expect_call(m, 0, "sync")
    assert isinstance(sync.request, SyncRequest)
    m.receive(0, SyncResponse(None, assignment=sync.request.assignments[0].assignment,
                              resources_epoch=5))
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0, 1))
    expect_call(m, 0, "join")


# ---------------------------------------------------------------- subscription, commit, close


def test_subscribe_cooperative_revokes_only_unsubscribed_sets_then_rejoins() -> None:
    m = make(sets=["s", "t"])
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, 0, "sync")
    both = ResourceAssignment(assigned={"s": [0], "t": [1]}).encode()
    m.receive(0, SyncResponse(None, assignment=both))
    expect_callback(m, 0, CallbackKind.ASSIGNED, {("s", 0), ("t", 1)})
    expect_call(m, 0, "heartbeat")
    assert m.subscribe(5, ["s"])
    assert m.wants_interrupt(5)
    m.call_abandoned(5)
    expect_callback(m, 5, CallbackKind.REVOKED, {("t", 1)})
    join = expect_call(m, 5, "join")
    meta = metadata_of(join)
    assert meta.sets == ("s",)
    assert meta.owned == {"s": [0]}
    assert not m.subscribe(6, ["s"])  # unchanged: nothing to do


def test_subscribe_eager_revokes_everything() -> None:
    m = _stable_owner(("range",))
    m.subscribe(5, ["other"])
    m.call_abandoned(5)
    expect_callback(m, 5, CallbackKind.REVOKED, res(0, 1))
    assert metadata_of(expect_call(m, 5, "join")).sets == ("other",)


def test_commit_only_for_owned_resources_with_the_current_generation() -> None:
    m = _stable_owner()
    request = m.build_commit({("s", 0): 42})
    assert request.generation_id == 1 and request.member_id == "m1"
    assert request.checkpoints == (("s", 0, 42),)
    with pytest.raises(NotOwnedError, match=r"s\[7\]"):
        m.build_commit({("s", 0): 1, ("s", 7): 1})


def test_commit_refused_with_illegal_generation_loses_everything() -> None:
    m = _stable_owner()
    request = m.build_commit({("s", 0): 1})
    error = m.commit_result(10, request, ErrorCode.ILLEGAL_GENERATION)
    # STABLE, the generation unchanged: the group moved on without the member
    # (not a rebalance of its own, unlike the test below)
    assert type(error) is CommitFailedError and error.code is ErrorCode.ILLEGAL_GENERATION
    assert m.wants_interrupt(10)
    m.call_abandoned(10)
    expect_callback(m, 10, CallbackKind.LOST, res(0, 1))
    expect_call(m, 10, "join")


@pytest.mark.parametrize("code", [ErrorCode.INVALID_REQUEST,
                                  ErrorCode.CHECKPOINT_LIMIT_REACHED])
def test_a_commit_refused_for_what_it_carries_fails_alone(code: ErrorCode) -> None:
    # E.g. the catalog shrank: a resource the member still owns until the next
    # rebalance is refused (400). The commit fails; the member is not stopped.
    m = _stable_owner()
    request = m.build_commit({("s", 1): 1})
    error = m.commit_result(10, request, code)
    assert isinstance(error, CommitFailedError) and error.code is code
    assert m.state is MemberState.STABLE and m.failure is None
    assert m.owned == frozenset(res(0, 1)) and not m.wants_interrupt(10)


def test_commit_during_rebalance_asks_to_rejoin() -> None:
    m = _stable_owner()
    request = m.build_commit({("s", 0): 1})
    error = m.commit_result(10, request, ErrorCode.REBALANCE_IN_PROGRESS)
    assert isinstance(error, RebalanceInProgressError)
    m.call_abandoned(10)
    expect_call(m, 10, "join")
    assert m.owned == frozenset(res(0, 1))


def test_a_stale_commit_answer_changes_nothing() -> None:
    m = _stable_owner()
    request = m.build_commit({("s", 0): 1})
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 10, "join")
    m.receive(11, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    # the commit of generation 1 comes back refused after we moved to generation 2
    m.commit_result(12, request, ErrorCode.ILLEGAL_GENERATION)
    expect_call(m, 12, "sync")
    assert m.owned == frozenset(res(0, 1))


def test_a_commit_sent_after_the_members_own_join_is_refused_as_a_rebalance() -> None:
    """Simulator seed 121489 (no fault): a cooperative member revoked for a
    hand-over, sent its follow-up join, then committed what it keeps at its
    old generation; the join phase completed first, so the commit was
    refused ILLEGAL_GENERATION. The refusal is about the generation it is
    leaving: the membership, what it owns and the join in flight stay as
    they are, and the caller is told to commit again after the rebalance
    (Kafka's RebalanceInProgressException), not that its resources are gone."""
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    join = expect_call(m, 10, "join")
    assert metadata_of(join).owned == {"s": [0, 1]}
    request = m.build_commit({("s", 0): 7})  # while the join is in flight
    assert request.generation_id == 1
    error = m.commit_result(15, request, ErrorCode.ILLEGAL_GENERATION)
    assert isinstance(error, RebalanceInProgressError), error
    assert error.code is ErrorCode.ILLEGAL_GENERATION
    assert "generation 1" in str(error) and "commit again" in str(error)
    # nothing lost, the join not abandoned: its answer is the next generation
    assert not m.wants_interrupt(15)
    assert m.state is MemberState.JOINING and m.owned == frozenset(res(0, 1))
    m.receive(20, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, 20, "sync")
    m.receive(25, SyncResponse(None, assignment=assignment(0, 1)))
    expect_callback(m, 25, CallbackKind.ASSIGNED, set())  # KIP-429: called even when empty
    expect_call(m, 25, "heartbeat")
    assert m.owned == frozenset(res(0, 1)) and m.generation_id == 2
    assert m.build_commit({("s", 0): 8}).generation_id == 2  # the retry goes at the new one


def test_a_commit_sent_while_syncing_refused_as_rebalancing_is_about_that_rebalance() -> None:
    """Simulator seed 5007018 (no fault): a member committed between its
    join's answer and its sync's, the commit arrived while the join phase was
    complete and was refused REBALANCE_IN_PROGRESS, and the answer came after
    the sync's, the member stable in that generation. The rebalance it reports
    is the one the member completed: it is told to commit again and does not
    rejoin (the rejoin was a rebalance of a settled group, without a fault)."""
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, 10, "join")
    m.receive(11, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, 11, "sync")
    request = m.build_commit({("s", 0): 7})  # while the sync is in flight
    assert request.generation_id == 2
    m.receive(12, SyncResponse(None, assignment=assignment(0, 1)))
    expect_callback(m, 12, CallbackKind.ASSIGNED, set())
    expect_call(m, 12, "heartbeat")
    error = m.commit_result(13, request, ErrorCode.REBALANCE_IN_PROGRESS)
    assert isinstance(error, RebalanceInProgressError)
    m.call_abandoned(13)
    expect_call(m, 13, "heartbeat")  # not a join
    assert m.state is MemberState.STABLE and m.generation_id == 2
    # a commit sent once stable and refused so does ask for a rejoin
    again = m.build_commit({("s", 0): 7})
    m.commit_result(14, again, ErrorCode.REBALANCE_IN_PROGRESS)
    m.call_abandoned(14)
    expect_call(m, 14, "join")


def test_close_dynamic_revokes_then_leaves() -> None:
    m = _stable_owner()
    m.close()
    assert m.wants_interrupt(10)
    m.call_abandoned(10)
    expect_callback(m, 10, CallbackKind.REVOKED, res(0, 1))
    leave = expect_call(m, 11, "leave")
    assert isinstance(leave.request, LeaveRequest)
    assert leave.request.members[0].member_id == "m1"
    m.receive(12, LeaveResponse(None))
    assert m.next_action(12) == Stop(None)
    with pytest.raises(MemberClosedError):
        m.build_commit({})


def test_on_revoked_during_close_may_still_commit() -> None:
    m = _stable_owner()
    m.close()
    m.call_abandoned(10)
    action = m.next_action(10)
    assert isinstance(action, InvokeListener) and action.kind is CallbackKind.REVOKED
    request = m.build_commit({("s", 0): b"final"})  # the final commit of a clean shutdown
    assert request.generation_id == 1
    m.listener_done(11)
    with pytest.raises(NotOwnedError):
        m.build_commit({("s", 0): b"too late"})


def test_close_static_revokes_and_stays_in_the_group() -> None:
    m = make(group_instance_id="worker-3")
    join_as_follower(m, 0, 4)
    expect_call(m, 0, "heartbeat")
    m.close()
    m.call_abandoned(1)
    expect_callback(m, 1, CallbackKind.REVOKED, res(4))
    assert m.next_action(1) == Stop(None)  # no leave: a restart gets the resources back


def test_close_when_the_leave_fails_still_stops() -> None:
    m = _stable_owner()
    m.close()
    m.call_abandoned(1)
    expect_callback(m, 1, CallbackKind.REVOKED, res(0, 1))
    expect_call(m, 1, "leave")
    assert not m.wants_interrupt(1)  # the leave itself is not interrupted
    m.call_failed(2, CoordinatorUnavailableError("gone"))
    assert m.next_action(2) == Stop(None)


def test_driver_contract_violations_raise() -> None:
    m = make()
    expect_call(m, 0, "join")
    with pytest.raises(RuntimeError):
        m.next_action(0)
    with pytest.raises(RuntimeError):
        m.listener_done(0)
    with pytest.raises(RuntimeError):
        m.receive(0, HeartbeatResponse(None))


@pytest.mark.parametrize("bad", [
    dict(heartbeat_interval_ms=1_000),  # not below the session timeout
    dict(assignors=()),
    dict(assignors=("range", "range")),
    dict(group_id=""),
    dict(sets="s"),
    dict(group_instance_id=""),
])
def test_bad_configuration_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        make(**bad)  # type: ignore[arg-type]


def test_unknown_assignor_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no-such"):
        make(("no-such",))


def test_table_actions_are_the_documented_ones() -> None:
    assert ERROR_ACTIONS[ErrorCode.REBALANCE_IN_PROGRESS] is ErrorAction.REJOIN
    assert ERROR_ACTIONS[ErrorCode.ILLEGAL_GENERATION] is ErrorAction.RESET_GENERATION
    assert ERROR_ACTIONS[ErrorCode.UNKNOWN_MEMBER_ID] is ErrorAction.RESET_MEMBER
    assert ERROR_ACTIONS[ErrorCode.MEMBER_ID_REQUIRED] is ErrorAction.SET_MEMBER_ID
    for code in (ErrorCode.FENCED_INSTANCE_ID, ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                 ErrorCode.GROUP_MAX_SIZE_REACHED):
        assert ERROR_ACTIONS[code] is ErrorAction.FATAL
    for code in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE):
        assert ERROR_ACTIONS[code] is ErrorAction.RETRY


# ---------------------------------------------------------------- a sync answer read too late


def _late_sync(m: MemberStateMachine, sent: int, late: int, *indexes: int) -> None:
    m.receive(sent, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    expect_call(m, sent, "join")
    m.receive(sent, JoinResponse(None, 2, "resources", "cooperative-sticky", "x", "m1"))
    expect_call(m, sent, "sync")
    m.receive(late, SyncResponse(None, assignment=assignment(*indexes)))


def test_a_sync_answer_read_after_the_session_timeout_is_verified_before_delivery() -> None:
    m = _stable_owner()
    _late_sync(m, 10, 10 + SESSION + 4_000, 0, 1, 2)  # paused with the answer in the socket
    now = 10 + SESSION + 4_000
    # what it owned may be someone else's by now: lost first, nothing assigned
    expect_callback(m, now, CallbackKind.LOST, res(0, 1))
    check = expect_call(m, now, "heartbeat")
    assert isinstance(check.request, HeartbeatRequest)
    assert check.request.generation_id == 2 and check.request.wait_ms == 0
    m.receive(now + 5, HeartbeatResponse(None))  # still a member of generation 2
    expect_callback(m, now + 5, CallbackKind.ASSIGNED, res(0, 1, 2))
    assert m.state is MemberState.STABLE


def test_a_stale_sync_answer_of_an_expired_member_is_never_delivered() -> None:
    m = make()
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    m.receive(5_000, SyncResponse(None, assignment=assignment(0, 1)))
    expect_call(m, 5_000, "heartbeat")
    m.receive(5_001, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    join = expect_call(m, 5_001, "join")  # rejoin at once, as a new member
    assert isinstance(join.request, JoinRequest)
    assert join.request.member_id == ""
    assert m.owned == frozenset()
    assert not any(isinstance(e, RebalanceCompleted) for e in m.drain_events())


def test_every_join_sent_carries_a_higher_sequence() -> None:
    """Simulator seed 61599 (the join sequence): a join the
    member gave up on (its connection reset) reached the coordinator after
    the member had joined again and synced; counted as the member's rejoin, it
    let the next generation give away what the member still owned. Each join
    carries a sequence above every earlier one of the member's life (a join
    sent again included), for the coordinator to refuse the older."""
    m = _stable_owner()
    m.receive(10, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    first = expect_call(m, 10, "join").request
    resent_at = _answers_until_resent(m, 10, HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION))
    m.call_abandoned(resent_at)
    second = expect_call(m, resent_at, "join").request
    assert isinstance(first, JoinRequest) and isinstance(second, JoinRequest)
    assert first.sequence is not None and second.sequence is not None
    assert second.sequence > first.sequence


def test_the_heartbeat_verifying_a_late_sync_answer_is_awaited_the_reply_allowance() -> None:
    # Simulator seed 217816: the verifying heartbeat was lost on a hung
    # connection and awaited request_timeout_ms (30 s) while the coordinator
    # expired the member and the group converged without it; its rejoin 30 s
    # later cost the converged group a rebalance.
    m = make(request_timeout_ms=30_000)
    expect_call(m, 0, "join")
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    expect_call(m, 0, "sync")
    now = 5_000
    m.receive(now, SyncResponse(None, assignment=assignment(0, 1)))  # read too late
    check = expect_call(m, now, "heartbeat")
    reply = (SESSION - 2 * HB) // 2  # the timing rule's reply allowance
    assert check.timeout_ms == reply
    now += check.timeout_ms
    m.call_failed(now, CoordinatorUnavailableError("heartbeat: no answer within its timeout"))
    action = m.next_action(now)
    if isinstance(action, Wait):  # the retry backoff
        assert action.until_ms is not None and action.until_ms - now <= HB
        now = action.until_ms
        action = m.next_action(now)
    assert isinstance(action, Call) and action.api == "heartbeat"
    assert isinstance(action.request, HeartbeatRequest) and action.request.generation_id == 1
    m.receive(now + 5, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    join = expect_call(m, now + 5, "join")  # back in the group a second after the answer
    assert isinstance(join.request, JoinRequest) and join.request.member_id == ""
