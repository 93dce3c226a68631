"""Per-rebalance accounting of resource ownership, from consecutive journal rows.

Pure Python (no Spark), one row at a time: the reference implementation of
the rules. The analysis job computes the same figures in numpy over many groups
at once (pipeline/facts.py); tests check both, this one by hand and the numpy
one against this one. The rules
are spelled out in docs/pipeline.md ("Moved resources and unavailability"); in
short, with ``A_i`` the assignment that rebalance ``i`` ended with and
``A_{i-1}`` the one before it:

* a resource is *revoked* at the start of rebalance ``i`` (``started_ms``)
  when it was owned in ``A_{i-1}`` and either the group is eager (KIP-429: an
  eager member gives up everything before it rejoins) or, cooperative, its
  owner in ``A_i`` is not its owner in ``A_{i-1}``;
* a revoked resource is unowned until the end (``ended_ms``) of the first
  rebalance ``j >= i`` whose assignment gives it to someone (``j = i`` for an
  eager group and for a departed member's resources; ``j = i + 1``, the
  follow-up, for a resource a cooperative owner had to give up);
* it *moved* if that new owner is not its owner in ``A_{i-1}``;
* all of it is booked on rebalance ``i``, the one that revoked it.

A group's history restarts (nothing owned) at an ``initial`` rebalance, when
the generation goes backwards (the group was deleted and created again), and
when the group's ``protocol_type`` is not ``"resources"`` (the coordinator
cannot read such assignments: only durations and counts are reported).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

Resource = tuple[str, int]
#: Inside :class:`GroupHistory` a resource is one int, ``set number << 32 | index``
#: (set numbers are per group): hashing ints is what keeps the set algebra cheap.
ResourceId = int

PROTOCOL_TYPE = "resources"

#: Output columns of :meth:`GroupHistory.add` results, in order (analyze's
#: ``rebalances`` table). Counts are ``None`` when the assignments could not be
#: read (another protocol_type, or undecodable bytes).
FACTS_FIELDS: tuple[str, ...] = (
    "source", "group_id", "journal_id", "generation_id", "protocol_type", "protocol_name",
    "cooperative", "reason", "started_ms", "ended_ms", "duration_ms", "member_count",
    "joined", "left", "owned_before", "owned_after", "revoked", "moved", "first_assigned",
    "unavailable_ms", "unowned_at_end", "is_follow_up", "follow_ups", "converged_ms",
    "window_count", "assignment_error",
)


@dataclass(frozen=True, slots=True)
class JournalRow:
    """The columns of one journal row that the accounting reads."""

    source: str
    group_id: str
    journal_id: int
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    reason: str
    started_ms: int
    ended_ms: int
    member_count: int
    joined: int
    left: int
    assignments: bytes | None


class _Open:
    """One rebalance whose revoked resources are not all owned again yet."""

    __slots__ = ("converged_ms", "error", "first_assigned", "follow_ups", "is_follow_up",
                 "moved", "owned_after", "owned_before", "pending", "readable", "revoked",
                 "row", "seq", "unavailable_ms", "unowned_at_end", "window_count")

    def __init__(self, row: JournalRow, seq: int, window_count: int) -> None:
        self.row = row
        self.seq = seq
        self.window_count = window_count
        self.readable = True
        self.error = False
        self.owned_before = 0
        self.owned_after = 0
        self.revoked = 0
        self.moved = 0
        self.first_assigned = 0
        self.unavailable_ms = 0
        self.unowned_at_end = 0
        self.pending = 0
        self.is_follow_up = False
        self.follow_ups = 0
        self.converged_ms = row.ended_ms

    def facts(self, cooperative: bool) -> tuple[Any, ...]:
        r = self.row
        counts: tuple[Any, ...]
        if self.readable:
            counts = (self.owned_before, self.owned_after, self.revoked, self.moved,
                      self.first_assigned, self.unavailable_ms, self.unowned_at_end,
                      self.is_follow_up, self.follow_ups, self.converged_ms)
        else:
            counts = (None,) * 10
        return (r.source, r.group_id, r.journal_id, r.generation_id, r.protocol_type,
                r.protocol_name, cooperative, r.reason, r.started_ms, r.ended_ms,
                r.ended_ms - r.started_ms, r.member_count, r.joined, r.left, *counts,
                self.window_count, self.error)


def decode_assignments(blob: bytes | None) -> dict[str, bytes]:
    """The journal's ``assignments`` blob: msgpack map member_id -> assignment bytes."""
    if not blob:
        return {}
    obj = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    if not isinstance(obj, dict):
        raise ValueError("assignments is not a map")
    out: dict[str, bytes] = {}
    for k, v in obj.items():
        if not isinstance(k, str) or not isinstance(v, (bytes, type(None))):
            raise ValueError("assignments is not a map of member id to bytes")
        out[k] = v or b""
    return out


