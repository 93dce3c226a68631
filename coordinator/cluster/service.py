"""The listeners' view of one coordinator among several (:class:`ClusterService`).

It is the :class:`coordinator.runtime.service.Service` the protocol and admin
listeners are written against, over a :class:`PartitionHost`:

- protocol calls are routed by partition (:meth:`route`); ``find_coordinator``
  answers from the leases as last read;
- admin calls about one group are applied where the group is served here;
  the admin app forwards those about a group owned by another coordinator to
  that coordinator's admin listener (:mod:`coordinator.http.app`);
- the catalog is the database's, changed in one transaction that orders the
  changes made through every coordinator, then adopted by this coordinator's
  partitions at once and by the others' within one lease round;
- ``GET /v1/groups`` lists every group of the database: those served here from
  memory, the others as their owner last wrote them (:meth:`refresh_groups`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.cluster.host import PartitionHost
from coordinator.core.admin import resource_problem
from coordinator.core.commands import CallCommand, DeleteResource, PutResource, command_group
from coordinator.core.effects import AdminResult
from coordinator.core.health import HEALTHY, Health
from coordinator.core.records import CheckpointMeta
from coordinator.core.states import GroupState
from coordinator.core.views import DrainCounts, GroupSummary, GroupView
from coordinator.runtime.clock import Clock
from coordinator.runtime.runtime import Answer, Core, Runtime, error_answer
from coordinator.storage.sqlite import StorageError
from protocol.catalog import Placement
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse, NotCoordinatorAnswer
from protocol.validate import Scalar, ValidationError

log = logging.getLogger("groupcoord.cluster")


class ClusterCore:
    """The read-only views (:class:`coordinator.runtime.runtime.CoreView`) over every
    partition served here (and, for the group list, the database's other groups)."""

    def __init__(self, host: PartitionHost) -> None:
        self._host = host
        self._elsewhere: dict[str, GroupSummary] = {}

    @property
    def elsewhere(self) -> list[GroupSummary]:
        """Groups of the partitions not served here, as read by the last refresh."""
        return list(self._elsewhere.values())

    @elsewhere.setter
    def elsewhere(self, groups: list[GroupSummary]) -> None:
        self._elsewhere = {g.group_id: g for g in groups}

    def _core_of(self, group_id: str) -> Core | None:
        target = self._host.route(group_id)
        return None if isinstance(target, NotCoordinatorAnswer) else target.core

    def _cores(self) -> list[Core]:
        return [runtime.core for runtime in self._host.serving()]

    def list_groups(self) -> Sequence[GroupSummary]:
        here = [g for core in self._cores() for g in core.list_groups()]
        served = {g.group_id for g in here}
        rows = here + [g for g in self.elsewhere if g.group_id not in served]
        return sorted(rows, key=lambda g: g.group_id)

    def group_ids(self) -> list[str]:
        ids = {group_id for core in self._cores() for group_id in core.group_ids()}
        ids.update(self._elsewhere)
        return sorted(ids)

    def group_summary(self, group_id: str) -> GroupSummary | None:
        core = self._core_of(group_id)
        return self._elsewhere.get(group_id) if core is None else core.group_summary(group_id)

    def describe_group(self, group_id: str) -> GroupView | None:
        core = self._core_of(group_id)
        return None if core is None else core.describe_group(group_id)

    def health(self, group_id: str, now_ms: int) -> Health:
        core = self._core_of(group_id)
        return HEALTHY if core is None else core.health(group_id, now_ms)

    def catalog(self) -> Mapping[str, int]:
        return dict(self._host.catalog)

    def catalog_placement(self) -> Mapping[str, Placement]:
        return dict(self._host.placement)

    @property
    def resources_epoch(self) -> int:
        return self._host.resources_epoch

    def checkpoints(self, group_id: str) -> Mapping[tuple[str, int], Scalar]:
        core = self._core_of(group_id)
        return {} if core is None else core.checkpoints(group_id)

    def checkpoint_meta(self, group_id: str) -> Mapping[tuple[str, int], CheckpointMeta]:
        core = self._core_of(group_id)
        return {} if core is None else core.checkpoint_meta(group_id)

    def state_counts(self) -> Mapping[str, int]:
        counts = {state.value: 0 for state in GroupState}
        for core in self._cores():
            for state, n in core.state_counts().items():
                counts[state] = counts.get(state, 0) + n
        return counts

    def member_count(self) -> int:
        return sum(core.member_count() for core in self._cores())

    def drain_counts(self) -> DrainCounts:
        counts = [core.drain_counts() for core in self._cores()]
        return DrainCounts(sum(c.draining for c in counts), sum(c.requested for c in counts))

    def parked_request_count(self) -> int:
        return sum(core.parked_request_count() for core in self._cores())

    def parked_by(self, principal: str) -> int:
        return sum(core.parked_by(principal) for core in self._cores())


class _Journal:
    def __init__(self, host: PartitionHost) -> None:
        self._host = host

    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self._host.read(
            lambda store: store.rebalances(group_id, limit))
        return rows


class ClusterService:
    """One coordinator of several, as the listeners see it (module docs)."""

    def __init__(self, host: PartitionHost) -> None:
        self.host = host
        self._core = ClusterCore(host)
        self._journal = _Journal(host)
        self._failed = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self.host.ready

    @property
    def failed(self) -> asyncio.Event:
        return self._failed

    @property
    def clock(self) -> Clock:
        return self.host.clock

    @property
    def core(self) -> ClusterCore:
        return self._core

    @property
    def storage(self) -> _Journal:
        return self._journal

    @property
    def advertised_url(self) -> str:
        return self.host.url

    def route(self, group_id: str) -> Runtime | NotCoordinatorAnswer:
        return self.host.route(group_id)

    def find_coordinator(self, group_id: str) -> FindCoordinatorResponse:
        return self.host.find_coordinator(group_id)

    def owner_admin_url(self, group_id: str) -> str | None:
        return self.host.admin_url_of_owner(group_id)

    def coordinators(self) -> list[dict[str, Any]]:
        owned: dict[str, list[dict[str, Any]]] = {}
        for row in sorted(self.host.lease_rows.values(), key=lambda r: r.partition):
            if row.held and row.owner_id is not None:
                owned.setdefault(row.owner_id, []).append({
                    "partition": row.partition, "epoch": row.epoch,
                    "since": None if row.acquired_at is None else row.acquired_at.isoformat()})
        return [{"id": c.id, "url": c.url, "admin_url": c.admin_url,
                 "started_at": c.started_at.isoformat(), "self": c.id == self.host.coordinator_id,
                 "partitions": owned.get(c.id, [])} for c in self.host.coordinators]

    async def refresh_groups(self) -> None:
        exclude = sorted(self.host.partitions)
        try:
            self._core.elsewhere = await self.host.read(
                lambda store: store.group_summaries(exclude))
        except StorageError as exc:
            # The database is unreachable: the groups served here are still listed,
            # the others as they were last read.
            log.warning("listing the groups owned elsewhere failed (showing the last "
                        "read): %s", exc)

    def local_groups(self) -> list[GroupSummary]:
        """The groups of the partitions served here (each coordinator exports its own
        per-group metrics; Prometheus sums them)."""
        return sorted((g for runtime in self.host.serving() for g in runtime.core.list_groups()),
                      key=lambda g: g.group_id)

    def new_request_id(self) -> int:
        # Every partition runtime here draws from the host's one counter (host.py).
        return self.host.new_request_id()

    async def call(self, command: CallCommand) -> Answer:
        if isinstance(command, (PutResource, DeleteResource)):
            return await self._change_catalog(command)
        group_id = command_group(command)
        if group_id is None:
            raise TypeError(f"{type(command).__name__} belongs to no group")
        target = self.route(group_id)
        if isinstance(target, NotCoordinatorAnswer):
            return error_answer(command, target.error)
        return await target.call(command)

    async def _change_catalog(self, command: PutResource | DeleteResource) -> AdminResult:
        partitions = command.partitions if isinstance(command, PutResource) else None
        problem = resource_problem(command.name, partitions)
        if problem is not None:
            return AdminResult(ErrorCode.INVALID_REQUEST, self.host.resources_epoch,
                               message=problem)
        weights, zones = ((command.weights, command.zones) if isinstance(command, PutResource)
                          else (None, None))
        try:
            epoch, found = await self.host.read(
                lambda store: store.change_catalog(command.name, partitions, weights, zones))
            # The whole catalog as of that epoch (others may have changed other sets).
            state = await self.host.read(lambda store: store.catalog_state())
        except ValidationError as exc:  # an override the new size leaves outside
            return AdminResult(ErrorCode.INVALID_REQUEST, self.host.resources_epoch,
                               message=str(exc))
        except StorageError:
            return AdminResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, self.host.resources_epoch)
        self.host.adopt_catalog(state)
        return AdminResult(None, epoch, found=found)
