"""Partition leases with fencing epochs, and the coordinators that hold them.

Three pieces:

:class:`Leases`
    the ``partition_leases`` and ``coordinators`` tables, on a connection of
    their own (a renewal never waits behind a write batch). Every change is
    one statement judged by the database's clock (``now()``), so the clocks of
    the coordinators do not matter:

    - :meth:`Leases.acquire` takes a partition that nobody holds (never held,
      released, or expired) and increases its ``epoch``: each acquisition
      starts a new epoch, which is the fencing token of the owner's writes
      (:meth:`coordinator.storage.postgres.PostgresStorage.write`);
    - :meth:`Leases.renew` extends leases still held at their epoch (also one
      that expired but nobody took: nobody else can have written since, as
      only a new epoch could);
    - :meth:`Leases.release` is the orderly hand-off: the owner, done with its
      writes, frees the partition at once (expiry now) for another to acquire.

:class:`LocalLease`
    the owner's own rule, pure: it answers for a partition only until
    ``sent_at + lease_ms`` by its monotonic clock, where ``sent_at`` is when
    the acquire or renew that granted the lease was *sent*. The database set
    the expiry from its clock when it ran the statement, after the sending, so
    the owner stops answering no later than the database lets another owner
    in (as long as the two clocks run at the same rate; a step of the
    database's wall clock is not covered: run it with NTP slewing).

:func:`balance`
    pure: which partitions this coordinator should acquire and which it should
    release so that the live coordinators share ``P`` evenly (counts differ
    by at most one), releasing only what other live coordinators are short of.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from coordinator.storage import pgurl
from coordinator.storage.pg_schema import PARTITIONS_KEY
from coordinator.storage.postgres import (
    CONNECT_TIMEOUT_S,
    connect,
    database_errors,
    describe_error,
)
from coordinator.storage.sqlite import StorageError

# ---------------------------------------------------------------- the owner's rule


@dataclass(frozen=True, slots=True)
class LocalLease:
    """A lease as its owner counts it: valid until ``valid_until`` (monotonic seconds)."""

    partition: int
    epoch: int
    lease_ms: int
    valid_until: float

    @classmethod
    def granted(cls, partition: int, epoch: int, lease_ms: int, sent_at: float) -> LocalLease:
        """The lease an acquire sent at ``sent_at`` (monotonic seconds) obtained."""
        return cls(partition, epoch, lease_ms, sent_at + lease_ms / 1000)

    def renewed(self, sent_at: float) -> LocalLease:
        """After a renewal sent at ``sent_at`` succeeded.

        Never shortens: when two renewals' answers come back out of order, the
        later-sent one decides.
        """
        return LocalLease(self.partition, self.epoch, self.lease_ms,
                          max(self.valid_until, sent_at + self.lease_ms / 1000))

    def valid(self, now: float) -> bool:
        """Whether the owner may still answer for the partition at ``now``."""
        return now < self.valid_until

    def remaining(self, now: float) -> float:
        """Seconds left (0 once expired)."""
        return max(0.0, self.valid_until - now)


# ---------------------------------------------------------------- balance


@dataclass(frozen=True, slots=True)
class Plan:
    """What one coordinator should do this round."""

    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()


def quotas(live: Iterable[str], partitions: int) -> dict[str, int]:
    """How many partitions each live coordinator should own: ``P // n``, and one more
    for the first ``P % n`` of them by id, so that every coordinator computes the
    same shares from the same list."""
    ordered = sorted(set(live))
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {cid: base + (1 if rank < extra else 0) for rank, cid in enumerate(ordered)}


def balance(me: str, live: Iterable[str], owners: Mapping[int, str],
            partitions: int) -> Plan:
    """This coordinator's moves towards an even share of the ``partitions``.

    ``live``: the ids of the live coordinators (``me`` counts as live whether
    listed or not). ``owners``: partition -> owner id of every lease currently
    held; a partition absent is free (acquirable now). A partition held by a
    coordinator that is not live is neither free nor anyone's share: its lease
    will expire and make it free.

    - Short of its quota, ``me`` acquires free partitions, as many as it lacks
      (starting at an offset derived from its id, so that coordinators
      starting together try different ones first).
    - Over its quota, ``me`` releases only what the other live coordinators
      cannot fill from free partitions and from those of departed owners
      (an orderly hand-off: nothing is released that nobody needs). Since the
      excess of all coordinators adds up to exactly that shortfall, each
      releasing up to its own excess never overshoots.
    """
    live_set = set(live) | {me}
    share = quotas(live_set, partitions)
    mine = sorted(p for p, owner in owners.items() if owner == me)
    free = [p for p in _rotated(me, partitions) if p not in owners]
    departed = sum(1 for owner in owners.values() if owner not in live_set)
    held = dict.fromkeys(live_set, 0)
    for owner in owners.values():
        if owner in held:
            held[owner] += 1
    quota = share[me]
    if len(mine) < quota:
        return Plan(acquire=tuple(free[:quota - len(mine)]))
    excess = len(mine) - quota
    if excess == 0:
        return Plan()
    short = sum(max(0, share[cid] - held[cid]) for cid in live_set if cid != me)
    give = min(excess, max(0, short - len(free) - departed))
    return Plan(release=tuple(sorted(mine, reverse=True)[:give]))


def _rotated(me: str, partitions: int) -> list[int]:
    start = zlib.crc32(me.encode("utf-8")) % partitions if partitions else 0
    return [(start + i) % partitions for i in range(partitions)]


# ---------------------------------------------------------------- the tables


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """One row of ``partition_leases`` as read, with times relative to the database's clock."""

    partition: int
    owner_id: str | None
    owner_url: str | None
    epoch: int
    #: milliseconds until the lease expires (<= 0: expired or free).
    expires_in_ms: int
    acquired_at: datetime | None
    #: the owner's admin listener, from its row of ``coordinators`` whether or not
    #: it is live (``None``: no owner, or it did not say, or it deregistered).
    owner_admin_url: str | None = None

    @property
    def held(self) -> bool:
        return self.owner_id is not None and self.expires_in_ms > 0


