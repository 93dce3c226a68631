"""What the partition host's machine asks its driver to do, as frozen values.

:class:`~coordinator.cluster.host_machine.HostMachine` appends these to its
outbox in order; a driver (``PartitionHost`` with asyncio and PostgreSQL, the
simulator's coordinator) takes them with ``HostMachine.take`` and carries each
out. ``R`` is the driver's handle of one partition's runtime (a
:class:`~coordinator.runtime.runtime.Runtime`, or the simulator's); the machine
only hands it back.

Two kinds:

- a :class:`Step` is one statement (or the hand-off of a runtime) of the
  machine's sequence -- start, a round, a stop. At most one is outstanding;
  the driver reports its outcome with ``HostMachine.done`` (the answer) or
  ``HostMachine.failed`` (the database refused it or did not answer in time),
  and the machine goes on;
- every other effect is carried out at once, and nothing waits for it except
  where it says so (a load reports ``HostMachine.loaded`` or
  ``HostMachine.load_failed``; a serving runtime's failure is reported with
  ``HostMachine.runtime_failed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from coordinator.core.commands import AdoptCatalog

R = TypeVar("R")


# ---------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Step:
    """One awaited statement of the sequence; report it with ``done`` or ``failed``."""


@dataclass(frozen=True, slots=True)
class Register(Step):
    """Announce this coordinator in the list of coordinators (answer: ``None``)."""


@dataclass(frozen=True, slots=True)
class ReadCatalog(Step):
    """Read the shared catalog (answer: a ``CatalogState``, or ``None`` when its epoch
    is still ``since``); ``since`` ``None``: read it whole."""

    since: int | None


@dataclass(frozen=True, slots=True)
class Renew(Step):
    """Extend the leases ``{partition: epoch}`` still held at those epochs, in one
    statement (answer: the set of partitions renewed)."""

    held: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class ReadCluster(Step):
    """Refresh this coordinator's row, read the coordinators seen within
    ``live_window_ms`` and every lease (answer: ``(coordinators, lease rows)``, as
    ``CoordinatorRow`` and ``LeaseRow`` values)."""

    live_window_ms: int


@dataclass(frozen=True, slots=True)
class Acquire(Step):
    """Take ``partition`` if nobody holds it (answer: its new epoch, or ``None``)."""

    partition: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class HandOff(Step, Generic[R]):
    """Stop ``runtime`` (its writes finished, its waiting calls answered
    ``NOT_COORDINATOR``; ``None``: still loading, the load is given up) and end
    whatever the driver runs for the partition (answer: ``None``)."""

    partition: int
    epoch: int
    runtime: R | None


@dataclass(frozen=True, slots=True)
class Release(Step):
    """Free ``partition``'s lease if still held at ``epoch`` (answer: ignored)."""

    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Deregister(Step):
    """Leave the list of coordinators (answer: ignored)."""


# ---------------------------------------------------------------- done at once


@dataclass(frozen=True, slots=True)
class Load:
    """Load ``partition``'s runtime from the database; report ``loaded`` with the
    runtime once it serves, or ``load_failed``."""

    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Serve(Generic[R]):
    """``runtime`` serves ``partition`` now: give it ``adoption`` (the catalog held
    here) and watch it (a failed write or check: ``runtime_failed``)."""

    partition: int
    epoch: int
    runtime: R
    adoption: AdoptCatalog


@dataclass(frozen=True, slots=True)
class Discard(Generic[R]):
    """A runtime loaded for a partition no longer owned: stop it, serving nothing."""

    partition: int
    runtime: R


@dataclass(frozen=True, slots=True)
class Drop(Generic[R]):
    """Stop serving ``partition`` at once (lost, expired, failed): abandon ``runtime``
    (``None``: still loading, give the load up), nothing waits."""

    partition: int
    epoch: int
    runtime: R | None
    why: str


@dataclass(frozen=True, slots=True)
class FreeDropped:
    """Release a dropped partition's lease in the background (the database may still
    have it): it is acquired again, and reloaded, at the next round rather than
    after it runs out. Nothing waits for it; a failure is of no consequence."""

    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Adopt(Generic[R]):
    """Give ``command`` (a newer catalog) to each of ``runtimes``."""

    runtimes: tuple[R, ...]
    command: AdoptCatalog


@dataclass(frozen=True, slots=True)
class ArmExpiry:
    """Call ``HostMachine.expire`` at ``at`` (monotonic seconds), replacing the timer
    armed before: the earliest moment an owned lease may have run out."""

    at: float


@dataclass(frozen=True, slots=True)
class DisarmExpiry:
    """Cancel the expiry timer (nothing owned, or stopping)."""


@dataclass(frozen=True, slots=True)
class NextRound:
    """Call ``HostMachine.begin_round`` at ``at`` (monotonic seconds)."""

    at: float


@dataclass(frozen=True, slots=True)
class RoundFailed:
    """A statement of the round failed (the database is unreachable): the round ends;
    leases not renewed run out by the clock."""

    why: str


@dataclass(frozen=True, slots=True)
class NotAcquired:
    """``partition`` could not be acquired this round (held up or failed)."""

    partition: int
    why: str


@dataclass(frozen=True, slots=True)
class SharedOut:
    """The round handed ``partitions`` off to share them with the other coordinators."""

    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoundAcquired:
    """The round acquired ``partitions`` (each now loading), starting at ``started``."""

    partitions: tuple[int, ...]
    started: float


@dataclass(frozen=True, slots=True)
class Started:
    """Registered, the catalog read and the first round over."""


@dataclass(frozen=True, slots=True)
class StartFailed:
    """Registering or reading the catalog failed: the coordinator cannot start."""

    why: str


@dataclass(frozen=True, slots=True)
class Stopped:
    """Every partition handed off (``handed``) and the coordinator deregistered."""

    handed: tuple[int, ...]


HostEffect = (Step | Load | Serve[R] | Discard[R] | Drop[R] | FreeDropped | Adopt[R]
              | ArmExpiry | DisarmExpiry | NextRound | RoundFailed | NotAcquired | SharedOut
              | RoundAcquired | Started | StartFailed | Stopped)
