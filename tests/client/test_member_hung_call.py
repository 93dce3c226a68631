"""A join or sync lost on a connection that hangs (docs/client.md, "A call the
coordinator is done with"), with the real driver, machine, runtime and core in
virtual time (``virtual_time.VirtualTimeLoop``).

The lost call is never answered and its connection neither closes nor
resets; the member's side-channel heartbeats still get through, so the
coordinator keeps it as a member holding its assignment. Before the fix the
member waited for the call's timeout, ``rebalance_timeout + max(5000,
session_timeout)`` (8 s here) owning nothing; now the heartbeats' answers
show the call will not be answered and it is sent again, so the group is
whole again well inside the simulator's convergence bound (two sessions
plus the rebalance timeout).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, MemoryStore
from virtual_time import LatencyTransport, LoopClock, loop_ms, run_virtual

from client.member import GroupMember
from coordinator.core import CoreConfig, GroupCoordinator
from coordinator.runtime.runtime import Runtime

RTT_MS = 4
SESSION_MS = 1_000
REBALANCE_MS = 3_000
#: the simulator's convergence bound (no initial delay here).
BOUND_MS = 2 * SESSION_MS + REBALANCE_MS
#: how long the member used to wait: the call's timeout.
OLD_WAIT_MS = REBALANCE_MS + max(5_000, SESSION_MS)
SHARDS = 12


class HangingTransport(LatencyTransport):
    """``hang_request``: the next call of that api never reaches the
    coordinator; ``hang_answer``: the next one is applied there but its answer
    never comes back. Either way the caller waits until it gives up (its
    cancellation reaches the coordinator as a closed connection would)."""

    def __init__(self, coordinator: InProcessCoordinator, rtt_ms: int) -> None:
        super().__init__(coordinator, rtt_ms)
        self.hang_request: set[str] = set()
        self.hang_answer: set[str] = set()
        self.hung: list[str] = []

    async def call(self, api: str, request: Any) -> Any:
        never = asyncio.get_running_loop().create_future()
        if api in self.hang_request:
            self.hang_request.discard(api)
            self.hung.append(api)
            self.calls[api] = self.calls.get(api, 0) + 1
            return await never
        if api in self.hang_answer:
            self.hang_answer.discard(api)
            await super().call(api, request)
            self.hung.append(api)
            return await never
        return await super().call(api, request)


async def _scenario(assignors: tuple[str, ...], hang: str, how: str) -> int:
    """Two members settle; then ``b``'s next ``hang`` call hangs (``how``:
    request or answer) in the rebalance ``b`` starts by subscribing to one
    more set; returns how long until every resource was owned exactly once
    again, in virtual milliseconds."""
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0)),
                      MemoryStore(), LoopClock())
    await runtime.start()
    coordinator = InProcessCoordinator(runtime)
    await coordinator.put_resource("shards", SHARDS)
    await coordinator.put_resource("more", 1)
    ledger = Ledger()
    nets = {name: HangingTransport(coordinator, RTT_MS) for name in "ab"}
    members = {name: GroupMember(nets[name], "g", ["shards"], assignors=assignors,
                                 listener=ledger.listener(name), client_id=name, clock=loop_ms,
                                 session_timeout_ms=SESSION_MS,
                                 rebalance_timeout_ms=REBALANCE_MS)
               for name in "ab"}
    a, b = members["a"], members["b"]
    expected = {("shards", i) for i in range(SHARDS)} | {("more", 0)}

    def whole() -> bool:
        owned = [r for m in (a, b) for r in m.assignment]
        return len(owned) == len(set(owned)) and set(owned) == expected

    try:
        for m in (a, b):
            m.start()
        for m in (a, b):
            await m.wait_assigned(60)
        await asyncio.sleep(2 * SESSION_MS / 1000)
        assert {len(m.assignment) for m in (a, b)} == {SHARDS // 2}
        (nets["b"].hang_request if how == "request" else nets["b"].hang_answer).add(hang)
        started = loop_ms()
        # b subscribes to one more set: its join starts the rebalance (or,
        # lost on the way, does not).
        await b.subscribe(["shards", "more"])
        while loop_ms() - started < OLD_WAIT_MS + BOUND_MS:
            await asyncio.sleep(0.01)
            if whole() and nets["b"].hung:
                break
        assert nets["b"].hung == [hang], nets["b"].hung
        took = loop_ms() - started
        # and it stays whole: no rebalance left pending
        await asyncio.sleep(2 * SESSION_MS / 1000)
        assert whole(), [sorted(m.assignment) for m in (a, b)]
        return took
    finally:
        for m in (a, b):
            await m.close()
        await runtime.stop()
        ledger.check()  # never two owners at once


@pytest.mark.parametrize(("assignors", "hang", "how", "before_ms"), [
    # the old code's figures: the call's timeout; the safety bound (on_lost);
    # the session expiry (the membership lost) and one more rebalance
    (("range",), "join", "request", 8_030),
    (("range",), "sync", "answer", 8_110),
    (("cooperative-sticky",), "sync", "answer", 3_010),
    (("range",), "join", "answer", 1_040),
], ids=["eager-join-lost", "eager-sync-answer-lost", "cooperative-sync-answer-lost",
        "eager-join-answer-lost"])
def test_a_member_whose_call_hangs_sends_it_again_within_a_session(
        assignors: tuple[str, ...], hang: str, how: str, before_ms: int) -> None:
    """Whole again in well under a session timeout: before the member's own
    bounds or the coordinator's session expiry act, and far inside the
    convergence bound (the old code took ``before_ms``)."""
    took = run_virtual(lambda: _scenario(assignors, hang, how))
    assert took < SESSION_MS, (
        f"whole again after {took} ms (the call's timeout: {OLD_WAIT_MS} ms)")
