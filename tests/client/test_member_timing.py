"""The timing rule (client/lease.py, docs/client.md "Timing rule").

For every configuration the client accepts, a healthy member on a healthy
network never loses its membership; every other configuration is refused at
construction with a message naming the parameters and the bound.

The sweep runs the real member (driver, machine), the real coordinator
runtime and core, in virtual time (``virtual_time.VirtualTimeLoop``): a group
of two, quiet for several sessions, then a third member joins and later
leaves, and one heartbeat is lost on the way; no member may ever see
``on_lost``, and the generation must not move while nothing changes (the
churn without the rule: ``Stable -> PreparingRebalance`` every session). The
reported case exactly as reported (two members, 12 resources, the churn read
from the coordinator's log) is test_member_timing_server.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, MemoryStore
from virtual_time import LatencyTransport, LoopClock, loop_ms, run_virtual, settings_id

from client.lease import LeaseTiming
from client.member import GroupMember
from client.member_state import MemberConfig
from coordinator.core import CoreConfig, GroupCoordinator
from coordinator.runtime.runtime import Runtime

#: the healthy network: every call takes this round trip.
RTT_MS = 4
#: sessions: a test's, the coordinator's default minimum, the client's default.
SESSIONS = (300, 6_000, 10_000)


def _sweep() -> Iterator[tuple[dict[str, int | None], bool]]:
    """(settings, accepted) over sessions, rebalance timeouts below, at and
    above the session, and heartbeat intervals unset, well inside the rule,
    at its boundary and one past it."""
    for session in SESSIONS:
        for rebalance in (session // 2, session, 60_000):
            lease = min(session, rebalance)
            bound = lease // 3
            for interval in (None, max(1, lease // 10), bound, bound + 1):
                accepted = interval is None or interval <= bound
                yield dict(session_timeout_ms=session, rebalance_timeout_ms=rebalance,
                           heartbeat_interval_ms=interval), accepted
    # The reported case, explicitly: the default interval with the minimum session.
    yield dict(session_timeout_ms=6_000, rebalance_timeout_ms=60_000,
               heartbeat_interval_ms=3_000), False
    # A request timeout shorter than the reply allowance the rule would give.
    yield dict(session_timeout_ms=6_000, rebalance_timeout_ms=60_000,
               heartbeat_interval_ms=None, request_timeout_ms=50), True


SWEEP = list(_sweep())
ACCEPTED = [s for s, ok in SWEEP if ok]
REFUSED = [s for s, ok in SWEEP if not ok]


def _kw(settings: dict[str, int | None]) -> dict[str, Any]:
    return {k: v for k, v in settings.items()}


async def _scenario(settings: dict[str, int | None], assignors: tuple[str, ...]) -> None:
    session = settings["session_timeout_ms"]
    assert session is not None
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100)), MemoryStore(),
                      LoopClock())  # the server's default initial rebalance delay (3 s)
    await runtime.start()
    coordinator = InProcessCoordinator(runtime)
    await coordinator.put_resource("shards", 12)
    ledger = Ledger()

    networks: dict[str, LatencyTransport] = {}

    def member(name: str) -> GroupMember:
        networks[name] = LatencyTransport(coordinator, RTT_MS)
        return GroupMember(networks[name], "g", ["shards"],
                           assignors=assignors, listener=ledger.listener(name), client_id=name,
                           clock=loop_ms, **_kw(settings))

    def generation() -> int:
        view = runtime.core.describe_group("g")
        assert view is not None
        return view.generation_id

    async def quiet(sessions: int, what: str) -> None:
        before = generation()
        await asyncio.sleep(sessions * session / 1000)
        assert generation() == before, (
            f"{what}: the group rebalanced with no membership change "
            f"(generation {before} -> {generation()})")

    a, b = member("a"), member("b")
    members = [a, b]
    try:
        for m in members:
            m.start()
        for m in members:
            await m.wait_assigned(120)
        await asyncio.sleep(2 * session / 1000)  # any follow-up rebalance settles
        await quiet(3, "two members")
        # One heartbeat lost on the way must not cost the membership either:
        # it is given up in time for a retry to renew the lease.
        networks["a"].lose_heartbeats = 1
        await quiet(3, "two members, a heartbeat of a lost")
        assert networks["a"].lost == 1
        c = member("c")
        members.append(c)
        c.start()
        await c.wait_assigned(120)
        await asyncio.sleep(2 * session / 1000)
        await quiet(3, "three members")
        await c.close()
        await asyncio.sleep(2 * session / 1000)
        await quiet(3, "after a leave")
        assert {len(m.assignment) for m in (a, b)} == {6}, [m.assignment for m in (a, b)]
    finally:
        for m in members:
            await m.close()
        await runtime.stop()
    lost = {name: ledger.count(name, "lost") for name in "abc"}
    assert lost == {"a": 0, "b": 0, "c": 0}, f"on_lost with {settings}: {lost}"
    ledger.check()


@pytest.mark.parametrize("settings", ACCEPTED, ids=[settings_id(s) for s in ACCEPTED])
def test_a_healthy_member_never_loses_its_membership(settings: dict[str, int | None]) -> None:
    run_virtual(lambda: _scenario(settings, ("cooperative-sticky",)))


@pytest.mark.parametrize("settings", [s for s in ACCEPTED if s["session_timeout_ms"] == 6_000],
                         ids=lambda s: settings_id(s))
def test_a_healthy_eager_member_never_loses_its_membership(
        settings: dict[str, int | None]) -> None:
    run_virtual(lambda: _scenario(settings, ("range",)))


@pytest.mark.parametrize("settings", REFUSED, ids=[settings_id(s) for s in REFUSED])
def test_a_configuration_outside_the_rule_is_refused_saying_what_to_change(
        settings: dict[str, int | None]) -> None:
    session, rebalance = settings["session_timeout_ms"], settings["rebalance_timeout_ms"]
    assert session is not None and rebalance is not None
    bound = min(session, rebalance) // 3
    binding = "rebalance_timeout_ms" if rebalance < session else "session_timeout_ms"
    with pytest.raises(ValueError) as refused:
        GroupMember("http://127.0.0.1:1", "g", ["shards"], **_kw(settings))
    message = str(refused.value)
    assert f"heartbeat_interval_ms={settings['heartbeat_interval_ms']}" in message
    assert f"{binding}={min(session, rebalance)}" in message
    assert f"heartbeat_interval_ms <= {bound}" in message
    # ... and the same for the sans-IO machine's configuration.
    with pytest.raises(ValueError, match="more than a third"):
        MemberConfig("g", ["shards"], **_kw(settings))


def test_the_reported_case_derives_a_third_of_the_session() -> None:
    config = MemberConfig("g", ["shards"], session_timeout_ms=6_000)
    assert config.heartbeat_interval_ms == 2_000
    assert MemberConfig("g", ["shards"]).heartbeat_interval_ms == 3_000  # the default session
    assert MemberConfig("g", ["shards"], session_timeout_ms=45_000,
                        rebalance_timeout_ms=4_500).heartbeat_interval_ms == 1_500


@pytest.mark.parametrize(("bad", "named"), [
    (dict(session_timeout_ms=0), "session_timeout_ms"),
    (dict(rebalance_timeout_ms=-1), "rebalance_timeout_ms"),
    (dict(request_timeout_ms=0), "request_timeout_ms"),
    (dict(heartbeat_interval_ms=0), "heartbeat_interval_ms"),
    (dict(session_timeout_ms=2), "session_timeout_ms=2"),
])
def test_timings_that_cannot_work_are_refused_by_name(bad: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        MemberConfig("g", ["shards"], **bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the rule's arithmetic


def test_the_hold_leaves_room_for_the_answer_and_one_retry() -> None:
    t = LeaseTiming.derive(session_timeout_ms=6_000, rebalance_timeout_ms=60_000,
                           heartbeat_interval_ms=None, request_timeout_ms=30_000)
    assert (t.heartbeat_interval_ms, t.reply_ms) == (2_000, 1_000)
    # steady state: sent an interval after the last renewal, held a full interval
    assert t.hold_ms(2_000, 6_000) == 2_000
    # late in the lease the hold shrinks, then vanishes
    assert t.hold_ms(3_500, 6_000) == 500
    assert t.hold_ms(4_500, 6_000) == 0
    # the answer is awaited reply_ms past the hold, never past the lease's end
    assert t.heartbeat_timeout_ms(2_000, 2_000, 6_000) == 3_000
    assert t.heartbeat_timeout_ms(5_500, 0, 6_000) == 500
    # a failed heartbeat's retry is pulled forward to the last chance
    assert t.retry_at(4_000, 1_500, 6_000) == 5_000
    assert t.retry_at(4_000, 500, 6_000) == 4_500
    assert t.retry_at(5_000, 1_500, 6_000) == 5_500  # at it: halfway to the end
    assert t.retry_at(5_800, 1_500, 6_000) == 5_900
    assert t.retry_at(6_000, 1_500, 6_000) == 7_500  # the lease is over: just back off
    # no lease yet: the full hold
    assert t.hold_ms(0, None) == 2_000


def test_a_short_request_timeout_bounds_the_reply_allowance() -> None:
    t = LeaseTiming.derive(session_timeout_ms=6_000, rebalance_timeout_ms=60_000,
                           heartbeat_interval_ms=1_000, request_timeout_ms=300)
    assert t.reply_ms == 300
    assert t.hold_ms(1_000, 7_000) == 1_000
