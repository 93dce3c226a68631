"""Per-rebalance facts for many groups at once, in numpy (docs/pipeline.md).

The same rules as :class:`pipeline.ownership.GroupHistory` (the row-at-a-time
reference the unit tests also run), computed over a matrix instead of a loop:
row ``i`` of a group, column ``r`` one of the group's resources, the cell the
member that owns ``r`` at the end of rebalance ``i`` (``-1``: nobody). With
``P`` the same matrix shifted down a row (``A_{i-1}``; ``-1`` where the
history restarts):

* revoked at ``i``: ``P >= 0`` and (eager, or ``O != P``) (KIP-429);
* it is owned again at ``j``, the first row ``>= i`` of the same history with
  ``O[j, r] >= 0`` (a backwards running minimum over row numbers), moved when
  ``O[j, r] != P[i, r]``; unowned ``E_j - S_i`` ms; booked on row ``i``;
* never owned again before the history breaks: counted until the break's last
  ``ended_ms`` and in ``unowned_at_end``;
* a row starts while something is waiting exactly when a resource it did not
  inherit was owned earlier in the same history (a running count per
  column): that gives ``is_follow_up`` and keeps waiting resources out of
  ``first_assigned``.

Only distinct assignments are decoded (a group goes back to the same
assignment often, and different assignments share most members' bytes):
:func:`partition_chunks` numbers a partition's distinct assignment blobs
with Arrow's dictionary encoding, and each member's assignment bytes are
decoded once per chunk. Matrices are
processed in blocks of at most :data:`BLOCK_CELLS` cells, carrying the state
of the open history from one block to the next, so a group with thousands of
resources and rows needs no more memory than a small one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ownership import FACTS_FIELDS, PROTOCOL_TYPE, decode_resources

#: Cells (rows x resources) of one owner matrix: 4M int32 = 16 MB, a few of
#: them alive at once.
BLOCK_CELLS = 4_000_000

#: Columns of the input: journal rows sorted by group, then ``id``.
INPUT_COLUMNS: tuple[str, ...] = (
    "source", "group_id", "id", "generation_id", "protocol_type", "protocol_name",
    "reason", "started_ms", "ended_ms", "member_count", "joined_count", "left_count",
    "assignments")

_LONG = {"journal_id", "generation_id", "started_ms", "ended_ms", "duration_ms",
         "member_count", "joined", "left", "owned_before", "owned_after", "revoked",
         "moved", "first_assigned", "unavailable_ms", "unowned_at_end", "follow_ups",
         "converged_ms", "window_count"}
_BOOL = {"cooperative", "is_follow_up", "assignment_error"}

#: The figures that are null on a row whose assignments cannot be read.
_OWNERSHIP = ("owned_before", "owned_after", "revoked", "moved", "first_assigned",
              "unavailable_ms", "unowned_at_end", "is_follow_up", "follow_ups", "converged_ms")


def facts_schema() -> pa.Schema:
    """The columns of ``rebalances/`` (``window_count``, a count, is never null)."""
    return pa.schema([pa.field(n, pa.int64() if n in _LONG else pa.bool_() if n in _BOOL
                               else pa.string(), nullable=n != "window_count")
                      for n in FACTS_FIELDS])


def window_counts(group: np.ndarray, started: np.ndarray, window_ms: int) -> np.ndarray:
    """The storm counter: for each row, the rows of its group (``group``:
    one number per group) that started in ``(S - W, S]`` of its start ``S``,
    itself and rows with the same start included (whole milliseconds, so
    ``[S - W + 1, S]``); rows in any order. The same count as Spark's
    ``count(1).over(Window.partitionBy(group).orderBy(started_ms)
    .rangeBetween(-(W - 1), 0))`` (tests/pipeline/test_pipeline_facts.py
    checks it against that window), without a second shuffle and sort of
    the facts.

    Starts and window bounds are ranked together, so that (group, rank)
    is one sortable integer, and two binary searches per row count the rows
    between the bounds."""
    n = len(started)
    if n == 0:
        return np.zeros(0, np.int64)
    s = np.asarray(started, np.int64)
    low = s - np.int64(max(1, int(window_ms)) - 1)
    values, rank = np.unique(np.concatenate([s, low]), return_inverse=True)
    rank = rank.reshape(-1)
    g = np.asarray(group, np.int64) * np.int64(len(values) + 1)
    at = g + rank[:n]
    keys = np.sort(at)
    hi = np.searchsorted(keys, at, side="right")
    lo = np.searchsorted(keys, g + rank[n:], side="left")
    out: np.ndarray = (hi - lo).astype(np.int64)
    return out


# ---------------------------------------------------------------- decoding


@dataclass
class _States:
    """The decoded distinct assignments of a chunk's groups, flattened."""

    group: np.ndarray            # per state: group number in the chunk
    error: np.ndarray            # per state: could not be read
    flat_state: np.ndarray       # per (state, member, resource)
    flat_col: np.ndarray
    flat_owner: np.ndarray
    width: np.ndarray            # per group: resources seen (matrix columns)


