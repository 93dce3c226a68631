"""The assignor's state between rounds, sans-IO: the member echoes the last
assignment's ``user_data`` in the metadata of that assignment's protocol
(and only that one), forgets it when it loses its membership, and the leader
hands the time to assignors that take ``now_ms`` (incremental-cooperative,
KIP-415)."""

from __future__ import annotations

from collections.abc import Mapping

from client.assignors import Assignment, RebalanceProtocol, Subscription, get_assignor
from client.leader import accepts_now, perform_assignment
from client.member_state import (
    Call,
    CallbackKind,
    InvokeListener,
    MemberConfig,
    MemberState,
    MemberStateMachine,
)
from client.transport import CatalogResponse
from protocol.errors import ErrorCode
from protocol.messages import (
    HeartbeatResponse,
    JoinMember,
    JoinRequest,
    JoinResponse,
    SyncRequest,
    SyncResponse,
)
from protocol.resources import MemberMetadata, ResourceAssignment

IC = "incremental-cooperative"
CS = "cooperative-sticky"


def make(assignor_clock: object = None, **kw: object) -> MemberStateMachine:
    settings: dict[str, object] = dict(group_id="g", sets=["s"], assignors=(IC, CS),
                                       session_timeout_ms=1_000, heartbeat_interval_ms=300,
                                       rebalance_timeout_ms=5_000, user_data=b"cfg")
    settings.update(kw)
    return MemberStateMachine(MemberConfig(**settings),  # type: ignore[arg-type]
                              rng=lambda: 0.5,
                              assignor_clock=assignor_clock)  # type: ignore[arg-type]


def call(m: MemberStateMachine, now: int, api: str) -> Call:
    action = m.next_action(now)
    assert isinstance(action, Call), action
    assert action.api == api, action
    return action


def run_callbacks(m: MemberStateMachine, now: int) -> None:
    """Run the callbacks; the stable heartbeat that follows stays in flight."""
    while True:
        action = m.next_action(now)
        if not isinstance(action, InvokeListener):
            assert isinstance(action, Call) and action.api == "heartbeat", action
            return
        m.listener_done(now)


def user_data_by_protocol(join: Call) -> dict[str, bytes | None]:
    assert isinstance(join.request, JoinRequest)
    return {name: MemberMetadata.decode(meta).user_data for name, meta in join.request.protocols}


def follow(m: MemberStateMachine, now: int, generation: int, protocol: str,
           assignment: ResourceAssignment) -> None:
    """One completed rebalance as a follower, the group having chosen ``protocol``."""
    m.receive(now, JoinResponse(None, generation, "resources", protocol, "leader", "m1"))
    call(m, now, "sync")
    m.receive(now, SyncResponse(None, "resources", protocol, assignment.encode()))
    run_callbacks(m, now)
    assert m.state is MemberState.STABLE


