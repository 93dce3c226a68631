"""The group state machine: pure, no I/O, no clock (docs/architecture.md).

``GroupCoordinator(config).handle(now_ms, command) -> list[Effect]`` is the
whole interface for changes; ``restore(snapshot, now_ms)`` rebuilds it from
storage; ``list_groups()``, ``describe_group()``, ``catalog()``,
``catalog_placement()``, ``resources_epoch``, ``state_counts()`` and
``member_count()`` are read-only.
"""

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator

__all__ = ["CoreConfig", "GroupCoordinator"]