def _decode_states(group: np.ndarray, blobs: Sequence[bytes | None], groups: int) -> _States:
    """Decodes the distinct assignments ``blobs`` (state ``k`` of group
    ``group[k]``) of a chunk.

    Only the outer map (member id -> bytes) is unpacked per state, its keys
    and values gathered with C-level ``extend``; member ids are numbered by
    Arrow (chunk-wide: a number only has to tell a group's members apart),
    and each distinct member assignment's bytes are decoded once for the
    whole chunk. Resource columns are numbered per group (a group's matrix
    has one column per resource it ever saw; their order does not matter).
    """
    n = len(blobs)
    error = np.zeros(n, dtype=bool)
    per_state = np.zeros(n, dtype=np.int64)      # members per state
    keys: list[Any] = []
    values: list[Any] = []
    unpack = msgpack.unpackb
    for k in range(n):
        blob = blobs[k]
        if not blob:
            continue
        try:
            obj = unpack(blob, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            error[k] = True
            continue
        if not isinstance(obj, dict):
            error[k] = True
            continue
        keys.extend(obj)
        values.extend(obj.values())
        per_state[k] = len(obj)
    entry_state = np.repeat(np.arange(n, dtype=np.int64), per_state)
    # A member id must be a string, its assignment bytes (or nil): checked for
    # all entries at once, entry by entry only when some are not.
    if not set(map(type, keys)) <= {str}:
        bad = np.fromiter((not isinstance(m, str) for m in keys), bool, len(keys))
        error[entry_state[bad]] = True
        keys = [m if isinstance(m, str) else "" for m in keys]
    if not set(map(type, values)) <= {bytes, type(None)}:
        bad = np.fromiter((not isinstance(v, (bytes, type(None))) for v in values), bool,
                          len(values))
        error[entry_state[bad]] = True
        values = [v if isinstance(v, (bytes, type(None))) else None for v in values]
    member = _np(pc.dictionary_encode(pa.array(keys, pa.string())).indices, np.int32)
    inner = pc.dictionary_encode(pc.fill_null(pa.array(values, pa.binary()), b""))
    inner_of = _np(inner.indices)
    # Each distinct member assignment once: its resources as chunk-wide ids.
    resources: dict[tuple[str, int], int] = {}
    pool: list[int] = []
    distinct = inner.dictionary.to_pylist()
    inner_len = np.zeros(len(distinct), dtype=np.int64)
    inner_bad = np.zeros(len(distinct), dtype=bool)
    for d, data in enumerate(distinct):
        if not data:
            continue
        try:
            found = decode_resources(data)
        except (ValueError, TypeError, msgpack.UnpackException):
            inner_bad[d] = True
            continue
        pool.extend([resources.setdefault(r, len(resources)) for r in found])
        inner_len[d] = len(found)
    error[entry_state[inner_bad[inner_of]]] = True
    # Entries of readable states only, expanded to one row per resource.
    keep = ~error[entry_state]
    entry_state, member, inner_of = entry_state[keep], member[keep], inner_of[keep]
    counts = inner_len[inner_of]
    total = int(counts.sum())
    inner_start = np.cumsum(inner_len) - inner_len
    flat_start = np.cumsum(counts) - counts
    pick = np.repeat(inner_start[inner_of] - flat_start, counts) + np.arange(total)
    res = np.array(pool, dtype=np.int64)[pick]
    flat_state = np.repeat(entry_state, counts)
    # Columns numbered per group: the rank of the resource among the group's.
    g = group[flat_state].astype(np.int64)
    col, width = _ranks_per_group(g, res, groups, len(resources))
    return _States(group, error, flat_state, col, np.repeat(member, counts), width)


#: Cells of the (group x resource) table _ranks_per_group marks, at most.
_DENSE_CELLS = 1 << 26


def _ranks_per_group(g: np.ndarray, res: np.ndarray, groups: int, resources: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """For pairs (group ``g``, resource ``res``): the rank of ``res`` among
    the distinct resources of its group (as int32), and each group's count
    of distinct resources. Groups of a chunk share resource names (and so
    ids) more often than not: a table of (group x resource) marks is then
    small, and marking it costs far less than sorting every pair."""
    if groups * resources <= _DENSE_CELLS:
        key = g * resources + res
        seen = np.zeros(groups * resources, dtype=bool)
        seen[key] = True
        rank = np.cumsum(seen, dtype=np.int64) - 1
        width = seen.reshape(groups, resources).sum(axis=1, dtype=np.int64)
        first_col = np.cumsum(width) - width
        return (rank[key] - first_col[g]).astype(np.int32), width
    uniq, inv = np.unique((g << 32) | res, return_inverse=True)
    width = np.bincount(uniq >> 32, minlength=groups).astype(np.int64)
    first_col = np.cumsum(width) - width
    return (inv.reshape(-1) - first_col[g]).astype(np.int32), width


# ---------------------------------------------------------------- the matrix


@dataclass
class _Carry:
    """State of the open history at the end of a block, per column."""

    prev: np.ndarray
    pend_row: np.ndarray
    pend_owner: np.ndarray
    ever: np.ndarray
    last_end: int = 0

    @classmethod
    def empty(cls, width: int) -> _Carry:
        return cls(np.full(width, -1, np.int32), np.full(width, -1, np.int64),
                   np.full(width, -1, np.int32), np.zeros(width, bool))


@dataclass
class _Out:
    """Per-row figures of one bucket of rows."""

    n: int
    owned_before: np.ndarray = field(init=False)
    owned_after: np.ndarray = field(init=False)
    revoked: np.ndarray = field(init=False)
    moved: np.ndarray = field(init=False)
    first: np.ndarray = field(init=False)
    unavailable: np.ndarray = field(init=False)
    unowned_end: np.ndarray = field(init=False)
    follow_ups: np.ndarray = field(init=False)
    converged: np.ndarray = field(init=False)
    is_follow_up: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("owned_before", "owned_after", "revoked", "moved", "first",
                     "unavailable", "unowned_end", "follow_ups", "converged"):
            setattr(self, name, np.zeros(self.n, np.int64))
        self.is_follow_up = np.zeros(self.n, bool)


def _block(o: np.ndarray, restart: np.ndarray, coop: np.ndarray, s: np.ndarray,
           e: np.ndarray, off: int, carry: _Carry, out: _Out, s_all: np.ndarray) -> None:
    """Rows ``off .. off + len(o)`` of a bucket: ``o`` their owner matrix."""
    n, width = o.shape
    p = np.empty_like(o)
    p[0] = carry.prev[:width]
    p[1:] = o[:-1]
    p[restart] = -1
    owned = o >= 0
    owned_prev = p >= 0
    rows = np.arange(n, dtype=np.int32)

    # Histories inside the block: chain c starts at starts[c - 1]; chain 0
    # (when the block does not start with a restart) continues the carried one.
    cid = np.cumsum(restart)
    starts = np.flatnonzero(restart)
    ends = np.append(starts, n) - 1          # last row of chain c is ends[c]
    chain_last = ends[cid]
    open_chain = cid == cid[-1]              # may go on in the next block

    # The first row of each history owning each resource (n: none; -1:
    # owned in an earlier block of the carried history). Owned earlier in
    # the same history than row i: that row is before i.
    idx = np.where(owned, rows[:, None], np.int32(n))
    seg = starts if restart[0] else np.r_[0, starts].astype(np.int64)
    seg_of = cid - 1 if restart[0] else cid
    first_row = np.minimum.reduceat(idx, seg, axis=0)
    if not restart[0]:
        first_row[0, carry.ever[:width]] = -1
    ever = first_row[seg_of] < rows[:, None]

    changed = o != p
    rev = owned_prev & (~coop[:, None] | changed)
    out.owned_before[off:off + n] = owned_prev.sum(1)
    out.owned_after[off:off + n] = owned.sum(1)
    out.revoked[off:off + n] = rev.sum(1)
    now = rev & owned                          # owned again at the end of row i
    out.unavailable[off:off + n] += now.sum(1) * np.maximum(0, e - s)
    out.moved[off:off + n] += (now & changed).sum(1)
    waiting = ~owned_prev & ever
    # Owned for the first time in its history at row i: i is its first row.
    firsts = first_row[(first_row >= 0) & (first_row < n)]
    out.first[off:off + n] = np.bincount(firsts, minlength=n)
    out.is_follow_up[off:off + n] = coop & waiting.any(1)

    ii, rr = np.nonzero(rev & ~owned)
    jj = _next_owned(owned, idx, ii + 1, rr)
    ok = jj <= chain_last[ii]
    gi, gj, gr = ii[ok], jj[ok], rr[ok]
    np.add.at(out.moved, off + gi, (o[gj, gr] != p[gi, gr]).astype(np.int64))
    np.add.at(out.unavailable, off + gi, np.maximum(0, e[gj] - s[gi]))
    np.maximum.at(out.follow_ups, off + gi, gj - gi)
    np.maximum.at(out.converged, off + gi, e[gj])
    bad = ~ok
    closed = bad & ~open_chain[ii]
    ci = ii[closed]
    np.add.at(out.unavailable, off + ci, np.maximum(0, e[chain_last[ci]] - s[ci]))
    np.add.at(out.unowned_end, off + ci, 1)
    new_pending = bad & open_chain[ii]

    # Resources revoked in earlier blocks and still waiting.
    (pr,) = np.nonzero(carry.pend_row[:width] >= 0)
    if len(pr):
        prow = carry.pend_row[pr]
        if restart[0]:
            _close(out, prow, carry.last_end, s_all)
            carry.pend_row[pr] = -1
        else:
            j = _next_owned(owned, idx, np.zeros(len(pr), np.int64), pr)
            got = j <= chain_last[0]
            gp, gprow, gjj = pr[got], prow[got], j[got]
            np.add.at(out.moved, gprow, (o[gjj, gp] != carry.pend_owner[gp]).astype(np.int64))
            np.add.at(out.unavailable, gprow, np.maximum(0, e[gjj] - s_all[gprow]))
            np.maximum.at(out.follow_ups, gprow, off + gjj - gprow)
            np.maximum.at(out.converged, gprow, e[gjj])
            carry.pend_row[gp] = -1
            if not open_chain[0]:               # the history broke inside this block
                rest = ~got
                _close(out, prow[rest], int(e[chain_last[0]]), s_all)
                carry.pend_row[pr[rest]] = -1
    carry.pend_row[rr[new_pending]] = off + ii[new_pending]
    carry.pend_owner[rr[new_pending]] = p[ii[new_pending], rr[new_pending]]

    carry.prev[:width] = o[-1]
    carry.ever[:width] = first_row[-1] < n       # the -1s: carried on (no restart)
    carry.last_end = int(e[-1])


#: Rows _next_owned probes before it falls back to a running minimum.
_PROBES = 4


def _next_owned(owned: np.ndarray, idx: np.ndarray, start: np.ndarray, col: np.ndarray
                ) -> np.ndarray:
    """For each query: the first row ``>= start`` owning resource ``col``
    (``len(owned)``: none in the block). ``idx`` is ``owned``'s row number,
    or ``len(owned)``, per cell.

    A revoked resource is usually owned again a row or two later: the rows
    after each query are probed first, and only the columns of queries
    still open then get a backwards running minimum (it was most of a
    block's time when run over every column)."""
    n = len(owned)
    out = np.full(len(start), n, dtype=np.int64)
    todo = np.arange(len(start))
    cur = start.astype(np.int64)
    for _ in range(_PROBES):
        live = cur < n
        todo, cur = todo[live], cur[live]
        if not len(todo):
            return out
        hit = owned[cur, col[todo]]
        out[todo[hit]] = cur[hit]
        todo, cur = todo[~hit], cur[~hit] + 1
    live = cur < n
    todo, cur = todo[live], cur[live]
    if len(todo):
        cols, where = np.unique(col[todo], return_inverse=True)
        nxt = np.minimum.accumulate(idx[::-1, cols], axis=0)[::-1]
        out[todo] = nxt[cur, where.reshape(-1)]
    return out


def _close(out: _Out, prow: np.ndarray, end: int, s_all: np.ndarray) -> None:
    np.add.at(out.unavailable, prow, np.maximum(0, end - s_all[prow]))
    np.add.at(out.unowned_end, prow, 1)


# ---------------------------------------------------------------- a chunk of groups


def _np(col: Any, dtype: Any = np.int64) -> np.ndarray:
    """An Arrow integer column as numpy (nulls as 0)."""
    arr = pc.fill_null(col, 0) if col.null_count else col
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _flag(col: Any) -> np.ndarray:
    out: np.ndarray = np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False),
                                 dtype=bool)
    return out