def decode_resources(data: bytes) -> frozenset[Resource]:
    """The resources of one ``ResourceAssignment`` (protocol/resources.py), as a set.

    Reads only ``assigned``; faster than ``ResourceAssignment.decode`` (which
    also validates every field) and equal on what it reads: the analysis runs
    this millions of times. An empty byte string is the empty assignment.
    """
    if not data:
        return frozenset()
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(obj, dict):
        raise ValueError("assignment is not a map")
    assigned = obj.get("assigned") or {}
    if not isinstance(assigned, dict):
        raise ValueError("assignment.assigned is not a map")
    out: list[Resource] = []
    for name, indexes in assigned.items():
        if not isinstance(name, str) or not isinstance(indexes, list):
            raise ValueError("assignment.assigned is not a map of set name to indexes")
        for i in indexes:
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise ValueError(f"assignment.assigned.{name} has a bad index {i!r}")
            out.append((name, i))
    return frozenset(out)


def decode_ids(data: bytes, set_numbers: dict[str, int]) -> frozenset[ResourceId]:
    """:func:`decode_resources`, as resource ids (new set names get the next number)."""
    return frozenset((set_numbers.setdefault(name, len(set_numbers)) << 32) | i
                     for name, i in decode_resources(data))


class GroupHistory:
    """Walks one group's journal rows in order and yields one facts tuple per row.

    Rows come out in input order, each once every resource it revoked is owned
    again (or the history ends), so memory holds only the rebalances still
    waiting for a follow-up.
    """

    def __init__(self, is_cooperative: Callable[[str | None], bool],
                 storm_window_ms: int) -> None:
        self._is_cooperative = is_cooperative
        self._window_ms = storm_window_ms
        self._starts: deque[int] = deque()
        self._seq = 0
        self._open: deque[_Open] = deque()
        self._cooperative: dict[int, bool] = {}
        self._reset_chain()
        self._last_generation: int | None = None
        self._decoded: dict[bytes, frozenset[ResourceId]] = {}
        self._set_numbers: dict[str, int] = {}
        self._states: dict[bytes, tuple[dict[str, bytes], dict[str, frozenset[ResourceId]],
                                        frozenset[ResourceId]]] = {}
        self._eager: dict[tuple[bytes, bytes], tuple[int, int, int]] = {}

    def _reset_chain(self) -> None:
        self._owned: dict[str, frozenset[ResourceId]] = {}  # A_{i-1}: member -> resources
        self._owned_all: frozenset[ResourceId] = frozenset()  # their union
        self._blob = b""                                    # A_{i-1} as stored
        self._raw: dict[str, bytes] = {}                   # A_{i-1}: member -> bytes
        # Revoked and not owned again yet: per revoking rebalance, per previous
        # owner, the resources. Set algebra per member keeps the cost per row
        # in C (frozenset operations), not in a Python loop per resource.
        self._pending: list[tuple[_Open, dict[str, set[ResourceId]]]] = []
        self._chain_end_ms = 0

    def _resources(self, data: bytes) -> frozenset[ResourceId]:
        found = self._decoded.get(data)
        if found is None:
            if len(self._decoded) > 4096:
                self._decoded.clear()
            found = decode_ids(data, self._set_numbers)
            self._decoded[data] = found
        return found

    def _close_chain(self) -> None:
        """The history breaks here: what is still unowned stays so until the
        end of the last rebalance we know of (docs/pipeline.md)."""
        for rec, by_owner in self._pending:
            n = sum(len(x) for x in by_owner.values())
            rec.unavailable_ms += n * max(0, self._chain_end_ms - rec.row.started_ms)
            rec.unowned_at_end += n
            rec.pending -= n
        self._reset_chain()

    def _emit_ready(self) -> Iterator[tuple[Any, ...]]:
        while self._open and self._open[0].pending <= 0:
            rec = self._open.popleft()
            yield rec.facts(self._cooperative.pop(rec.seq))

    def finish(self) -> Iterator[tuple[Any, ...]]:
        """End of input for this group: flush every row still waiting."""
        self._close_chain()
        yield from self._emit_ready()

    def add(self, row: JournalRow) -> Iterator[tuple[Any, ...]]:
        # Storm counter: rebalances of this group started in the last window.
        starts = self._starts
        starts.append(row.started_ms)
        while starts and starts[0] <= row.started_ms - self._window_ms:
            starts.popleft()
        rec = _Open(row, self._seq, len(starts))
        self._seq += 1
        cooperative = self._is_cooperative(row.protocol_name)
        self._cooperative[rec.seq] = cooperative
        self._open.append(rec)

        restart = (row.reason == "initial"
                   or (self._last_generation is not None
                       and row.generation_id <= self._last_generation)
                   or row.protocol_type != PROTOCOL_TYPE)
        self._last_generation = row.generation_id
        if restart:
            self._close_chain()
        if row.protocol_type != PROTOCOL_TYPE:
            rec.readable = False
            yield from self._emit_ready()
            return
        try:
            raw, current, owned_all = self._state(row.assignments or b"")
        except (ValueError, TypeError, msgpack.UnpackException):
            # Unreadable bytes: no ownership figures for this row, and the
            # chain restarts after it (we cannot tell what moved).
            rec.readable = False
            rec.error = True
            self._close_chain()
            self._chain_end_ms = row.ended_ms
            yield from self._emit_ready()
            return
        self._account(rec, cooperative, raw, current, owned_all, row.assignments or b"")
        yield from self._emit_ready()

    def _state(self, blob: bytes) -> tuple[dict[str, bytes], dict[str, frozenset[ResourceId]],
                                           frozenset[ResourceId]]:
        """A row's assignments decoded: per member bytes and resources, and their
        union. Groups go back to the same assignment often (a member restarts,
        a follow-up), so whole states are cached by their bytes."""
        found = self._states.get(blob)
        if found is None:
            if len(self._states) > 1024:
                self._states.clear()
                self._eager.clear()
            raw = decode_assignments(blob)
            current = {m: self._resources(b) for m, b in raw.items()}
            owned_all: set[ResourceId] = set()
            for x in current.values():
                owned_all |= x
            found = (raw, current, frozenset(owned_all))
            self._states[blob] = found
        return found

    def _account(self, rec: _Open, cooperative: bool, raw: Mapping[str, bytes],
                 current: Mapping[str, frozenset[ResourceId]],
                 owned_all: frozenset[ResourceId], blob: bytes) -> None:
        row = rec.row
        prev_owned, prev_raw, pending = self._owned, self._raw, self._pending
        duration = max(0, row.ended_ms - row.started_ms)
        rec.is_follow_up = cooperative and bool(pending)
        rec.owned_before = len(self._owned_all)
        pending_before: set[ResourceId] = set()
        for _, by_owner in pending:
            for x in by_owner.values():
                pending_before |= x

        # Members whose assignment bytes differ (or who are new): only they
        # can gain resources. A member with the same bytes keeps the same.
        rec.owned_after = len(owned_all)

        if not cooperative and not pending:
            # Eager, nothing waiting (the common case), in set algebra: all of
            # A_{i-1} is revoked at the start; what A_i owns is back at the end.
            prev_all = self._owned_all
            key = (self._blob, blob)
            figures = self._eager.get(key)
            if figures is None:
                back = len(prev_all & owned_all)
                same = 0
                for m, before in prev_owned.items():
                    after = current.get(m)
                    if after is not None:
                        same += len(before & after)
                figures = (back, same, len(owned_all - prev_all))
                self._eager[key] = figures
            back, same, first = figures
            rec.revoked = len(prev_all)
            rec.moved = back - same
            rec.unavailable_ms = back * duration
            rec.first_assigned = first
            if back < len(prev_all):  # not owned again: waits for a later rebalance
                lost = {m: set(before - owned_all) for m, before in prev_owned.items()}
                lost = {m: x for m, x in lost.items() if x}
                rec.pending = sum(len(x) for x in lost.values())
                pending.append((rec, lost))
            self._finish_row(row, raw, current, owned_all, blob)
            return

        changed = [m for m in current if prev_raw.get(m) != raw[m]]

        # Revocations at started_ms.
        revoked: dict[str, set[ResourceId]] = {}
        for m, before in prev_owned.items():
            if not before:
                continue
            after = current.get(m)
            if after is not None and prev_raw[m] == raw[m]:
                if not cooperative:
                    # Eager: revoked at the start, given back to the same
                    # member at the end: unowned for the whole rebalance.
                    rec.revoked += len(before)
                    rec.unavailable_ms += len(before) * duration
                continue
            # Gone, or eager: everything it had; cooperative: what it lost.
            lost_m = set(before) if (after is None or not cooperative) else set(before - after)
            if lost_m:
                revoked[m] = lost_m
                rec.revoked += len(lost_m)
                rec.pending += len(lost_m)
        if revoked:
            pending.append((rec, revoked))

        # Assignments at ended_ms: what changed members own now.
        gained: frozenset[ResourceId] | set[ResourceId]
        if len(changed) == len(current):
            gained = owned_all
        else:
            gained = set()
            for m in changed:
                gained |= current[m]
        if gained and pending:
            for owner_rec, by_owner in pending:
                for m, waiting in by_owner.items():
                    got = waiting & gained
                    if not got:
                        continue
                    now_m = current.get(m)
                    kept = len(got & now_m) if now_m is not None else 0
                    owner_rec.moved += len(got) - kept
                    owner_rec.unavailable_ms += len(got) * max(
                        0, row.ended_ms - owner_rec.row.started_ms)
                    owner_rec.pending -= len(got)
                    waiting -= got
                    if rec.seq > owner_rec.seq:
                        owner_rec.follow_ups = max(owner_rec.follow_ups, rec.seq - owner_rec.seq)
                        owner_rec.converged_ms = max(owner_rec.converged_ms, row.ended_ms)
            self._pending = [(r, {m: w for m, w in b.items() if w}) for r, b in pending
                             if any(b.values())]
        if gained:
            new = gained - self._owned_all
            rec.first_assigned += len(new - pending_before) if pending_before else len(new)
        self._finish_row(row, raw, current, owned_all, blob)

    def _finish_row(self, row: JournalRow, raw: Mapping[str, bytes],
                    current: Mapping[str, frozenset[ResourceId]],
                    owned_all: frozenset[ResourceId], blob: bytes) -> None:
        self._blob = blob
        self._owned_all = owned_all
        self._owned = dict(current)
        self._raw = dict(raw)
        self._chain_end_ms = row.ended_ms


