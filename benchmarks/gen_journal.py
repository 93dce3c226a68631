"""Synthetic rebalance journals for the pipeline benchmark (docs/bench-pipeline.md).

Writes the Parquet export format of ``groupcoord journal export``
(pipeline/sources.py JOURNAL_SCHEMA) and, optionally, a coordinator SQLite file
with the same rows (schema migrations of coordinator/storage/schema.py).

The journal is meant to look like a fleet's week:

* ``--groups`` groups spread over ``--sources`` coordinators, ``--rows``
  rebalances in all (the same number per group), over 7 days from
  2026-11-20 00:00 UTC (a group that storms uses up its rows sooner);
* each group has 2-12 members (a pool of two more that come and go), one or
  two resource sets of 4-64 partitions, and an assignor: range, sticky or
  cooperative-sticky (a third each);
* events: members join, leave, their sessions expire, they rejoin with new
  metadata; in cooperative groups a change that moves resources is two rows,
  the revoking rebalance and its follow-up; 1 group in 50 has rebalance
  storms (bursts of 30-80 rebalances within minutes);
* assignments are real ``ResourceAssignment`` bytes in the coordinator's
  msgpack map, round-robin over the sorted members.

Deterministic for a given ``--seed``. Distinct assignment states are encoded
once per group and columns are assembled with Arrow ``take``, so ten million
rows take a few minutes, not an hour.

    .venv/bin/python benchmarks/gen_journal.py --rows 10000000 --groups 10000 \\
        --out /tmp/journal-10m
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from coordinator.storage.schema import MIGRATIONS
from pipeline.sources import JOURNAL_SCHEMA, MEMBER_TYPE
from protocol.codec import encode
from protocol.resources import ResourceAssignment

START_MS = 1_795_132_800_000  # 2026-11-20 00:00:00 UTC
WEEK_MS = 7 * 24 * 3_600_000
ASSIGNORS = ("range", "sticky", "cooperative-sticky")


class Group:
    """One group's history, as row-level indexes into small per-group tables."""

    def __init__(self, gid: int, rows: int, rng: random.Random) -> None:
        self.name = f"group-{gid:05d}"
        self.protocol = ASSIGNORS[gid % 3]
        self.coop = self.protocol == "cooperative-sticky"
        base = rng.randint(2, 12)
        self.pool = [f"{self.name}-m{k:02d}" for k in range(base + 2)]
        sets = rng.choice((1, 2))
        self.catalog = [(f"set-{gid % 97:02d}-{j}", rng.choice((4, 8, 16, 32, 64)))
                        for j in range(sets)]
        self.rng = rng
        self.rows = rows
        self.states: dict[Any, int] = {}   # state key -> index
        self.blobs: list[bytes] = []
        self.member_lists: list[list[str]] = []
        self.transitions: dict[tuple[int, int], int] = {}
        self.joined: list[list[str]] = []
        self.left: list[list[str]] = []
        self.initial = frozenset(range(base))

    def _owners(self, members: tuple[int, ...]) -> dict[tuple[str, int], int]:
        out = {}
        k = 0
        for name, n in self.catalog:
            for i in range(n):
                out[(name, i)] = members[k % len(members)]
                k += 1
        return out

    def state(self, members: frozenset[int], prev: frozenset[int] | None) -> int:
        """Index of the assignment state: final (prev None) or cooperative
        intermediate (resources changing owner left out)."""
        key = (members, prev)
        found = self.states.get(key)
        if found is not None:
            return found
        order = tuple(sorted(members))
        owners = self._owners(order)
        if prev is not None:
            before = self._owners(tuple(sorted(prev)))
            owners = {r: m for r, m in owners.items() if before.get(r) == m}
        per: dict[int, dict[str, list[int]]] = {m: {} for m in order}
        for (name, i), m in owners.items():
            per[m].setdefault(name, []).append(i)
        blob = encode({self.pool[m]: ResourceAssignment(assigned=a).encode()
                       for m, a in per.items()})
        self.states[key] = len(self.blobs)
        self.blobs.append(blob)
        self.member_lists.append([self.pool[m] for m in order])
        return self.states[key]

    def transition(self, a: frozenset[int] | None, b: frozenset[int]) -> int:
        key = (hash(a), hash(b))
        found = self.transitions.get(key)
        if found is None:
            found = len(self.joined)
            self.transitions[key] = found
            self.joined.append([self.pool[m] for m in sorted(b - (a or frozenset()))])
            self.left.append([self.pool[m] for m in sorted((a or frozenset()) - b)])
        return found

    def history(self) -> dict[str, list[Any]]:
        rng = self.rng
        cols: dict[str, list[Any]] = {k: [] for k in (
            "state", "trans", "reason", "started", "ended", "gen")}
        storms = rng.random() < 0.02
        mean_gap = WEEK_MS / self.rows
        t = START_MS + int(rng.random() * mean_gap)
        members = self.initial
        prev: frozenset[int] | None = None
        gen = 0
        burst = 0

        def emit(state: int, trans: int, reason: str, start: int, dur: int) -> None:
            cols["state"].append(state)
            cols["trans"].append(trans)
            cols["reason"].append(reason)
            cols["started"].append(start)
            cols["ended"].append(start + dur)
            cols["gen"].append(gen)

        while len(cols["state"]) < self.rows:
            gen += 1
            dur = int(rng.lognormvariate(6.5, 0.9)) + 20  # ~700 ms median
            if prev is None:
                emit(self.state(members, None), self.transition(None, members), "initial", t,
                     dur)
                prev = members
            else:
                roll = rng.random()
                absent = [m for m in range(len(self.pool)) if m not in members]
                if roll < 0.3 and absent:
                    new, reason = members | {rng.choice(absent)}, "join"
                elif roll < 0.55 and len(members) > 2:
                    new, reason = members - {rng.choice(sorted(members))}, "leave"
                elif roll < 0.7 and len(members) > 2:
                    new, reason = members - {rng.choice(sorted(members))}, "session_expiry"
                    dur += 200
                else:
                    new, reason = members, rng.choice(("metadata_change", "rejoin"))
                trans = self.transition(members, new)
                if self.coop and new != members:
                    emit(self.state(new, members), trans, reason, t, dur)
                    if len(cols["state"]) < self.rows:
                        gen += 1
                        t2 = t + dur + rng.randint(5, 50)
                        emit(self.state(new, None), self.transition(new, new), "rejoin", t2,
                             int(rng.lognormvariate(5.5, 0.6)) + 10)
                        t = t2
                else:
                    emit(self.state(new, None), trans, reason, t, dur)
                members = new
            if burst > 0:
                burst -= 1
                t += rng.randint(2_000, 15_000)
            elif storms and rng.random() < 0.01:
                burst = rng.randint(30, 80)
                t += rng.randint(2_000, 15_000)
            else:
                t += int(rng.expovariate(1 / mean_gap)) + 1_000
        return cols


