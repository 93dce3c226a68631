"""What the coordinator reads of a "resources" group's placement (v1.2,
docs/protocol.md, "What a member reports" and "What the leader hands out").

The coordinator never assigns: the leader does. But each member's metadata
(its ``rack``, ``capacity``, the ``load`` it measured, ``warm``, ``draining``) and each
assignment (``standby``, ``band``) pass through the coordinator, which keeps
them with the member. This module decodes them for the admin API, the
console (:func:`member_placement`) and the per-group metrics
(:func:`load_imbalance`). Bytes that do not decode read as nothing sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordinator.core.records import MemberRecord
from coordinator.core.views import GroupView
from protocol.admin_docs import MemberPlacement
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError

#: the weight of a resource no member reported a load for (the catalog's
#: default weight, as the ``balanced`` assignor takes it).
DEFAULT_WEIGHT = 1.0


def metadata_of(m: MemberRecord, protocol_name: str | None) -> MemberMetadata | None:
    """The member's metadata for the group's protocol, decoded; ``None``: none or malformed."""
    data = next((data for name, data in m.protocols if name == protocol_name), None)
    if data is None:
        return None
    try:
        return MemberMetadata.decode(data)
    except ValidationError:
        return None


def assignment_of(m: MemberRecord) -> ResourceAssignment | None:
    """The member's assignment decoded (none yet: empty); ``None``: malformed."""
    try:
        return ResourceAssignment.decode(m.assignment or b"")
    except ValidationError:
        return None


def member_placement(m: MemberRecord, protocol_name: str | None) -> MemberPlacement:
    """What the member reported in its metadata for the group's protocol, the
    standby its assignment gives it, and whether an operator's drain request
    waits for it."""
    reported = metadata_of(m, protocol_name)
    given = assignment_of(m)
    load = None
    if reported is not None and reported.load:
        load = sum(x for loads in reported.load.values() for x in loads.values())
    draining = reported is not None and reported.draining
    return MemberPlacement(
        rack=None if reported is None else reported.rack,
        capacity=None if reported is None else reported.capacity,
        load=load,
        draining=draining,
        drain_requested=m.drain_requested_ms is not None and not draining,
        standby={} if given is None else
        {name: list(indexes) for name, indexes in given.standby.items() if indexes},
        warm={} if reported is None else
        {name: list(indexes) for name, indexes in reported.warm.items() if indexes})


def load_imbalance(view: GroupView) -> float | None:
    """The busiest member's load per capacity over the group's (1.0: even), among
    the members whose assignment carries a ``band`` (a load-balancing assignor's
    members). A member's load is the sum, over what it is assigned, of the load
    its owner reported at the last join (``DEFAULT_WEIGHT`` for a resource
    nobody reported); its capacity is the one it reported (1.0 if none).

    ``None`` when that cannot be told: another protocol, no assignment with a
    ``band``, no member that reported a ``load`` or ``capacity``, or nothing
    assigned."""
    if view.protocol_type != RESOURCES:
        return None
    banded: list[tuple[ResourceAssignment, float]] = []
    measured: dict[tuple[str, int], float] = {}
    reported_any = False
    for m in view.members:
        reported = metadata_of(m, view.protocol_name)
        capacity = 1.0
        if reported is not None:
            reported_any = reported_any or bool(reported.load) or reported.capacity is not None
            capacity = 1.0 if reported.capacity is None else reported.capacity
            for name, loads in reported.load.items():
                for index, x in loads.items():
                    measured[(name, index)] = x
        given = assignment_of(m)
        if given is not None and given.band is not None:
            banded.append((given, capacity))
    if not banded or not reported_any:
        return None
    per_capacity = []
    for given, capacity in banded:
        per_capacity.append(_load(given.assigned, measured) / capacity)
    total = sum(x * c for x, (_, c) in zip(per_capacity, banded, strict=True))
    total_capacity = sum(c for _, c in banded)
    if total <= 0:
        return None
    return max(per_capacity) / (total / total_capacity)


def _load(assigned: Mapping[str, Any], measured: Mapping[tuple[str, int], float]) -> float:
    return sum(measured.get((name, index), DEFAULT_WEIGHT)
               for name, indexes in assigned.items() for index in indexes)
