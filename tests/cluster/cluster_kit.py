"""Coordinators in this process on a real PostgreSQL: hosts, and calls to them.

Each :class:`Node` is what ``groupcoord serve --db postgresql://`` runs, minus
the listeners: a :class:`PartitionHost` with its lease loop, on its own
connections, with the wall clock and a short lease so a test sees leases run
out in about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from coordinator.cluster.host import PartitionHost, lease_settings, writer_settings
from coordinator.cluster.service import ClusterService
from coordinator.core.commands import Commit, Fetch, Heartbeat, Join, Sync
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Answer, Runtime
from coordinator.storage.leases import Leases
from coordinator.storage.postgres import PostgresStorage
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    JoinResponse,
    NotCoordinatorAnswer,
    SyncAssignment,
    SyncRequest,
)

CONFIG = CoreConfig(min_session_timeout_ms=100, max_session_timeout_ms=60_000,
                    initial_rebalance_delay_ms=0)
LEASE_MS = 1_000
SESSION_MS = 30_000


class Node:
    """One coordinator: ``await Node.start(url, name)``, then ``await node.stop()``."""

    def __init__(self, name: str, host: PartitionHost, stores: list[PostgresStorage],
                 leases: Leases) -> None:
        self.name = name
        self.host = host
        self.service = ClusterService(host)
        self._stores = stores
        self._leases = leases
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, url: str, name: str, *, partitions: int = 6,
                    lease_ms: int = LEASE_MS) -> Node:
        writer = await PostgresStorage.open(url, partitions=partitions, coordinator_id=name,
                                            settings=writer_settings(lease_ms))
        reader = await PostgresStorage.open(url, partitions=partitions, coordinator_id=name)
        leases = await Leases.open(url, name, f"http://{name}:9080",
                                   admin_url=f"http://{name}:9081",
                                   settings=lease_settings(lease_ms))
        host = PartitionHost(writer_store=writer, reader_store=reader, leases=leases,
                             lease_ms=lease_ms, make_core=lambda: GroupCoordinator(CONFIG),
                             clock=WallClock(), metrics=Metrics())
        node = cls(name, host, [writer, reader], leases)
        await host.start()
        node.resume()
        return node

    def pause(self) -> None:
        """Stop the lease loop (as a process paused or cut from the database does):
        nothing is renewed any more."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def resume(self) -> None:
        self.task = asyncio.ensure_future(self.host.run())

    async def stop(self, hand_off: bool = True) -> None:
        self.pause()
        if hand_off:
            await self.host.stop()
        else:
            for number in list(self.host.partitions):
                self.host._drop(number, "test teardown")
        await self._leases.close()
        for store in self._stores:
            await store.close()

    def owned(self) -> set[int]:
        """Partitions served now (loaded, lease valid)."""
        now = time.monotonic()
        return {n for n, p in self.host.partitions.items()
                if p.runtime is not None and p.runtime.ready and not p.leaving
                and p.lease.valid(now)}

    def runtime_for(self, group_id: str) -> Runtime:
        target = self.host.route(group_id)
        assert not isinstance(target, NotCoordinatorAnswer), (self.name, group_id, target)
        return target


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0,
                   what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


async def stable_member(runtime: Runtime, group: str, instance: str = "i-1"
                        ) -> tuple[str, int]:
    """A static member joined and synced (leader, assigned b"A"): (member_id, generation)."""
    req = JoinRequest(group_id=group, member_id="", protocol_type="test",
                      protocols=(("range", b"meta"),), session_timeout_ms=SESSION_MS,
                      rebalance_timeout_ms=SESSION_MS, group_instance_id=instance,
                      client_id="test")
    rid = runtime.new_request_id()
    joined = await asyncio.wait_for(runtime.call(
        Join(rid, req, "127.0.0.1", f"{instance}-{rid:08x}")), 5)
    assert isinstance(joined, JoinResponse) and joined.error is None, joined
    sync = SyncRequest(group_id=group, member_id=joined.member_id,
                       generation_id=joined.generation_id, group_instance_id=instance,
                       assignments=(SyncAssignment(joined.member_id, b"A"),))
    synced = await asyncio.wait_for(runtime.call(Sync(runtime.new_request_id(), sync)), 5)
    assert synced.error is None, synced
    return joined.member_id, joined.generation_id


async def heartbeat(runtime: Runtime, group: str, member_id: str, generation: int) -> Answer:
    req = HeartbeatRequest(group_id=group, member_id=member_id, generation_id=generation)
    return await asyncio.wait_for(runtime.call(Heartbeat(runtime.new_request_id(), req)), 5)


async def commit(runtime: Runtime, group: str, member_id: str, generation: int,
                 value: int, sequence: int | None = None) -> Answer:
    req = CommitRequest(group_id=group, member_id=member_id, generation_id=generation,
                        checkpoints=(("orders", 0, value),), sequence=sequence)
    return await asyncio.wait_for(runtime.call(Commit(runtime.new_request_id(), req)), 5)


async def fetch(runtime: Runtime, group: str) -> Answer:
    return await asyncio.wait_for(runtime.call(
        Fetch(runtime.new_request_id(), FetchRequest(group_id=group))), 5)


async def stop_all(*nodes: Node) -> None:
    for node in nodes:
        with contextlib.suppress(Exception):
            await node.stop(hand_off=False)


__all__ = ["ErrorCode", "Node", "commit", "fetch", "heartbeat", "stable_member", "stop_all",
           "wait_for"]
