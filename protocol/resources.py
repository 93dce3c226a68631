"""The embedded ``"resources"`` protocol (docs/protocol.md, "The embedded "resources" protocol").

Member metadata and assignments are msgpack maps inside the opaque byte
fields of join and sync. The client encodes and decodes them; the coordinator
decodes assignments only to show them in the admin API.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.codec import DecodeError, decode, encode
from protocol.limits import MAX_RESOURCE_INDEX
from protocol.validate import Fields, ValidationError, check_int, check_pair, check_string

#: Why a member gains or loses a resource (docs/protocol.md, "What the leader
#: hands out"): the ``cause`` of an assignment's ``why`` entry. The assignors
#: give these; the coordinator counts them (a later version may add causes: the
#: admin API shows a cause as the leader sent it, the metrics count one they do
#: not know as ``other``).
CAUSES: tuple[str, ...] = (
    "join", "leave", "expired", "catalog", "load", "zone", "capacity", "drain", "warm",
    "warm_timeout", "balance", "admin",
)

PROTOCOL_TYPE = "resources"
VERSION = 1


def _index_map(value: object, path: str) -> dict[str, list[int]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(path, "expected a map of set name to indexes")
    out: dict[str, list[int]] = {}
    for name, indexes in value.items():
        key = check_string(name, f"{path} key") or ""
        if not isinstance(indexes, list):
            raise ValidationError(f"{path}.{key}", "expected a list of indexes")
        out[key] = sorted(check_int(i, f"{path}.{key}[]", lo=0, hi=MAX_RESOURCE_INDEX)
                          for i in indexes)
    return out


def _number(value: object, path: str, *, positive: bool) -> float:
    """A finite number, > 0 (``positive``) or >= 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(path, "expected a number")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise ValidationError(path, f"expected a finite number {'>' if positive else '>='} 0")
    return x


def _load_map(value: object, path: str) -> dict[str, dict[int, float]]:
    """``{set: [[index, load], ...]}`` (v1.2 ``load``) as ``{set: {index: load}}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(path, "expected a map of set name to [index, load] pairs")
    out: dict[str, dict[int, float]] = {}
    for name, pairs in value.items():
        key = check_string(name, f"{path} key") or ""
        if not isinstance(pairs, list):
            raise ValidationError(f"{path}.{key}", "expected a list of [index, load] pairs")
        loads: dict[int, float] = {}
        for n, pair in enumerate(pairs):
            where = f"{path}.{key}[{n}]"
            index, load = check_pair(pair, where, 2)
            loads[check_int(index, where, lo=0, hi=MAX_RESOURCE_INDEX)] = _number(
                load, where, positive=False
            )
        out[key] = loads
    return out


def _why_list(value: object, path: str) -> tuple[tuple[str, int, str], ...]:
    """``[[set, index, cause], ...]`` (v1.2 ``why``). A cause this version does
    not know is kept as sent (a later version may add causes)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValidationError(path, "expected a list of [set, index, cause]")
    out: list[tuple[str, int, str]] = []
    for n, entry in enumerate(value):
        where = f"{path}[{n}]"
        name, index, cause = check_pair(entry, where, 3)
        out.append((
            check_string(name, where) or "",
            check_int(index, where, lo=0, hi=MAX_RESOURCE_INDEX),
            check_string(cause, where, max_len=64) or "",
        ))
    return tuple(out)


def _band(value: object, path: str) -> tuple[float, float] | None:
    if value is None:
        return None
    low, high = check_pair(value, path, 2)
    lo, hi = _number(low, path, positive=False), _number(high, path, positive=False)
    if lo > hi:
        raise ValidationError(path, f"low {lo} is above high {hi}")
    return lo, hi


def _load_share(value: object, path: str) -> tuple[float, float] | None:
    """``[load, ideal]`` (v1.2 assignment ``load``), each a finite number >= 0."""
    if value is None:
        return None
    load, ideal = check_pair(value, path, 2)
    return _number(load, f"{path}[0]", positive=False), _number(ideal, f"{path}[1]",
                                                                 positive=False)


def _opt_bytes(f: Fields, key: str) -> bytes | None:
    raw = f.raw(key)
    if raw is None:
        return None
    if not isinstance(raw, bytes):
        raise ValidationError(f.name(key), "expected bytes")
    return raw


