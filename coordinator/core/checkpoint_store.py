"""One group's checkpoints: values, their byte count, and their keys in order.

The caps (``--max-checkpoints-per-group``, ``--max-checkpoint-bytes-per-group``)
need the count and the bytes of a group at every commit, and paged fetches need
the keys sorted by (set, index) at every page; both are kept up to date here
as commits apply, so neither a commit nor a fetch page ever walks the whole
group (a fetch page is a binary search and a slice).

Keeping the key list sorted: a commit that adds or removes a few keys moves
them in place (``bisect``: a search and one memmove of the list); one that adds
or removes many re-sorts once (the list is two sorted runs, which Timsort merges
in linear time) or filters once, so a large commit never pays per key for the
whole list.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping

from protocol.validate import Scalar, checkpoint_size

Key = tuple[str, int]
Checkpoint = tuple[str, int, Scalar]

#: up to this many keys added or removed by one commit are moved one by one.
_IN_PLACE = 32


class CheckpointStore:
    """The checkpoints of one group (never holds a ``None`` value)."""

    __slots__ = ("_keys", "nbytes", "values")

    def __init__(self, values: Mapping[Key, Scalar] | None = None) -> None:
        self.values: dict[Key, Scalar] = {}
        #: every key of ``values``, sorted.
        self._keys: list[Key] = []
        #: bytes counted against --max-checkpoint-bytes-per-group (checkpoint_size).
        self.nbytes = 0
        if values:
            self.values = {key: value for key, value in values.items() if value is not None}
            self._keys = sorted(self.values)
            self.nbytes = sum(checkpoint_size(s, v) for (s, _), v in self.values.items())

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    def get(self, key: Key) -> Scalar:
        return self.values.get(key)

    def after_changes(self, changes: Mapping[Key, Scalar]) -> tuple[int, int]:
        """(count, bytes) the group would hold with ``changes`` applied (``None`` deletes)."""
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
        return count, nbytes

    def apply(self, changes: Iterable[tuple[Key, Scalar]]) -> None:
        """Write ``changes`` in order (``None`` deletes); a later one for a key wins."""
        values = self.values
        added: list[Key] = []
        removed: list[Key] = []
        for key, value in changes:
            old = values.get(key)
            if old is not None:
                self.nbytes -= checkpoint_size(key[0], old)
            if value is None:
                if old is not None:
                    del values[key]
                    removed.append(key)
            else:
                if old is None:
                    added.append(key)
                values[key] = value
                self.nbytes += checkpoint_size(key[0], value)
        if added or removed:
            self._reindex(added, removed)

    def _reindex(self, added: list[Key], removed: list[Key]) -> None:
        keys = self._keys
        values = self.values
        # A key both added and removed by the same commit is in neither list's
        # effect: keep only what is true of ``values`` now.
        added = [k for k in dict.fromkeys(added) if k in values]
        removed = [k for k in dict.fromkeys(removed) if k not in values]
        if len(removed) <= _IN_PLACE:
            for key in removed:
                i = bisect_left(keys, key)
                if i < len(keys) and keys[i] == key:
                    del keys[i]
        else:
            gone = set(removed)
            keys = self._keys = [k for k in keys if k not in gone]
        # An added key may still be listed when it was removed and re-added by
        # one commit: skip what the list already holds.
        added = [k for k in added if not _listed(keys, k)]
        if len(added) <= _IN_PLACE:
            for key in added:
                insort(keys, key)
        else:
            keys.extend(sorted(added))
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


def _listed(keys: list[Key], key: Key) -> bool:
    i = bisect_left(keys, key)
    return i < len(keys) and keys[i] == key
