"""Server limits in the runtime: ``--max-parked-requests``, and ``--max-groups`` as served.

What an operator relies on: at the limit a new join or sync is answered
``COORDINATOR_NOT_AVAILABLE`` (retriable) and changes nothing, a long-poll
heartbeat is answered at once (its session still renewed), service resumes
by itself once parked requests drain, every refusal is counted in
``groupcoord_requests_refused_total{reason}``, and the log gets one warning
a minute per limit, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runtime_kit import CONFIG, SESSION_MS, Harness, make_harness, settle

from coordinator.core.commands import Heartbeat, Join, Sync
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.runtime.clock import FakeClock
from coordinator.runtime.runtime import REFUSAL_LOG_INTERVAL_MS, Runtime
from coordinator.storage.sqlite import Storage
from protocol.errors import ErrorCode
from protocol.messages import HeartbeatResponse, JoinResponse


def refused(h: Harness, reason: str) -> float:
    value: float = h.metrics.requests_refused.labels(reason)._value.get()
    return value


@pytest.fixture
async def parked_limit(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await make_harness(tmp_path / "g.db", max_parked_requests=2)
    yield h
    h.storage.gate.set()
    await h.runtime.stop()
    await h.storage.inner.close()


async def test_at_the_parked_limit_joins_and_syncs_are_refused_and_heartbeats_answered_at_once(
        parked_limit: Harness) -> None:
    h = parked_limit
    member, generation = await h.stable_member("A")
    # Two long-polls fill the limit.
    polls = [h.heartbeat(member, generation, group="A", wait_ms=5_000) for _ in range(2)]
    await settle()
    assert not any(p.done() for p in polls)
    assert h.runtime.core.parked_request_count() == 2
    # A third long-poll is answered at once: the core got it as a plain
    # heartbeat (wait_ms 0), which renews the session as any heartbeat does.
    beat = await asyncio.wait_for(h.heartbeat(member, generation, group="A", wait_ms=5_000), 5)
    assert isinstance(beat, HeartbeatResponse) and beat.error is None
    last = h.core.commands[-1]
    assert isinstance(last, Heartbeat) and last.request.wait_ms == 0
    assert h.runtime.core.parked_request_count() == 2
    h.clock.advance(SESSION_MS // 2 - 1)
    await settle()
    commands_before = len(h.core.commands)
    # A join (for a new group, or the member's own) and a sync are refused
    # before they reach the core: nothing is created or changed.
    joined = await asyncio.wait_for(h.join(group="B"), 5)
    assert isinstance(joined, JoinResponse)
    assert joined.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    rejoined = await asyncio.wait_for(h.join(member, group="A"), 5)
    assert rejoined.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    synced = await asyncio.wait_for(h.sync(member, generation, group="A"), 5)
    assert synced.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert not any(isinstance(c, (Join, Sync)) for c in h.core.commands[commands_before:])
    assert h.runtime.core.describe_group("B") is None
    assert h.runtime.core.describe_group("A").state == "Stable"
    assert refused(h, "max_parked_requests") == 3
    # The long-polls end (held at most half the session): joins are served again.
    h.clock.advance(1)
    answers = await asyncio.wait_for(asyncio.gather(*polls), 5)
    assert [a.error for a in answers] == [None, None]
    assert h.runtime.core.parked_request_count() == 0
    joined = await asyncio.wait_for(h.join(group="B"), 5)
    assert joined.error is ErrorCode.MEMBER_ID_REQUIRED
    assert (await h.heartbeat(member, generation, group="A")).error is None


async def test_below_the_limit_joins_park_as_usual(parked_limit: Harness) -> None:
    h = parked_limit
    await h.stable_member("B")
    # A second member's join parks until the first rejoins: one parked
    # request, below the limit of 2.
    second = await asyncio.wait_for(h.join(group="B"), 5)
    parked = h.join(second.member_id, group="B")
    await settle()
    assert not parked.done()
    assert refused(h, "max_parked_requests") == 0
    parked.cancel()
    await settle()


async def test_max_groups_refusals_are_counted_and_logged_once_a_minute(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = CoreConfig(min_session_timeout_ms=CONFIG.min_session_timeout_ms,
                        max_session_timeout_ms=CONFIG.max_session_timeout_ms,
                        initial_rebalance_delay_ms=0, max_groups=1)
    h = await make_harness(tmp_path / "g.db", config)
    try:
        await h.stable_member("A")
        caplog.set_level(logging.WARNING, logger="groupcoord.runtime")
        for i in range(5):
            answer = await asyncio.wait_for(h.join(group=f"new-{i}"), 5)
            assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert refused(h, "max_groups") == 5
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "--max-groups reached" in warnings[0] and "'new-0'" in warnings[0]
        h.clock.advance(REFUSAL_LOG_INTERVAL_MS)
        await settle()
        answer = await asyncio.wait_for(h.join(group="later"), 5)
        assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2
        assert "4 more refused" in warnings[1]
        assert [g.group_id for g in h.runtime.core.list_groups()] == ["A"]
        rendered = h.metrics.render().decode()
        assert 'groupcoord_requests_refused_total{reason="max_groups"} 6.0' in rendered
    finally:
        await h.runtime.stop()
        await h.storage.inner.close()


async def test_a_negative_parked_limit_is_refused(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path / "g.db")
    try:
        with pytest.raises(ValueError, match="max_parked_requests"):
            Runtime(GroupCoordinator(CONFIG), storage, FakeClock(), max_parked_requests=-1)
    finally:
        await storage.close()
