"""A failure stays in its group: the runtime with the real core and a real SQLite file.

An exception in the core while it handles one group's command, or a record of one
group the database will not take, answers that call with an error, evicts that
group and reloads it from what is durable, and leaves every other group serving
(as Kafka reverts one group's state when its write fails). Failures of no one
group (the catalog, the database itself) still stop the server.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_kit import Harness, settle

from coordinator.core import coordinator as core_module
from coordinator.core.commands import Heartbeat, PutResource
from coordinator.core.kernel import Kernel
from coordinator.core.records import CheckpointsWritten
from coordinator.storage.sqlite import RecordError, Storage
from protocol.errors import ErrorCode
from protocol.messages import FetchResponse, HeartbeatRequest


async def heartbeat_now(h: Harness, member: str, generation: int, group: str) -> Any:
    """A heartbeat applied at once (no task in between)."""
    req = HeartbeatRequest(group_id=group, member_id=member, generation_id=generation)
    return await h.runtime.call(Heartbeat(h.runtime.new_request_id(), req))


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached within 5 s")


def reloads(h: Harness, cause: str) -> float:
    value = h.metrics.registry.get_sample_value("groupcoord_reloaded_groups_total",
                                                {"cause": cause})
    return 0.0 if value is None else value


async def test_an_exception_in_the_core_for_one_group_reloads_it_alone(
        harness: Harness, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    h = harness
    others = [await h.stable_member(group) for group in ("a", "b")]
    bad_member, bad_generation = await h.stable_member("bad")
    real = core_module._HANDLERS[Heartbeat]

    def half_then_raise(k: Kernel, command: Heartbeat) -> None:
        if command.request.group_id == "bad":
            k.groups["bad"].generation_id += 40  # a change the durable state lacks
            raise RuntimeError("a bug in the core")
        real(k, command)

    monkeypatch.setitem(core_module._HANDLERS, Heartbeat, half_then_raise)
    caplog.set_level(logging.INFO, logger="groupcoord.runtime")
    answer = await heartbeat_now(h, bad_member, bad_generation, "bad")
    assert answer.error is ErrorCode.UNKNOWN_SERVER_ERROR
    assert h.runtime.ready and not h.runtime.failed.is_set()
    # Until it is reloaded its calls are answered as Kafka answers while loading.
    answer = await heartbeat_now(h, bad_member, bad_generation, "bad")
    assert answer.error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    # Every other group heartbeats undisturbed, before and during the reload.
    for member, generation in others * 3:
        group = "a" if (member, generation) == others[0] else "b"
        assert (await heartbeat_now(h, member, generation, group)).error is None
    await until(lambda: h.core.describe_group("bad") is not None)
    monkeypatch.setitem(core_module._HANDLERS, Heartbeat, real)
    # Reloaded from what is durable: the member and its generation, not the half-change.
    view = h.core.describe_group("bad")
    assert view is not None and view.generation_id == bad_generation
    answer = await heartbeat_now(h, bad_member, bad_generation, "bad")
    assert answer.error is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "group 'bad'" in errors[0].getMessage()
    assert "RuntimeError('a bug in the core')" in errors[0].getMessage()
    assert errors[0].exc_info is None  # one line; the traceback is at DEBUG
    assert reloads(h, "core") == 1


async def test_a_record_the_database_refuses_fails_its_group_alone(
        harness: Harness, tmp_path: Path) -> None:
    h = harness
    a_member, a_generation = await h.stable_member("a")
    bad_member, bad_generation = await h.stable_member("bad")
    assert (await h.commit(a_member, a_generation, 1, group="a")).error is None
    assert (await h.commit(bad_member, bad_generation, 1, group="bad")).error is None
    # The database itself refuses group bad's checkpoints from now on (a constraint,
    # through a connection of its own): the store cannot say which record it was.
    with sqlite3.connect(tmp_path / "g.db") as db:
        db.execute("CREATE TRIGGER refuse_bad BEFORE INSERT ON checkpoints "
                   "WHEN NEW.group_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    # Both commits go in one transaction.
    h.storage.gate.clear()
    committing_bad = h.commit(bad_member, bad_generation, 2, group="bad")
    committing_a = h.commit(a_member, a_generation, 2, group="a")
    await settle()
    h.storage.gate.set()
    bad = await asyncio.wait_for(committing_bad, 5)
    good = await asyncio.wait_for(committing_a, 5)
    assert bad.error is ErrorCode.UNKNOWN_SERVER_ERROR
    assert good.error is None
    assert h.runtime.ready and not h.runtime.failed.is_set()
    # They did share a transaction, which failed; each group's records were then
    # written apart.
    assert any({r.group_id for r in batch if isinstance(r, CheckpointsWritten)} == {"a", "bad"}
               for batch in h.storage.batches)
    assert reloads(h, "storage") == 1
    await until(lambda: h.core.describe_group("bad") is not None)
    # What is durable: a's new value; bad's old one, its member still in it.
    fetched = await h.fetch("a")
    assert isinstance(fetched, FetchResponse) and fetched.checkpoints == (("orders", 0, 2),)
    fetched = await h.fetch("bad")
    assert isinstance(fetched, FetchResponse) and fetched.checkpoints == (("orders", 0, 1),)
    assert (await heartbeat_now(h, bad_member, bad_generation, "bad")).error is None
    assert (await heartbeat_now(h, a_member, a_generation, "a")).error is None


async def test_the_store_names_the_group_of_a_value_it_cannot_encode(tmp_path: Path) -> None:
    """The storage codec checks values by the same definition as the edge: a record
    that slipped past it is refused by group before anything is written."""
    storage = await Storage.open(tmp_path / "s.db")
    try:
        with pytest.raises(RecordError) as raised:
            await storage.write([
                CheckpointsWritten("fine", (("s", 0, 1),), 1),
                CheckpointsWritten("bad", (("s", 0, 2**70),), 1)])
        assert raised.value.group_id == "bad"
        assert "outside the storable range" in str(raised.value)
        snapshot = await storage.load()
        assert snapshot.checkpoints == {}
    finally:
        await storage.close()


async def test_a_failure_of_no_one_group_still_stops_serving(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog is every group's: a core failure there cannot be confined."""
    def broken(k: Kernel, command: Any) -> None:
        raise RuntimeError("a bug in the catalog")

    monkeypatch.setitem(core_module._HANDLERS, PutResource, broken)
    answer = await harness.put_resource("shards", 4)
    assert answer.error is ErrorCode.UNKNOWN_SERVER_ERROR
    assert harness.runtime.failed.is_set() and not harness.runtime.ready
