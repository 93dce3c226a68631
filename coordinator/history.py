"""A group's rebalance history for operators (``GET /v1/groups/{id}/rebalances``
and ``GET /v1/groups/{id}/resources/{set}/{index}/history``).

The rebalance journal (docs/protocol.md, "Durability") keeps one row per completed
rebalance with the whole assignment. An operator asks of it: why did the group
rebalance, how long did it take, who came and went, what moved and why. This
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

Why it moved is read from the assignments too: since v1.2 a leader may list,
in each member's assignment, a ``why`` entry ``[set, index, cause]`` for every
resource that member gains or loses (docs/protocol.md, "What the leader hands
out"). The journal stores the assignment bytes as the leader sent them, so the
causes are decoded from the same rows, with nothing stored besides. A
resource that changed owner is counted under the cause of its new owner's
entry, else of its old owner's, else :data:`~protocol.admin_docs.UNKNOWN_CAUSE`
(a leader whose assignor gives no ``why``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.core.records import JournalMember
from protocol.admin_docs import (
    UNKNOWN_CAUSE,
    Change,
    RebalanceMoves,
    RebalanceSummary,
    ResourceChange,
)
from protocol.codec import encode
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import ResourceAssignment
from protocol.validate import ValidationError

Resource = tuple[str, int]

#: how the key ``why`` looks inside assignment bytes (a msgpack string): bytes
#: without it carry no ``why`` entries and are not decoded to count them.
_WHY_KEY = encode("why")


@dataclass(frozen=True, slots=True)
class Generation:
    """One journal row of a ``resources`` group, its assignments decoded."""

    #: member id -> how owners are named: its instance id, else its member id.
    identity: Mapping[str, str]
    assignments: Mapping[str, ResourceAssignment]

    def owners(self) -> dict[Resource, str]:
        """Resource -> owner."""
        out: dict[Resource, str] = {}
        for member_id, assignment in self.assignments.items():
            who = self.identity.get(member_id, member_id)
            for name, indexes in assignment.assigned.items():
                for index in indexes:
                    out[(name, index)] = who
        return out

    def causes(self) -> dict[Resource, str]:
        """Resource -> the cause the members' ``why`` entries give it: the
        entry of the member that gains it, else of the one that loses it."""
        out: dict[Resource, str] = {}
        for assignment in self.assignments.values():
            for name, index, cause in assignment.why:
                if holds(assignment.assigned, name, index):
                    out[(name, index)] = cause
                else:
                    out.setdefault((name, index), cause)
        return out

    def owner_of(self, resource: Resource) -> tuple[str, str] | None:
        """``(owner, member_id)`` of one resource; ``None``: nobody."""
        name, index = resource
        for member_id, assignment in self.assignments.items():
            if holds(assignment.assigned, name, index):
                return self.identity.get(member_id, member_id), member_id
        return None

    def standby_of(self, resource: Resource) -> list[str]:
        """The members (as owners are named) asked to warm up one resource."""
        name, index = resource
        return sorted(self.identity.get(member_id, member_id)
                      for member_id, assignment in self.assignments.items()
                      if holds(assignment.standby, name, index))


def holds(indexes_by_set: Mapping[str, Sequence[int]], name: str, index: int) -> bool:
    # The codec gives each set's indexes sorted.
    indexes = indexes_by_set.get(name)
    if not indexes:
        return False
    at = bisect_left(indexes, index)
    return at < len(indexes) and indexes[at] == index


def read(row: Mapping[str, Any]) -> Generation | None:
    """One journal row decoded; ``None`` when its assignments are not of the
    resources protocol (another protocol, or bytes that are not a resources map)."""
    if row.get("protocol_type") != RESOURCES:
        return None
    members = map(JournalMember._make, row.get("members", ()))
    identity = {m.member_id: (m.group_instance_id or m.member_id) for m in members}
    assignments: dict[str, ResourceAssignment] = {}
    for member_id, blob in (row.get("assignments") or {}).items():
        try:
            assignments[member_id] = ResourceAssignment.decode(blob)
        except ValidationError:
            return None  # a leader sent bytes that are not a resources map
    return Generation(identity, assignments)


def owners(row: Mapping[str, Any]) -> dict[Resource, str] | None:
    """Resource -> owner (instance id, else member id) of one journal row;
    ``None`` when the row's assignments are not of the resources protocol."""
    generation = read(row)
    return None if generation is None else generation.owners()