def _opt_epoch(f: Fields) -> int | None:
    if f.raw("resources_epoch") is None:
        return None
    return f.integer("resources_epoch", lo=0, hi=2**63 - 1)


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """What a member tells the leader: its subscription and what it owns
    (KIP-429); since v1.2 also, all optional (docs/protocol.md, "What a member
    reports"), its ``capacity``, the ``load`` it measured on what it owns,
    the standby resources it has ``warm`` and whether it is ``draining``.
    Absent fields are left out of the bytes, so an older leader reads the
    same map as before."""

    sets: tuple[str, ...]
    owned: Mapping[str, Sequence[int]] = field(default_factory=dict)
    generation: int = -1
    rack: str | None = None
    user_data: bytes | None = None
    v: int = VERSION
    capacity: float | None = None
    load: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    warm: Mapping[str, Sequence[int]] = field(default_factory=dict)
    draining: bool = False

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "v": self.v,
            "sets": list(self.sets),
            "owned": {k: sorted(v) for k, v in self.owned.items() if v},
            "generation": self.generation,
        }
        if self.rack is not None:
            doc["rack"] = self.rack
        if self.user_data is not None:
            doc["user_data"] = self.user_data
        if self.capacity is not None:
            doc["capacity"] = self.capacity
        load = {k: [[i, x] for i, x in sorted(v.items())] for k, v in self.load.items() if v}
        if load:
            doc["load"] = load
        warm = {k: sorted(v) for k, v in self.warm.items() if v}
        if warm:
            doc["warm"] = warm
        if self.draining:
            doc["draining"] = True
        return encode(doc)

    @classmethod
    def decode(cls, data: bytes) -> MemberMetadata:
        """Decode, raising :class:`ValidationError` naming what is malformed."""
        try:
            obj = decode(data)
        except DecodeError as exc:
            raise ValidationError("metadata", str(exc)) from exc
        f = Fields(obj, "metadata")
        sets_raw = f.items("sets") or []
        sets = tuple(check_string(s, f"metadata.sets[{i}]") or "" for i, s in enumerate(sets_raw))
        return cls(
            sets=sets,
            owned=_index_map(f.raw("owned"), "metadata.owned"),
            generation=f.integer("generation", lo=-1, hi=2**31 - 1, required=False, default=-1),
            rack=f.opt_string("rack"),
            user_data=_opt_bytes(f, "user_data"),
            v=f.integer("v", lo=0, hi=2**31 - 1, required=False, default=VERSION),
            capacity=(
                None if f.raw("capacity") is None
                else _number(f.raw("capacity"), "metadata.capacity", positive=True)
            ),
            load=_load_map(f.raw("load"), "metadata.load"),
            warm=_index_map(f.raw("warm"), "metadata.warm"),
            draining=f.flag("draining"),
        )


@dataclass(frozen=True, slots=True)
class ResourceAssignment:
    """What the leader gives one member (the sync ``assignment`` bytes)."""

    assigned: Mapping[str, Sequence[int]] = field(default_factory=dict)
    user_data: bytes | None = None
    delay_ms: int = 0
    error: str | None = None
    v: int = VERSION
    #: the catalog epoch the leader assigned from (``GET /v1/resources``);
    #: absent from older leaders' assignments. A later leader process that
    #: syncs without assigning (KIP-814) compares it with the current epoch.
    resources_epoch: int | None = None
    #: the plan this assignment is part of gives some subscribed resource to
    #: nobody (a cooperative hand-over: its owner revokes it, and it moves in
    #: the follow-up rebalance). A later leader process that syncs without
    #: assigning (KIP-814) starts that follow-up itself, since the revoker may
    #: have been its own earlier process. Absent (false) from older leaders'.
    followup: bool = False
    #: v1.2 (docs/protocol.md, "What the leader hands out"), all optional:
    #: what to warm up without owning, why each resource was gained or lost
    #: (``(set, index, cause)``), the load range the leader considers
    #: balanced for this member, and ``(load, ideal)``: the load of what this
    #: assignment gives the member, as the leader weighed it, and its fair
    #: share of the group's load.
    standby: Mapping[str, Sequence[int]] = field(default_factory=dict)
    why: Sequence[tuple[str, int, str]] = ()
    band: tuple[float, float] | None = None
    load: tuple[float, float] | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "v": self.v,
            "assigned": {k: sorted(v) for k, v in self.assigned.items() if v},
        }
        if self.user_data is not None:
            doc["user_data"] = self.user_data
        if self.delay_ms:
            doc["delay_ms"] = self.delay_ms
        if self.error is not None:
            doc["error"] = self.error
        if self.resources_epoch is not None:
            doc["resources_epoch"] = self.resources_epoch
        if self.followup:
            doc["followup"] = True
        standby = {k: sorted(v) for k, v in self.standby.items() if v}
        if standby:
            doc["standby"] = standby
        if self.why:
            doc["why"] = [[s, i, cause] for s, i, cause in self.why]
        if self.band is not None:
            doc["band"] = [self.band[0], self.band[1]]
        if self.load is not None:
            doc["load"] = [self.load[0], self.load[1]]
        return encode(doc)

    @classmethod
    def decode(cls, data: bytes) -> ResourceAssignment:
        """Decode; an empty byte string is the empty assignment (docs/protocol.md,
        "POST /v1/sync")."""
        if not data:
            return cls()
        try:
            obj = decode(data)
        except DecodeError as exc:
            raise ValidationError("assignment", str(exc)) from exc
        f = Fields(obj, "assignment")
        return cls(
            assigned=_index_map(f.raw("assigned"), "assignment.assigned"),
            user_data=_opt_bytes(f, "user_data"),
            delay_ms=f.integer("delay_ms", lo=0, hi=2**31 - 1, required=False),
            error=f.opt_string("error", max_len=4096),
            v=f.integer("v", lo=0, hi=2**31 - 1, required=False, default=VERSION),
            resources_epoch=_opt_epoch(f),
            followup=f.flag("followup"),
            standby=_index_map(f.raw("standby"), "assignment.standby"),
            why=_why_list(f.raw("why"), "assignment.why"),
            band=_band(f.raw("band"), "assignment.band"),
            load=_load_share(f.raw("load"), "assignment.load"),
        )


#: how the key ``draining`` looks inside metadata bytes (a msgpack string):
#: bytes without it cannot report draining and are not decoded to find out.
_DRAINING_KEY = encode("draining")


def reports_draining(metadata: bytes) -> bool:
    """Does this member metadata say ``draining: true`` (malformed bytes: no)?

    The coordinator asks it of every rejoin of a member an operator asked to
    drain, and of each member for the draining-members gauge: metadata that
    does not hold the key (nearly all of it) is not decoded."""
    if _DRAINING_KEY not in metadata:
        return False
    try:
        return MemberMetadata.decode(metadata).draining
    except ValidationError:
        return False
