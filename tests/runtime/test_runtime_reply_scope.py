"""Reply after commit, per group (docs/architecture.md, practice 5).

What a user relies on: an answer is never released before every write its
group's state depends on is committed (its group's records and checkpoints,
and the catalog), yet a slow commit of one group's writes does not hold
another group's heartbeats. Storage here holds every transaction open until
the test releases it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runtime_kit import Harness, make_harness, settle

from coordinator.core.records import CatalogChanged, CheckpointsWritten
from protocol.messages import FetchResponse, HeartbeatResponse


@pytest.fixture
async def two_groups(tmp_path: Path) -> AsyncIterator[tuple[Harness, tuple[str, int],
                                                              tuple[str, int]]]:
    h = await make_harness(tmp_path / "g.db")
    a = await h.stable_member("A")
    b = await h.stable_member("B")
    yield h, a, b
    h.storage.gate.set()
    await h.runtime.stop()
    await h.storage.inner.close()


async def in_flight(h: Harness) -> None:
    """Wait until storage holds a transaction open."""
    await asyncio.wait_for(h.storage.waiting.wait(), 5)
    await settle()


async def test_a_heartbeat_of_group_b_is_answered_while_group_a_commits(
        two_groups: tuple[Harness, tuple[str, int], tuple[str, int]]) -> None:
    h, (a, gen_a), (b, gen_b) = two_groups
    h.storage.gate.clear()
    committing = h.commit(a, gen_a, 7, group="A")
    await in_flight(h)
    assert h.storage.batches[-1] == [CheckpointsWritten("A", (("orders", 0, 7),))]
    # B depends on nothing uncommitted: answered while A's transaction is open.
    beat_b = await asyncio.wait_for(h.heartbeat(b, gen_b, group="B"), 5)
    assert isinstance(beat_b, HeartbeatResponse) and beat_b.error is None
    # A's own heartbeat and fetch wait for A's write.
    beat_a = h.heartbeat(a, gen_a, group="A")
    fetch_a = h.fetch("A")
    await settle()
    assert not committing.done() and not beat_a.done() and not fetch_a.done()
    h.storage.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(committing, beat_a, fetch_a), 5)
    assert [x.error for x in answers] == [None, None, None]
    fetched = answers[2]
    assert isinstance(fetched, FetchResponse) and fetched.checkpoints == (("orders", 0, 7),)
    # ...and by the time they were released the write was on disk.
    assert (await h.storage.inner.load()).checkpoints["A"] == {("orders", 0): 7}


async def test_a_write_queued_behind_another_groups_commit_holds_its_own_group(
        two_groups: tuple[Harness, tuple[str, int], tuple[str, int]]) -> None:
    h, (a, gen_a), (b, gen_b) = two_groups
    c, gen_c = await h.stable_member("C")
    batches_before = len(h.storage.batches)
    h.storage.gate.clear()
    commit_a = h.commit(a, gen_a, 1, group="A")
    await in_flight(h)
    # B's commit collects in the next batch while A's is in flight: B's
    # heartbeat waits for that later batch, A's for the one in flight.
    commit_b = h.commit(b, gen_b, 2, group="B")
    beat_b = h.heartbeat(b, gen_b, group="B")
    beat_a = h.heartbeat(a, gen_a, group="A")
    await settle()
    assert not any(t.done() for t in (commit_a, commit_b, beat_b, beat_a))
    # A third group with no write pending is answered at once.
    beat_c = await asyncio.wait_for(h.heartbeat(c, gen_c, group="C"), 5)
    assert beat_c.error is None
    h.storage.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(commit_a, commit_b, beat_b, beat_a), 5)
    assert [x.error for x in answers] == [None] * 4
    # Group commit is kept: one transaction in flight, the next collected behind it.
    assert len(h.storage.batches) == batches_before + 2


async def test_a_heartbeat_waits_for_its_group_write_in_the_batch_behind_the_one_in_flight(
        two_groups: tuple[Harness, tuple[str, int], tuple[str, int]]) -> None:
    h, (a, gen_a), (b, gen_b) = two_groups
    h.storage.gate.clear()
    commit_a = h.commit(a, gen_a, 1, group="A")
    await in_flight(h)
    commit_b = h.commit(b, gen_b, 2, group="B")
    beat_b = h.heartbeat(b, gen_b, group="B")
    await settle()
    # Let A's transaction commit, but hold the next one (B's).
    h.storage.close_after_one = True
    h.storage.gate.set()
    assert (await asyncio.wait_for(commit_a, 5)).error is None
    await in_flight(h)
    assert h.storage.batches[-1] == [CheckpointsWritten("B", (("orders", 0, 2),))]
    await settle()
    assert not commit_b.done() and not beat_b.done()
    # A's heartbeat no longer depends on anything uncommitted.
    assert (await asyncio.wait_for(h.heartbeat(a, gen_a, group="A"), 5)).error is None
    h.storage.gate.set()
    assert [x.error for x in await asyncio.wait_for(asyncio.gather(commit_b, beat_b), 5)] \
        == [None, None]


async def test_a_catalog_write_holds_every_groups_answers(
        two_groups: tuple[Harness, tuple[str, int], tuple[str, int]]) -> None:
    h, (a, gen_a), (b, gen_b) = two_groups
    # B's member long-polls; a catalog change answers it with the new epoch.
    polling = h.heartbeat(b, gen_b, group="B", wait_ms=2_000)
    await settle()
    assert not polling.done()
    h.storage.gate.clear()
    putting = h.put_resource("orders", 4)
    await in_flight(h)
    assert h.storage.batches[-1] == [CatalogChanged("orders", 4, 1)]
    # Every heartbeat answer carries resources_epoch: none leaves before the
    # catalog write is durable, in any group, the parked one included.
    beat_a = h.heartbeat(a, gen_a, group="A")
    await settle()
    assert not putting.done() and not polling.done() and not beat_a.done()
    h.storage.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(putting, polling, beat_a), 5)
    assert [x.error for x in answers] == [None, None, None]
    assert [x.resources_epoch for x in answers[1:]] == [1, 1]
    # Once committed, nothing is held any more.
    h.storage.gate.clear()
    assert (await asyncio.wait_for(h.heartbeat(a, gen_a, group="A"), 5)).error is None
    assert h.runtime.pending_writes == 0
