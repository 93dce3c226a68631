"""Warm-ups as the rebalance journal shows them, for the metrics (v1.2,
docs/protocol.md, "What the leader hands out"; docs/operations.md, "Metrics").

A warm-up is one resource given to one member as ``standby``: it *starts* in
the generation whose assignment first lists it there, and it *ends* when the
resource leaves that member's standby, either **owned** (the member owns it
in that generation, or in the next one: a cooperative hand-over revokes it
from its old owner first, KIP-429) or **dropped** (the plan changed; the
member never got it). Its duration runs from the generation it was given as
standby to the one it became owned (the journal's ``ended_ms`` of each).

A warm-up that ends owned is counted **timed out** instead when the new
owner's ``why`` gives the resource the cause ``warm_timeout`` (the assignor
moved it cold, its ``warmup_timeout_ms`` over); ``warm`` (or any other
cause) is a warm-up that finished.

Members are named as the journal's history names owners: a static member by
its instance id (a restart keeps its warm-ups), others by member id. What is
known of a group is what this process saw of its journal: a standby already
listed in the first generation seen here counts as started, with no known
start (no duration). Entries of a group are taken in generation order; an
older one arriving late (its counting ran on the offload worker) is ignored.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from coordinator.core.records import JournalEntry
from coordinator.history import holds
from protocol.codec import encode
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import ResourceAssignment
from protocol.validate import ValidationError

#: (member as owners are named, set, index).
_Key = tuple[str, str, int]
#: member as owners are named -> what it owns, ``{set: sorted indexes}``.
Assigned = dict[str, Mapping[str, Sequence[int]]]
#: how the key ``standby`` looks inside assignment bytes (a msgpack string).
_STANDBY_KEY = encode("standby")
Phase = Literal["standby", "handover"]


@dataclass(slots=True)
class _Warmup:
    #: ``ended_ms`` of the generation that first listed it as standby; ``None``: unknown.
    started_ms: int | None
    #: ``handover``: no longer standby and not owned yet (its old owner revoked it).
    phase: Phase = "standby"


@dataclass(slots=True)
class _Group:
    generation_id: int
    warmups: dict[_Key, _Warmup] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WarmupEvents:
    """What one journal entry started and ended."""

    started: int = 0
    #: durations (ms) of the warm-ups that ended owned; ``None``: start unknown.
    owned: tuple[int | None, ...] = ()
    dropped: int = 0
    #: of ``owned``, how many were moved cold when their warm-up timed out.
    timed_out: int = 0


NOTHING = WarmupEvents()


class WarmupTracker:
    """The warm-ups under way in each group, fed one journal entry at a time
    (module docs). Thread-safe: large entries are counted on the offload worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def forget(self, group_id: str) -> None:
        with self._lock:
            self._groups.pop(group_id, None)

    def observe(self, entry: JournalEntry) -> WarmupEvents:
        if entry.protocol_type != RESOURCES:
            self.forget(entry.group_id)
            return NOTHING
        with self._lock:
            seen = self._groups.get(entry.group_id)
            if seen is not None and entry.generation_id <= seen.generation_id:
                return NOTHING
            under_way = seen is not None and bool(seen.warmups)
        decoded = None
        tried = under_way or any(_STANDBY_KEY in b for b in entry.assignments.values())
        if tried:
            # Decoded outside the lock: a large entry is decoded on the offload
            # worker, and the event loop may want the lock meanwhile (forget).
            decoded = _decode(entry)
        with self._lock:
            seen = self._groups.get(entry.group_id)
            if seen is None:
                seen = self._groups[entry.group_id] = _Group(entry.generation_id)
                # Seen here first: when it was given is known only for a first generation.
                start: int | None = entry.ended_ms if entry.generation_id <= 1 else None
            elif entry.generation_id <= seen.generation_id:
                return NOTHING  # a newer entry was taken meanwhile
            else:
                seen.generation_id = entry.generation_id
                start = entry.ended_ms
            if decoded is None and not tried and seen.warmups:
                decoded = _decode(entry)  # rare: an older entry began some meanwhile
            if decoded is None:
                # Nothing to decode (no warm-up under way, none given), or bytes
                # that are not a resources map: the warm-ups cannot be followed.
                seen.warmups.clear()
                return NOTHING
            return _step(seen.warmups, *decoded, start, entry.ended_ms)


def _step(warmups: dict[_Key, _Warmup], standby: set[_Key], assigned: Assigned,
          cold: set[_Key], start: int | None, now_ms: int) -> WarmupEvents:
    started = dropped = timed_out = 0
    ended_owned: list[int | None] = []
    for key in standby:
        current = warmups.get(key)
        if current is None:
            warmups[key] = _Warmup(start)
            started += 1
        else:
            current.phase = "standby"
    for key in [key for key in warmups if key not in standby]:
        warmup = warmups[key]
        who, name, index = key
        if holds(assigned.get(who, {}), name, index):
            del warmups[key]
            ended_owned.append(None if warmup.started_ms is None
                               else max(0, now_ms - warmup.started_ms))
            timed_out += key in cold
        elif warmup.phase == "standby":
            warmup.phase = "handover"
        else:
            del warmups[key]
            dropped += 1
    if not (started or ended_owned or dropped):
        return NOTHING
    return WarmupEvents(started, tuple(ended_owned), dropped, timed_out)


def _decode(entry: JournalEntry) -> tuple[set[_Key], Assigned, set[_Key]] | None:
    """The standby resources of an entry, what each member owns, and what it
    gained cold after a warm-up ran out of time (``why``: ``warm_timeout``), by
    member as owners are named; ``None``: bytes that are not a resources map."""
    identity = {m.member_id: (m.group_instance_id or m.member_id) for m in entry.members}
    standby: set[_Key] = set()
    assigned: Assigned = {}
    cold: set[_Key] = set()
    for member_id, blob in entry.assignments.items():
        try:
            assignment = ResourceAssignment.decode(blob)
        except ValidationError:
            return None
        who = identity.get(member_id, member_id)
        for name, indexes in assignment.standby.items():
            standby.update((who, name, i) for i in indexes)
        assigned[who] = assignment.assigned
        cold.update((who, name, i) for name, i, cause in assignment.why
                    if cause == "warm_timeout")
    return standby, assigned, cold

