"""Standbys and drain in the member state machine, without a network (sans-IO;
docs/protocol.md, "Drain" and "Warm-up on the member"): what each callback
gets, what the joins report, that a standby is never owned or committable,
and when a draining member leaves."""

from __future__ import annotations

import pytest
from test_member_state import expect_call, expect_callback, make, metadata_of, res

from client.assignors import get_assignor
from client.errors import NotOwnedError
from client.leader import perform_assignment
from client.member_state import CallbackKind, MemberState, MemberStateMachine, Stop
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatResponse,
    JoinMember,
    JoinResponse,
    LeaveResponse,
    SyncResponse,
)
from protocol.resources import MemberMetadata, ResourceAssignment


def sync(m: MemberStateMachine, now: int, generation: int, owned: list[int],
         standby: list[int] | None = None, delay_ms: int = 0) -> None:
    """Join (as follower) and receive an assignment of ``owned``, ``standby``."""
    expect_call(m, now, "join")
    m.receive(now, JoinResponse(None, generation, "resources", "balanced", "leader", "m1"))
    expect_call(m, now, "sync")
    m.receive(now, SyncResponse(None, "resources", "balanced", ResourceAssignment(
        assigned={"s": owned} if owned else {}, standby={"s": standby} if standby else {},
        delay_ms=delay_ms).encode()))


def test_a_standby_is_warmed_beside_the_steps_reported_warm_then_owned() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [0, 1], standby=[5, 6])
    # The warm-up starts beside the steps (it holds up none), once.
    run, warmups = m.start_warmups()
    assert warmups == frozenset(res(5, 6))
    assert m.start_warmups()[1] == frozenset()
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0, 1))
    # Warming: not owned, not committable, not in the next join's claims.
    assert m.owned == frozenset(res(0, 1)) and m.standby == frozenset(res(5, 6))
    with pytest.raises(NotOwnedError):
        m.build_commit({("s", 5): 1})
    assert expect_call(m, 0, "heartbeat")  # stable meanwhile
    assert not m.rejoin_requested
    m.call_abandoned(10)
    m.warmup_done(10, run, frozenset(res(5, 6)))
    # Warm: reported at a cooperative rejoin, at once.
    assert m.rejoin_requested
    join = expect_call(m, 10, "join")
    meta = metadata_of(join)
    assert meta.warm == {"s": [5, 6]} and meta.owned == {"s": [0, 1]}
    # The assignor moves 5 (now owned: in on_assigned, never "dropped") and
    # drops 6 (on_standby_dropped).
    m.receive(10, JoinResponse(None, 2, "resources", "balanced", "leader", "m1"))
    expect_call(m, 10, "sync")
    m.receive(10, SyncResponse(None, "resources", "balanced", ResourceAssignment(
        assigned={"s": [0, 1, 5]}).encode()))
    expect_callback(m, 10, CallbackKind.ASSIGNED, res(5))
    expect_callback(m, 10, CallbackKind.STANDBY_DROPPED, res(6))
    assert m.standby == frozenset() and m.owned == frozenset(res(0, 1, 5))
    assert expect_call(m, 10, "heartbeat")


def test_a_resource_owned_is_never_a_standby_too() -> None:
    """An assignment naming an owned resource as standby (a broken assignor, or
    one revoked in the same round) leaves it owned, never standby."""
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [0, 1])
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0, 1))
    m.request_rejoin(1, "test")
    sync(m, 1, 2, [0], standby=[1, 2])
    expect_callback(m, 1, CallbackKind.REVOKED, res(1))
    expect_callback(m, 1, CallbackKind.ASSIGNED, set())
    assert m.standby == frozenset(res(2)) and m.start_warmups()[1] == frozenset(res(2))


def test_a_dropped_standby_is_no_longer_reported_warm() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [], standby=[3])
    expect_callback(m, 0, CallbackKind.ASSIGNED, set())
    run, warmups = m.start_warmups()
    assert warmups == frozenset(res(3))
    m.warmup_done(0, run, warmups)
    sync(m, 1, 2, [], standby=[])  # the warm rejoin
    expect_callback(m, 1, CallbackKind.ASSIGNED, set())
    expect_callback(m, 1, CallbackKind.STANDBY_DROPPED, res(3))
    expect_call(m, 1, "heartbeat")
    m.request_rejoin(2, "test")
    m.call_abandoned(2)
    assert metadata_of(expect_call(m, 2, "join")).warm == {}


