"""A large commit (tens of thousands of checkpoints, about 1 MB) is decoded,
validated and encoded into rows off the event loop (coordinator/offload.py),
so the loop goes on answering other groups meanwhile; small calls stay on it.
Either way the commit is answered as before: written whole, or refused with a
400 naming the field."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from listeners_kit import InProcess, serve_in_process

from coordinator import offload
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http import calls as calls_module
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage import sqlite as sqlite_module
from coordinator.storage.sqlite import Storage

MSGPACK = {"Content-Type": "application/msgpack"}
#: about 1 MB of msgpack.
COUNT = 50_000


class Threads:
    """Which thread parsed each commit and encoded each checkpoint record."""

    def __init__(self) -> None:
        self.parsed: list[tuple[int, bool]] = []
        self.encoded: list[tuple[int, bool]] = []


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[InProcess, GroupCoordinator, Storage, Threads]]:
    threads = Threads()
    loop_thread = threading.get_ident()
    parse_commit, make_commit = calls_module.PROTOCOL_APIS["commit"]

    def watched_parse(wire: Any) -> Any:
        msg = parse_commit(wire)
        threads.parsed.append((len(msg.checkpoints), threading.get_ident() == loop_thread))
        return msg

    statements: Callable[[Any], Any] = sqlite_module._statements

    def watched_statements(record: Any) -> Any:
        if hasattr(record, "checkpoints"):
            threads.encoded.append((len(record.checkpoints),
                                    threading.get_ident() == loop_thread))
        return statements(record)

    apis = dict(calls_module.PROTOCOL_APIS)
    apis["commit"] = (watched_parse, make_commit)
    monkeypatch.setattr(calls_module, "PROTOCOL_APIS", apis)
    monkeypatch.setattr(sqlite_module, "_statements", watched_statements)
    storage = await Storage.open(tmp_path / "g.db")
    core = GroupCoordinator(CoreConfig(initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()
    async with serve_in_process(runtime, metrics, max_body_bytes=2 * 1024 * 1024) as client:
        yield client, core, storage, threads
    await runtime.stop()
    await storage.close()


def _commit(group: str, checkpoints: list[list[Any]]) -> bytes:
    return msgpack.packb({"group_id": group, "member_id": "tool", "generation_id": -1,
                          "checkpoints": checkpoints}, use_bin_type=True)


async def test_a_large_commit_is_read_and_encoded_off_the_loop_and_written_whole(
        served: tuple[InProcess, GroupCoordinator, Storage, Threads]) -> None:
    client, core, storage, threads = served
    body = _commit("big", [["s", i, i] for i in range(COUNT)])
    assert len(body) >= offload.LARGE_BODY_BYTES
    resp = await client.post("/v1/commit", data=body, headers=MSGPACK)
    assert resp.status == 200 and msgpack.unpackb(await resp.read())["error"] is None
    small = _commit("small", [["s", 0, 1]])
    resp = await client.post("/v1/commit", data=small, headers=MSGPACK)
    assert resp.status == 200 and msgpack.unpackb(await resp.read())["error"] is None
    # (count, on the loop's thread): the large one on the worker, the small one inline.
    assert threads.parsed == [(COUNT, False), (1, True)]
    assert threads.encoded == [(COUNT, False), (1, True)]
    assert len(core.checkpoints("big")) == COUNT
    on_disk = await storage.load()
    assert len(on_disk.checkpoints["big"]) == COUNT


async def test_a_large_commit_with_a_bad_field_is_a_400_naming_it(
        served: tuple[InProcess, GroupCoordinator, Storage, Threads]) -> None:
    client, core, _storage, threads = served
    checkpoints: list[list[Any]] = [["s", i, i] for i in range(COUNT)]
    checkpoints[-1] = ["s", -1, 0]
    resp = await client.post("/v1/commit", data=_commit("big", checkpoints), headers=MSGPACK)
    assert resp.status == 400
    answer = msgpack.unpackb(await resp.read())
    assert answer["error"] == "INVALID_REQUEST"
    assert answer["message"].startswith(f"checkpoints[{COUNT - 1}][1]")
    assert core.checkpoints("big") == {} and threads.encoded == []
