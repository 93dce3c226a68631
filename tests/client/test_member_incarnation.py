"""A static member's incarnation (v1.1; docs/client.md, "Incarnation"): one id
per process, drawn once and sent with the process's start time on every join,
so the coordinator can tell a late join of this process from a newer one's
(docs/coordinator-semantics.md, "Incarnations")."""

from __future__ import annotations

import re

from client.errors import CoordinatorUnavailableError
from client.member_state import MemberConfig, MemberStateMachine
from client.member_state.actions import Call, Wait
from protocol.errors import ErrorCode
from protocol.messages import JoinRequest, JoinResponse

WALL = 1_700_000_000_000


def _machine(instance: str | None, **kw: object) -> MemberStateMachine:
    config = MemberConfig(group_id="g", sets=["s"], group_instance_id=instance,
                          session_timeout_ms=1_000, heartbeat_interval_ms=300,
                          rebalance_timeout_ms=5_000)
    return MemberStateMachine(config, rng=lambda: 0.5, **kw)  # type: ignore[arg-type]


def _next_join(m: MemberStateMachine, now: int) -> tuple[int, JoinRequest]:
    """The next join the member sends at or after ``now`` (waits skipped)."""
    for _ in range(10):
        action = m.next_action(now)
        if isinstance(action, Wait):
            now = action.until_ms
            continue
        assert isinstance(action, Call) and isinstance(action.request, JoinRequest), action
        return now, action.request
    raise AssertionError("no join")


def test_every_join_of_a_static_process_carries_the_same_incarnation() -> None:
    m = _machine("i1", assignor_clock=lambda: WALL)
    now, first = _next_join(m, 0)
    assert re.fullmatch(r"[0-9a-f]{32}", first.incarnation or "")
    assert first.incarnation_ms == WALL
    # The join sent again after a reset, and after the member id was lost.
    m.call_failed(now, CoordinatorUnavailableError("join: connection reset"))
    now, again = _next_join(m, now)
    m.receive(now, JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID))
    now, third = _next_join(m, now)
    for join in (again, third):
        assert join.member_id == ""
        assert (join.incarnation, join.incarnation_ms) == (first.incarnation, WALL)


def test_each_process_draws_its_own_incarnation() -> None:
    joins = [_next_join(_machine("i1", assignor_clock=lambda: WALL), 0)[1] for _ in range(2)]
    assert joins[0].incarnation != joins[1].incarnation


def test_an_injected_incarnation_is_sent_as_given() -> None:
    _, join = _next_join(_machine("i1", incarnation="w1#3", assignor_clock=lambda: 7), 0)
    assert (join.incarnation, join.incarnation_ms) == ("w1#3", 7)


def test_a_dynamic_member_sends_no_incarnation() -> None:
    _, join = _next_join(_machine(None, assignor_clock=lambda: WALL), 0)
    assert (join.incarnation, join.incarnation_ms) == (None, None)
    assert "incarnation" not in join.to_wire()


def test_without_a_wall_clock_the_start_time_is_not_sent() -> None:
    _, join = _next_join(_machine("i1"), 0)
    assert join.incarnation is not None and join.incarnation_ms is None
    assert "incarnation_ms" not in join.to_wire()
