"""Read-only views of the core's state for the admin API and metrics."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.records import MemberRecord


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str | None
    protocol_name: str | None
    generation_id: int
    member_count: int


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str | None
    protocol_name: str | None
    generation_id: int
    leader: str | None
    #: each member as its record (frozen, so the view is a safe copy): the admin
    #: JSON shows its ``SHOWN_MEMBER_FIELDS`` (coordinator/admin_views.py).
    members: tuple[MemberRecord, ...]


@dataclass(frozen=True, slots=True)
class DrainCounts:
    """Members of "resources" groups draining (their metadata says so) and asked
    to drain by an operator but not draining yet (the metrics' gauges)."""

    draining: int = 0
    requested: int = 0
