"""Runtime.request: an answer at once, or a future; and the protocol calls on top of it.

The HTTP edge (coordinator.http.calls) builds each command itself and hands it
to ``Runtime.request``; a call whose answer waits is a future, and a future
given up on (the client went away) must reach the core as ``Cancelled``
however early it is given up on.
"""

from __future__ import annotations

import asyncio

import msgpack

from coordinator.core.commands import Cancelled, Heartbeat, Join
from coordinator.http.calls import Calls
from protocol.errors import ErrorCode
from protocol.messages import Api, HeartbeatRequest, HeartbeatResponse, JoinRequest
from tests.runtime.runtime_kit import SESSION_MS, Harness, settle


def join_request(member_id: str = "") -> JoinRequest:
    return JoinRequest(group_id="g", member_id=member_id, protocol_type="test",
                       protocols=(("range", b"meta"),), session_timeout_ms=SESSION_MS,
                       rebalance_timeout_ms=SESSION_MS, client_id="test")


def cancels(harness: Harness) -> list[Cancelled]:
    return [c for c in harness.core.commands if isinstance(c, Cancelled)]


async def test_an_answer_given_in_the_apply_step_comes_back_without_a_future(
        harness: Harness) -> None:
    member, generation = await harness.stable_member()
    runtime = harness.runtime
    answer = runtime.request(Heartbeat(runtime.new_request_id(),
                                       HeartbeatRequest("g", member, generation)))
    assert isinstance(answer, HeartbeatResponse) and answer.error is None


async def test_a_parked_request_is_a_future_and_cancelling_it_tells_the_core(
        harness: Harness) -> None:
    await harness.stable_member()
    runtime = harness.runtime
    first = runtime.request(Join(runtime.new_request_id(), join_request(), "h", "m-2"))
    assert not isinstance(first, asyncio.Future)
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    parked = runtime.request(Join(runtime.new_request_id(), join_request(first.member_id),
                                  "h", "unused"))
    assert isinstance(parked, asyncio.Future) and not parked.done()
    assert harness.core.parked_request_count() == 1
    parked.cancel()
    await settle()
    assert len(cancels(harness)) == 1
    assert harness.core.parked_request_count() == 0


async def test_a_call_given_up_on_before_it_ever_ran_still_tells_the_core(
        harness: Harness) -> None:
    """The client goes away in the same loop turn its parked join was handed over:
    the call's future is cancelled before its task took a step."""
    await harness.stable_member()
    calls = Calls(harness.runtime, harness.metrics, max_body_bytes=100_000)
    body = msgpack.packb({"group_id": "g", "member_id": "", "protocol_type": "test",
                          "protocols": [["range", b"meta"]],
                          "session_timeout_ms": SESSION_MS,
                          "rebalance_timeout_ms": SESSION_MS, "client_id": "test"})
    answered = calls.call(Api.JOIN, body, False, "h", None, 0.0)
    assert isinstance(answered, tuple)
    member_id = msgpack.unpackb(answered[1])["member_id"]
    rejoin = msgpack.packb({**msgpack.unpackb(body), "member_id": member_id})
    parked = calls.call(Api.JOIN, rejoin, False, "h", None, 0.0)
    assert isinstance(parked, asyncio.Future)
    assert harness.core.parked_request_count() == 1
    parked.cancel()  # before the loop ran anything
    await settle()
    assert len(cancels(harness)) == 1
    assert harness.core.parked_request_count() == 0
