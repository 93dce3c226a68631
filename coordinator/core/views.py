"""Read-only views of the core's state for the admin API and metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str | None
    protocol_name: str | None
    generation_id: int
    member_count: int


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: as the leader sent it; ``b""`` when none yet. The HTTP layer decodes it.
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str | None
    protocol_name: str | None
    generation_id: int
    leader: str | None
    members: tuple[MemberView, ...]