def moves(before: Mapping[Resource, str], after: Mapping[Resource, str],
          causes: Mapping[Resource, str] | None = None) -> RebalanceMoves:
    """``moved``, ``assigned`` and ``revoked`` counts between two owner maps, and
    the resources they count by cause (``causes``: resource -> cause, as
    :meth:`Generation.causes`; a changed resource it lacks is ``unknown``)."""
    why = causes or {}
    by_cause: dict[str, int] = {}

    def count(resource: Resource) -> None:
        cause = why.get(resource, UNKNOWN_CAUSE)
        by_cause[cause] = by_cause.get(cause, 0) + 1

    moved = assigned = revoked = 0
    for r, who in after.items():
        was = before.get(r)
        if was is None:
            assigned += 1
            count(r)
        elif was != who:
            moved += 1
            count(r)
    for r in before:
        if r not in after:
            revoked += 1
            count(r)
    return RebalanceMoves(moved=moved, assigned=assigned, revoked=revoked,
                          causes=dict(sorted(by_cause.items())))


def summarize(rows_newest_first: Sequence[Mapping[str, Any]], limit: int
              ) -> list[RebalanceSummary]:
    """The newest ``limit`` rebalances, newest first.

    ``rows_newest_first`` holds up to ``limit + 1`` journal rows: the extra
    (oldest) one is there only to count what the oldest reported one moved.
    """
    generations = [read(row) for row in rows_newest_first[:limit + 1]]
    owner_maps = [None if g is None else g.owners() for g in generations]
    out: list[RebalanceSummary] = []
    for n, row in enumerate(rows_newest_first[:limit]):
        now, now_owners = generations[n], owner_maps[n]
        resources: RebalanceMoves | None = None
        if now is not None and now_owners is not None:
            before = owner_maps[n + 1] if n + 1 < len(owner_maps) else {}
            if before is not None:
                resources = moves(before, now_owners, now.causes())
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


def resource_history(rows_newest_first: Sequence[Mapping[str, Any]], limit: int,
                     resource: Resource) -> list[ResourceChange]:
    """One resource over the newest ``limit`` rebalances, newest first: who owned
    it, how that changed from the generation before and why (as
    :func:`summarize`, ``rows_newest_first`` holds up to ``limit + 1`` rows).
    Empty when the rows are not of the resources protocol."""
    generations = [read(row) for row in rows_newest_first[:limit + 1]]
    owned = [None if g is None else g.owner_of(resource) for g in generations]
    out: list[ResourceChange] = []
    for n, row in enumerate(rows_newest_first[:limit]):
        now = generations[n]
        if now is None:
            continue
        before = owned[n + 1] if n + 1 < len(owned) else None
        after = owned[n]
        who = None if after is None else after[0]
        change = _change(None if before is None else before[0], who)
        cause = None
        if change in ("moved", "assigned", "revoked"):
            cause = now.causes().get(resource, UNKNOWN_CAUSE)
        out.append(ResourceChange(
            generation_id=row["generation_id"], ended_ms=int(row["ended_ms"]),
            reason=row["reason"], owner=who, member_id=None if after is None else after[1],
            change=change, cause=cause, standby=now.standby_of(resource)))
    return out


def _change(was: str | None, who: str | None) -> Change:
    if who is None:
        return "unowned" if was is None else "revoked"
    if was is None:
        return "assigned"
    return "kept" if was == who else "moved"


def gained_by_cause(protocol_type: str | None, assignments: Mapping[str, bytes]
                    ) -> dict[str, int]:
    """How many resources one generation's assignments give their members, by
    the cause of the gaining member's ``why`` entry (a resource handed over
    cooperatively is counted once: when its new owner gains it). Only what the
    leader explained is counted: assignments without ``why`` entries, and
    bytes that are not a resources map, count nothing."""
    if protocol_type != RESOURCES:
        return {}
    out: dict[str, int] = {}
    for blob in assignments.values():
        if _WHY_KEY not in blob:
            continue
        try:
            assignment = ResourceAssignment.decode(blob)
        except ValidationError:
            continue
        for name, index, cause in assignment.why:
            if holds(assignment.assigned, name, index):
                out[cause] = out.get(cause, 0) + 1
    return out
