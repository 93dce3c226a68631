"""`groupcoord journal export` and `analyze` on a PostgreSQL coordinator database.

One journal is written through both stores' ``write`` (the records of
coordinator/core/records.py, as a coordinator writes them): into a real
PostgreSQL (tests/pg_harness.py, a schema of this module's own) and into a
SQLite file named so that both get the same source name. Export and analysis
of either must give the same tables, byte for byte for the export. Bad URLs
give one line that names the host and never the password, and change nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pg_harness import PASSWORD, PostgresServer, free_port
from pipeline_journal_builder import COOP, EAGER, T0, Row

from coordinator.cli import main
from coordinator.core.records import GroupRecord, JournalEntry, MemberRecord, Record
from coordinator.storage.pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from coordinator.storage.postgres import PostgresStorage
from coordinator.storage.sqlite import Storage
from pipeline.analyze import AnalyzeOptions, analyze, plan_inputs
from pipeline.errors import PipelineError
from pipeline.sources import open_database
from protocol.resources import ResourceAssignment

_schemas = itertools.count()

#: A group whose id sorts differently by bytes and by a language's rules, so
#: the export's row order is the database's business, not the locale's.
UMLAUT = [
    Row("Ärger", 1, "initial", T0 + 50, T0 + 90, {"m1": {"c": [0, 1]}}, joined=("m1",)),
    Row("Ärger", 2, "join", T0 + 700, T0 + 760, {"m1": {"c": [0]}, "m2": {"c": [1]}},
        joined=("m2",)),
]


def member(mid: str, assignment: bytes | None) -> MemberRecord:
    return MemberRecord(member_id=mid, group_instance_id=None, client_id="test-client",
                        client_host="127.0.0.1", session_timeout_ms=10_000,
                        rebalance_timeout_ms=30_000, protocols=(("range", b""),),
                        assignment=assignment)


def records(rows: Sequence[Row]) -> list[Record]:
    """Per journal row, the group as it formed, then stable with its assignment and
    the journal entry (as the runtime writes them); the last generation of "eager"
    formed but never got its assignment."""
    out: list[Record] = []
    for r in rows:
        blobs = {m: ResourceAssignment(assigned=sets).encode() for m, sets in r.owned.items()}
        ids = r.member_ids()

        def grp(state: str, assigned: bool, r: Row = r, ids: list[str] = ids,
                blobs: dict[str, bytes] = blobs) -> GroupRecord:
            return GroupRecord(r.group_id, state, r.generation_id, r.protocol_type,
                               r.protocol_name, ids[0],
                               tuple(member(m, blobs[m] if assigned else None) for m in ids),
                               r.started_ms)
        out += [grp("CompletingRebalance", False), grp("Stable", True),
                JournalEntry(r.group_id, r.generation_id, r.protocol_type, r.protocol_name,
                             ids[0], tuple((m, None, "test-client") for m in ids),
                             tuple(r.joined), tuple(r.left), r.reason, r.started_ms,
                             r.ended_ms, blobs)]
    out.append(GroupRecord("eager", "CompletingRebalance", 6, "resources", "range", "m1",
                           (member("m1", None),), T0 + 7_200_000))
    return out


async def write_both(url: str, db: Path, batches: Sequence[Sequence[Record]]) -> None:
    pg = await PostgresStorage.open(url, partitions=4)
    sq = await Storage.open(db)
    try:
        for batch in batches:
            await pg.write(batch)
            await sq.write(batch)
    finally:
        await pg.close()
        await sq.close()


def new_schema(server: PostgresServer) -> tuple[str, str]:
    """An empty schema of its own in the database ``groupcoord``: (name, URL)."""
    name = f"pj{os.getpid()}_{next(_schemas)}"
    server.psql(f"CREATE SCHEMA {name}", "groupcoord")
    return name, server.url("groupcoord") + f"?search_path={name}"


@pytest.fixture(scope="module")
def journal(postgres_server: PostgresServer,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    schema, url = new_schema(postgres_server)
    d = tmp_path_factory.mktemp("pgjournal")
    # The default source of a PostgreSQL database is "<database>.<schema>"
    # (not "public"); of a SQLite file, its stem: the same here.
    db = d / f"groupcoord.{schema}.db"
    recs = records(EAGER + UMLAUT + COOP)
    # Several transactions, as a coordinator commits them (a batch per rebalance).
    asyncio.run(write_both(url, db, [recs[i:i + 3] for i in range(0, len(recs), 3)]))
    return {"url": url, "db": db, "dir": d, "source": f"groupcoord.{schema}",
            "server": postgres_server, "schema": schema}


def test_open_names_the_source_and_hides_the_password(journal: dict[str, Any]) -> None:
    pg = open_database(journal["url"])
    assert (pg.source, pg.rows, pg.schema_version) == (
        journal["source"], len(EAGER + UMLAUT + COOP), PG_SCHEMA_VERSION)
    assert PASSWORD not in pg.name and PASSWORD not in repr(pg)
    assert pg.name.startswith("postgresql://postgres:***@127.0.0.1:")
    assert open_database(journal["db"]).source == journal["source"]
    assert open_database(f"sqlite:///{journal['db']}").source == journal["source"]


def test_journal_export_is_the_same_from_either_database(
        journal: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d: Path = journal["dir"]
    assert main(["journal", "export", journal["url"], "-o", str(d / "exp-pg")]) == 0
    assert main(["journal", "export", str(journal["db"]), "-o", str(d / "exp-sq")]) == 0
    out = capsys.readouterr().out
    assert PASSWORD not in out
    rows = len(EAGER + UMLAUT + COOP)
    assert out.count(f"{rows} journal rows, {rows + 1} generations") == 2, out
    files = sorted(p.relative_to(d / "exp-pg") for p in (d / "exp-pg").rglob("*.parquet"))
    assert files == sorted(p.relative_to(d / "exp-sq") for p in (d / "exp-sq").rglob("*.parquet"))
    assert files == [Path("generations") / f"{journal['source']}.parquet",
                     Path("journal") / f"{journal['source']}-1-11.parquet"]
    for f in files:
        pg_table, sq_table = pq.read_table(d / "exp-pg" / f), pq.read_table(d / "exp-sq" / f)
        assert pg_table.schema.equals(sq_table.schema, check_metadata=True)
        assert pg_table.equals(sq_table), f
    groups = pq.read_table(d / "exp-pg" / files[1]).column("group_id").to_pylist()
    assert groups == sorted(groups, key=lambda g: g.encode())  # byte order, as SQLite's


def test_analyze_gives_the_same_tables_from_either_database(
        spark: Any, journal: dict[str, Any]) -> None:
    """One run over both databases (one Spark job, not two): their source names
    collide, so each is named by its URL or path and counts apart; every row of
    every per-source table is then the same for both but for ``source``, and the
    fleet-wide hours count both."""
    d: Path = journal["dir"]
    res = analyze(spark, [journal["url"], str(journal["db"])], d / "an",
                  AnalyzeOptions(storm_threshold=3, progress=False))
    rows = len(EAGER + UMLAUT + COOP)
    assert (res.rebalances, res.groups) == (2 * rows, 6)
    pg_name, sq_name = open_database(journal["url"]).name, str(journal["db"])
    for table in ("rebalances", "group_hours", "groups"):
        by: dict[str, list[str]] = {pg_name: [], sq_name: []}
        for r in spark.read.parquet(str(res.tables[table])).collect():
            values = r.asDict()
            by[values.pop("source")].append(repr(sorted(values.items())))
        assert by[pg_name], table
        assert sorted(by[pg_name]) == sorted(by[sq_name]), table
        if table == "rebalances":
            assert len(by[pg_name]) == rows
    fleet = spark.read.parquet(str(res.tables["fleet_hours"])).collect()
    assert sum(r["rebalances"] for r in fleet) == 2 * rows
    groups = {(r["source"], r["group_id"]): r
              for r in spark.read.parquet(str(res.tables["groups"])).collect()}
    # The generations table came along: eager's generation 6 never got its assignment.
    assert (groups[pg_name, "eager"]["generations_formed"],
            groups[pg_name, "eager"]["generations_without_assignment"]) == (6, 1)
    assert groups[pg_name, "coop"]["moved"] > 0
    report = res.report.read_text()
    assert PASSWORD not in report and "postgresql://postgres:***@127.0.0.1" in report


def test_a_database_and_a_file_of_the_same_name_stay_two_sources(
        journal: dict[str, Any]) -> None:
    plan = plan_inputs([journal["url"], str(journal["db"]), journal["url"]])
    sources = [j.source for j in plan.databases]
    pg_name = open_database(journal["url"]).name
    # The same database twice is one source (its rows count once, as a file's).
    assert sources == [pg_name, str(journal["db"]), pg_name]
    assert PASSWORD not in repr(plan)


# ---------------------------------------------------------------- bad input


def one_error_line(command: list[str], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> str:
    code = main([*command, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert PASSWORD not in captured.err + captured.out
    assert not (tmp_path / "out").exists()
    return lines[0]


@pytest.mark.parametrize("command", [["journal", "export"], ["analyze"]])
def test_a_url_that_does_not_connect_names_the_host_not_the_password(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/groupcoord"
    line = one_error_line([*command, url], tmp_path, capsys)
    name = "journal export" if command[0] == "journal" else "analyze"
    assert line.startswith(f"groupcoord {name}: error: cannot connect to PostgreSQL at "
                           f"postgresql://postgres:***@127.0.0.1:{port}/groupcoord: "), line


def test_a_wrong_password_is_refused_without_showing_either(
        journal: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = journal["url"].replace(PASSWORD, "not-" + PASSWORD[::-1])
    line = one_error_line(["journal", "export", url], tmp_path, capsys)
    assert "password authentication failed" in line and PASSWORD[::-1] not in line


def test_a_database_that_is_not_groupcoord_is_refused_and_left_alone(
        journal: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server: PostgresServer = journal["server"]
    schema, url = new_schema(server)
    line = one_error_line(["analyze", url], tmp_path, capsys)
    assert line.endswith(f"/groupcoord?search_path={schema}: not a groupcoord database "
                         "(no meta table in the schemas of its search_path)"), line
    # Read-only: the tool must not have migrated it (PostgresStorage.open would).
    assert server.psql("SELECT count(*) FROM pg_tables WHERE schemaname = "
                       f"'{schema}'", "groupcoord").strip() == "0"


def test_a_newer_schema_version_is_refused(
        journal: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server: PostgresServer = journal["server"]
    schema, url = new_schema(server)
    asyncio.run(write_both(url, tmp_path / "x.db", []))  # the current schema, empty
    server.psql(f"UPDATE {schema}.meta SET value = 99 WHERE key = 'schema_version'",
                "groupcoord")
    line = one_error_line(["journal", "export", url], tmp_path, capsys)
    assert (f"schema version 99 is newer than this groupcoord reads ({PG_SCHEMA_VERSION})"
            in line)


def test_an_empty_sqlite_url_is_refused() -> None:
    with pytest.raises(PipelineError, match=r"sqlite:///PATH"):
        open_database("sqlite:///")
