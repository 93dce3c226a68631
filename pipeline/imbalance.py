"""``imbalance/``: the load imbalance of each generation whose leader said
what load it gave (docs/pipeline.md).

A load-balancing assignor (``balanced``) gives each member sharing the load
a ``load`` of ``[load, ideal]`` (docs/protocol.md, "What the leader hands
out"): the load of what the assignment gives the member, as the leader
weighed it (the loads members measured, else the catalog's weights), and
the member's fair share (the group's load times its capacity over the
sharing members' capacity). The journal keeps each member's assignment
bytes, so the figures are read from there; nothing else is recorded. A
generation's imbalance is its busiest member's ``load / ideal`` (1.0: every
member at its fair share); its ``spread`` is the least one's. In a
cooperative hand-over the moving resources are nobody's for one generation,
so that generation's figures count them nowhere.

A generation none of whose assignments has a ``load`` (another assignor, an
older leader) or whose bytes cannot be read (the facts mark those rows
``assignment_error``) has no row. Only the distinct assignment blobs of a
chunk that contain the bytes ``load`` are decoded (with
:meth:`protocol.resources.ResourceAssignment.decode`).
"""

from __future__ import annotations

from typing import NamedTuple

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.move_causes import assignment_blobs, journal_assignments
from protocol.resources import ResourceAssignment
from protocol.validate import ValidationError

#: Columns of ``imbalance/``: one row per generation whose leader gave loads.
IMBALANCE_SCHEMA = pa.schema([
    ("source", pa.string()), ("group_id", pa.string()), ("generation_id", pa.int64()),
    ("started_ms", pa.int64()), ("members", pa.int64()), ("imbalance", pa.float64()),
    ("spread", pa.float64()), ("busiest", pa.string())])


class Loads(NamedTuple):
    """One generation's figures: members with a ``load`` whose ideal is > 0,
    the largest and least ``load / ideal``, and the member with the largest."""

    members: int
    imbalance: float
    spread: float
    busiest: str


def generation_loads(blob: bytes) -> Loads | None:
    """The figures of one generation's assignments (the journal's map of
    member id -> assignment bytes); ``None`` when no member's assignment
    has a ``load`` with an ideal > 0, or the bytes cannot be read."""
    members = journal_assignments(blob)
    if members is None:
        return None
    ratios: list[tuple[float, str]] = []
    for member, data in members.items():
        if not isinstance(data, bytes) or b"load" not in data:
            continue
        try:
            a = ResourceAssignment.decode(data)
        except (ValidationError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if a.load is not None and a.load[1] > 0:
            ratios.append((a.load[0] / a.load[1], str(member)))
    if not ratios:
        return None
    top, busiest = max(ratios, key=lambda r: (r[0], r[1]))
    return Loads(len(ratios), top, min(r for r, _ in ratios), busiest)


def imbalance_rows(chunk: pa.Table) -> pa.Table:
    """``imbalance/`` rows (:data:`IMBALANCE_SCHEMA`) of ``chunk`` (whole
    groups, as ``facts.facts_for_chunk`` takes them), in journal order."""
    if chunk.num_rows == 0:
        return IMBALANCE_SCHEMA.empty_table()
    rows, _, row_blob, distinct, candidates = assignment_blobs(chunk, "load")
    found: dict[int, Loads] = {}
    for d in candidates:
        value = distinct[int(d)].as_py()
        loads = generation_loads(value) if isinstance(value, bytes) else None
        if loads is not None:
            found[int(d)] = loads
    at = np.flatnonzero(np.isin(row_blob, np.fromiter(found, np.int64, len(found))))
    if not len(at):
        return IMBALANCE_SCHEMA.empty_table()
    figures = [found[int(row_blob[i])] for i in at]
    take = pa.array(at)
    return pa.table([
        rows["source"].take(take), rows["group_id"].take(take),
        pc.cast(rows["generation_id"].take(take), pa.int64()),
        pc.cast(rows["started_ms"].take(take), pa.int64()),
        pa.array([f.members for f in figures], pa.int64()),
        pa.array([f.imbalance for f in figures], pa.float64()),
        pa.array([f.spread for f in figures], pa.float64()),
        pa.array([f.busiest for f in figures], pa.string())], schema=IMBALANCE_SCHEMA)
