"""The runtime with a database file deleted under it.

A commit after the file is gone must not be acknowledged; an idle server
must notice within ``storage_check_interval_ms`` (``/readyz`` reads
``runtime.ready``). Both take the storage-failure path of a failed write.
(A real process: tests/e2e/test_e2e_storage_files.py.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runtime_kit import Harness, make_harness, settle

from coordinator.runtime.runtime import STORAGE_CHECK_INTERVAL_MS, Runtime
from protocol.errors import ErrorCode


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await make_harness(tmp_path / "g.db")
    try:
        yield h
    finally:
        await h.runtime.stop()
        await h.storage.inner.close()


def remove_database(harness: Harness) -> None:
    path = harness.storage.inner.path
    for suffix in ("", "-wal", "-shm"):
        os.unlink(path + suffix)


async def test_a_commit_after_the_database_was_deleted_is_not_acknowledged(
        harness: Harness) -> None:
    member, generation = await harness.stable_member()
    assert (await harness.commit(member, generation, 1)).error is None
    remove_database(harness)
    answer = await asyncio.wait_for(harness.commit(member, generation, 2), 5)
    assert answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert harness.runtime.failed.is_set()
    assert not harness.runtime.ready
    assert harness.metrics.storage_failures._value.get() == 1
    later = await harness.heartbeat(member, generation)
    assert later.error is ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_an_idle_runtime_notices_the_deleted_database_within_the_interval(
        harness: Harness) -> None:
    member, generation = await harness.stable_member()
    harness.clock.advance(STORAGE_CHECK_INTERVAL_MS)  # checked, still there: nothing
    await settle()
    assert harness.runtime.ready and not harness.runtime.failed.is_set()
    remove_database(harness)
    harness.clock.advance(STORAGE_CHECK_INTERVAL_MS - 1)
    assert harness.runtime.ready
    harness.clock.advance(1)
    assert not harness.runtime.ready
    assert harness.runtime.failed.is_set()
    assert harness.metrics.ready._value.get() == 0
    # The member's session timer was cancelled with the rest: nothing is armed.
    assert harness.runtime.timer_keys() == []
    assert harness.clock.pending() == []
    beat = await harness.heartbeat(member, generation)
    assert beat.error is ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_the_idle_check_is_off_at_zero(tmp_path: Path) -> None:
    h = await make_harness(tmp_path / "g.db", storage_check_interval_ms=0)
    try:
        assert h.clock.pending() == []
        with pytest.raises(ValueError, match="storage_check_interval_ms: must be >= 0"):
            Runtime(h.core, h.storage, h.clock, storage_check_interval_ms=-1)
    finally:
        await h.runtime.stop()
        await h.storage.inner.close()
