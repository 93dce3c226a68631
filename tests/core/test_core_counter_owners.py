"""Each counter of the core has one owner: only the owning module
writes it, through its methods, so a counter cannot drift from what it counts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "coordinator" / "core"

#: counter (or derived index) -> the one module that writes it.
OWNERS = {
    "num_awaiting_join": "group.py",    # Group.set_join_request, add_member, detach
    "join_request": "group.py",         # Group.set_join_request
    "protocol_counts": "group.py",      # Group._count
    "static_members": "group.py",
    "resources_epoch": "kernel.py",     # Kernel.set_catalog, change_catalog
    "catalog": "kernel.py",
    "placement": "kernel.py",           # Kernel.set_catalog, change_catalog
    "owned_groups": "kernel.py",        # Kernel.add_group, drop_group
    "owned_bytes": "kernel.py",         # Kernel.add_group, write_checkpoints, drop_group
    "retention": "kernel.py",           # Kernel.arm/renew/extend/disarm_retention
    "parked": "kernel.py",              # Kernel.park_*, answer_*, cancel_parked
    "parked_by": "kernel.py",           # Kernel._park, _unpark
    "heartbeats": "kernel.py",
    "pending": "kernel.py",             # Kernel.add_pending, drop_pending, drop_group
}


def _writes(name: str, text: str) -> bool:
    """Whether ``text`` changes attribute ``name`` (its declaration with a type,
    ``self.name: T = ...``, is not a change)."""
    pattern = (rf"\.{name}\s*(\+|-)?=(?!=)|\.{name}\[[^\]]*\]\s*(\+|-)?=(?!=)"
               rf"|del [\w.]+\.{name}\[|\.{name}\.(pop|add|discard|clear|update|setdefault)\(")
    return re.search(pattern, text) is not None


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_only_the_owner_writes_the_counter(name: str) -> None:
    writers = {p.name for p in CORE.glob("*.py") if _writes(name, p.read_text())}
    assert writers <= {OWNERS[name]}, f"{name} is written in {sorted(writers)}"


def test_the_scan_sees_writes() -> None:
    assert _writes("parked", "del self.parked[request_id]")
    assert _writes("num_awaiting_join", "g.num_awaiting_join -= 1")
    assert _writes("heartbeats", "member.heartbeats.discard(rid)")
    assert not _writes("parked", "if self.parked[rid] == x:")
    assert not _writes("pending", "        self.pending: dict[str, int] = {}")
