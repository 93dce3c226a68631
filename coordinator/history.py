"""A group's rebalance history for operators (``GET /v1/groups/{id}/rebalances``).

The rebalance journal (docs/protocol.md, "Durability") keeps one row per completed
rebalance with the whole assignment. An operator asks of it: why did the group
rebalance, how long did it take, who came and went, and what moved. This
module answers from the rows alone (pure functions; the HTTP handler reads the
rows and encodes the answer).

What moved is counted between a generation and the one before it, resource by
resource, for groups of the ``resources`` protocol (other protocols' bytes
are opaque here):

``moved``
    owned in both generations, by different members;
``assigned``
    owned now, by nobody before;
``revoked``
    owned before, by nobody now.

A member is identified by its ``group_instance_id`` when it has one (a static
member that restarted keeps what it had: that is no move) and by its member
id otherwise. A cooperative hand-over shows as ``revoked`` in the first
generation and ``assigned`` in the follow-up one (KIP-429).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.core.records import JournalMember
from protocol.admin_docs import RebalanceMoves, RebalanceSummary
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import ResourceAssignment
from protocol.validate import ValidationError

Resource = tuple[str, int]


def owners(row: Mapping[str, Any]) -> dict[Resource, str] | None:
    """Resource -> owner (instance id, else member id) of one journal row;
    ``None`` when the row's assignments are not of the resources protocol."""
    if row.get("protocol_type") != RESOURCES:
        return None
    members = map(JournalMember._make, row.get("members", ()))
    identity = {m.member_id: (m.group_instance_id or m.member_id) for m in members}
    out: dict[Resource, str] = {}
    for member_id, blob in (row.get("assignments") or {}).items():
        try:
            assigned = ResourceAssignment.decode(blob).assigned
        except ValidationError:
            return None  # a leader sent bytes that are not a resources map
        who = identity.get(member_id, member_id)
        for name, indexes in assigned.items():
            for index in indexes:
                out[(name, index)] = who
    return out


def moves(before: Mapping[Resource, str], after: Mapping[Resource, str]) -> RebalanceMoves:
    """``moved``, ``assigned`` and ``revoked`` counts between two owner maps."""
    moved = sum(1 for r, who in after.items() if r in before and before[r] != who)
    assigned = sum(1 for r in after if r not in before)
    revoked = sum(1 for r in before if r not in after)
    return RebalanceMoves(moved=moved, assigned=assigned, revoked=revoked)


def summarize(rows_newest_first: Sequence[Mapping[str, Any]], limit: int
              ) -> list[RebalanceSummary]:
    """The newest ``limit`` rebalances, newest first.

    ``rows_newest_first`` holds up to ``limit + 1`` journal rows: the extra
    (oldest) one is there only to count what the oldest reported one moved.
    """
    out: list[RebalanceSummary] = []
    for n, row in enumerate(rows_newest_first[:limit]):
        previous = rows_newest_first[n + 1] if n + 1 < len(rows_newest_first) else None
        now_owners = owners(row)
        resources: RebalanceMoves | None = None
        if now_owners is not None:
            before = owners(previous) if previous is not None else {}
            if before is not None:
                resources = moves(before, now_owners)
        started, ended = int(row["started_ms"]), int(row["ended_ms"])
        out.append(RebalanceSummary(
            generation_id=row["generation_id"],
            reason=row["reason"],
            started_ms=started,
            ended_ms=ended,
            duration_ms=max(0, ended - started),
            protocol_name=row.get("protocol_name"),
            leader=row.get("leader"),
            member_count=row.get("member_count", len(row.get("members", ()))),
            joined=list(row.get("joined", ())),
            left=list(row.get("left", ())),
            resources=resources,
        ))
    return out

