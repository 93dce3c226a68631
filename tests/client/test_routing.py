"""Routing, the member router's decisions, stepped by hand: each input (a call
to send, the answer or failure of a leg at a URL, a find that timed out, a
call given up) and the effects it returns, without I/O. The asyncio driver
(CoordinatorRouter) is exercised in test_member_routing*.py, the simulator's
driver by tests/sim."""

from __future__ import annotations

import pytest

from client.errors import (
    CoordinatorUnavailableError,
    GroupAuthorizationFailedError,
    NotCoordinatorError,
)
from client.routing import (
    MAX_REDIRECTS,
    Answer,
    AskFind,
    CoordinatorChanged,
    Fail,
    RedirectRefused,
    RoutedCall,
    Routing,
    RoutingEffect,
    SendCall,
)
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse, HeartbeatResponse

A, B, C = "http://a:9080", "http://b:9080", "http://c:9080"
OK = HeartbeatResponse(None)


def _not_coordinator(owner: str = "") -> NotCoordinatorError:
    return NotCoordinatorError("heartbeat: NOT_COORDINATOR", ErrorCode.NOT_COORDINATOR, owner)


def _found(url: str) -> FindCoordinatorResponse:
    return FindCoordinatorResponse(None, url, 1)


def _legs(effects: list[RoutingEffect]) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.url) for e in effects if isinstance(e, (SendCall, AskFind))]


def _call(routing: Routing, api: str = "heartbeat") -> tuple[RoutedCall, list[RoutingEffect]]:
    call = routing.new_call(api)
    return call, routing.route(call)


def _routing_at(url: str) -> tuple[Routing, RoutedCall]:
    """A routing over A, B, C whose coordinator is ``url`` (found through A),
    and a call sent there."""
    routing = Routing([A, B, C], "g", find_timeout_ms=500)
    call, effects = _call(routing)
    assert effects == [AskFind(call, A)]
    effects = routing.answered(call, _found(url))
    assert effects == [CoordinatorChanged(url, f"find_coordinator at {A}", None),
                       SendCall(call, url)]
    return routing, call


def test_a_call_finds_its_coordinator_then_goes_there_directly() -> None:
    routing, call = _routing_at(B)
    assert routing.answered(call, OK) == [Answer(call, OK)]
    assert call.done
    second, effects = _call(routing)
    assert effects == [SendCall(second, B)]  # no find_coordinator again


def test_redirects_are_followed_at_most_max_redirects_times_then_the_call_fails() -> None:
    routing, call = _routing_at(A)
    at, other = A, B
    for n in range(MAX_REDIRECTS):
        effects = routing.failed(call, _not_coordinator(other))
        assert effects == [CoordinatorChanged(other, f"NOT_COORDINATOR from {at}", at),
                           SendCall(call, other)], n
        at, other = other, at
    error = _not_coordinator(other)
    effects = routing.failed(call, error)
    # The last redirect is still taken (the next call goes there), the call fails.
    assert effects == [CoordinatorChanged(other, f"NOT_COORDINATOR from {at}", at),
                       Fail(call, error)]
    assert call.done
    assert routing.choice.current == other
    # The count is per call: the next call follows MAX_REDIRECTS again.
    second, effects = _call(routing)
    assert _legs(routing.failed(second, _not_coordinator(at))) == [("SendCall", at)]


def test_not_coordinator_naming_nobody_sends_the_call_to_find_coordinator() -> None:
    routing, call = _routing_at(A)
    effects = routing.failed(call, _not_coordinator(""))
    assert effects == [AskFind(call, B)]  # A was given up: asked last
    assert routing.choice.current is None and routing.choice.failed == A
    assert _legs(routing.answered(call, _found(C))) == [("SendCall", C)]


