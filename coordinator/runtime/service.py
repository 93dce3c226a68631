"""What the listeners need of the server behind them (the HTTP layer's seam).

A one-process server is one :class:`coordinator.runtime.runtime.Runtime`,
which serves every group itself. Several coordinators on PostgreSQL
(:mod:`coordinator.cluster`) serve one runtime per owned partition behind a
:class:`coordinator.cluster.service.ClusterService`. The protocol calls, the
admin API and the console are written against this protocol only, so they
work the same on both.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from coordinator.core.commands import CallCommand
from protocol.messages import FindCoordinatorResponse, NotCoordinatorAnswer

if TYPE_CHECKING:
    from coordinator.runtime.clock import Clock
    from coordinator.runtime.runtime import Answer, CoreView, Runtime


class JournalReader(Protocol):
    async def rebalances(self, group_id: str, limit: int) -> list[dict[str, Any]]: ...


class Service(Protocol):
    @property
    def ready(self) -> bool:
        """State loaded and serving (``/readyz``)."""

    @property
    def failed(self) -> asyncio.Event:
        """Set when the server must exit (a storage failure of a one-process server)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def core(self) -> CoreView:
        """Read-only views of the groups this server holds in memory."""

    @property
    def storage(self) -> JournalReader: ...

    @property
    def advertised_url(self) -> str: ...

    def new_request_id(self) -> int:
        """A request id for a command of :meth:`call`: unique within whichever
        runtime behind this service runs the command."""

    async def call(self, command: CallCommand) -> Answer:
        """Apply ``command`` (an admin call, its ``request_id`` from
        :meth:`new_request_id`) where its group is served and wait for the answer;
        a group served elsewhere is answered ``NOT_COORDINATOR``."""

    def route(self, group_id: str) -> Runtime | NotCoordinatorAnswer:
        """The runtime serving ``group_id`` here, or what to answer instead."""

    def find_coordinator(self, group_id: str) -> FindCoordinatorResponse: ...

    async def refresh_groups(self) -> None:
        """Read what :meth:`CoreView.list_groups` needs of groups held elsewhere."""

    def owner_admin_url(self, group_id: str) -> str | None:
        """The admin URL of the coordinator serving ``group_id`` when it is another
        one (admin calls about the group are forwarded there), else ``None``."""

    def coordinators(self) -> list[dict[str, Any]]:
        """``GET /v1/coordinators``: every live coordinator, its URLs and partitions."""
