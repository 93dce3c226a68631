"""The chaos harness's own reads of a several-coordinators database (PostgreSQL).

The harness reads the coordinators' shared database directly, beside the
protocol, for what the protocol does not show at the right moment: who holds
each partition's lease (also a paused or dead coordinator's), the checkpoints
as of a coordinator's crash (read while its leases still fence every other
writer out), the generation of each group and its rebalance journal. Each
read opens its own connection (the database may have been restarted since
the last one) and closes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from coordinator.storage.postgres import partition_of
from coordinator.storage.sqlite import decode_checkpoint_row

Resource = tuple[str, int]


@dataclass(frozen=True)
class LeaseState:
    partition: int
    owner_url: str | None
    epoch: int
    #: milliseconds until it runs out by the database's clock (<= 0: free or expired).
    expires_in_ms: int

    @property
    def held(self) -> bool:
        return self.owner_url is not None and self.expires_in_ms > 0


_LEASES = """
SELECT partition, owner_url, epoch,
       CASE WHEN expires_at = '-infinity' THEN -1
            ELSE floor(extract(epoch FROM expires_at - now()) * 1000)::bigint END
FROM partition_leases ORDER BY partition
"""


class ClusterDB:
    """Reads of the shared database at ``url`` (a ``postgresql://`` URL)."""

    def __init__(self, url: str, partitions: int) -> None:
        self.url = url
        self.partitions = partitions

    def partition_of(self, group_id: str) -> int:
        return partition_of(group_id, self.partitions)

    async def _connect(self) -> Any:
        return await asyncpg.connect(self.url, timeout=5)

    async def leases(self) -> dict[int, LeaseState]:
        conn = await self._connect()
        try:
            return _lease_states(await conn.fetch(_LEASES))
        finally:
            await conn.close()

    async def snapshot(self, groups: list[str]
                       ) -> tuple[dict[int, LeaseState], dict[str, dict[Resource, Any]]]:
        """Every lease and the checkpoints of ``groups``, in one snapshot (REPEATABLE
        READ): the checkpoints are exactly those committed when the leases read so."""
        conn = await self._connect()
        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                leases = _lease_states(await conn.fetch(_LEASES))
                rows = await conn.fetch(
                    "SELECT group_id, resource_set, idx, value FROM checkpoints "
                    "WHERE group_id = ANY($1::text[])", groups)
        finally:
            await conn.close()
        stored: dict[str, dict[Resource, Any]] = {g: {} for g in groups}
        for row in rows:
            group_id, resource_set, idx, value = decode_checkpoint_row(tuple(row))
            stored[group_id][(resource_set, idx)] = value
        return leases, stored

    async def generations(self, groups: list[str]) -> dict[str, int]:
        conn = await self._connect()
        try:
            rows = await conn.fetch("SELECT group_id, generation_id FROM groups "
                                    "WHERE group_id = ANY($1::text[])", groups)
        finally:
            await conn.close()
        return {r["group_id"]: int(r["generation_id"]) for r in rows}

    async def journal(self, groups: list[str]) -> list[tuple[str, int, str]]:
        """(group, generation, reason) of every rebalance journal row of ``groups``."""
        conn = await self._connect()
        try:
            rows = await conn.fetch("SELECT group_id, generation_id, reason FROM "
                                    "rebalance_journal WHERE group_id = ANY($1::text[]) "
                                    "ORDER BY id", groups)
        finally:
            await conn.close()
        return [(r["group_id"], int(r["generation_id"]), r["reason"]) for r in rows]


def _lease_states(rows: list[Any]) -> dict[int, LeaseState]:
    return {int(r[0]): LeaseState(int(r[0]), r[1], int(r[2]), int(r[3])) for r in rows}


def group_in_partition(partition: int, partitions: int, prefix: str = "probe") -> str:
    """A group id that hashes to ``partition`` (for a probe at a given partition)."""
    for i in range(100_000):
        name = f"{prefix}-{i}"
        if partition_of(name, partitions) == partition:
            return name
    raise ValueError(f"no {prefix}-N group id hashes to partition {partition} of {partitions}")