def test_the_last_assignments_user_data_goes_back_in_its_protocol_only() -> None:
    m = make()
    first = call(m, 0, "join")
    assert user_data_by_protocol(first) == {IC: b"cfg", CS: b"cfg"}
    follow(m, 1, 1, IC, ResourceAssignment(assigned={"s": [0]}, user_data=b"state-1"))

    m.receive(2, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    second = call(m, 2, "join")
    # incremental-cooperative gets its state back; the other protocol's
    # metadata is the member's own.
    assert user_data_by_protocol(second) == {IC: b"state-1", CS: b"cfg"}
    assert isinstance(second.request, JoinRequest)
    assert MemberMetadata.decode(second.request.protocols[0][1]).owned == {"s": [0]}

    # An assignment without user_data does not erase the state; a new one replaces it.
    follow(m, 3, 2, IC, ResourceAssignment(assigned={"s": [0]}))
    m.receive(4, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    assert user_data_by_protocol(call(m, 4, "join")) == {IC: b"state-1", CS: b"cfg"}
    follow(m, 5, 3, CS, ResourceAssignment(assigned={"s": [0]}, user_data=b"cs-state"))
    m.receive(6, HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS))
    # The group moved to the other protocol: that one echoes now.
    assert user_data_by_protocol(call(m, 6, "join")) == {IC: b"cfg", CS: b"cs-state"}


def test_losing_the_membership_forgets_the_echoed_user_data() -> None:
    m = make()
    call(m, 0, "join")
    follow(m, 1, 1, IC, ResourceAssignment(assigned={"s": [0, 1]}, user_data=b"state-1"))
    m.receive(3, HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    lost = m.next_action(3)
    assert isinstance(lost, InvokeListener) and lost.kind is CallbackKind.LOST
    m.listener_done(3)
    join = call(m, 3, "join")
    assert user_data_by_protocol(join) == {IC: b"cfg", CS: b"cfg"}


def test_the_safety_rule_forgets_it_too() -> None:
    m = make()
    call(m, 0, "join")
    follow(m, 1, 1, IC, ResourceAssignment(assigned={"s": [0]}, user_data=b"state-1"))
    m.call_abandoned(2)
    # No answer for a session timeout: everything is lost first, then a rejoin.
    lost = m.next_action(1_001)
    assert isinstance(lost, InvokeListener) and lost.kind is CallbackKind.LOST
    m.listener_done(1_001)
    assert user_data_by_protocol(call(m, 1_001, "join")) == {IC: b"cfg", CS: b"cfg"}


class _Clocked:
    """Records the time it was given."""

    name = CS
    protocols = (RebalanceProtocol.COOPERATIVE,)

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def assign(self, resources: Mapping[str, int], subscriptions: Mapping[str, Subscription],
               now_ms: int | None = None) -> dict[str, Assignment]:
        self.seen.append(now_ms)
        return {m: Assignment({}) for m in subscriptions}


class _Timeless:
    name = CS
    protocols = (RebalanceProtocol.COOPERATIVE,)

    def assign(self, resources: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        return {m: Assignment({}) for m in subscriptions}


def test_perform_assignment_passes_now_only_to_assignors_that_declare_it() -> None:
    members = [JoinMember("m1", None, MemberMetadata(sets=("s",)).encode())]
    clocked = _Clocked()
    assert accepts_now(clocked) and not accepts_now(_Timeless())
    assert accepts_now(get_assignor(IC)) and not accepts_now(get_assignor("range"))
    perform_assignment(clocked, {"s": 2}, members, now_ms=42)
    perform_assignment(clocked, {"s": 2}, members)
    assert clocked.seen == [42, None]
    # An assignor without the keyword is called as before.
    assert perform_assignment(_Timeless(), {"s": 2}, members, now_ms=42).assignments["m1"] == (
        ResourceAssignment(assigned={}))


def test_the_leader_hands_its_assignor_clock_to_incremental_cooperative() -> None:
    settings = {IC: {"scheduled_rebalance_max_delay_ms": 10_000}}
    assignor = get_assignor(IC, **settings[IC])
    # Round 1 (at t=1000 on the group's clock): m1, m2, m3 share 6 resources.
    subs = {m: Subscription(sets=["s"]) for m in ("m1", "m2", "m3")}
    round1 = assignor.assign({"s": 6}, subs, now_ms=1_000)
    # Round 2: m3 has gone; m1 leads and echoes what round 1 gave it.
    members = tuple(
        JoinMember(m, None, MemberMetadata(sets=("s",), owned=round1[m].assigned, generation=1,
                                           user_data=round1[m].user_data).encode())
        for m in ("m1", "m2"))
    m = make(assignors=(IC,), assignor_settings=settings, assignor_clock=lambda: 4_000)
    call(m, 0, "join")
    m.receive(5, JoinResponse(None, 2, "resources", IC, "m1", "m1", members))
    call(m, 5, "resources")
    m.receive(6, CatalogResponse(1, {"s": 6}))
    sync = call(m, 6, "sync")
    assert isinstance(sync.request, SyncRequest)
    got = {a.member_id: ResourceAssignment.decode(a.assignment) for a in sync.request.assignments}
    # m3's resources wait for it; the deadline counts from the departure
    # seen at t=4000 on the assignor clock (not the machine's now_ms 6).
    assert all(a.delay_ms == 10_000 for a in got.values())
    held = {("s", i) for a in got.values() for i in a.assigned.get("s", [])}
    gone = {("s", i) for i in round1["m3"].assigned["s"]}
    assert held.isdisjoint(gone) and len(held) == 6 - len(gone)
    assert all(a.user_data for a in got.values())
