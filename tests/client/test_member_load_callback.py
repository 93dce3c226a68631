"""``load_callback``: the member asks the application for the load of what it
owns once a heartbeat interval while stable, and the answer goes where
``report_load``'s goes. Against the real server: a load that rises makes the
member rejoin once, cooperatively (``balanced`` moves the hot resource; the
ledger shows no resource held twice), and a load that keeps rising makes it
rejoin no more often than ``load_rejoin_interval_ms``. ``BlockingGroupMember``
runs a plain-function callback on its member thread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from client_harness import Ledger, admin_put_resource, eventually

from client import BlockingGroupMember, GroupMember, Resource

pytestmark = pytest.mark.timeout(90)

HEARTBEAT_MS = 200
FAST: dict[str, Any] = dict(session_timeout_ms=3_000, heartbeat_interval_ms=HEARTBEAT_MS,
                            rebalance_timeout_ms=5_000, retry_backoff_ms=20,
                            retry_backoff_max_ms=100, assignors=["balanced"])
LOAD_REJOIN = "rebalance started (measured load"


def load_rejoins(caplog: pytest.LogCaptureFixture, client_id: str) -> list[float]:
    """When ``client_id`` started a rebalance for its measured load (wall seconds)."""
    return [r.created for r in caplog.records
            if r.getMessage().startswith(f"member {client_id}: {LOAD_REJOIN}")]


def test_a_rising_load_from_the_callback_rejoins_once_cooperatively(
        start_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="groupcoord.client")
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 4)
    asyncio.run(_rising_once(server.url, caplog))
    assert server.terminate() == 0


async def _rising_once(url: str, caplog: pytest.LogCaptureFixture) -> None:
    true_load: dict[Resource, float] = {("s", i): 1.0 for i in range(4)}
    calls: dict[str, list[tuple[float, frozenset[Resource]]]] = {"a": [], "b": []}

    def measure(name: str) -> Any:
        async def callback(owned: frozenset[Resource]) -> Mapping[Resource, float]:
            calls[name].append((time.monotonic(), owned))
            await asyncio.sleep(0)  # a coroutine callback: it may await its metrics
            return {r: true_load[r] for r in owned}
        return callback

    ledger = Ledger()
    a = GroupMember(url, "g", ["s"], client_id="a", listener=ledger.listener("a"),
                    load_callback=measure("a"), load_rejoin_interval_ms=60_000, **FAST)
    b = GroupMember(url, "g", ["s"], client_id="b", listener=ledger.listener("b"),
                    load_callback=measure("b"), load_rejoin_interval_ms=60_000, **FAST)
    async with a, b:
        await eventually(lambda: len(a.assignment) == 2 and len(b.assignment) == 2,
                         timeout_s=15)
        await asyncio.sleep(1.0)  # settled: the loads match the catalog's weights
        generation = a.generation_id
        assert load_rejoins(caplog, "a") == load_rejoins(caplog, "b") == []
        # Called about once a heartbeat interval, with what the member owns.
        recent = [(t, owned) for t, owned in calls["a"] if t > time.monotonic() - 0.8]
        assert 2 <= len(recent) <= 6, calls["a"]
        assert recent[-1][1] == a.assignment
        gaps = [t2 - t1 for (t1, _), (t2, _) in pairwise(recent)]
        assert min(gaps) >= 0.8 * HEARTBEAT_MS / 1000, gaps
        # One of a's resources gets ten times as busy, and stays so.
        hot = min(a.assignment)
        kept = a.assignment - {hot}
        true_load[hot] = 10.0
        # balanced places by the measured load: the hot resource ends up alone.
        await eventually(lambda: any(m.assignment == {hot} for m in (a, b)), timeout_s=15)
        await asyncio.sleep(2.0)  # a dozen more measurements: nothing more happens
        assert len(load_rejoins(caplog, "a")) == 1
        assert load_rejoins(caplog, "b") == []
        assert a.generation_id > generation
        other = b if a.assignment == {hot} else a
        assert other.assignment == set(true_load) - {hot}
        if other is b:
            # Cooperative: what a kept was never revoked from it on the way.
            assert not ledger.revoked_or_lost("a") & kept - b.assignment
    ledger.check()


def test_a_load_that_keeps_rising_rejoins_no_more_often_than_the_interval(
        start_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A plain-function callback on a ``BlockingGroupMember`` (run on the member
    thread): its one member's load keeps rising, always outside the band the
    leader last gave; it rejoins once per ``load_rejoin_interval_ms``, no more."""
    caplog.set_level(logging.INFO, logger="groupcoord.client")
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 3)
    threads: set[str] = set()
    level = [1.0]

    def callback(owned: frozenset[Resource]) -> dict[Resource, float]:
        threads.add(threading.current_thread().name)
        level[0] *= 1.5
        return {r: level[0] for r in owned}

    interval_ms = 1_500
    with BlockingGroupMember(server.url, "g", ["s"], client_id="solo", load_callback=callback,
                             load_rejoin_interval_ms=interval_ms, **FAST):
        started = time.time()
        time.sleep(5.0)
        rejoins = load_rejoins(caplog, "solo")
    assert threads == {"groupcoord-member"}
    assert rejoins and rejoins[0] - started < 1.0  # the first measurement is out of band
    gaps = [t2 - t1 for t1, t2 in pairwise(rejoins)]
    assert len(rejoins) >= 3, rejoins  # 5 s of a rising load, one per 1.5 s
    assert all(g >= interval_ms / 1000 * 0.99 for g in gaps), gaps
    assert server.terminate() == 0