def test_the_end_of_a_warm_up_for_an_earlier_offer_does_not_make_a_standby_warm() -> None:
    """A standby dropped while its warm-up runs, and offered again later, is
    warmed by a new warm-up; the old one's end says nothing of the new offer
    (it may have skipped the resource once it was dropped). Reported warm
    before it was, it was handed over cold (benchmarks/rolling_restart.py:
    a replacement's first warm-ups, queued behind each other, ended 40 s
    later, during a drain that offered two of those resources again)."""
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [], standby=[3, 4])
    expect_callback(m, 0, CallbackKind.ASSIGNED, set())
    old = m.start_warmups()
    m.request_rejoin(1, "test")
    sync(m, 1, 2, [], standby=[])  # dropped while on_standby({3, 4}) runs
    expect_callback(m, 1, CallbackKind.ASSIGNED, set())
    expect_callback(m, 1, CallbackKind.STANDBY_DROPPED, res(3, 4))
    m.request_rejoin(2, "test")
    sync(m, 2, 3, [], standby=[3, 9])  # offered again, with another
    expect_callback(m, 2, CallbackKind.ASSIGNED, set())
    new = m.start_warmups()
    assert new[1] == frozenset(res(3, 9))
    m.warmup_done(4, *old)  # the first offer's warm-up ends now
    assert not m.rejoin_requested
    expect_call(m, 4, "heartbeat")
    m.warmup_done(6, *new)  # its own warm-up: now it is warm, and reported
    assert m.rejoin_requested
    m.call_abandoned(6)
    assert metadata_of(expect_call(m, 6, "join")).warm == {"s": [3, 9]}


def test_a_failed_warm_up_is_not_reported_warm_nor_started_again() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [], standby=[3, 4])
    expect_callback(m, 0, CallbackKind.ASSIGNED, set())
    run, warmups = m.start_warmups()
    assert warmups == frozenset(res(3, 4))
    m.warmup_done(5, run, warmups, failed=True)
    assert not m.rejoin_requested and m.start_warmups()[1] == frozenset()
    m.request_rejoin(6, "test")
    assert metadata_of(expect_call(m, 6, "join")).warm == {}


def test_closing_drops_the_standbys_and_warms_nothing_more() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [0], standby=[4])
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0))
    m.close()
    assert m.start_warmups()[1] == frozenset()  # closing: nothing to warm up
    expect_callback(m, 0, CallbackKind.REVOKED, res(0))
    expect_callback(m, 0, CallbackKind.STANDBY_DROPPED, res(4))
    expect_call(m, 0, "leave")


def test_a_drain_rejoins_draining_serves_until_revoked_then_leaves() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [0, 1])
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0, 1))
    m.drain(5)
    assert m.draining and not m.drained
    meta = metadata_of(expect_call(m, 5, "join"))
    assert meta.draining is True and meta.owned == {"s": [0, 1]}
    # The plan keeps 0 for a round (its new owner warms it up): still served.
    m.receive(5, JoinResponse(None, 2, "resources", "balanced", "leader", "m1"))
    expect_call(m, 5, "sync")
    m.receive(5, SyncResponse(None, "resources", "balanced",
                              ResourceAssignment(assigned={"s": [0]}).encode()))
    expect_callback(m, 5, CallbackKind.REVOKED, res(1))
    expect_callback(m, 5, CallbackKind.ASSIGNED, set())
    assert m.owned == frozenset(res(0)) and not m.drained
    sync(m, 6, 3, [])
    expect_callback(m, 6, CallbackKind.REVOKED, res(0))
    expect_callback(m, 6, CallbackKind.ASSIGNED, set())
    assert m.drained
    expect_call(m, 6, "leave")  # owning nothing: it leaves (no follow-up join)
    m.receive(7, LeaveResponse(None))
    assert isinstance(m.next_action(7), Stop) and m.state is MemberState.CLOSED


