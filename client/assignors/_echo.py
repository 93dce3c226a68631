"""What the ``balanced`` assignor remembers between rounds, carried in each
member's ``Assignment.user_data`` and echoed back by the member as
``Subscription.user_data`` (the client library echoes it; the assignor keeps
nothing itself). JSON, keys sorted, so equal inputs give equal bytes:

    {"balanced": 1,
     "sizes": {set: partitions, ...},       # the catalog this round assigned
     "capacity": c,                         # the member's capacity then
     "revoked": [[set, index, cause, to, load], ...],  # what it was asked to
                                            # give up, why, the member meant to
                                            # get it, and its measured load (or
                                            # null): nobody reports a resource
                                            # while it changes hands
     "standby": [[set, index, since_ms], ...]}   # what it was asked to warm up

Only a member with something in flight (a revocation, a standby) gets it; a
settled member gets no ``user_data``, so a static member that restarts
(without its echo) rejoins unchanged (KIP-345). Everything here only
explains or steadies the next round (``why`` causes, the receiver of a
hand-over, warm-up deadlines); a member whose ``user_data`` is missing or
foreign is planned for just the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Echo", "encode_echo", "read_echo"]

Key = tuple[str, int]


@dataclass(frozen=True)
class Echo:
    sizes: dict[str, int] = field(default_factory=dict)
    capacity: float | None = None
    #: (set, index) -> (cause, member id meant to receive it, measured load)
    revoked: dict[Key, tuple[str, str | None, float | None]] = field(default_factory=dict)
    #: (set, index) -> when the standby was first offered (ms), if known
    standby: dict[Key, int | None] = field(default_factory=dict)


def read_echo(data: bytes | None) -> Echo | None:
    """The state in one member's ``user_data``; None if it is not ours or
    malformed (a malformed echo costs explanations, never correctness)."""
    if not data or not data.startswith(b'{"balanced":1'):
        return None
    try:
        doc = json.loads(data)
        sizes = {str(k): int(v) for k, v in doc.get("sizes", {}).items()}
        cap = doc.get("capacity")
        capacity = float(cap) if isinstance(cap, (int, float)) and math.isfinite(cap) else None
        revoked = {
            (str(s), int(i)): (
                str(cause), None if to is None else str(to), _load(load)
            )
            for s, i, cause, to, load in doc.get("revoked", ())
        }
        standby = {
            (str(s), int(i)): None if since is None else int(since)
            for s, i, since in doc.get("standby", ())
        }
    except (ValueError, TypeError, AttributeError):
        return None
    return Echo(sizes, capacity, revoked, standby)


def _load(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
        if math.isfinite(x) and x >= 0:
            return x
    return None


def encode_echo(
    sizes: Mapping[str, int],
    capacity: float,
    revoked: Sequence[tuple[str, int, str, str | None, float | None]],
    standby: Sequence[tuple[str, int, int | None]],
) -> bytes:
    doc: dict[str, Any] = {"balanced": 1, "capacity": capacity, "sizes": dict(sizes)}
    if revoked:
        doc["revoked"] = [list(r) for r in revoked]
    if standby:
        doc["standby"] = [list(s) for s in standby]
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
