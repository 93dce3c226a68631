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
from coordinator.runtime.runtime import REFUSAL_LOG_INTERVAL_MS, Answer, Runtime
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


async def test_one_member_parks_at_most_one_heartbeat(parked_limit: Harness) -> None:
    """One member's long-polls used to fill the limit alone."""
    h = parked_limit
    member, generation = await h.stable_member("A")
    polls = [h.heartbeat(member, generation, group="A", wait_ms=5_000) for _ in range(3)]
    await settle()
    # Each newer long-poll supersedes the older one, which is answered at once,
    # without error (the member is fine); only the newest stays parked.
    assert [p.done() for p in polls] == [True, True, False]
    assert [p.result().error for p in polls[:2]] == [None, None]
    assert h.runtime.core.parked_request_count() == 1
    assert refused(h, "max_parked_requests") == 0
    h.clock.advance(SESSION_MS // 2)
    assert (await asyncio.wait_for(polls[2], 5)).error is None


async def test_at_the_parked_limit_a_join_takes_the_place_of_a_long_poll(
        parked_limit: Harness) -> None:
    """Long-polls filling --max-parked-requests no longer make
    every other group's joins fail; a heartbeat at the limit is answered at once."""
    h = parked_limit
    a, gen_a = await h.stable_member("A")
    c, gen_c = await h.stable_member("C")
    b, gen_b = await h.stable_member("B")
    poll_a = h.heartbeat(a, gen_a, group="A", wait_ms=5_000)
    poll_c = h.heartbeat(c, gen_c, group="C", wait_ms=5_000)
    await settle()
    assert h.runtime.core.parked_request_count() == 2
    # A third long-poll (another member) is answered at once: the core got it as a
    # plain heartbeat (wait_ms 0), which renews the session as any heartbeat does.
    beat = await asyncio.wait_for(h.heartbeat(b, gen_b, group="B", wait_ms=5_000), 5)
    assert isinstance(beat, HeartbeatResponse) and beat.error is None
    last = h.core.commands[-1]
    assert isinstance(last, Heartbeat) and last.request.wait_ms == 0
    # A join of another group takes the place of the oldest long-poll (A's),
    # which is answered now, without error.
    joined = await asyncio.wait_for(h.join(group="D"), 5)
    assert isinstance(joined, JoinResponse) and joined.error is ErrorCode.MEMBER_ID_REQUIRED
    assert poll_a.done() and poll_a.result().error is None
    assert not poll_c.done()
    assert refused(h, "max_parked_requests") == 0
    poll_c.cancel()
    await settle()


async def test_when_joins_and_syncs_fill_the_limit_further_ones_are_refused(
        parked_limit: Harness) -> None:
    h = parked_limit
    member, generation = await h.stable_member("A")
    # A new member of B and one of E park their joins: each waits for the
    # group's current member to rejoin.
    parked = []
    for group in ("B", "E"):
        await h.stable_member(group)
        newcomer = await asyncio.wait_for(h.join(group=group), 5)
        parked.append(h.join(newcomer.member_id, group=group))
    await settle()
    assert not any(p.done() for p in parked)
    assert h.runtime.core.parked_request_count() == 2
    commands_before = len(h.core.commands)
    # A join (for a new group, or the member's own) and a sync are refused
    # before they reach the core: nothing is created or changed.
    joined = await asyncio.wait_for(h.join(group="C"), 5)
    assert isinstance(joined, JoinResponse)
    assert joined.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    rejoined = await asyncio.wait_for(h.join(member, group="A"), 5)
    assert rejoined.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    synced = await asyncio.wait_for(h.sync(member, generation, group="A"), 5)
    assert synced.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert not any(isinstance(c, (Join, Sync)) for c in h.core.commands[commands_before:])
    assert h.runtime.core.describe_group("C") is None
    assert h.runtime.core.describe_group("A").state == "Stable"
    assert refused(h, "max_parked_requests") == 3
    # The parked joins end (their callers go away): joins are served again.
    for p in parked:
        p.cancel()
    await settle()
    assert h.runtime.core.parked_request_count() == 0
    joined = await asyncio.wait_for(h.join(group="C"), 5)
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


@pytest.fixture
async def per_token(tmp_path: Path) -> AsyncIterator[Harness]:
    """4 parked requests in all, 2 per token."""
    h = await make_harness(tmp_path / "g.db", max_parked_requests=4, max_parked_per_token=2)
    yield h
    h.storage.gate.set()
    await h.runtime.stop()
    await h.storage.inner.close()


async def _park_newcomers(h: Harness, group: str, count: int, principal: str | None
                          ) -> list[asyncio.Task[Answer]]:
    """Member ids minted in ``group`` (a Stable group of one member), each joining
    with its id: what one client can send. Returns the joins."""
    minted = []
    for _ in range(count):
        first = await asyncio.wait_for(h.join(group=group, principal=principal), 5)
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        minted.append(first.member_id)
    joins = []
    for member_id in minted:
        joins.append(h.join(member_id, group=group, principal=principal))
        await settle()
    return joins


async def test_one_token_filling_its_share_leaves_room_for_another(per_token: Harness) -> None:
    """The security re-attack: one member minting member ids parked a join per id
    until --max-parked-requests was full and every other tenant's joins were
    refused. A token now parks at most --max-parked-per-token joins and syncs."""
    h = per_token
    await h.stable_member("A", principal="a")
    await h.stable_member("B", principal="b")
    a_joins = await _park_newcomers(h, "A", 4, "a")
    # Two of a's joins park; the next ones are refused before the core, so a's
    # minted member ids never join (and changed nothing).
    assert [j.done() for j in a_joins] == [False, False, True, True]
    assert [j.result().error for j in a_joins[2:]] == [ErrorCode.COORDINATOR_NOT_AVAILABLE] * 2
    assert h.runtime.core.parked_by("a") == 2
    assert refused(h, "max_parked_per_token") == 2
    # b's newcomer is admitted: it parks its join like any other.
    b_joins = await _park_newcomers(h, "B", 1, "b")
    assert not b_joins[0].done()
    assert h.runtime.core.parked_by("b") == 1
    assert refused(h, "max_parked_requests") == 0
    # a's parked joins end (their callers gone): a is served again.
    for j in a_joins:
        j.cancel()
    b_joins[0].cancel()
    await settle()
    assert h.runtime.core.parked_by("a") == 0
    again = await _park_newcomers(h, "A", 1, "a")
    assert not again[0].done()
    again[0].cancel()
    await settle()


async def test_without_a_token_only_the_global_limit_applies(per_token: Harness) -> None:
    """Authentication off: every caller is the same anonymous one; no share applies,
    --max-parked-requests alone bounds the parked joins."""
    h = per_token
    await h.stable_member("A")
    joins = await _park_newcomers(h, "A", 5, None)
    assert [j.done() for j in joins] == [False] * 4 + [True]
    assert joins[4].result().error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert refused(h, "max_parked_per_token") == 0
    assert refused(h, "max_parked_requests") == 1
    for j in joins:
        j.cancel()
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
        with pytest.raises(ValueError, match="max_parked_per_token"):
            Runtime(GroupCoordinator(CONFIG), storage, FakeClock(), max_parked_per_token=-1)
    finally:
        await storage.close()