def group_table(g: Group, gid: int, source: str, groups: int) -> pa.Table:
    cols = g.history()
    n = len(cols["state"])
    state = pa.array(cols["state"], pa.int32())
    trans = pa.array(cols["trans"], pa.int32())
    blobs = pa.array(g.blobs, pa.binary())
    members = pa.array([[{"member_id": m, "group_instance_id": None, "client_id": "bench"}
                         for m in ms] for ms in g.member_lists], pa.list_(MEMBER_TYPE))
    lists = {"joined": pa.array(g.joined, pa.list_(pa.string())),
             "left": pa.array(g.left, pa.list_(pa.string()))}
    member_lists = g.member_lists
    return pa.table({
        "source": pa.array([source] * n, pa.string()),
        "id": pa.array([i * groups + gid for i in range(n)], pa.int64()),
        "group_id": pa.array([g.name] * n, pa.string()),
        "generation_id": pa.array(cols["gen"], pa.int64()),
        "protocol_type": pa.array(["resources"] * n, pa.string()),
        "protocol_name": pa.array([g.protocol] * n, pa.string()),
        "leader": pa.array([member_lists[s][0] for s in cols["state"]], pa.string()),
        "member_count": pa.array([len(member_lists[s]) for s in cols["state"]], pa.int64()),
        "members": members.take(state),
        "joined": lists["joined"].take(trans),
        "left": lists["left"].take(trans),
        "reason": pa.array(cols["reason"], pa.string()),
        "started_ms": pa.array(cols["started"], pa.int64()),
        "ended_ms": pa.array(cols["ended"], pa.int64()),
        "assignments": blobs.take(state),
    }, schema=JOURNAL_SCHEMA)


def write_sqlite(path: Path, tables: list[pa.Table]) -> None:
    con = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS, start=1):
        con.executescript(script)
        con.execute(f"PRAGMA user_version = {number}")
    for t in tables:
        rows = t.to_pylist()
        con.executemany(
            "INSERT INTO rebalance_journal (group_id, generation_id, protocol_type, "
            "protocol_name, leader, member_count, members, joined, left, reason, started_ms, "
            "ended_ms, assignments) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(r["group_id"], r["generation_id"], r["protocol_type"], r["protocol_name"],
              r["leader"], r["member_count"],
              json.dumps([[m["member_id"], m["group_instance_id"], m["client_id"]]
                          for m in r["members"]]),
              json.dumps(r["joined"]), json.dumps(r["left"]), r["reason"], r["started_ms"],
              r["ended_ms"], r["assignments"]) for r in rows])
    con.commit()
    con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--sources", type=int, default=4, help="coordinators the groups live on")
    ap.add_argument("--out", required=True, help="export directory to write (journal/...)")
    ap.add_argument("--sqlite", default=None, help="also write one coordinator SQLite file")
    ap.add_argument("--groups-per-file", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    per_group = max(1, args.rows // args.groups)
    out = Path(args.out) / "journal"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    total = 0
    keep: list[pa.Table] = []
    for first in range(0, args.groups, args.groups_per_file):
        batch = []
        for gid in range(first, min(args.groups, first + args.groups_per_file)):
            g = Group(gid, per_group, random.Random(args.seed * 1_000_003 + gid))
            batch.append(group_table(g, gid, f"coord-{gid % args.sources}", args.groups))
        table = pa.concat_tables(batch)
        pq.write_table(table, out / f"bench-{first:06d}.parquet", compression="zstd")
        total += table.num_rows
        if args.sqlite:
            keep.append(table)
        print(f"  {total:,} rows ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if args.sqlite:
        write_sqlite(Path(args.sqlite), keep)
    size = sum(f.stat().st_size for f in out.glob("*.parquet"))
    print(f"wrote {total:,} journal rows of {args.groups:,} groups to {out} "
          f"({size / 1e6:.0f} MB Parquet) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