def test_a_drain_staying_idle_waits_for_a_generation_that_knows_it() -> None:
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [])
    expect_callback(m, 0, CallbackKind.ASSIGNED, set())
    m.drain(1, leave=False)
    assert not m.drained  # the group may still give it something
    assert metadata_of(expect_call(m, 1, "join")).draining
    m.receive(1, JoinResponse(None, 2, "resources", "balanced", "leader", "m1"))
    expect_call(m, 1, "sync")
    m.receive(1, SyncResponse(None, "resources", "balanced", ResourceAssignment().encode()))
    expect_callback(m, 1, CallbackKind.ASSIGNED, set())
    assert m.drained and m.state is MemberState.STABLE
    assert expect_call(m, 1, "heartbeat")  # stays in the group


def test_a_heartbeat_answer_asking_to_drain_starts_the_drain() -> None:
    m = make(assignors=("cooperative-sticky",))
    sync(m, 0, 1, [0])
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0))
    expect_call(m, 0, "heartbeat")
    m.receive(100, HeartbeatResponse(None, drain=True))
    assert m.draining
    assert metadata_of(expect_call(m, 100, "join")).draining is True


def test_an_assignor_that_ignores_draining_gives_a_draining_member_nothing() -> None:
    """cooperative-sticky through the leader: the draining member's claims are
    withheld this round (it revokes them), nothing new goes to it; when it is
    the only subscriber of a set it keeps serving it."""
    def member(name: str, owned: list[int], draining: bool, sets: tuple[str, ...] = ("s",)
               ) -> JoinMember:
        return JoinMember(name, None, MemberMetadata(
            sets=sets, owned={"s": owned} if owned else {}, generation=4,
            draining=draining).encode())

    members = (member("a", [0, 1, 2], False), member("b", [3, 4, 5], True, ("s", "t")))
    result = perform_assignment(get_assignor("cooperative-sticky"), {"s": 6, "t": 2}, members)
    got = {m: a.assigned for m, a in result.assignments.items()}
    assert got == {"a": {"s": [0, 1, 2]}, "b": {"t": [0, 1]}}
    # The follow-up: b owns no "s" any more, a takes it all.
    members = (member("a", [0, 1, 2], False), member("b", [], True, ("s", "t")))
    result = perform_assignment(get_assignor("cooperative-sticky"), {"s": 6, "t": 2}, members)
    assert result.assignments["a"].assigned == {"s": list(range(6))}


def test_warm_ups_running_together_are_reported_at_one_rejoin() -> None:
    """One rebalance for a batch of warm-ups: each rebalance may cut another
    member's sync short (its claims then go stale and move cold)."""
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [], standby=[3])
    expect_callback(m, 0, CallbackKind.ASSIGNED, set())
    first = m.start_warmups()
    m.request_rejoin(1, "another member joined")
    sync(m, 1, 2, [], standby=[3, 4])  # (a rebalance meanwhile) another standby
    expect_callback(m, 1, CallbackKind.ASSIGNED, set())
    second = m.start_warmups()
    assert (first[1], second[1]) == (frozenset(res(3)), frozenset(res(4)))
    m.warmup_done(2, *first)
    assert not m.rejoin_requested  # 4 still warms up
    m.warmup_done(3, *second)
    assert m.rejoin_requested
    assert metadata_of(expect_call(m, 3, "join")).warm == {"s": [3, 4]}


def test_claims_carry_the_generation_of_the_join_when_its_sync_is_cut_short() -> None:
    """Warm reports and drains rebalance often, so a sync is often cut short by
    the next rebalance. The member's claims then carry its join's generation
    (as Kafka's do): that generation gave none of them away, and claimed at
    the older one they went stale and moved cold."""
    m = make(assignors=("balanced",))
    sync(m, 0, 1, [0, 1])
    expect_callback(m, 0, CallbackKind.ASSIGNED, res(0, 1))
    m.request_rejoin(1, "a warm report")
    expect_call(m, 1, "join")
    m.receive(1, JoinResponse(None, 2, "resources", "balanced", "leader", "m1"))
    expect_call(m, 1, "sync")
    m.receive(2, SyncResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    meta = metadata_of(expect_call(m, 2, "join"))
    assert meta.owned == {"s": [0, 1]} and meta.generation == 2
