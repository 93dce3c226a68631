"""The embedded ``"resources"`` protocol (docs/protocol.md, "The embedded "resources" protocol").

Member metadata and assignments are msgpack maps inside the opaque byte
fields of join and sync. The client encodes and decodes them; the coordinator
decodes assignments only to show them in the admin API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.codec import DecodeError, decode, encode
from protocol.limits import MAX_RESOURCE_INDEX
from protocol.validate import Fields, ValidationError, check_int, check_string

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


def _opt_flag(f: Fields, key: str) -> bool:
    raw = f.raw(key)
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ValidationError(f.name(key), "expected a boolean")
    return raw


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """What a member tells the leader: its subscription and what it owns (KIP-429)."""

    sets: tuple[str, ...]
    owned: Mapping[str, Sequence[int]] = field(default_factory=dict)
    generation: int = -1
    rack: str | None = None
    user_data: bytes | None = None
    v: int = VERSION

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
            followup=_opt_flag(f, "followup"),
        )
