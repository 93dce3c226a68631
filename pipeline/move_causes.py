"""``move_causes/``: moved resources by cause, per group and hour (docs/pipeline.md).

A leader whose assignor says why (docs/protocol.md, "What the leader hands
out") gives each member a ``why`` list, ``[set, index, cause]`` for every
resource the member gains or loses in the generation. A move is counted once,
on the member that gains the resource, in the generation it gains it (under
cooperative rebalancing that is the follow-up, where the new owner gets it),
under the cause the leader gave for that gain. Losses are not counted again:
the gain at the new owner is the same move, and a resource that leaves the
catalog was not moved.

A generation whose assignment bytes are those of the group's generation
before (a leader that synced without assigning hands the last assignment
out again) moved nothing and counts nothing. A generation none of whose
assignments carries a ``why`` (an assignor that
does not say why, or an older client) counts the resources the accounting
found moved on that row (``rebalances.moved``) under the cause ``unknown``.

Only the assignment blobs of a chunk that contain the bytes ``why`` are
decoded again (with :meth:`protocol.resources.ResourceAssignment.decode`),
so journals whose leaders never say why cost one substring scan of the
distinct blobs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.facts import distinct_rows
from protocol.resources import ResourceAssignment
from protocol.validate import ValidationError

HOUR_MS = 3_600_000

#: The cause of moves in generations whose assignments carry no ``why``.
UNKNOWN = "unknown"

#: Columns of ``move_causes/``: one row per (source, group, hour, cause) with moves.
MOVE_CAUSES_SCHEMA = pa.schema([
    ("source", pa.string()), ("group_id", pa.string()), ("hour_start_ms", pa.int64()),
    ("cause", pa.string()), ("moves", pa.int64())])


def journal_assignments(blob: bytes) -> dict[Any, Any] | None:
    """One generation's assignments as the journal keeps them (a msgpack map of
    member id -> assignment bytes), undecoded inside; ``None``: not such a map."""
    try:
        members = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return members if isinstance(members, dict) else None


def gains_by_cause(blob: bytes) -> Counter[str] | None:
    """The resources gained per cause in one generation's assignments (the
    journal's map of member id -> assignment bytes); ``None`` when no
    member's assignment has a ``why`` entry, or the bytes cannot be read
    (the facts mark those rows ``assignment_error``)."""
    members = journal_assignments(blob)
    if members is None:
        return None
    out: Counter[str] = Counter()
    said = False
    for data in members.values():
        if not isinstance(data, bytes) or b"why" not in data:
            continue
        try:
            a = ResourceAssignment.decode(data)
        except (ValidationError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if not a.why:
            continue
        said = True
        owned = {name: set(indexes) for name, indexes in a.assigned.items()}
        for name, index, cause in a.why:
            if index in owned.get(name, ()):
                out[cause] += 1
    return out if said else None


class AssignmentBlobs(NamedTuple):
    """A chunk's rows, each row's assignments column as one of its distinct values."""

    rows: pa.Table
    #: per row, its group (:func:`pipeline.facts.distinct_rows`).
    group: np.ndarray
    #: per row, the position of its assignments in ``distinct``.
    row_blob: np.ndarray
    distinct: pa.Array
    #: positions in ``distinct`` whose bytes hold the marker (a field name): only
    #: those can carry the field, so only those are decoded.
    candidates: np.ndarray


def assignment_blobs(chunk: pa.Table, marker: str) -> AssignmentBlobs:
    """``chunk``'s distinct rows and their assignments, each distinct value once
    (a generation's assignments repeat across rows: decoded once each)."""
    rows, group = distinct_rows(chunk.combine_chunks())
    blobs = rows["assignments"].combine_chunks()
    if not pa.types.is_dictionary(blobs.type):
        blobs = pc.dictionary_encode(blobs, null_encoding="encode")
    codes = np.asarray(pc.fill_null(blobs.indices, 0).to_numpy(zero_copy_only=False), np.int64)
    used, row_blob = np.unique(codes, return_inverse=True)
    distinct = blobs.dictionary.take(pa.array(used))
    maybe = np.asarray(pc.fill_null(pc.match_substring(distinct, marker), False)
                       .to_numpy(zero_copy_only=False), bool)
    return AssignmentBlobs(rows, group, row_blob.reshape(-1), distinct, np.flatnonzero(maybe))


def move_cause_rows(chunk: pa.Table, facts: pa.Table) -> pa.Table:
    """``move_causes/`` rows (:data:`MOVE_CAUSES_SCHEMA`) of ``chunk`` (whole
    groups, as ``facts.facts_for_chunk`` takes them) and ``facts``, that
    function's output for the same chunk (its ``moved`` gives the
    ``unknown`` moves)."""
    if chunk.num_rows == 0:
        return MOVE_CAUSES_SCHEMA.empty_table()
    rows, group, row_blob, distinct, candidates = assignment_blobs(chunk, "why")
    said: dict[int, Counter[str]] = {}
    for d in candidates:
        found = gains_by_cause(distinct[int(d)].as_py())
        if found is not None:
            said[int(d)] = found
    moved = np.asarray(pc.fill_null(facts["moved"], 0).to_numpy(zero_copy_only=False), np.int64)
    has_why = np.isin(row_blob, np.fromiter(said, np.int64, len(said)))
    # The same bytes as the group's row before (a leader that synced without
    # assigning, KIP-814, hands the last assignment out again): nothing moved.
    repeat = np.zeros(len(row_blob), bool)
    repeat[1:] = (row_blob[1:] == row_blob[:-1]) & (group[1:] == group[:-1])
    has_why &= ~repeat
    # Rows without a why: their moved resources, as one cause.
    (unknown,) = np.nonzero(~has_why & (moved > 0))
    at: list[np.ndarray] = [unknown]
    causes: list[str] = [UNKNOWN] * len(unknown)
    counts: list[np.ndarray] = [moved[unknown]]
    for i in np.flatnonzero(has_why):   # rows of leaders that said why: few per blob
        gains = said[int(row_blob[i])]
        at.append(np.full(len(gains), i, np.int64))
        causes.extend(gains)
        counts.append(np.fromiter(gains.values(), np.int64, len(gains)))
    return _per_group_hour(rows, group, np.concatenate(at), causes, np.concatenate(counts))


def _per_group_hour(rows: pa.Table, group: np.ndarray, at: np.ndarray, causes: list[str],
                    counts: np.ndarray) -> pa.Table:
    """Moves ``counts[k]`` of cause ``causes[k]`` on row ``at[k]``, added up per
    (source, group, hour, cause)."""
    if not len(at):
        return MOVE_CAUSES_SCHEMA.empty_table()
    started = np.asarray(rows["started_ms"].to_numpy(zero_copy_only=False), np.int64)[at]
    sums = pa.table({"group": pa.array(group[at]), "hour": pa.array(started - started % HOUR_MS),
                     "cause": pa.array(causes, pa.string()), "moves": pa.array(counts),
                     "row": pa.array(at)}) \
        .group_by(["group", "hour", "cause"]).aggregate([("moves", "sum"), ("row", "min")]) \
        .sort_by([("group", "ascending"), ("hour", "ascending"), ("cause", "ascending")])
    first = sums["row_min"]
    return pa.table([rows["source"].take(first), rows["group_id"].take(first), sums["hour"],
                     sums["cause"], sums["moves_sum"]], schema=MOVE_CAUSES_SCHEMA)
