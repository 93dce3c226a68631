"""The value types of the embedded "resources" protocol (docs/protocol.md, "The
embedded "resources" protocol"): what a member sends (``Subscription``), what the
leader hands back (``Assignment``), and the shape every assignor has.

These are plain frozen dataclasses; turning them into msgpack bytes is
``protocol/resources.py``'s job, not ours.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "Assignment",
    "Assignor",
    "RebalanceProtocol",
    "Subscription",
    "UnknownAssignorError",
]


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
    """

    sets: Sequence[str]
    owned: Mapping[str, Sequence[int]] = field(default_factory=dict)
    generation: int = -1
    rack: str | None = None
    user_data: bytes | None = None
    group_instance_id: str | None = None


@dataclass(frozen=True)
class Assignment:
    """What one member gets: ``assigned`` maps a set name to its sorted
    indexes (sets with nothing are left out). ``delay_ms`` > 0 asks the group
    to rebalance again after that long (deferred imbalance resolution)."""

    assigned: dict[str, list[int]]
    user_data: bytes | None = None
    delay_ms: int = 0


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
        self, resources: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]: ...


class UnknownAssignorError(ValueError):
    """``get_assignor`` was asked for a name it does not know."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown assignor {name!r}; known: {', '.join(known)}")
        self.name = name
