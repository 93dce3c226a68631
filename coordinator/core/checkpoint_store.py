"""One group's checkpoints: values, their byte count, and their keys in order.

The caps (``--max-checkpoints-per-group``, ``--max-checkpoint-bytes-per-group``,
``--max-checkpoint-bytes-per-token``) need the count and the bytes of a group at
every commit, and paged fetches need the keys sorted by (set, index) at every
page; both are kept up to date here as commits apply, so neither a commit nor a
fetch page ever walks the whole group.

A commit is planned first (:meth:`CheckpointStore.plan`: its net changes, and
the count and bytes after them, for the caps) and applied only if accepted.

The sorted keys are :class:`SortedKeys`: a list of sorted chunks of a few
hundred keys each. A commit's new keys go into the chunks they fall in (one by
one, a binary search and a short move each, or, for many into one chunk, a
merge of that chunk), and a deleted key leaves its chunk the same way; a chunk
grown too long is split. So a commit costs the loop in proportion to the keys
it adds or removes, whatever the group already holds (with one sorted list,
re-sorted or filtered whole, a commit of a few dozen new keys into a group of
100,000 cost about 10 ms), and a page is a binary search and a slice or two.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import NamedTuple

from coordinator.core.records import CheckpointMeta
from protocol.validate import Scalar, checkpoint_size

Key = tuple[str, int]
Checkpoint = tuple[str, int, Scalar]

#: keys per chunk of :class:`SortedKeys` (a chunk is split at twice this).
CHUNK = 512
#: up to this many keys added to one chunk go in one by one; more: one merge.
_ONE_BY_ONE = 16


class SortedKeys:
    """Distinct keys in order, in chunks: adding or removing ``k`` keys costs about
    ``k`` binary searches and moves of at most ``2 * chunk`` pointers each."""

    __slots__ = ("_chunk", "_chunks", "_len", "_maxes")

    def __init__(self, ordered: list[Key] | None = None, chunk: int = CHUNK) -> None:
        self._chunk = chunk
        #: sorted, non-empty, each one's keys below the next one's.
        self._chunks: list[list[Key]] = []
        #: the last key of each chunk (what a binary search finds a key's chunk by).
        self._maxes: list[Key] = []
        self._len = 0
        if ordered:
            self._build(ordered)

    def _build(self, ordered: list[Key]) -> None:
        size = self._chunk
        self._chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
        self._maxes = [c[-1] for c in self._chunks]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Key]:
        return chain.from_iterable(self._chunks)

    def add(self, new: list[Key]) -> None:
        """Add keys not held yet (``new`` sorted)."""
        if not new:
            return
        chunks, maxes = self._chunks, self._maxes
        if not chunks:
            self._build(new)
            return
        last = len(chunks) - 1
        i, n = 0, len(new)
        too_long = False
        while i < n:
            # new[i]'s chunk: the first whose last key is above it, else the last one;
            # the keys after new[i] up to that chunk's last key go in with it.
            j = min(bisect_left(maxes, new[i]), last)
            end = n if j == last else bisect_right(new, maxes[j], i)
            chunk = chunks[j]
            if end - i <= _ONE_BY_ONE:
                for key in new[i:end]:
                    insort(chunk, key)
            else:
                # Two sorted runs: Timsort merges them in linear time.
                chunk += new[i:end]
                chunk.sort()
            maxes[j] = chunk[-1]
            too_long = too_long or len(chunk) > 2 * self._chunk
            i = end
        self._len += n
        if too_long:
            self._split()

    def _split(self) -> None:
        size = self._chunk
        chunks: list[list[Key]] = []
        for c in self._chunks:
            if len(c) > 2 * size:
                chunks += (c[i:i + size] for i in range(0, len(c), size))
            else:
                chunks.append(c)
        self._chunks = chunks
        self._maxes = [c[-1] for c in chunks]

    def remove(self, gone: list[Key]) -> None:
        """Remove held keys."""
        if not gone:
            return
        if 8 * len(gone) >= self._len:
            # A large share of the keys: one pass costs less than a search each.
            drop = set(gone)
            self._build([k for k in self if k not in drop])
            return
        chunks, maxes = self._chunks, self._maxes
        emptied = False
        for key in gone:
            j = bisect_left(maxes, key)
            chunk = chunks[j]
            del chunk[bisect_left(chunk, key)]
            if chunk:
                maxes[j] = chunk[-1]
            else:
                emptied = True
        self._len -= len(gone)
        if emptied:
            self._chunks = [c for c in chunks if c]
            self._maxes = [c[-1] for c in self._chunks]

    def page(self, after: Key | None, limit: int) -> tuple[list[Key], bool]:
        """Up to ``limit`` keys sorted after ``after`` (``None``: from the first), and
        whether more follow them."""
        chunks = self._chunks
        if after is None:
            j, start = 0, 0
        else:
            j = bisect_right(self._maxes, after)
            if j == len(chunks):
                return [], False
            start = bisect_right(chunks[j], after)
        found: list[Key] = []
        while j < len(chunks) and len(found) < limit:
            chunk = chunks[j]
            taken = chunk[start:start + limit - len(found)]
            found += taken
            if start + len(taken) < len(chunk):
                return found, True
            j, start = j + 1, 0
        return found, j < len(chunks)


class Plan(NamedTuple):
    """A commit's net effect on one store: key -> value (``None``: delete), and the
    checkpoints and bytes the store would hold after it."""

    changes: dict[Key, Scalar]
    total: int
    nbytes: int
    #: keys the store does not hold yet, and held keys deleted (in no order).
    added: list[Key]
    removed: list[Key]
    #: whether any change is a delete (``None``), of a held key or not.
    deletes: bool
    #: integer checkpoints moved backwards: (key, old, new), for group health.
    rewound: list[tuple[Key, int, int]]


class CheckpointStore:
    """The checkpoints of one group (never holds a ``None`` value)."""

    __slots__ = ("_keys", "meta", "nbytes", "values")

    def __init__(self, values: Mapping[Key, Scalar] | None = None,
                 meta: Mapping[Key, CheckpointMeta] | None = None, *,
                 chunk: int = CHUNK) -> None:
        self.values: dict[Key, Scalar] = {}
        #: who wrote each checkpoint and when, where known; one shared tuple per
        #: commit, so a key costs a dict slot, not an object.
        self.meta: dict[Key, CheckpointMeta] = {}
        #: every key of ``values``, sorted.
        self._keys = SortedKeys(chunk=chunk)
        #: bytes counted against --max-checkpoint-bytes-per-group (checkpoint_size).
        self.nbytes = 0
        if values:
            self.values = {key: value for key, value in values.items() if value is not None}
            self._keys = SortedKeys(sorted(self.values), chunk)
            self.nbytes = sum(checkpoint_size(s, v) for (s, _), v in self.values.items())
        if meta:
            self.meta = {key: m for key, m in meta.items() if key in self.values}

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    def get(self, key: Key) -> Scalar:
        return self.values.get(key)

    def plan(self, checkpoints: Iterable[Checkpoint]) -> Plan:
        """What writing ``checkpoints`` in order would do (a later one for a key wins;
        ``None`` deletes), and the count and bytes the group would hold after.

        One pass over the net changes works out everything :meth:`apply` and the
        callers need, so a large commit is walked as few times as possible.
        """
        changes: dict[Key, Scalar] = {(s, i): v for s, i, v in checkpoints}
        count = len(self.values)
        nbytes = self.nbytes
        get = self.values.get
        added: list[Key] = []
        removed: list[Key] = []
        rewound: list[tuple[Key, int, int]] = []
        deletes = False
        for key, value in changes.items():
            old = get(key)
            if value is None:
                deletes = True
                if old is not None:
                    removed.append(key)
                    count -= 1
                    nbytes -= checkpoint_size(key[0], old)
                continue
            if old is None:
                added.append(key)
                count += 1
            else:
                nbytes -= checkpoint_size(key[0], old)
                if type(value) is int and type(old) is int and value < old:
                    rewound.append((key, old, value))
            nbytes += checkpoint_size(key[0], value)
        return Plan(changes, count, nbytes, added, removed, deletes, rewound)

    def apply(self, plan: Plan, meta: CheckpointMeta | None = None) -> None:
        """Write what :meth:`plan` worked out (on this store, unchanged since);
        ``meta``: who wrote it and when."""
        values = self.values
        changes = plan.changes
        written = self.meta
        if plan.deletes:
            for key in plan.removed:
                del values[key]
                written.pop(key, None)
            values.update((k, v) for k, v in changes.items() if v is not None)
            if meta is not None:
                written.update((k, meta) for k, v in changes.items() if v is not None)
        else:
            # Only writes: dict updates that never leave C.
            values.update(changes)
            if meta is not None:
                written.update(dict.fromkeys(changes, meta))
        self.nbytes = plan.nbytes
        self._keys.remove(sorted(plan.removed))
        self._keys.add(sorted(plan.added))

    def page(self, after: Key | None, limit: int) -> tuple[list[Checkpoint], Key | None]:
        """Up to ``limit`` checkpoints sorted after ``after`` (``None``: from the first),
        and the ``after`` of the next page (``None``: none left)."""
        chunk, more = self._keys.page(after, limit)
        values = self.values
        found = [(s, i, values[(s, i)]) for s, i in chunk]
        return found, (chunk[-1] if more and chunk else None)
