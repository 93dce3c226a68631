"""Leases on a real PostgreSQL: acquire, renew, expiry, release, and fenced writes.

Times are the database's (``now()``): a lease of ``SHORT_MS`` is waited out
with a sleep a little longer than it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
from pg_harness import PASSWORD
from test_storage_sqlite import group, member

from coordinator.core.records import CatalogChanged, CheckpointsWritten
from coordinator.storage.leases import Leases
from coordinator.storage.postgres import FencedError, PostgresStorage, partition_of
from coordinator.storage.sqlite import StorageError

P = 8
LONG_MS = 60_000
SHORT_MS = 300


@dataclass
class Coordinator:
    id: str
    store: PostgresStorage
    leases: Leases


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    """Two coordinators, ``a`` and ``b``, each with its store and its lease connection."""
    made = []
    for cid in ("a", "b"):
        store = await PostgresStorage.open(pg_url, partitions=P, coordinator_id=cid)
        leases = await Leases.open(pg_url, cid, f"http://{cid}.example:9080")
        made.append(Coordinator(cid, store, leases))
    yield made[0], made[1]
    for c in made:
        await c.leases.close()
        await c.store.close()


async def test_leases_need_a_database_made_by_the_store(pg_url: str) -> None:
    with pytest.raises(StorageError, match="has no partitions yet") as caught:
        await Leases.open(pg_url, "a", "http://a")
    assert PASSWORD not in str(caught.value)


async def test_register_heartbeat_and_live_coordinators(
        pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    await a.leases.register()
    await b.leases.register()
    live = await a.leases.live_coordinators(within_ms=LONG_MS)
    assert [(c.id, c.url) for c in live] == [("a", "http://a.example:9080"),
                                             ("b", "http://b.example:9080")]
    assert all(0 <= c.last_seen_ms_ago < LONG_MS for c in live)
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    await a.leases.heartbeat()
    assert [c.id for c in await b.leases.live_coordinators(within_ms=SHORT_MS)] == ["a"]
    await a.leases.deregister()
    assert [c.id for c in await b.leases.live_coordinators(within_ms=LONG_MS)] == ["b"]
    await a.leases.heartbeat()  # a row removed meanwhile is made again
    assert [c.id for c in await b.leases.live_coordinators(within_ms=LONG_MS)] == ["a", "b"]


async def test_acquire_is_exclusive_until_expiry_and_each_owner_gets_a_new_epoch(
        pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    assert await a.leases.acquire(3, SHORT_MS) == 1
    assert await b.leases.acquire(3, LONG_MS) is None  # held
    assert await a.leases.acquire(3, LONG_MS) is None  # even by its owner: renew instead
    row = (await b.leases.leases())[3]
    assert (row.owner_id, row.owner_url, row.epoch, row.held) == (
        "a", "http://a.example:9080", 1, True)
    assert 0 < row.expires_in_ms <= SHORT_MS
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    assert not (await b.leases.leases())[3].held
    assert await b.leases.owners() == {}
    assert await b.leases.acquire(3, LONG_MS) == 2
    assert await a.leases.owners() == {3: "b"}
    with pytest.raises(ValueError, match=r"partition 8 is outside 0\.\.7"):
        await a.leases.acquire(8, LONG_MS)


async def test_renew_only_at_the_held_epoch(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    e1 = await a.leases.acquire(1, SHORT_MS)
    e2 = await a.leases.acquire(2, SHORT_MS)
    assert (e1, e2) == (1, 1)
    assert await a.leases.renew({1: 1, 2: 1}, LONG_MS) == {1, 2}
    assert (await a.leases.leases())[1].expires_in_ms > SHORT_MS
    assert await a.leases.renew({1: 0}, LONG_MS) == set()  # wrong epoch
    assert await b.leases.renew({1: 1}, LONG_MS) == set()  # not the owner
    assert await a.leases.renew({}, LONG_MS) == set()
    # Expired but nobody took it: renewed at the same epoch (nobody else wrote).
    assert await a.leases.renew({1: 1}, SHORT_MS) == {1}
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    assert await a.leases.renew({1: 1}, SHORT_MS) == {1}
    assert (await a.leases.leases())[1].epoch == 1
    # Taken over after expiry: a's renewal of it fails, the other one goes through.
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    assert await b.leases.acquire(1, LONG_MS) == 2
    assert await a.leases.renew({1: 1, 2: 1}, LONG_MS) == {2}


async def test_release_hands_off_at_once(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    epoch = await a.leases.acquire(5, LONG_MS)
    assert epoch == 1
    assert not await b.leases.release(5, 1)  # only the owner releases
    assert not await a.leases.release(5, 7)  # at its epoch
    assert await a.leases.release(5, 1)
    row = (await b.leases.leases())[5]
    assert (row.owner_id, row.owner_url, row.held) == (None, None, False)
    assert await b.leases.acquire(5, LONG_MS) == 2
    assert not await a.leases.release(5, 1)  # released already: nothing to do


async def test_a_lease_row_names_its_owners_admin_url_live_or_not(
        pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    a.leases.admin_url = "http://a.example:9081"
    await a.leases.register()
    await b.leases.register()                        # b says no admin URL
    assert await a.leases.acquire(2, LONG_MS) == 1
    assert await b.leases.acquire(3, LONG_MS) == 1
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    assert await b.leases.live_coordinators(within_ms=SHORT_MS) == []  # a is late
    rows = await b.leases.leases()
    assert (rows[2].owner_id, rows[2].held, rows[2].owner_admin_url) == (
        "a", True, "http://a.example:9081")          # named while its lease is held
    assert rows[3].owner_admin_url is None
    assert rows[4].owner_admin_url is None           # nobody's
    assert await a.leases.release(2, 1)
    assert (await b.leases.leases())[2].owner_admin_url is None


async def test_a_deposed_owners_fenced_write_fails_and_writes_nothing(
        pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    p = partition_of("g1", P)
    epoch_a = await a.leases.acquire(p, SHORT_MS)
    assert epoch_a is not None
    g1 = group("g1", "Stable", 1, member("m1", b"x"))
    await a.store.write([g1, CheckpointsWritten("g1", (("orders", 0, 1),))],
                        fence={p: epoch_a})
    # a pauses past its lease; b takes the partition over.
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)
    epoch_b = await b.leases.acquire(p, LONG_MS)
    assert epoch_b == epoch_a + 1
    later = group("g1", "Stable", 2, member("m1", b"y"))
    with pytest.raises(FencedError) as caught:
        await a.store.write([later, CheckpointsWritten("g1", (("orders", 0, 99),)),
                             CatalogChanged("orders", 4, 1)], fence={p: epoch_a})
    error = caught.value
    assert (error.partition, error.expected_epoch, error.owner, error.epoch) == (
        p, epoch_a, "b", epoch_b)
    assert str(error) == (
        f"database {a.store.path}: write fenced off: partition {p} is not held by 'a' at "
        f"epoch {epoch_a} any more (held by 'b' at epoch {epoch_b}); nothing written")
    snapshot = await b.store.load_partition(p)
    assert snapshot.groups == (g1,)
    assert snapshot.checkpoints == {"g1": {("orders", 0): 1}}
    assert snapshot.catalog == {}  # the global record of the batch was not written either
    # The new owner writes at its epoch.
    await b.store.write([later], fence={p: epoch_b})
    assert (await a.store.load_partition(p)).groups == (later,)


async def test_a_fence_must_cover_every_group_of_the_batch(
        pair: tuple[Coordinator, Coordinator], pg_url: str) -> None:
    a, _ = pair
    p = partition_of("g1", P)
    other = next(g for g in (f"x{i}" for i in range(100)) if partition_of(g, P) != p)
    epoch = await a.leases.acquire(p, LONG_MS)
    assert epoch is not None
    with pytest.raises(ValueError, match=f"record of group '{other}'"):
        await a.store.write([group("g1", "Stable", 1, member("m", b"")),
                             CheckpointsWritten(other, (("s", 0, 1),))], fence={p: epoch})
    assert (await a.store.load()).groups == ()
    unnamed = await PostgresStorage.open(pg_url)
    try:
        with pytest.raises(ValueError, match="needs the store opened with a coordinator_id"):
            await unnamed.write([], fence={p: epoch})
    finally:
        await unnamed.close()


async def test_a_takeover_waits_for_a_fenced_write_in_flight(
        pair: tuple[Coordinator, Coordinator], pg_url: str) -> None:
    """The lease row read FOR SHARE by a's fenced write holds b's acquisition back
    until the write committed, so b's load after acquiring sees what a wrote."""
    a, b = pair
    p = partition_of("g1", P)
    epoch = await a.leases.acquire(p, SHORT_MS)
    assert epoch is not None
    # A slow batch: each checkpoint insert takes a second inside a's transaction.
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("""
            CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
            CREATE TRIGGER slow BEFORE INSERT ON checkpoints
            FOR EACH ROW EXECUTE FUNCTION slow()""")
    finally:
        await conn.close()
    await asyncio.sleep(SHORT_MS * 1.5 / 1000)  # the lease expired; nobody took it yet
    writing = asyncio.ensure_future(a.store.write(
        [CheckpointsWritten("g1", (("orders", 0, 7),))], fence={p: epoch}))
    await asyncio.sleep(0.3)
    acquiring = asyncio.ensure_future(b.leases.acquire(p, LONG_MS))
    await asyncio.sleep(0.3)
    assert not writing.done()
    assert not acquiring.done()  # blocked on the lease row until a's COMMIT
    await asyncio.wait_for(writing, 10)
    assert await asyncio.wait_for(acquiring, 10) == epoch + 1
    assert (await b.store.load_partition(p)).checkpoints == {"g1": {("orders", 0): 7}}