def _shift_differs(col: Any) -> np.ndarray:
    """Row k differs from row k - 1 (row 0: True)."""
    n = len(col)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = _flag(pc.not_equal(col.slice(1), col.slice(0, n - 1)).fill_null(True))
    return out


def _bucket_width(width: int) -> int:
    return max(8, 1 << max(0, int(width) - 1).bit_length())


def distinct_rows(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The rows of ``table`` (whole groups, each group's rows contiguous and
    in journal order; one chunk per column) that facts are made of, a row
    given twice kept once, and each row's group number in the table."""
    new_group = _shift_differs(table["source"]) | _shift_differs(table["group_id"])
    group = np.cumsum(new_group) - 1
    ids = _np(table["id"])
    keep = np.ones(len(ids), dtype=bool)
    keep[1:] = (group[1:] != group[:-1]) | (ids[1:] != ids[:-1])
    if not keep.all():
        return table.filter(pa.array(keep)), group[keep]
    return table, group


def facts_for_chunk(table: pa.Table, is_cooperative: Callable[[str | None], bool],
                    window_ms: int) -> pa.Table:
    """The facts (:func:`facts_schema`) of every journal row in ``table``,
    the storm counter over ``window_ms`` included.

    ``table`` has :data:`INPUT_COLUMNS` and holds whole groups, each group's
    rows contiguous and in journal order (a row given twice counts once).
    """
    table = table.combine_chunks()
    if table.num_rows == 0:
        return facts_schema().empty_table()
    rows, group = distinct_rows(table)
    ids = _np(rows["id"])
    n = rows.num_rows
    groups = int(group[-1]) + 1

    # Distinct assignments of each group (Arrow hashes the bytes, unless
    # partition_chunks did already): decoded once.
    blobs = rows["assignments"].combine_chunks()
    if not pa.types.is_dictionary(blobs.type):
        blobs = pc.dictionary_encode(blobs, null_encoding="encode")
    codes = _np(blobs.indices)
    keys, state = np.unique((group.astype(np.int64) << 32) | codes, return_inverse=True)
    s_group = keys >> 32
    states = _decode_states(s_group, blobs.dictionary.take(pa.array(keys & 0xFFFFFFFF))
                            .to_pylist(), groups)
    if len(states.flat_state):
        # A resource given to two members is not a valid assignment
        # (client.assignors.validate_assignment): no figures for it.
        key = (states.flat_state << 32) | states.flat_col.astype(np.int64)
        key.sort()
        states.error[np.unique(key[1:][key[1:] == key[:-1]] >> 32)] = True

    started, ended = _np(rows["started_ms"]), _np(rows["ended_ms"])
    generation = _np(rows["generation_id"])
    names = [x for x in pc.unique(rows["protocol_name"]).to_pylist() if is_cooperative(x)]
    coop = _flag(pc.is_in(rows["protocol_name"], value_set=pa.array(names, pa.string())))
    readable_type = _flag(pc.equal(rows["protocol_type"], PROTOCOL_TYPE))
    bad_bytes = states.error[state]
    null = ~readable_type | bad_bytes
    first_of_group = np.ones(n, dtype=bool)
    first_of_group[1:] = group[1:] != group[:-1]
    restart = first_of_group | _flag(pc.equal(rows["reason"], "initial")) | null
    restart[1:] |= (generation[1:] <= generation[:-1]) | null[:-1]

    out = _Out(n)
    out.converged[:] = ended
    widths = np.array([_bucket_width(w) for w in states.width], dtype=np.int64)
    row_width = widths[group]
    state_width = widths[s_group]
    for width in np.unique(row_width):
        w = int(width)
        (rows_b,) = np.nonzero(row_width == width)
        in_b = state_width == width
        local = np.cumsum(in_b) - 1
        matrix = np.full((int(in_b.sum()), w), -1, dtype=np.int32)
        fm = in_b[states.flat_state]
        matrix[local[states.flat_state[fm]], states.flat_col[fm]] = states.flat_owner[fm]
        matrix[states.error[in_b]] = -1
        st = local[state[rows_b]]
        nulls = null[rows_b]
        sub = _Out(len(rows_b))
        sub.converged[:] = ended[rows_b]
        carry = _Carry.empty(w)
        s_b, e_b = started[rows_b], ended[rows_b]
        step = max(1, BLOCK_CELLS // w)
        for off in range(0, len(rows_b), step):
            sl = slice(off, off + step)
            o = matrix[st[sl]]
            o[nulls[sl]] = -1
            _block(o, restart[rows_b][sl], coop[rows_b][sl], s_b[sl], e_b[sl], off, carry,
                   sub, s_b)
        (pr,) = np.nonzero(carry.pend_row >= 0)
        if len(pr):
            _close(sub, carry.pend_row[pr], carry.last_end, s_b)
        for name in ("owned_before", "owned_after", "revoked", "moved", "first",
                     "unavailable", "unowned_end", "follow_ups", "converged", "is_follow_up"):
            getattr(out, name)[rows_b] = getattr(sub, name)

    figures: dict[str, np.ndarray] = {
        "owned_before": out.owned_before, "owned_after": out.owned_after,
        "revoked": out.revoked, "moved": out.moved, "first_assigned": out.first,
        "unavailable_ms": out.unavailable, "unowned_at_end": out.unowned_end,
        "is_follow_up": out.is_follow_up, "follow_ups": out.follow_ups,
        "converged_ms": out.converged}
    columns: dict[str, Any] = {
        "source": rows["source"], "group_id": rows["group_id"], "journal_id": pa.array(ids),
        "generation_id": pa.array(generation), "protocol_type": rows["protocol_type"],
        "protocol_name": rows["protocol_name"], "cooperative": pa.array(coop),
        "reason": rows["reason"], "started_ms": pa.array(started),
        "ended_ms": pa.array(ended), "duration_ms": pa.array(ended - started),
        "member_count": pa.array(_np(rows["member_count"])),
        "joined": pa.array(_np(rows["joined_count"])),
        "left": pa.array(_np(rows["left_count"])),
        "assignment_error": pa.array(readable_type & bad_bytes),
        "window_count": pa.array(window_counts(group, started, window_ms))}
    for name, values in figures.items():
        columns[name] = pa.array(values, mask=null) if null.any() else pa.array(values)
    schema = facts_schema()
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)


#: String columns of the input: dictionary encoded over a partition, gathered
#: per chunk as indices.
_STRINGS = ("source", "group_id", "protocol_type", "protocol_name", "reason")


def _shared_dictionary(column: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """``column`` dictionary encoded over all its chunks: one index per row
    (nulls get an index of their own) and the distinct values."""
    encoded = pc.dictionary_encode(column, null_encoding="encode")
    if encoded.num_chunks == 0:
        return np.zeros(0, np.int32), pa.array([], column.type)
    chunks = encoded.chunks
    indices = np.concatenate([np.asarray(c.indices.to_numpy(zero_copy_only=False), np.int32)
                              for c in chunks])
    # Arrow's encoding of a chunked array gives every chunk the same, whole
    # dictionary. Were that ever not so, the chunks' dictionaries are merged
    # here (Arrow's unify_dictionaries refuses the null entries).
    last = chunks[-1].dictionary
    data = last.buffers()[-1]
    if data is not None and all(len(c.dictionary) == len(last)
                                and c.dictionary.buffers()[-1] is not None
                                and c.dictionary.buffers()[-1].address == data.address
                                for c in chunks[:-1]):
        return indices, last
    merged = pc.dictionary_encode(pa.concat_arrays([c.dictionary for c in chunks]),
                                  null_encoding="encode")
    remap = np.asarray(merged.indices.to_numpy(zero_copy_only=False), np.int32)
    sizes = np.array([len(c.dictionary) for c in chunks], np.int64)
    offset = np.repeat(np.cumsum(sizes) - sizes, [len(c) for c in chunks])
    return remap[offset + indices], merged.dictionary


def partition_chunks(batches: Iterable[pa.RecordBatch], rows: int = 262_144
                     ) -> Iterator[pa.Table]:
    """Tables of whole groups (about ``rows`` rows each; a bigger group is a
    chunk of its own), each group's rows contiguous and in ``id`` order, from
    the record batches of one partition in any order: Spark puts all the
    rows of a group in one partition (pipeline/analyze.py) but does not sort
    them; sorting in the JVM copied every row's bytes into sort pages and
    cost more than this.

    The partition is held in memory (the job sizes its partitions for
    that). Its string columns are dictionary encoded over the whole
    partition, groups are numbered exactly from the ``source`` and
    ``group_id`` codes (no hash that could collide), and the rows ordered by
    (group, id) in numpy. A chunk's columns are gathered in that order:
    strings through their codes, the assignments as indices into the
    partition's distinct blobs (a ``DictionaryArray``: facts_for_chunk then
    decodes each distinct blob of a group once, without hashing the bytes
    again).
    """
    full = [b for b in batches if b.num_rows]
    table = pa.Table.from_batches(full) if full else input_schema().empty_table()
    n = table.num_rows
    if n == 0:
        return
    codes: dict[str, tuple[np.ndarray, pa.Array]] = {
        c: _shared_dictionary(table[c]) for c in (*_STRINGS, "assignments")}
    numbers = {c: table[c].combine_chunks() for c in INPUT_COLUMNS
               if c not in codes}
    del table, full  # the blobs live on in the dictionary of distinct ones only
    ids = _np(numbers["id"])
    group = (codes["source"][0].astype(np.int64) * len(codes["group_id"][1])
             + codes["group_id"][0])
    order = np.argsort(group, kind="stable")
    g, i = group[order], ids[order]
    if ((g[1:] == g[:-1]) & (i[1:] < i[:-1])).any():  # ids not in order within a group
        order = np.lexsort((ids, group))
        g = group[order]
    bounds = np.append(np.flatnonzero(g[1:] != g[:-1]) + 1, n)
    start = 0
    while start < n:
        at = min(int(np.searchsorted(bounds, start + rows)), len(bounds) - 1)
        end = int(bounds[at])
        pick = order[start:end]
        take = pa.array(pick)
        columns: dict[str, pa.Array] = {c: a.take(take) for c, a in numbers.items()}
        for c in _STRINGS:
            columns[c] = codes[c][1].take(pa.array(codes[c][0][pick]))
        indices, blobs = codes["assignments"]
        columns["assignments"] = pa.DictionaryArray.from_arrays(pa.array(indices[pick]), blobs)
        yield pa.table([columns[c] for c in INPUT_COLUMNS], names=list(INPUT_COLUMNS))
        start = end


# ---------------------------------------------------------------- for tests and tools


def input_table(rows: Iterable[Any]) -> pa.Table:
    """:data:`INPUT_COLUMNS` from :class:`pipeline.ownership.JournalRow` objects
    (sorted by source, group_id, journal_id), for tests and tools."""
    return pa.Table.from_pylist([
        {"source": r.source, "group_id": r.group_id, "id": r.journal_id,
         "generation_id": r.generation_id, "protocol_type": r.protocol_type,
         "protocol_name": r.protocol_name, "reason": r.reason, "started_ms": r.started_ms,
         "ended_ms": r.ended_ms, "member_count": r.member_count, "joined_count": r.joined,
         "left_count": r.left, "assignments": r.assignments} for r in rows],
        schema=input_schema())


def input_schema() -> pa.Schema:
    strings = {"source", "group_id", "protocol_type", "protocol_name", "reason"}
    return pa.schema([(c, pa.string() if c in strings else pa.binary() if c == "assignments"
                       else pa.int64()) for c in INPUT_COLUMNS])
