"""What the runtime's machine asks its driver to do, as frozen values.

:class:`~coordinator.runtime.machine.RuntimeMachine` appends these to its
outbox in order; a driver (``Runtime`` with asyncio, the simulator's
coordinator) takes them with ``RuntimeMachine.take`` and carries each out:
answer a waiting call, write records and report the outcome, arm or cancel a
key's loop timer, load a group, or log and count what happened. Like the
core's effects (``coordinator/core/effects.py``), the core's own
``GroupStateChanged``, ``RebalanceCompleted``, ``MemberExpired`` and
``DrainRequested`` pass through as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.commands import Command
from coordinator.core.effects import (
    AdminResult,
    DrainRequested,
    Effect,
    GroupStateChanged,
    MemberExpired,
    RebalanceCompleted,
)
from coordinator.core.records import JournalEntry, Record
from protocol.messages import Response

#: what a call is answered with: a protocol response or an admin call's result.
Answer = Response | AdminResult


@dataclass(frozen=True, slots=True)
class Answered:
    """Send ``answer`` to the caller of request ``request_id`` (it waits for it)."""

    request_id: int
    answer: Answer


@dataclass(frozen=True, slots=True)
class WriteDue:
    """Records wait to be written: call :meth:`RuntimeMachine.begin_write` when
    ready to write (every record collected until then shares the transaction)."""


@dataclass(frozen=True, slots=True)
class WriteRecords:
    """Write ``records`` in one storage transaction and report the outcome with
    :meth:`RuntimeMachine.write_done`, :meth:`~RuntimeMachine.write_refused` or
    :meth:`~RuntimeMachine.write_failed`. One is outstanding at a time."""

    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Set the loop timer of ``key`` for ``deadline_ms``, replacing the one it had;
    when it goes off call :meth:`RuntimeMachine.timer_due`."""

    key: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class DisarmTimer:
    """Cancel the loop timer of ``key``."""

    key: str


@dataclass(frozen=True, slots=True)
class DisarmTimers:
    """Cancel every loop timer (stopped serving)."""


@dataclass(frozen=True, slots=True)
class ArmStorageCheck:
    """Call :meth:`RuntimeMachine.storage_check_due` at ``deadline_ms``."""

    deadline_ms: int


@dataclass(frozen=True, slots=True)
class DisarmStorageCheck:
    """Cancel the armed storage check."""


@dataclass(frozen=True, slots=True)
class CheckStorage:
    """Check that what is open is what the next start would load; report with
    :meth:`RuntimeMachine.storage_checked` or :meth:`~RuntimeMachine.storage_failed`."""


@dataclass(frozen=True, slots=True)
class LoadGroup:
    """Read one group's durable state; report with :meth:`RuntimeMachine.group_loaded`
    or :meth:`~RuntimeMachine.group_load_failed`."""

    group_id: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """The snapshot is restored and serving began."""

    groups: int
    checkpoint_groups: int
    resource_sets: int


@dataclass(frozen=True, slots=True)
class BatchCommitted:
    """A batch is durable (its replies follow as :class:`Answered`)."""

    seconds: float
    records: int


@dataclass(frozen=True, slots=True)
class LimitRefused:
    """A request refused by a limit (``reason``: its setting). Count every one; log
    when ``logged`` (at most once per ``machine.REFUSAL_LOG_INTERVAL_MS`` per limit),
    saying ``earlier`` more were refused since the last such line."""

    reason: str
    group_id: str
    logged: bool
    earlier: int


@dataclass(frozen=True, slots=True)
class CoreRaised:
    """The core raised on ``command`` (a bug in it). ``group_id``: the one group whose
    state it was changing (it is evicted and reloaded), ``None``: serving stops."""

    command: str
    error: Exception
    group_id: str | None


@dataclass(frozen=True, slots=True)
class GroupEvicted:
    """A failure confined to one group: it is evicted and will be reloaded."""

    group_id: str
    #: ``"core"`` or ``"storage"`` (the label of ``groupcoord_reloaded_groups_total``).
    cause: str
    why: str


@dataclass(frozen=True, slots=True)
class GroupReloaded:
    """An evicted group is back, from what is durable."""

    group_id: str
    took_ms: int
    #: what was found, for the log line.
    found: str


@dataclass(frozen=True, slots=True)
class ServingStopped:
    """Memory may be ahead of what is durable, or half-changed: nothing more is
    served (every waiting call was answered); the process or partition should go."""

    why: str
    #: a storage failure (rather than the core failing over no one group).
    storage: bool


@dataclass(frozen=True, slots=True)
class Stopped:
    """:meth:`RuntimeMachine.stop` is done: writes finished, waiting calls answered."""


@dataclass(frozen=True, slots=True)
class Applied:
    """``command`` was applied and the core emitted ``effects`` (only with
    :attr:`RuntimeMachine.trace` set: the simulator's invariant checks)."""

    command: Command
    effects: tuple[Effect, ...]


@dataclass(frozen=True, slots=True)
class JournalRecorded:
    """A generation's journal entry went into the open batch (its assignments, with
    their ``why`` entries, are what ``groupcoord_resource_moves_total`` counts)."""

    entry: JournalEntry


MachineEffect = (Answered | WriteDue | WriteRecords | ArmTimer | DisarmTimer | DisarmTimers
                 | ArmStorageCheck | DisarmStorageCheck | CheckStorage | LoadGroup | Loaded
                 | BatchCommitted | LimitRefused | CoreRaised | GroupEvicted | GroupReloaded
                 | ServingStopped | Stopped | Applied | GroupStateChanged | RebalanceCompleted
                 | MemberExpired | DrainRequested | JournalRecorded)
