"""Small hand-made journals for the pipeline tests.

``write_db`` creates a coordinator SQLite file with the schema's own
migrations (coordinator/storage/schema.py) and appends journal rows laid out as
coordinator/storage/sqlite.py writes them (JSON member lists, a msgpack map of
assignment bytes). The figures the tests expect are worked out by hand in each
test from the rows here.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.core.records import JournalMember
from coordinator.storage.schema import MIGRATIONS
from pipeline.ownership import JournalRow
from protocol.codec import encode
from protocol.resources import ResourceAssignment

Owned = Mapping[str, Mapping[str, Sequence[int]]]  # member -> set -> indexes

HOUR = 3_600_000
T0 = 1_795_000_000_000 - (1_795_000_000_000 % HOUR)  # an hour boundary in 2026


Why = Mapping[str, Sequence[tuple[str, int, str]]]  # member -> [(set, index, cause)]
Load = Mapping[str, tuple[float, float]]  # member -> (load, ideal)


def assignments_blob(owned: Owned, why: Why | None = None, load: Load | None = None) -> bytes:
    said, gave = why or {}, load or {}
    return encode({m: ResourceAssignment(assigned=sets, why=tuple(said.get(m, ())),
                                         load=gave.get(m)).encode()
                   for m, sets in owned.items()})


@dataclass
class Row:
    group_id: str
    generation_id: int
    reason: str
    started_ms: int
    ended_ms: int
    owned: Owned
    protocol_name: str = "range"
    protocol_type: str = "resources"
    joined: Sequence[str] = ()
    left: Sequence[str] = ()
    members: Sequence[str] = field(default_factory=list)
    raw_assignments: bytes | None = None  # overrides ``owned`` (corrupt-bytes tests)
    #: the leader's ``why`` entries per member (docs/protocol.md), if any
    why: Why = field(default_factory=dict)
    #: the leader's ``load`` per member, ``(load, ideal)``, if any
    load: Load = field(default_factory=dict)

    def member_ids(self) -> list[str]:
        return list(self.members) or sorted(self.owned)

    def blob(self) -> bytes:
        return self.raw_assignments if self.raw_assignments is not None \
            else assignments_blob(self.owned, self.why, self.load)


def write_db(path: Path, rows: Sequence[Row], generations: Sequence[tuple[str, int, bool]] = (),
             user_version: int | None = None) -> Path:
    con = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS, start=1):
        con.executescript(script)
        con.execute(f"PRAGMA user_version = {number}")
    for r in rows:
        ids = r.member_ids()
        con.execute(
            "INSERT INTO rebalance_journal (group_id, generation_id, protocol_type, "
            "protocol_name, leader, member_count, members, joined, left, reason, started_ms, "
            "ended_ms, assignments) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (r.group_id, r.generation_id, r.protocol_type, r.protocol_name,
             ids[0] if ids else None, len(ids),
             json.dumps([JournalMember(m, None, "test-client") for m in ids]),
             json.dumps(list(r.joined)), json.dumps(list(r.left)), r.reason,
             r.started_ms, r.ended_ms, r.blob()))
    for group_id, generation_id, has_assignments in generations:
        con.execute(
            "INSERT INTO generations (group_id, generation_id, protocol_type, protocol_name, "
            "leader, formed_ms, member_count, members, assignments) VALUES (?,?,?,?,?,?,?,?,?)",
            (group_id, generation_id, "resources", "range", "m1", T0, 1, '[["m1",null,"c"]]',
             b"\x80" if has_assignments else None))
    if user_version is not None:
        con.execute(f"PRAGMA user_version = {user_version}")
    con.commit()
    con.close()
    return path


def journal_rows(rows: Sequence[Row], source: str = "db") -> list[JournalRow]:
    """The rows as the accounting sees them, journal ids 1, 2, ... in order."""
    return [JournalRow(source, r.group_id, i, r.generation_id, r.protocol_type, r.protocol_name,
                       r.reason, r.started_ms, r.ended_ms, len(r.member_ids()), len(r.joined),
                       len(r.left), r.blob())
            for i, r in enumerate(rows, start=1)]


# ---------------------------------------------------------------- the shared example
#
# Two groups over two hours (T0 is an hour boundary):
#
# "eager" (range, eager): 4 resources a0..a3
#   1 initial  T0+0      .. T0+100     m1:a0,a1 m2:a2,a3
#   2 join     T0+1000   .. T0+1300    m1:a0 m2:a2 m3:a1,a3          (eager: all 4 revoked)
#   3 leave    T0+5000   .. T0+5050    m1:a0,a1 m2:a2,a3  (m3 left)
#   4 metadata_change T0+6000 .. T0+6010 same as 3 (bytes unchanged)
#   5 session_expiry  T0+HOUR+0 .. T0+HOUR+500  m1:a0..a3  (m2 expired)
#
# "coop" (cooperative-sticky): 4 resources b0..b3
#   1 initial  T0+0    .. T0+100    m1:b0..b3
#   2 join     T0+1000 .. T0+1200   m1:b0,b1 m2:-   (m1 gives up b2,b3)
#   3 rejoin   T0+1300 .. T0+1400   m1:b0,b1 m2:b2,b3  (the follow-up)
#   4 leave    T0+2000 .. T0+2100   m2:b0..b3  (m1 left)

EAGER = [
    Row("eager", 1, "initial", T0, T0 + 100, {"m1": {"a": [0, 1]}, "m2": {"a": [2, 3]}},
        joined=("m1", "m2")),
    Row("eager", 2, "join", T0 + 1000, T0 + 1300,
        {"m1": {"a": [0]}, "m2": {"a": [2]}, "m3": {"a": [1, 3]}}, joined=("m3",)),
    Row("eager", 3, "leave", T0 + 5000, T0 + 5050, {"m1": {"a": [0, 1]}, "m2": {"a": [2, 3]}},
        left=("m3",)),
    Row("eager", 4, "metadata_change", T0 + 6000, T0 + 6010,
        {"m1": {"a": [0, 1]}, "m2": {"a": [2, 3]}}),
    Row("eager", 5, "session_expiry", T0 + HOUR, T0 + HOUR + 500, {"m1": {"a": [0, 1, 2, 3]}},
        left=("m2",)),
]

COOP = [
    Row("coop", 1, "initial", T0, T0 + 100, {"m1": {"b": [0, 1, 2, 3]}},
        protocol_name="cooperative-sticky", joined=("m1",)),
    Row("coop", 2, "join", T0 + 1000, T0 + 1200, {"m1": {"b": [0, 1]}, "m2": {}},
        protocol_name="cooperative-sticky", joined=("m2",)),
    Row("coop", 3, "rejoin", T0 + 1300, T0 + 1400, {"m1": {"b": [0, 1]}, "m2": {"b": [2, 3]}},
        protocol_name="cooperative-sticky"),
    Row("coop", 4, "leave", T0 + 2000, T0 + 2100, {"m2": {"b": [0, 1, 2, 3]}},
        protocol_name="cooperative-sticky", left=("m1",)),
]
