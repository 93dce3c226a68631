"""The console's journal cache: a live group page asks for the timeline every
half second; the journal is read, and its rows summarized, once per change."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from coordinator.console.views import TIMELINE_LENGTH, JournalCache
from protocol.resources import ResourceAssignment


def row(generation: int) -> dict[str, Any]:
    return {"group_id": "g", "generation_id": generation, "protocol_type": "resources",
            "protocol_name": "balanced", "leader": "m", "member_count": 1,
            "members": [["m", None, "c"]], "joined": [], "left": [], "reason": "join",
            "started_ms": 0, "ended_ms": 1,
            "assignments": {"m": ResourceAssignment(
                {"s": [generation]}, why=(("s", generation, "load"),)).encode()}}


class Storage:
    def __init__(self) -> None:
        self.rows = [row(2), row(1)]
        self.reads = 0

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        self.reads += 1
        return self.rows[:limit]


async def test_the_timeline_is_summarized_once_per_journal_read() -> None:
    storage = Storage()
    now = [0.0]
    cache = JournalCache(SimpleNamespace(storage=storage), clock=lambda: now[0])  # type: ignore[arg-type]
    first = await cache.timeline("g", 2, TIMELINE_LENGTH)
    assert [(t["generation_id"], t["resources"]) for t in first] == [
        # s:2 gained with a why; s:1 revoked without one.
        (2, {"moved": 0, "assigned": 1, "revoked": 1, "causes": {"load": 1, "unknown": 1}}),
        (1, {"moved": 0, "assigned": 1, "revoked": 0, "causes": {"load": 1}})]
    now[0] = 0.5
    assert await cache.timeline("g", 2, TIMELINE_LENGTH) is first
    assert storage.reads == 1
    # A new generation: read and summarized again.
    storage.rows.insert(0, row(3))
    third = await cache.timeline("g", 3, TIMELINE_LENGTH)
    assert [t["generation_id"] for t in third] == [3, 2, 1]
    assert storage.reads == 2
