"""Helpers of the client tests (imported by conftest.py and the tests).

``coordinator``: the real coordinator core and runtime in this event loop,
with an in-memory store and no HTTP; members talk to it through
:class:`InProcessTransport` (the member's one-method transport swapped, as
docs/architecture.md practice 7 intends). Wall-clock time, small session timeouts.

:class:`Ledger` records every listener callback with a timestamp and checks
the ownership invariant: at no instant do two members hold one resource.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.errors import CoordinatorUnavailableError
from client.listener import RebalanceListener, Resource
from client.member import GroupMember
from client.transport import CatalogResponse
from coordinator.core.commands import (
    Commit,
    Fetch,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
)
from coordinator.core.records import Record, Snapshot
from coordinator.runtime.runtime import Runtime
from protocol.catalog import Weights, Zones
from protocol.messages import (
    Api,
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    SyncRequest,
)


class MemoryStore:
    async def load(self) -> Snapshot:
        return Snapshot()

    async def write(self, records: Sequence[Record]) -> float:
        return 0.0

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        """In memory the journal is not kept: no rebalances to list."""
        return []

    def check(self) -> None:
        """In memory: no file to find replaced."""


class InProcessCoordinator:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def put_resource(self, name: str, partitions: int, weights: Weights | None = None,
                           zones: Zones | None = None) -> None:
        runtime = self.runtime
        await runtime.call(PutResource(runtime.new_request_id(), name, partitions, weights, zones))

    def transport(self) -> InProcessTransport:
        return InProcessTransport(self)


class InProcessTransport:
    """The member's transport over the in-process runtime. ``partitioned``
    makes every call fail as a cut network would (after ``cut_delay_s``)."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        self.coordinator = coordinator
        self.partitioned = False
        self.cut_delay_s = 0.05
        self.calls: list[str] = []

    async def call(self, api: str, request: Any) -> Any:
        self.calls.append(api)
        if self.partitioned:
            await asyncio.sleep(self.cut_delay_s)
            raise CoordinatorUnavailableError(f"{api}: partitioned (test)")
        runtime = self.coordinator.runtime
        if api == Api.RESOURCES:
            return CatalogResponse(runtime.core.resources_epoch, dict(runtime.core.catalog()),
                                   dict(runtime.core.catalog_placement()))
        if isinstance(request, JoinRequest):
            return await runtime.call(Join(runtime.new_request_id(), request, "127.0.0.1",
                                           f"m-{uuid.uuid4().hex}"))
        command: Any = {SyncRequest: Sync, HeartbeatRequest: Heartbeat, LeaveRequest: Leave,
                        CommitRequest: Commit, FetchRequest: Fetch}[type(request)]
        return await runtime.call(command(runtime.new_request_id(), request))


def admin_put_resource(admin_url: str, name: str, partitions: int) -> None:
    """``PUT /v1/resources/{name}`` on a real server's admin port: set ``name``
    to ``partitions`` partitions (raises on an error status)."""
    req = urllib.request.Request(f"{admin_url}/v1/resources/{name}", method="PUT",
                                 data=json.dumps({"partitions": partitions}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 201, 204), resp.status


# ---------------------------------------------------------------- the ledger


@dataclass
class Ledger:
    """Every callback of every member, in the order they ran, stamped by
    ``clock`` (seconds; ``virtual_time.loop_s`` for a test in virtual time)."""

    events: list[tuple[float, str, str, frozenset[Resource]]] = field(default_factory=list)
    clock: Callable[[], float] = time.time

    def listener(self, member: str) -> LedgerListener:
        return LedgerListener(self, member)

    def record(self, member: str, kind: str, resources: Iterable[Resource]) -> None:
        self.events.append((self.clock(), member, kind, frozenset(resources)))

    def check(self) -> dict[Resource, str]:
        """Replay; fail on double ownership; return who holds what at the end."""
        return check_ledger(self.events)

    def revoked_or_lost(self, member: str, since: float = 0.0) -> set[Resource]:
        return {r for t, m, k, rs in self.events if m == member and t >= since
                and k in ("revoked", "lost") for r in rs}

    def count(self, member: str, kind: str, since: float = 0.0) -> int:
        return sum(1 for t, m, k, _ in self.events if m == member and k == kind and t >= since)


def check_ledger(events: Iterable[tuple[float, str, str, Iterable[Resource]]]) -> dict[
        Resource, str]:
    holder: dict[Resource, str] = {}
    for t, member, kind, resources in sorted(events, key=lambda e: e[0]):
        for r in resources:
            if kind in ("standby", "standby_dropped"):
                # A standby is never owned: never given as one while held.
                assert kind == "standby_dropped" or holder.get(r) != member, (
                    f"{r} given to {member} as standby at {t:.6f} while it owns it")
                continue
            if kind == "assigned":
                other = holder.get(r)
                assert other is None or other == member, (
                    f"{r} assigned to {member} at {t:.6f} while {other} still holds it")
                holder[r] = member
            else:
                assert holder.get(r) == member, (
                    f"{member} {kind} {r} at {t:.6f} but the ledger says {holder.get(r)}")
                del holder[r]
    return holder


def read_ledger_files(paths: Iterable[Path]) -> list[tuple[float, str, str, list[Resource]]]:
    """JSON lines written by member processes: {t, member, kind, resources}."""
    events = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            ev = json.loads(line)
            events.append((ev["t"], ev["member"], ev["kind"],
                           [(s, i) for s, i in ev["resources"]]))
    return events


class LedgerListener(RebalanceListener):
    def __init__(self, ledger: Ledger, member: str) -> None:
        self.ledger = ledger
        self.member = member
        self.assigned_calls = 0
        #: seconds ``on_standby`` takes per resource (warming it up).
        self.warmup_s = 0.0

    async def on_assigned(self, resources: set[Resource]) -> None:
        self.assigned_calls += 1
        self.ledger.record(self.member, "assigned", resources)

    async def on_revoked(self, resources: set[Resource]) -> None:
        self.ledger.record(self.member, "revoked", resources)

    async def on_lost(self, resources: set[Resource]) -> None:
        self.ledger.record(self.member, "lost", resources)

    async def on_standby(self, resources: set[Resource]) -> None:
        self.ledger.record(self.member, "standby", resources)
        if self.warmup_s:
            await asyncio.sleep(self.warmup_s * len(resources))

    async def on_standby_dropped(self, resources: set[Resource]) -> None:
        self.ledger.record(self.member, "standby_dropped", resources)


def owners(members: Iterable[GroupMember]) -> dict[Resource, int]:
    """How many of ``members`` hold each resource (every one should be 1)."""
    count: dict[Resource, int] = {}
    for m in members:
        for r in m.assignment:
            count[r] = count.get(r, 0) + 1
    return count


async def eventually(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Await until ``predicate()`` is true; fail after ``timeout_s`` of the
    running loop's time (real time, or virtual time on a ``VirtualTimeLoop``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if predicate():
            return
        await asyncio.sleep(interval_s)
    assert predicate(), f"condition not met within {timeout_s}s"
