"""The assignors of the embedded "resources" protocol (docs/protocol.md, "The embedded
"resources" protocol").

Each assignor is a pure function with a name: ``get_assignor(name).assign(
resources, subscriptions)``. One module per assignor; see docs/assignors.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .balanced import BalancedAssignor
from .cooperative_sticky import CooperativeStickyAssignor
from .incremental_cooperative import IncrementalCooperativeAssignor
from .model import (
    CAUSES,
    Assignment,
    Assignor,
    RebalanceProtocol,
    Resources,
    ResourceSet,
    Subscription,
    UnknownAssignorError,
    Why,
)
from .range_assignor import RangeAssignor
from .roundrobin import RoundRobinAssignor
from .sticky import StickyAssignor
from .validate import AssignmentError, validate_assignment

__all__ = [
    "ASSIGNOR_NAMES",
    "CAUSES",
    "Assignment",
    "AssignmentError",
    "Assignor",
    "RebalanceProtocol",
    "ResourceSet",
    "Resources",
    "Subscription",
    "UnknownAssignorError",
    "Why",
    "get_assignor",
    "validate_assignment",
]

_FACTORIES: dict[str, Callable[..., Assignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "sticky": StickyAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
    "incremental-cooperative": IncrementalCooperativeAssignor,
    "balanced": BalancedAssignor,
}

ASSIGNOR_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def get_assignor(name: str, **settings: Any) -> Assignor:
    """The assignor registered as protocol ``name``, configured by
    ``settings`` (incremental-cooperative and balanced have some); an unknown
    setting is a ``TypeError`` naming it."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise UnknownAssignorError(name, ASSIGNOR_NAMES)
    return factory(**settings)