def test_load_in_progress_ends_the_call_and_keeps_the_owner_for_the_retry() -> None:
    routing, call = _routing_at(B)
    loading = NotCoordinatorError("heartbeat: loading", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    assert routing.failed(call, loading) == [Fail(call, loading)]
    assert routing.choice.current == B  # the owner, still loading
    retry, effects = _call(routing)
    assert effects == [SendCall(retry, B)]  # the member's retry goes there again


def test_a_find_round_that_no_one_answers_fails_the_call_and_starts_further_next_time() -> None:
    routing = Routing([A, B, C], "g", find_timeout_ms=500)
    call, effects = _call(routing)
    assert effects == [AskFind(call, A)]
    assert routing.failed(call, CoordinatorUnavailableError("refused")) == [AskFind(call, B)]
    assert routing.find_timed_out(call) == [AskFind(call, C)]
    effects = routing.failed(call, _not_coordinator())
    assert len(effects) == 1 and isinstance(effects[0], Fail)
    message = str(effects[0].error)
    assert isinstance(effects[0].error, CoordinatorUnavailableError)
    assert message.startswith("heartbeat: find_coordinator for group 'g' got no answer: ")
    assert f"{A}: refused" in message and f"{B}: no answer within 500 ms" in message
    assert routing.choice.current is None
    second, effects = _call(routing)
    assert effects == [AskFind(second, B)]  # the next round starts one further


def test_one_find_round_at_a_time_the_others_wait_and_go_where_it_found() -> None:
    routing = Routing([A, B], "g")
    first, effects = _call(routing, "join")
    assert effects == [AskFind(first, A)]
    waiting, effects = _call(routing, "commit")
    assert effects == []  # waits for the round under way
    effects = routing.answered(first, _found(B))
    assert _legs(effects) == [("SendCall", B), ("SendCall", B)]
    assert [e.call for e in effects if isinstance(e, SendCall)] == [first, waiting]


def test_a_round_without_an_answer_lets_the_next_waiting_call_ask_itself() -> None:
    routing = Routing([A, B], "g")
    first, _ = _call(routing, "join")
    second, _ = _call(routing, "commit")
    third, _ = _call(routing, "heartbeat")
    routing.failed(first, CoordinatorUnavailableError("refused"))
    effects = routing.find_timed_out(first)
    assert isinstance(effects[0], Fail) and effects[0].call is first
    assert effects[1:] == [AskFind(second, B)]  # starts one further; third still waits
    assert _legs(routing.answered(second, _found(A))) == [("SendCall", A), ("SendCall", A)]
    assert third.url == A and not third.done


def test_a_finder_given_up_hands_the_round_to_a_waiting_call() -> None:
    routing = Routing([A, B], "g")
    first, _ = _call(routing, "join")
    second, _ = _call(routing, "commit")
    assert routing.cancelled(first) == [AskFind(second, A)]
    assert first.done


def test_calls_in_flight_to_a_coordinator_given_up_fail_when_another_is_found() -> None:
    routing, parked = _routing_at(A)  # a join parked at A
    commit, effects = _call(routing, "commit")
    assert effects == [SendCall(commit, A)]
    routing.cancelled(commit)  # the member's timeout: A answers nothing
    routing.timed_out("commit")
    assert routing.choice.current is None and routing.choice.failed == A
    beat, effects = _call(routing)
    assert effects == [AskFind(beat, B)]  # A, given up, asked last
    effects = routing.answered(beat, _found(C))
    assert isinstance(effects[0], Fail) and effects[0].call is parked
    assert str(effects[0].error).startswith(f"heartbeat: gave up waiting on {A}")
    assert effects[1:] == [CoordinatorChanged(C, f"find_coordinator at {B}", A),
                           SendCall(beat, C)]
    assert parked.done
    assert routing.answered(parked, OK) == []  # its late answer is dropped


def test_timed_out_gives_up_the_coordinator_only_for_a_call_sent_to_one() -> None:
    routing, call = _routing_at(A)
    assert routing.answered(call, OK) == [Answer(call, OK)]
    routing.timed_out("heartbeat")  # answered: nothing to give up
    assert routing.choice.current == A
    sent, _ = _call(routing, "join")
    routing.cancelled(sent)  # the member's timeout of the join
    routing.timed_out("commit")
    assert routing.choice.current == A
    routing.timed_out("join")
    assert routing.choice.current is None and routing.choice.failed == A
    # A new call of the api before the member reports the timeout: nothing to give up.
    routing, call = _routing_at(A)
    routing.cancelled(call)
    routing.new_call("heartbeat")
    routing.timed_out("heartbeat")
    assert routing.choice.current == A


def test_failures_and_coordinator_not_available_forget_the_coordinator() -> None:
    routing, call = _routing_at(A)
    refused = CoordinatorUnavailableError("reset")
    assert routing.failed(call, refused) == [Fail(call, refused)]
    assert routing.choice.current is None
    routing, call = _routing_at(A)
    gone = HeartbeatResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    assert routing.answered(call, gone) == [Answer(call, gone)]
    assert routing.choice.current is None
    routing, call = _routing_at(A)
    fatal = GroupAuthorizationFailedError("denied")
    assert routing.failed(call, fatal) == [Fail(call, fatal)]
    assert routing.choice.current == A  # a setting to fix, not the coordinator's failure


def test_a_v1_server_without_find_coordinator_is_the_coordinator() -> None:
    routing = Routing([A, B], "g")
    call, _ = _call(routing)
    effects = routing.failed(call, CoordinatorUnavailableError("HTTP 404", http_status=404))
    assert effects == [CoordinatorChanged(A, "a server without find_coordinator", None),
                       SendCall(call, A)]


def test_find_coordinator_naming_nobody_or_an_unusable_url_fails_the_call() -> None:
    routing = Routing(["https://a:9080", "https://b:9080"], "g")
    call, _ = _call(routing)
    effects = routing.answered(call, _found("http://plain:9080"))
    assert len(effects) == 1 and isinstance(effects[0], Fail)
    assert "named an unusable coordinator URL" in str(effects[0].error)
    assert "not an https:// URL" in str(effects[0].error)
    call, _ = _call(routing)
    assert call.url == "https://a:9080"  # the last that answered is asked first
    effects = routing.answered(call, FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))
    assert isinstance(effects[0], Fail)
    assert "no coordinator serves group 'g' now" in str(effects[0].error)
    assert routing.choice.current is None


def test_a_redirect_to_an_unusable_url_is_refused_and_the_coordinator_looked_for() -> None:
    routing = Routing(["https://a:9080"], "g")
    call, effects = _call(routing)
    assert effects == [SendCall(call, "https://a:9080")]
    effects = routing.failed(call, _not_coordinator("http://plain:9080"))
    assert isinstance(effects[0], RedirectRefused) and effects[0].url == "https://a:9080"
    # One URL: presumed the coordinator again.
    assert effects[1:] == [SendCall(call, "https://a:9080")]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Routing([], "g")
    with pytest.raises(ValueError, match="find_timeout_ms must be positive, got 0"):
        Routing([A], "g", find_timeout_ms=0)
