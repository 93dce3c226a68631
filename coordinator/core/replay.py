"""Fold persisted records into a :class:`Snapshot`, the way storage must.

This is the reference for what storage keeps (records.py): the latest
:class:`GroupRecord` per group, checkpoints with ``None`` deleting, the catalog
(with the weights and zones of its sets) and its epoch, the last commit time of
each group holding checkpoints;
:class:`GroupOwner` records who created a group;
:class:`GroupDeleted` drops a group, its checkpoints and its owner;
:class:`JournalEntry` is analysis-only and not part of the snapshot. Storage
tests can compare their load result with ``fold`` of the same records, and the
core tests use it for the replay round-trip (records -> snapshot -> restore).
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.core.effects import Effect, Persist
from coordinator.core.records import (
    CatalogChanged,
    CheckpointMeta,
    CheckpointsWritten,
    GroupDeleted,
    GroupOwner,
    GroupRecord,
    JournalEntry,
    Record,
    Snapshot,
)
from protocol.catalog import Placement
from protocol.validate import Scalar


def records_of(effects: Iterable[Effect]) -> list[Record]:
    """The records of every ``Persist`` among ``effects``, in order."""
    return [effect.record for effect in effects if isinstance(effect, Persist)]


def fold(records: Iterable[Record], base: Snapshot | None = None) -> Snapshot:
    """Apply ``records`` in order on top of ``base`` (default: nothing stored)."""
    groups: dict[str, GroupRecord] = {}
    checkpoints: dict[str, dict[tuple[str, int], Scalar]] = {}
    catalog: dict[str, int] = {}
    placement: dict[str, Placement] = {}
    epoch = 0
    last_commit: dict[str, int] = {}
    owners: dict[str, str] = {}
    written: dict[str, dict[tuple[str, int], CheckpointMeta]] = {}
    if base is not None:
        groups = {g.group_id: g for g in base.groups}
        checkpoints = {gid: dict(values) for gid, values in base.checkpoints.items()}
        catalog = dict(base.catalog)
        placement = dict(base.placement)
        epoch = base.resources_epoch
        last_commit = dict(base.last_commit_ms)
        owners = dict(base.owners)
        written = {gid: dict(meta) for gid, meta in base.checkpoint_meta.items()}
    for record in records:
        if isinstance(record, GroupRecord):
            groups[record.group_id] = record
        elif isinstance(record, GroupDeleted):
            groups.pop(record.group_id, None)
            checkpoints.pop(record.group_id, None)
            last_commit.pop(record.group_id, None)
            owners.pop(record.group_id, None)
            written.pop(record.group_id, None)
        elif isinstance(record, GroupOwner):
            owners[record.group_id] = record.owner
        elif isinstance(record, CheckpointsWritten):
            store = checkpoints.setdefault(record.group_id, {})
            meta = written.setdefault(record.group_id, {})
            who = (CheckpointMeta(record.committed_ms, record.member_id, record.generation_id,
                                  record.sequence)
                   if record.committed_ms > 0 else None)
            for resource_set, index, value in record.checkpoints:
                key = (resource_set, index)
                if value is None:
                    store.pop(key, None)
                else:
                    store[key] = value
                if value is None or who is None:
                    meta.pop(key, None)
                else:
                    meta[key] = who
            if not store:
                del checkpoints[record.group_id]
            if not meta:
                del written[record.group_id]
            if record.committed_ms > 0:
                last_commit[record.group_id] = max(record.committed_ms,
                                                   last_commit.get(record.group_id, 0))
        elif isinstance(record, CatalogChanged):
            if record.partitions is None:
                catalog.pop(record.name, None)
            else:
                catalog[record.name] = record.partitions
            if record.partitions is None or record.placement.is_default:
                placement.pop(record.name, None)
            else:
                placement[record.name] = record.placement
            epoch = record.resources_epoch
        elif isinstance(record, JournalEntry):
            continue
        else:
            raise TypeError(f"not a record: {record!r}")
    # Like storage, a last commit time only for groups that still hold checkpoints.
    return Snapshot(tuple(groups[gid] for gid in sorted(groups)), checkpoints, catalog, epoch,
                    {gid: ms for gid, ms in last_commit.items() if gid in checkpoints},
                    owners, written, placement)
