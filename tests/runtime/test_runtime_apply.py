"""The runtime with the real core, a fake clock and a real SQLite file.

What a user relies on: a reply is never released before the write it depends
on is committed; writes issued while one is in flight share the next
transaction; timers re-armed are not fired early; a storage failure stops
service instead of serving state that a restart would not reproduce.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runtime_kit import CONFIG, SESSION_MS, Harness, SpyCore, make_harness, settle

from coordinator.core.commands import Cancelled, Command, Heartbeat, Join
from coordinator.core.coordinator import GroupCoordinator
from coordinator.runtime.clock import FakeClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage, StorageError
from protocol.errors import ErrorCode
from protocol.messages import HeartbeatRequest, JoinRequest


async def test_calls_before_start_answer_load_in_progress(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path / "g.db")
    try:
        runtime = Runtime(GroupCoordinator(CONFIG), storage, FakeClock())
        req = HeartbeatRequest(group_id="g", member_id="m", generation_id=1)
        answer = await runtime.call(Heartbeat(runtime.new_request_id(), req))
        assert answer.error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    finally:
        await storage.close()


async def test_reply_waits_for_its_commit(harness: Harness) -> None:
    first = await harness.join()
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    harness.storage.gate.clear()
    joining = harness.join(first.member_id)
    await settle()
    harness.clock.advance(0)
    await asyncio.wait_for(harness.storage.waiting.wait(), 5)
    await settle()
    # The generation is formed in memory and its record handed to storage,
    # but the transaction has not committed: the join answer is held.
    assert not joining.done()
    assert harness.runtime.pending_writes >= 1
    loaded = await harness.storage.inner.load()
    assert loaded.groups == ()
    harness.storage.gate.set()
    joined = await asyncio.wait_for(joining, 5)
    assert joined.error is None and joined.generation_id == 1
    # ...and once released, the generation is on disk.
    loaded = await harness.storage.inner.load()
    assert [(g.group_id, g.generation_id) for g in loaded.groups] == [("g", 1)]


async def test_writes_during_a_commit_share_the_next_transaction(harness: Harness) -> None:
    member, generation = await harness.stable_member()
    batches_before = len(harness.storage.batches)
    harness.storage.gate.clear()
    first = harness.commit(member, generation, 1)
    await asyncio.wait_for(harness.storage.waiting.wait(), 5)
    later = [harness.commit(member, generation, v) for v in (2, 3, 4)]
    await settle()
    assert not first.done() and not any(t.done() for t in later)
    # A heartbeat issued now changes nothing, but its group has writes that
    # are not committed yet: it waits for them too.
    beat = harness.heartbeat(member, generation)
    await settle()
    assert not beat.done()
    harness.storage.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(first, *later, beat), 5)
    assert [a.error for a in answers] == [None] * 5
    # Three commits collected while the first was in flight: one transaction.
    assert len(harness.storage.batches) == batches_before + 2
    assert len(harness.storage.batches[-1]) == 3
    loaded = await harness.storage.inner.load()
    assert loaded.checkpoints["g"] == {("orders", 0): 4}


async def test_heartbeat_rearms_the_session_timer(harness: Harness) -> None:
    member, generation = await harness.stable_member()
    harness.clock.advance(SESSION_MS - 1)
    assert (await harness.heartbeat(member, generation)).error is None
    # Past the first deadline: that firing is stale and dropped.
    harness.clock.advance(SESSION_MS // 2)
    await settle()
    assert (await harness.heartbeat(member, generation)).error is None
    assert harness.metrics.session_expiries._value.get() == 0
    # No heartbeat for a whole session: the member expires.
    harness.clock.advance(SESSION_MS + 1)
    await settle()
    assert harness.metrics.session_expiries._value.get() == 1
    answer = await harness.heartbeat(member, generation)
    assert answer.error is ErrorCode.UNKNOWN_MEMBER_ID


async def test_a_caller_going_away_cancels_its_parked_request(harness: Harness) -> None:
    member, generation = await harness.stable_member()
    # A second member joins: the group rebalances and the new member's join parks
    # until the first one rejoins.
    first = await harness.join()
    parked = harness.join(first.member_id)
    await settle()
    assert not parked.done()
    parked.cancel()
    await settle()
    cancels = [c for c in harness.core.commands if isinstance(c, Cancelled)]
    assert len(cancels) == 1
    # A request that already has its answer is not reported as cancelled.
    done = harness.heartbeat(member, generation)
    await asyncio.wait_for(done, 5)
    assert len([c for c in harness.core.commands if isinstance(c, Cancelled)]) == 1


async def test_storage_failure_stops_service(harness: Harness) -> None:
    member, generation = await harness.stable_member()
    harness.storage.gate.clear()
    harness.storage.fail_with = StorageError("disk full")
    committing = harness.commit(member, generation, 7)
    await asyncio.wait_for(harness.storage.waiting.wait(), 5)
    harness.storage.gate.set()
    answer = await asyncio.wait_for(committing, 5)
    assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert harness.runtime.failed.is_set()
    assert not harness.runtime.ready
    later = await harness.heartbeat(member, generation)
    assert later.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert harness.metrics.storage_failures._value.get() == 1
    # Disk kept the state from before the failed write.
    loaded = await harness.storage.inner.load()
    assert "g" not in loaded.checkpoints


async def test_restart_resumes_a_stable_group(tmp_path: Path) -> None:
    h = await make_harness(tmp_path / "g.db")
    member, generation = await h.stable_member()
    assert (await h.commit(member, generation, 42)).error is None
    await h.runtime.stop()
    await h.storage.inner.close()

    h2 = await make_harness(tmp_path / "g.db")
    try:
        assert (await h2.heartbeat(member, generation)).error is None
        synced = await asyncio.wait_for(h2.sync(member, generation), 5)
        assert synced.error is None and synced.assignment == b"A"
        # No rebalance happened: no state change away from Stable was applied.
        assert h2.core.describe_group("g").state == "Stable"
        assert h2.core.describe_group("g").generation_id == generation
    finally:
        await h2.runtime.stop()
        await h2.storage.inner.close()


class FailingCore(SpyCore):
    """The real core, except that heartbeats hit a bug."""

    def handle(self, now_ms: int, command: Command) -> Any:
        if isinstance(command, Heartbeat):
            raise RuntimeError("a bug")
        return super().handle(now_ms, command)


async def test_a_core_bug_answers_unknown_server_error_and_stops_serving(
        tmp_path: Path) -> None:
    """The core may have changed part of its state before it raised. When it does not
    say which group's (a plain exception, not ``CoreFailure``), the runtime stops
    serving, as after a storage failure (``groupcoord serve`` exits and is restarted
    from what is durable); nothing half-changed is answered from. A failure the core
    confines to one group reloads that group alone (test_runtime_group_failure.py)."""
    storage = await Storage.open(tmp_path / "g.db")
    try:
        runtime = Runtime(FailingCore(GroupCoordinator(CONFIG)), storage, FakeClock())
        await runtime.start()
        join = JoinRequest(group_id="g", member_id="", protocol_type="resources",
                           protocols=(("range", b""),), session_timeout_ms=SESSION_MS,
                           rebalance_timeout_ms=SESSION_MS)
        answer = await runtime.call(Join(runtime.new_request_id(), join, "h", "fresh-id"))
        assert answer.error is ErrorCode.MEMBER_ID_REQUIRED
        req = HeartbeatRequest(group_id="g", member_id="m", generation_id=1)
        answer = await runtime.call(Heartbeat(runtime.new_request_id(), req))
        assert answer.error is ErrorCode.UNKNOWN_SERVER_ERROR
        assert runtime.failed.is_set() and not runtime.ready
        answer = await runtime.call(Join(runtime.new_request_id(), join, "h", "other-id"))
        assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        await runtime.stop()
    finally:
        await storage.close()