@dataclass(frozen=True, slots=True)
class CoordinatorRow:
    id: str
    url: str
    started_at: datetime
    #: milliseconds since its last heartbeat, by the database's clock.
    last_seen_ms_ago: int
    #: its admin listener ("" when it did not say).
    admin_url: str = ""


_ACQUIRE = """
UPDATE partition_leases
SET owner_id = $2, owner_url = $3, epoch = epoch + 1, acquired_at = now(),
    expires_at = now() + $4::bigint * interval '1 millisecond'
WHERE partition = $1 AND (owner_id IS NULL OR expires_at <= now())
RETURNING epoch
"""

_RENEW = """
UPDATE partition_leases AS l
SET expires_at = now() + $3::bigint * interval '1 millisecond'
FROM unnest($1::integer[], $2::bigint[]) AS held(partition, epoch)
WHERE l.partition = held.partition AND l.epoch = held.epoch AND l.owner_id = $4
RETURNING l.partition
"""

_RELEASE = """
UPDATE partition_leases SET owner_id = NULL, owner_url = NULL, expires_at = now()
WHERE partition = $1 AND owner_id = $2 AND epoch = $3
RETURNING partition
"""

_LEASES = """
SELECT l.partition, l.owner_id, l.owner_url, l.epoch,
       CASE WHEN l.expires_at = '-infinity' THEN -1
            ELSE floor(extract(epoch FROM l.expires_at - now()) * 1000)::bigint END,
       l.acquired_at, NULLIF(c.admin_url, '')
FROM partition_leases AS l LEFT JOIN coordinators AS c ON c.id = l.owner_id
ORDER BY l.partition
"""

_REGISTER = """
INSERT INTO coordinators (id, url, admin_url, started_at, last_seen)
VALUES ($1, $2, $3, now(), now())
ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, admin_url = EXCLUDED.admin_url,
    started_at = now(), last_seen = now()
"""

_COORDINATORS = """
SELECT id, url, started_at, floor(extract(epoch FROM now() - last_seen) * 1000)::bigint,
       admin_url
FROM coordinators WHERE last_seen > now() - $1::bigint * interval '1 millisecond'
ORDER BY id
"""


