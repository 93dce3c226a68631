"""A runtime test harness: the real core and SQLite storage behind a gate, a fake clock.

``HeldStorage`` holds every storage transaction until the test opens its gate,
so a test can look at what is answered while a commit is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.core.commands import (
    Command,
    Commit,
    Fetch,
    Heartbeat,
    Join,
    PutResource,
    Sync,
)
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.records import Record, Snapshot
from coordinator.metrics import Metrics
from coordinator.runtime.clock import FakeClock
from coordinator.runtime.runtime import Answer, Runtime
from coordinator.storage.sqlite import Storage
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    JoinResponse,
    SyncAssignment,
    SyncRequest,
)

CONFIG = CoreConfig(min_session_timeout_ms=100, max_session_timeout_ms=60_000,
                    initial_rebalance_delay_ms=0)
SESSION_MS = 10_000


class HeldStorage:
    """The real storage, with a gate: writes wait until the test opens it."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[Record]] = []
        self.fail_with: Exception | None = None
        self.waiting = asyncio.Event()
        #: set with the gate: the gate closes again behind the next transaction.
        self.close_after_one = False

    async def load(self) -> Snapshot:
        return await self.inner.load()

    async def load_group(self, group_id: str) -> Snapshot:
        return await self.inner.load_group(group_id)

    def check(self) -> None:
        self.inner.check()

    async def write(self, records: Sequence[Record]) -> float:
        self.batches.append(list(records))
        self.waiting.set()
        await self.gate.wait()
        if self.close_after_one:
            # Let this transaction through and hold the next one.
            self.close_after_one = False
            self.gate.clear()
        self.waiting.clear()
        if self.fail_with is not None:
            raise self.fail_with
        return await self.inner.write(records)


class SpyCore:
    """The real core; remembers every command it was given."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.commands: list[Command] = []

    def handle(self, now_ms: int, command: Command) -> Any:
        self.commands.append(command)
        return self.core.handle(now_ms, command)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


@dataclass
class Harness:
    runtime: Runtime
    clock: FakeClock
    storage: HeldStorage
    core: SpyCore
    metrics: Metrics

    def join(self, member_id: str = "", group: str = "g", instance: str | None = None,
             principal: str | None = None) -> asyncio.Task[Answer]:
        req = JoinRequest(group_id=group, member_id=member_id, protocol_type="test",
                          protocols=(("range", b"meta"),), session_timeout_ms=SESSION_MS,
                          rebalance_timeout_ms=SESSION_MS, group_instance_id=instance,
                          client_id="test")
        rid = self.runtime.new_request_id()
        return asyncio.ensure_future(self.runtime.call(
            Join(rid, req, "127.0.0.1", f"test-{rid:032x}", principal)))

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
             group: str = "g", principal: str | None = None) -> asyncio.Task[Answer]:
        req = SyncRequest(group_id=group, member_id=member_id, generation_id=generation,
                          assignments=tuple(SyncAssignment(m, a)
                                            for m, a in (assignments or {}).items()))
        return asyncio.ensure_future(self.runtime.call(
            Sync(self.runtime.new_request_id(), req, principal)))

    def heartbeat(self, member_id: str, generation: int, group: str = "g",
                  wait_ms: int = 0) -> asyncio.Task[Answer]:
        req = HeartbeatRequest(group_id=group, member_id=member_id, generation_id=generation,
                               wait_ms=wait_ms)
        return asyncio.ensure_future(self.runtime.call(
            Heartbeat(self.runtime.new_request_id(), req)))

    def commit(self, member_id: str, generation: int, value: int,
               group: str = "g") -> asyncio.Task[Answer]:
        req = CommitRequest(group_id=group, member_id=member_id, generation_id=generation,
                            checkpoints=(("orders", 0, value),))
        return asyncio.ensure_future(self.runtime.call(Commit(self.runtime.new_request_id(), req)))

    def fetch(self, group: str = "g") -> asyncio.Task[Answer]:
        req = FetchRequest(group_id=group)
        return asyncio.ensure_future(self.runtime.call(Fetch(self.runtime.new_request_id(), req)))

    def put_resource(self, name: str, partitions: int) -> asyncio.Task[Answer]:
        return asyncio.ensure_future(self.runtime.call(
            PutResource(self.runtime.new_request_id(), name, partitions)))

    async def stable_member(self, group: str = "g", principal: str | None = None
                            ) -> tuple[str, int]:
        """One dynamic member through join, rejoin and sync: (member_id, generation)."""
        first = await self.join(group=group, principal=principal)
        assert isinstance(first, JoinResponse)
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        joining = self.join(first.member_id, group=group, principal=principal)
        await settle()
        self.clock.advance(0)  # the (zero) initial rebalance delay
        joined = await asyncio.wait_for(joining, 5)
        assert isinstance(joined, JoinResponse) and joined.error is None, joined
        synced = await asyncio.wait_for(
            self.sync(joined.member_id, joined.generation_id, {joined.member_id: b"A"},
                      group=group, principal=principal), 5)
        assert synced.error is None, synced
        return joined.member_id, joined.generation_id


async def settle() -> None:
    """Let ready tasks run (the runtime's steps are synchronous between awaits)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def make_harness(path: Path, config: CoreConfig = CONFIG, **runtime_options: Any
                       ) -> Harness:
    storage = HeldStorage(await Storage.open(path))
    clock = FakeClock()
    core = SpyCore(GroupCoordinator(config))
    metrics = Metrics()
    runtime = Runtime(core, storage, clock, metrics, **runtime_options)
    await runtime.start()
    return Harness(runtime, clock, storage, core, metrics)
