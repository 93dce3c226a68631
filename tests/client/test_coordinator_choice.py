"""CoordinatorChoice: which coordinator the router's calls go to (client.routing)."""

from __future__ import annotations

import pytest

from client.errors import CoordinatorUnavailableError
from client.routing import CoordinatorChoice
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse

URLS = ("http://a", "http://b/", "http://c")


def test_one_url_is_the_coordinator_from_the_start_several_are_found() -> None:
    assert CoordinatorChoice(["http://a/"]).current == "http://a"
    choice = CoordinatorChoice(URLS)
    assert choice.current is None
    assert choice.bootstrap == ("http://a", "http://b", "http://c")
    with pytest.raises(ValueError, match="at least one"):
        CoordinatorChoice([])


def test_find_order_starts_at_the_last_that_answered_and_asks_the_one_given_up_last() -> None:
    choice = CoordinatorChoice(URLS)
    assert choice.find_order() == ["http://a", "http://b", "http://c"]
    choice.answered("http://b")
    choice.current = "http://b"
    choice.forget("http://b")
    assert choice.current is None
    assert choice.find_order() == ["http://c", "http://a", "http://b"]
    # A round without an answer: the next starts one further on.
    choice.none_answered()
    choice.none_answered()
    assert choice.find_order() == ["http://a", "http://c", "http://b"]


def test_forget_only_the_current_coordinator() -> None:
    choice = CoordinatorChoice(URLS)
    choice.current = "http://a"
    choice.forget("http://c")
    assert choice.current == "http://a" and choice.failed is None


def test_redirect_target_follows_a_named_owner_or_looks_again() -> None:
    choice = CoordinatorChoice(URLS)
    choice.current = "http://a"
    assert choice.redirect_target("http://a", "http://b/") == "http://b"
    assert choice.redirect_target("http://a", "") is None
    assert choice.redirect_target("http://a", "http://a") is None
    # Another call moved on already: nothing to do.
    assert choice.redirect_target("http://c", "http://b") == ""


def test_found_target_names_the_owner_the_asked_one_or_none() -> None:
    choice = CoordinatorChoice(URLS)
    assert choice.found_target("http://a", FindCoordinatorResponse(None, "http://c/", 3)) \
        == "http://c"
    assert choice.found_target("http://a", FindCoordinatorResponse(None, "", 3)) == "http://a"
    with pytest.raises(CoordinatorUnavailableError, match="COORDINATOR_NOT_AVAILABLE"):
        choice.found_target("http://a", FindCoordinatorResponse(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, "", 3))


def test_https_members_follow_no_server_to_http() -> None:
    choice = CoordinatorChoice(["https://a", "https://b"])
    choice.check_named("https://c")
    with pytest.raises(ValueError, match="not an https:// URL"):
        choice.check_named("http://c")