class Leases:
    """This coordinator's view of, and moves on, the lease tables.

    Opened after :meth:`PostgresStorage.open` made the database (it reads
    ``P`` from it). Every method raises :class:`StorageError` (one line, no
    password) when the database cannot be reached; the connection is made
    again at the next call.
    """

    def __init__(self, conn: Any, url: str, coordinator_id: str, advertised_url: str,
                 partitions: int, admin_url: str = "") -> None:
        self._conn = conn
        self._url = url
        self.path = pgurl.redact(url)
        self.coordinator_id = coordinator_id
        self.advertised_url = advertised_url
        self.admin_url = admin_url
        self.partitions = partitions
        self._settings: dict[str, str] = {}
        #: seconds one statement may take (a database cut off mid-statement would
        #: otherwise hold the caller until TCP gives up); ``None``: no limit.
        self.timeout_s: float | None = CONNECT_TIMEOUT_S

    def __repr__(self) -> str:
        return f"Leases({self.path!r}, coordinator_id={self.coordinator_id!r})"

    @classmethod
    async def open(cls, url: str, coordinator_id: str, advertised_url: str, *,
                   admin_url: str = "",
                   connect_timeout: float = CONNECT_TIMEOUT_S,
                   settings: Mapping[str, str] | None = None) -> Leases:
        conn = await connect(url, timeout=connect_timeout, settings=settings)
        name = pgurl.redact(url)
        try:
            exists = await conn.fetchval("SELECT to_regclass('meta') IS NOT NULL")
            count = (await conn.fetchval("SELECT value FROM meta WHERE key = $1",
                                         PARTITIONS_KEY) if exists else None)
        except database_errors() as exc:
            await conn.close()
            raise StorageError(f"database {name}: cannot use it: "
                               f"{describe_error(exc, url)}") from None
        if count is None:
            await conn.close()
            raise StorageError(f"database {name} has no partitions yet: open it with "
                               f"PostgresStorage.open first")
        leases = cls(conn, url, coordinator_id, advertised_url, int(count), admin_url)
        leases._settings = dict(settings or {})
        return leases

    async def close(self) -> None:
        await self._conn.close()

    async def _run(self, method: str, sql: str, *args: Any) -> list[Any]:
        try:
            if self._conn.is_closed():
                self._conn = await connect(self._url, settings=self._settings,
                                           timeout=self.timeout_s or CONNECT_TIMEOUT_S)
            return list(await self._conn.fetch(sql, *args, timeout=self.timeout_s))
        except TimeoutError:
            # The statement may or may not have run; the connection is in an unknown
            # state: drop it, the next call makes a new one.
            self._conn.terminate()
            raise StorageError(f"database {self.path}: {method} took over "
                               f"{self.timeout_s}s; gave up") from None
        except database_errors() as exc:
            raise StorageError(f"database {self.path}: {method} failed: "
                               f"{describe_error(exc, self._url)}") from None

    # ------------------------------------------------------------ coordinators

    async def register(self) -> None:
        """Announce this coordinator (id, advertised URL); a restart registers again."""
        await self._run("register", _REGISTER + " RETURNING id", self.coordinator_id,
                        self.advertised_url, self.admin_url)

    async def heartbeat(self) -> None:
        """Refresh ``last_seen``; registers again if the row was removed meanwhile."""
        rows = await self._run("heartbeat", "UPDATE coordinators SET last_seen = now() "
                               "WHERE id = $1 RETURNING id", self.coordinator_id)
        if not rows:
            await self.register()

    async def deregister(self) -> None:
        """Leave the list of coordinators (an orderly stop, after releasing)."""
        await self._run("deregister", "DELETE FROM coordinators WHERE id = $1 RETURNING id",
                        self.coordinator_id)

    async def live_coordinators(self, within_ms: int) -> list[CoordinatorRow]:
        """Coordinators seen within the last ``within_ms`` (database clock), by id."""
        return [CoordinatorRow(r[0], r[1], r[2], int(r[3]), r[4])
                for r in await self._run("live_coordinators", _COORDINATORS, within_ms)]

    # ------------------------------------------------------------ leases

    async def leases(self) -> list[LeaseRow]:
        """Every partition's lease, by partition, with its owner's admin URL (read in
        the same statement, not filtered by liveness: an owner whose heartbeat is
        late still holds its leases, and admin calls about them go to it)."""
        return [LeaseRow(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], r[6])
                for r in await self._run("leases", _LEASES)]

    async def owners(self) -> dict[int, str]:
        """Partition -> owner of every lease held now (the input of :func:`balance`)."""
        return {row.partition: row.owner_id for row in await self.leases()
                if row.held and row.owner_id is not None}

    async def acquire(self, partition: int, lease_ms: int) -> int | None:
        """Take ``partition`` if nobody holds it; its new epoch, or ``None`` if held.

        Note the monotonic time *before* calling: it is ``sent_at`` of
        :meth:`LocalLease.granted`.
        """
        self._check(partition, lease_ms)
        rows = await self._run("acquire", _ACQUIRE, partition, self.coordinator_id,
                               self.advertised_url, lease_ms)
        return int(rows[0][0]) if rows else None

    async def renew(self, held: Mapping[int, int], lease_ms: int) -> set[int]:
        """Extend the leases ``{partition: epoch}`` still held at those epochs, in one
        statement; returns the partitions renewed (any other one is lost: drop it)."""
        for partition in held:
            self._check(partition, lease_ms)
        if not held:
            return set()
        order = sorted(held)
        rows = await self._run("renew", _RENEW, order, [held[p] for p in order], lease_ms,
                               self.coordinator_id)
        return {int(r[0]) for r in rows}

    async def release(self, partition: int, epoch: int) -> bool:
        """Hand ``partition`` off: free it now if still held at ``epoch``.

        Call it after the partition's last write returned and after this
        coordinator stopped answering for it.
        """
        self._check(partition, 1)
        return bool(await self._run("release", _RELEASE, partition, self.coordinator_id,
                                    epoch))

    def _check(self, partition: int, lease_ms: int) -> None:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is outside 0..{self.partitions - 1}")
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
