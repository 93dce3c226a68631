"""Group commit and reply after commit, as bookkeeping: which batch a reply waits for.

Pure: no I/O, no clock, no event loop. The runtime's machine
(``machine.py``) holds one; :class:`Runtime` (``runtime.py``) drives that
machine, and the simulator's coordinator (``tests/sim/server.py``) runs that
same runtime, so the simulator checks the rule the server runs rather than a
copy of it.

- ``Persist`` records are collected into the *open* batch (:meth:`Commits.write`).
  One batch commits at a time: :meth:`Commits.start_commit` makes the open
  batch the one *in flight* and opens a new one (group commit: while a
  storage transaction is in flight, the next batch collects, so many
  requests share one fsync); :meth:`Commits.committed` retires it.
- A reply is released only after every write it depends on is committed:
  every write of its own group (group records, checkpoints, journal entries,
  whichever command emitted them), every catalog write (heartbeat and sync
  answers carry ``resources_epoch``; any record not tied to one group counts
  as catalog), and every write emitted earlier by the same command. A reply
  that depends on no uncommitted write goes out at once, so a slow commit of
  group A's records does not hold group B's heartbeats (docs/architecture.md,
  practice 5).
- Because batches commit one at a time and in order, "every write it depends
  on" is "the latest uncommitted batch holding such a write", so the rule
  needs only, per group, the uncommitted batch holding the group's latest
  write, and the one holding the latest catalog write. At most two batches
  are uncommitted, the open one being the later, so the answer of
  :meth:`Commits.wait_for` is: the open batch if any dependency is in it,
  else the one in flight if any is there, else none (release now).
- A crash or a storage failure loses what is uncommitted (:meth:`Commits.clear`).

A batch is compared by identity: it is the unit a reply waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.core.commands import Command, command_group
from coordinator.core.effects import Reply
from coordinator.core.records import (
    CatalogChanged,
    CheckpointsWritten,
    GroupDeleted,
    GroupOwner,
    GroupRecord,
    JournalEntry,
    Record,
)

__all__ = ["Batch", "Commits", "command_group", "record_group"]


def record_group(record: Record) -> str | None:
    """The one group a record belongs to; ``None`` for the catalog or any record that
    belongs to no single group (every reply then depends on it)."""
    match record:
        case GroupRecord(group_id=g) | CheckpointsWritten(group_id=g) | GroupDeleted(group_id=g) \
                | GroupOwner(group_id=g) | JournalEntry(group_id=g):
            return g
        case CatalogChanged():
            return None
    return None


@dataclass(slots=True, eq=False)
class Batch:
    """Records written in one transaction, and the replies waiting for it."""

    records: list[Record] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)


class Commits:
    """The open batch, the one in flight, and which of them each reply waits for."""

    __slots__ = ("_global_write", "_group_writes", "idle", "inflight", "open")

    def __init__(self) -> None:
        #: collecting the records of the commands applied now.
        self.open = Batch()
        #: being written (None: no storage transaction in flight).
        self.inflight: Batch | None = None
        #: group id -> the uncommitted batch (open or in flight) holding the group's
        #: latest write; an entry goes when that batch commits.
        self._group_writes: dict[str, Batch] = {}
        #: the uncommitted batch holding the latest write every reply depends on (catalog).
        self._global_write: Batch | None = None
        #: no write is uncommitted, so no reply waits for anything (the steady
        #: state of heartbeats). A plain attribute: the runtime reads it on its
        #: hot path before calling :meth:`wait_for` at all.
        self.idle = True

    @property
    def pending_writes(self) -> int:
        """Records collected or in flight (for tests and diagnostics)."""
        inflight = len(self.inflight.records) if self.inflight is not None else 0
        return len(self.open.records) + inflight

    def write(self, record: Record) -> None:
        """A ``Persist``: into the open batch, which is now the latest holding a
        write of the record's group (or of the catalog)."""
        batch = self.open
        batch.records.append(record)
        self.idle = False
        group_id = record_group(record)
        if group_id is None:
            self._global_write = batch
        else:
            self._group_writes[group_id] = batch

    def wait_for(self, command: Command, wrote: bool) -> Batch | None:
        """The batch ``command``'s reply must wait for, None to release it now.

        ``wrote``: the same command emitted a write before this reply (so it is
        in the open batch)."""
        if wrote:
            return self.open
        if self.idle:
            return None  # nothing uncommitted anywhere: release now
        global_write = self._global_write
        group_id = command_group(command)
        group_write = self._group_writes.get(group_id) if group_id is not None else None
        opened = self.open
        if group_write is opened or global_write is opened:
            return opened
        if group_write is not None or global_write is not None:
            batch = self.inflight
            assert batch is not None and (group_write is batch or global_write is batch)
            return batch
        return None

    def holds(self, group_id: str) -> bool:
        """Whether a write of ``group_id`` is uncommitted (open or in flight)."""
        return group_id in self._group_writes

    def drop_group(self, group_id: str) -> None:
        """Take the group's records out of the open batch (a failed write of it left
        memory ahead of disk: what it wrote since must not be written). Its replies
        waiting there are the caller's to answer."""
        batch = self.open
        batch.records = [r for r in batch.records if record_group(r) != group_id]
        if self._group_writes.get(group_id) is batch:
            del self._group_writes[group_id]
        self.idle = self._global_write is None and not self._group_writes

    def start_commit(self) -> Batch:
        """Open a new batch; the one that was open is now in flight (and returned).
        Only while no other is in flight."""
        assert self.inflight is None, "one batch commits at a time"
        batch, self.open = self.open, Batch()
        self.inflight = batch
        return batch

    def committed(self, batch: Batch) -> None:
        """``batch`` (the one in flight) is durable: drop the entries that point at
        it; its replies may go (the caller sends them)."""
        if self.inflight is batch:
            self.inflight = None
        if self._global_write is batch:
            self._global_write = None
        group_writes = self._group_writes
        for record in batch.records:
            group_id = record_group(record)
            if group_id is not None and group_writes.get(group_id) is batch:
                del group_writes[group_id]
        self.idle = self._global_write is None and not group_writes

    def clear(self) -> None:
        """Forget everything uncommitted (a crash, a storage failure): a new open
        batch, none in flight, no reply waits for anything."""
        self.open = Batch()
        self.inflight = None
        self._group_writes.clear()
        self._global_write = None
        self.idle = True
