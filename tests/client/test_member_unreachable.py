"""A member that cannot reach its coordinator.

It retries with backoff for as long as it runs, but its log backs off too
(one line at once, then after 1 s, 2 s, 4 s, ... of failures, each naming
the coordinator's URL once, never ``join: join:``), and ``close()`` stops it
promptly whatever it is doing: backing off, or waiting on a join the
coordinator never answers. The example worker is tested as a process in
test_worker_example.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import pytest
from virtual_time import loop_ms, run_virtual

from client.errors import CoordinatorUnavailableError
from client.member import GroupMember
from client.retry_log import RetryLog

pytestmark = pytest.mark.timeout(60)

URL = "http://coordinator.invalid:9080"


class Refused:
    """A transport whose every call fails as a refused connection does."""

    base_url = URL

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, api: str, request: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(0.001)
        raise CoordinatorUnavailableError(
            f"{api}: ClientConnectorError: Cannot connect to host coordinator.invalid:9080")


def test_the_log_of_an_unreachable_coordinator_backs_off(
        caplog: pytest.LogCaptureFixture) -> None:
    transport = Refused()

    async def main() -> None:
        member = GroupMember(transport, "g", ["s"], client_id="w1", clock=loop_ms)
        member.start()
        await asyncio.sleep(120)  # virtual time: two minutes of retries
        started = asyncio.get_running_loop().time()
        await member.close()
        assert asyncio.get_running_loop().time() - started < 0.01

    with caplog.at_level(logging.INFO, logger="groupcoord.client"):
        run_virtual(main)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    reports = [line for line in lines if "cannot reach the coordinator" in line]
    assert transport.calls >= 100  # retried about once a second (backoff capped at 1 s)
    # reported at 0, ~1, ~3, ~7, ~15, ~31, ~63 s: a handful, not one per attempt
    assert 5 <= len(reports) <= 9, reports
    assert all(line.count(URL) == 1 for line in reports), reports
    assert not [line for line in lines if "join: join:" in line], lines
    assert reports[0].startswith("member w1: cannot reach the coordinator at " + URL)
    assert "still cannot reach" in reports[-1]
    # nothing else is logged per attempt at INFO or above
    assert len(lines) <= len(reports) + 3, lines


def test_retry_log_reports_the_first_failure_then_backs_off_then_recovery() -> None:
    r = RetryLog("w1", URL, first_interval_ms=1_000, max_interval_ms=4_000)
    assert not r.failing
    first = r.failed(0, "join: refused")
    assert first is not None and URL in first and "join: refused" in first
    times = [t for t in range(100, 20_000, 100) if r.failed(t, "join: refused") is not None]
    assert times[:4] == [1_000, 3_000, 7_000, 11_000]  # 1 s, 2 s, 4 s, then the 4 s cap
    back = r.succeeded(20_000)
    assert back is not None and "again after 20.0 s" in back and URL in back
    assert r.succeeded(20_100) is None
    assert r.failed(30_000, "heartbeat: refused") is not None  # a new streak starts afresh
    with pytest.raises(ValueError):
        RetryLog("w1", URL, first_interval_ms=0)


def test_credentials_in_the_url_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        member = GroupMember("http://user:secret@127.0.0.1:1", "g", ["s"], client_id="w1")
        member.start()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if any("cannot reach" in r.getMessage() for r in caplog.records):
                break
        await member.close()

    with caplog.at_level(logging.INFO, logger="groupcoord.client"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert lines and "http://127.0.0.1:1" in lines[0] and "secret" not in lines[0]


async def test_close_stops_a_member_whose_join_is_never_answered() -> None:
    """A coordinator that accepts the connection and never answers: the join
    hangs in flight; close() abandons it at once."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # connections complete in the backlog, nothing is read
        host, port = listener.getsockname()
        member = GroupMember(f"http://{host}:{port}", "g", ["s"], client_id="w1")
        member.start()
        await asyncio.sleep(0.5)
        assert member.state.value == "joining"
        started = time.monotonic()
        await member.close()
        assert time.monotonic() - started < 1.0


async def test_leaving_async_with_by_cancellation_stops_the_join_promptly() -> None:
    """``async with`` waits for the first assignment; cancelling it (Ctrl-C in
    ``asyncio.run``) closes the member promptly while it retries."""
    member = GroupMember("http://127.0.0.1:1", "g", ["s"], client_id="w1")

    async def use() -> None:
        async with member:
            raise AssertionError("never assigned")

    task = asyncio.ensure_future(use())
    await asyncio.sleep(1.0)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 1.0
    assert member.state.value == "closed"