def facts_for_rows(rows: Iterable[JournalRow], is_cooperative: Callable[[str | None], bool],
                   storm_window_ms: int) -> Iterator[tuple[Any, ...]]:
    """Facts for rows sorted by (source, group_id, journal_id); consecutive rows
    with the same (source, group_id, journal_id) are one row exported twice."""
    history: GroupHistory | None = None
    key: tuple[str, str] | None = None
    last_id: int | None = None
    for row in rows:
        k = (row.source, row.group_id)
        if k != key:
            if history is not None:
                yield from history.finish()
            history = GroupHistory(is_cooperative, storm_window_ms)
            key, last_id = k, None
        if row.journal_id == last_id:
            continue
        last_id = row.journal_id
        assert history is not None
        yield from history.add(row)
    if history is not None:
        yield from history.finish()


def cooperative_names(extra: Iterable[str] = ()) -> Callable[[str | None], bool]:
    """``protocol_name -> cooperative?``: the assignors of client/assignors that
    support KIP-429's cooperative protocol, plus ``extra`` names. Unknown names
    count as eager, which books the most unavailability (the safe side)."""
    names = set(extra)
    try:
        from client.assignors import ASSIGNOR_NAMES, RebalanceProtocol, get_assignor
        for n in ASSIGNOR_NAMES:
            if RebalanceProtocol.COOPERATIVE in get_assignor(n).protocols:
                names.add(n)
    except ImportError:  # pragma: no cover - the client package ships with groupcoord
        names.add("cooperative-sticky")
    frozen = frozenset(names)

    def is_cooperative(name: str | None) -> bool:
        return name in frozen

    return is_cooperative
