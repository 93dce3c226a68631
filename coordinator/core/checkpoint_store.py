"""One group's checkpoints: values, their byte count, and their keys in order.

The caps (``--max-checkpoints-per-group``, ``--max-checkpoint-bytes-per-group``)
need the count and the bytes of a group at every commit, and paged fetches need
the keys sorted by (set, index) at every page; both are kept up to date here
as commits apply, so neither a commit nor a fetch page ever walks the whole
group (a fetch page is a binary search and a slice).

A commit is planned first (:meth:`CheckpointStore.plan`: its net changes, and
the count and bytes after them, for the caps) and applied only if accepted.
Keeping the key list sorted: a commit that adds or removes a few keys moves
them in place (``bisect``: a search and one memmove of the list); one that adds
or removes many re-sorts once (the list is two sorted runs, which Timsort merges
in linear time) or filters once, so a large commit never pays per key for the
whole list.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from coordinator.core.records import CheckpointMeta
from protocol.validate import Scalar, checkpoint_size

Key = tuple[str, int]
Checkpoint = tuple[str, int, Scalar]

#: up to this many keys added or removed by one commit are moved one by one.
_IN_PLACE = 32


class Plan(NamedTuple):
    """A commit's net effect on one store: key -> value (``None``: delete), and the
    checkpoints and bytes the store would hold after it."""

    changes: dict[Key, Scalar]
    total: int
    nbytes: int


class CheckpointStore:
    """The checkpoints of one group (never holds a ``None`` value)."""

    __slots__ = ("_keys", "meta", "nbytes", "values")

    def __init__(self, values: Mapping[Key, Scalar] | None = None,
                 meta: Mapping[Key, CheckpointMeta] | None = None) -> None:
        self.values: dict[Key, Scalar] = {}
        #: who wrote each checkpoint and when, where known; one shared tuple per
        #: commit, so a key costs a dict slot, not an object.
        self.meta: dict[Key, CheckpointMeta] = {}
        #: every key of ``values``, sorted.
        self._keys: list[Key] = []
        #: bytes counted against --max-checkpoint-bytes-per-group (checkpoint_size).
        self.nbytes = 0
        if values:
            self.values = {key: value for key, value in values.items() if value is not None}
            self._keys = sorted(self.values)
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
        ``None`` deletes), and the count and bytes the group would hold after."""
        changes: dict[Key, Scalar] = {(s, i): v for s, i, v in checkpoints}
        count = len(self.values)
        nbytes = self.nbytes
        values = self.values
        for key, value in changes.items():
            old = values.get(key)
            if old is not None:
                count -= 1
                nbytes -= checkpoint_size(key[0], old)
            if value is not None:
                count += 1
                nbytes += checkpoint_size(key[0], value)
        return Plan(changes, count, nbytes)

    def apply(self, plan: Plan, meta: CheckpointMeta | None = None) -> None:
        """Write what :meth:`plan` worked out (on this store, unchanged since);
        ``meta``: who wrote it and when."""
        values = self.values
        changes = plan.changes
        added = [k for k, v in changes.items() if v is not None and k not in values]
        removed = [k for k, v in changes.items() if v is None and k in values]
        written = self.meta
        for key in removed:
            del values[key]
            written.pop(key, None)
        values.update((k, v) for k, v in changes.items() if v is not None)
        if meta is not None:
            written.update((k, meta) for k, v in changes.items() if v is not None)
        self.nbytes = plan.nbytes
        keys = self._keys
        if len(removed) <= _IN_PLACE:
            for key in removed:
                del keys[bisect_left(keys, key)]
        else:
            gone = set(removed)
            keys = self._keys = [k for k in keys if k not in gone]
        if len(added) <= _IN_PLACE:
            for key in added:
                insort(keys, key)
        else:
            # Two sorted runs: Timsort merges them in linear time.
            added.sort()
            keys += added
            keys.sort()

    def page(self, after: Key | None, limit: int) -> tuple[list[Checkpoint], Key | None]:
        """Up to ``limit`` checkpoints sorted after ``after`` (``None``: from the first),
        and the ``after`` of the next page (``None``: none left)."""
        keys = self._keys
        start = 0 if after is None else bisect_right(keys, after)
        chunk = keys[start:start + limit]
        values = self.values
        found = [(s, i, values[(s, i)]) for s, i in chunk]
        more = start + limit < len(keys)
        return found, (chunk[-1] if more and chunk else None)


