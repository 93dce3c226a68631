"""The value types of the embedded "resources" protocol (docs/protocol.md, "The
embedded "resources" protocol"): what a member sends (``Subscription``), what the
leader hands back (``Assignment``), and the shape every assignor has.

These are plain frozen dataclasses; turning them into msgpack bytes is
``protocol/resources.py``'s job, not ours.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable

from protocol.resources import CAUSES

__all__ = [
    "CAUSES",
    "Assignment",
    "Assignor",
    "RebalanceProtocol",
    "ResourceSet",
    "Resources",
    "Subscription",
    "UnknownAssignorError",
    "Why",
]


#: One ``Assignment.why`` entry: ``(set, index, cause)``.
Why: TypeAlias = tuple[str, int, str]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, eq=True)
class ResourceSet:
    """One set of the catalog with what v1.2 adds (docs/protocol.md, "Resources
    that differ: weights and home zones"): ``weights`` maps an index to the
    load it is expected to carry (finite, >= 0; others weigh
    ``default_weight``), ``zones`` maps an index to its home zones (others
    may run anywhere). Anywhere ``resources`` takes a partition count, it
    also takes a ``ResourceSet``; assignors other than ``balanced`` use only
    ``partitions``. Invalid values raise ``ValueError`` naming the field."""

    partitions: int
    weights: Mapping[int, float] = field(default_factory=dict)
    zones: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        n = self.partitions
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"ResourceSet.partitions: expected an integer >= 0, got {n!r}")
        if not _is_number(self.default_weight) or not (
            math.isfinite(self.default_weight) and self.default_weight >= 0
        ):
            raise ValueError(
                f"ResourceSet.default_weight: expected a finite number >= 0, "
                f"got {self.default_weight!r}"
            )
        weights = dict(self.weights)
        # Checked in bulk (a set may have a million weights); the loop below
        # only runs to name the first bad entry.
        keys, values = list(weights), list(weights.values())
        ok = (
            all(type(i) is int for i in keys)
            and (not keys or (min(keys) >= 0 and max(keys) < n))
            and all(type(v) is float or type(v) is int for v in values)
            and all(map(math.isfinite, values))
            and (not values or min(values) >= 0)
        )
        if not ok:
            for i, w in weights.items():
                _check_index(i, n, "weights")
                if not _is_number(w) or not (math.isfinite(w) and w >= 0):
                    raise ValueError(
                        f"ResourceSet.weights[{i}]: expected a finite number >= 0, got {w!r}"
                    )
        if not all(type(v) is float for v in values):
            weights = {i: float(v) for i, v in weights.items()}
        zones: dict[int, tuple[str, ...]] = {}
        for i, z in self.zones.items():
            _check_index(i, n, "zones")
            if isinstance(z, str) or not all(isinstance(x, str) and x for x in z):
                raise ValueError(
                    f"ResourceSet.zones[{i}]: expected a list of non-empty zone names, got {z!r}"
                )
            if z:
                zones[i] = tuple(z)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "zones", zones)
        object.__setattr__(self, "default_weight", float(self.default_weight))

    def weight(self, index: int) -> float:
        return self.weights.get(index, self.default_weight)


def _check_index(i: object, n: int, name: str) -> None:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise ValueError(f"ResourceSet.{name}: index {i!r} is not in 0..{n - 1}")


#: What an assignor assigns: set name -> partition count or ``ResourceSet``.
Resources: TypeAlias = Mapping[str, int | ResourceSet]


class RebalanceProtocol(enum.Enum):
    """KIP-429's two rebalance protocols.

    EAGER: every member revokes everything before it rejoins.
    COOPERATIVE: members keep what they own; a resource changes owner only
    after its owner gave it up (a follow-up rebalance moves it).
    """

    EAGER = "eager"
    COOPERATIVE = "cooperative"


@dataclass(frozen=True)
class Subscription:
    """One member's metadata, as the leader sees it.

    ``owned`` is what the member holds now, from generation ``generation``
    (-1: none). ``group_instance_id`` is set for static members (KIP-345): the
    range and roundrobin assignors order members by it so that a restart keeps
    the order.

    v1.2 (docs/protocol.md, "What a member reports"; only ``balanced`` reads
    them): ``rack`` is the member's zone; ``capacity`` its share relative to
    the others (finite, > 0); ``load`` the load it measured on resources it
    owns (``{set: {index: load}}``, finite, >= 0); ``warm`` the standby
    resources it finished warming; ``draining`` that it is leaving on
    purpose. Invalid values raise ``ValueError`` naming the field.
    """

    sets: Sequence[str]
    owned: Mapping[str, Sequence[int]] = field(default_factory=dict)
    generation: int = -1
    rack: str | None = None
    user_data: bytes | None = None
    group_instance_id: str | None = None
    capacity: float = 1.0
    load: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    warm: Mapping[str, Sequence[int]] = field(default_factory=dict)
    draining: bool = False

    def __post_init__(self) -> None:
        c = self.capacity
        if not _is_number(c) or not (math.isfinite(c) and c > 0):
            raise ValueError(f"Subscription.capacity: expected a finite number > 0, got {c!r}")
        for name, loads in self.load.items():
            for i, v in loads.items():
                if not _is_number(v) or not (math.isfinite(v) and v >= 0):
                    raise ValueError(
                        f"Subscription.load[{name!r}][{i}]: expected a finite number >= 0, "
                        f"got {v!r}"
                    )


@dataclass(frozen=True)
class Assignment:
    """What one member gets: ``assigned`` maps a set name to its sorted
    indexes (sets with nothing are left out). ``delay_ms`` > 0 asks the group
    to rebalance again after that long (deferred imbalance resolution).

    v1.2 (docs/protocol.md, "What the leader hands out"; only ``balanced``
    fills them): ``standby``, shaped like ``assigned``, what to warm up
    without owning; ``why``, a ``(set, index, cause)`` for every resource
    gained or lost this generation (causes: ``CAUSES``); ``band``, the
    ``(low, high)`` load the leader considers balanced for this member;
    ``load``, ``(load, ideal)``: the load of what ``assigned`` gives the
    member, as the assignor weighed it, and the member's fair share (the
    group's load times its capacity over the sharing members' capacity)."""

    assigned: dict[str, list[int]]
    user_data: bytes | None = None
    delay_ms: int = 0
    standby: dict[str, list[int]] = field(default_factory=dict)
    why: tuple[Why, ...] = ()
    band: tuple[float, float] | None = None
    load: tuple[float, float] | None = None


@runtime_checkable
class Assignor(Protocol):
    """A pure function with a name: no I/O, no state kept between calls,
    the same output for equal inputs."""

    @property
    def name(self) -> str: ...

    @property
    def protocols(self) -> tuple[RebalanceProtocol, ...]:
        """Supported rebalance protocols, most preferred first."""
        ...

    def assign(
        self, resources: Resources, subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]: ...


class UnknownAssignorError(ValueError):
    """``get_assignor`` was asked for a name it does not know."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown assignor {name!r}; known: {', '.join(known)}")
        self.name = name
