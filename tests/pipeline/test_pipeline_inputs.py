"""Reading journals: SQLite -> Arrow, the Parquet export, and clear errors naming the file.

None of these start Spark: inputs are checked before the JVM starts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pipeline_journal_builder import COOP, EAGER, write_db

from coordinator import history
from coordinator.cli import main
from coordinator.core.records import (
    JOURNAL_MEMBER_FIELDS,
    JournalEntry,
    JournalMember,
    MemberRecord,
    journal_member,
)
from coordinator.storage.schema import SCHEMA_VERSION
from coordinator.storage.sqlite import Storage
from pipeline.analyze import plan_inputs
from pipeline.errors import PipelineError
from pipeline.sources import JOURNAL_SCHEMA, MEMBER_TYPE, export, open_sqlite, read_journal
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import ResourceAssignment


def test_sqlite_journal_reads_into_arrow_with_64_bit_integers(tmp_path: Path) -> None:
    db = write_db(tmp_path / "c1.db", EAGER)
    table = read_journal(open_sqlite(db))
    assert table.schema.equals(JOURNAL_SCHEMA)
    assert table.num_rows == len(EAGER)
    assert str(table.schema.field("started_ms").type) == "int64"
    first = table.slice(0, 1).to_pylist()[0]
    assert first["source"] == "c1"
    assert first["joined"] == ["m1", "m2"]
    assert first["members"][0] == {"member_id": "m1", "group_instance_id": None,
                                   "client_id": "test-client"}


MEMBERS = (
    MemberRecord("m-1", None, "c1", "10.0.0.1", 10_000, 30_000, (("range", b""),)),
    MemberRecord("s-1", "inst", "c2", "10.0.0.2", 10_000, 30_000, (("range", b""),),
                 owner="team-a", incarnation="i-9", incarnation_ms=5),
)


async def test_a_journal_the_coordinator_wrote_reads_back_member_by_member(
        tmp_path: Path) -> None:
    # Storage writes the members, the admin history and the pipeline read them back.
    assignments = {"m-1": ResourceAssignment({"t": [0]}).encode(),
                   "s-1": ResourceAssignment({"t": [1]}).encode()}
    entry = JournalEntry("g", 1, RESOURCES, "range", "m-1",
                         tuple(journal_member(m) for m in MEMBERS), joined=("m-1", "s-1"),
                         left=(), reason="initial", started_ms=100, ended_ms=250,
                         assignments=assignments)
    db = tmp_path / "c1.db"
    storage = await Storage.open(db)
    try:
        await storage.write([entry])
        (row,) = await storage.rebalances("g", 10)
    finally:
        await storage.close()
    # The stored format, byte for byte: what every database written so far holds.
    con = sqlite3.connect(db)
    try:
        (raw,) = con.execute("SELECT members FROM rebalance_journal").fetchone()
    finally:
        con.close()
    assert raw == '[["m-1", null, "c1"], ["s-1", "inst", "c2"]]'
    # The admin API's history: a static member is known by its instance id.
    assert history.owners(row) == {("t", 0): "m-1", ("t", 1): "inst"}
    # The pipeline: the same fields, by name.
    assert MEMBER_TYPE.names == list(JOURNAL_MEMBER_FIELDS)
    members = read_journal(open_sqlite(db)).column("members").to_pylist()
    assert members == [[{"member_id": "m-1", "group_instance_id": None, "client_id": "c1"},
                        {"member_id": "s-1", "group_instance_id": "inst", "client_id": "c2"}]]
    assert [JournalMember(**m) for m in members[0]] == list(entry.members)


@pytest.mark.parametrize("members", ['[["m1", null]]', '[["m1", null, "c", "x"]]',
                                     '[[1, null, "c"]]', '[["m1", 2, "c"]]', '{"m1": 1}',
                                     '["m1"]', "not json"])
def test_a_journal_member_of_another_shape_is_named(tmp_path: Path, members: str) -> None:
    db = write_db(tmp_path / "c1.db", EAGER[:1])
    con = sqlite3.connect(db)
    con.execute("UPDATE rebalance_journal SET members = ?", (members,))
    con.commit()
    con.close()
    with pytest.raises(PipelineError, match=r"c1\.db: rebalance_journal id 1: members is not a "
                       r"JSON list of \[member_id, group_instance_id, client_id\]"):
        read_journal(open_sqlite(db))


def test_export_writes_parquet_that_keeps_every_column(tmp_path: Path) -> None:
    db = write_db(tmp_path / "c1.db", EAGER + COOP, generations=[("eager", 5, True)])
    res = export(open_sqlite(db, "coordinator-a"), tmp_path / "out")
    assert (res.journal_rows, res.generation_rows) == (9, 1)
    files = sorted((tmp_path / "out" / "journal").glob("*.parquet"))
    assert [f.name for f in files] == ["coordinator-a-1-9.parquet"]
    back = pq.read_table(files[0])
    assert back.column("source").to_pylist() == ["coordinator-a"] * 9
    assert back.drop_columns(["source"]).equals(
        read_journal(open_sqlite(db)).drop_columns(["source"]))
    # exporting again replaces the file instead of adding a copy
    export(open_sqlite(db, "coordinator-a"), tmp_path / "out")
    assert len(list((tmp_path / "out" / "journal").glob("*.parquet"))) == 1


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"nope\.db: no such file"):
        plan_inputs([str(tmp_path / "nope.db")])


def test_not_a_sqlite_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"this is not a database at all" * 10)
    with pytest.raises(PipelineError, match=r"junk\.db: not a SQLite database"):
        plan_inputs([str(bad)])


def test_corrupt_sqlite_file_is_named(tmp_path: Path) -> None:
    db = write_db(tmp_path / "broken.db", EAGER)
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # wreck the first page after the header
    db.write_bytes(bytes(data))
    with pytest.raises(PipelineError, match=r"broken\.db: corrupt or unreadable"):
        plan_inputs([str(db)])


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    db = write_db(tmp_path / "future.db", EAGER, user_version=SCHEMA_VERSION + 1)
    with pytest.raises(PipelineError, match=rf"future\.db: schema version {SCHEMA_VERSION + 1} "
                                            rf"is newer than this groupcoord reads"):
        plan_inputs([str(db)])


def test_sqlite_without_a_journal_is_refused(tmp_path: Path) -> None:
    import sqlite3
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(PipelineError, match=r"other\.db: not a groupcoord database"):
        plan_inputs([str(other)])


def test_corrupt_parquet_in_an_export_is_named(tmp_path: Path) -> None:
    db = write_db(tmp_path / "c1.db", EAGER)
    export(open_sqlite(db), tmp_path / "out")
    bad = tmp_path / "out" / "journal" / "zz-broken.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(PipelineError, match=r"zz-broken\.parquet: corrupt or not a Parquet"):
        plan_inputs([str(tmp_path / "out")])


def test_directory_that_is_not_an_export_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="not a `groupcoord journal export` directory"):
        plan_inputs([str(tmp_path)])


def test_cli_reports_errors_without_a_traceback(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["analyze", str(tmp_path / "missing.db"), "-o", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "groupcoord analyze: error:" in err and "missing.db: no such file" in err
    assert not (tmp_path / "out").exists()


def test_cli_journal_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = write_db(tmp_path / "coord-7.db", COOP)
    assert main(["journal", "export", str(db), "-o", str(tmp_path / "x")]) == 0
    assert "4 journal rows" in capsys.readouterr().out
    assert (tmp_path / "x" / "journal" / "coord-7-1-4.parquet").exists()


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipeline.spark import java_problem
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    problem = java_problem()
    assert problem is not None
    assert "Java 17+" in problem and "no-jdk has no bin/java" in problem
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no `java` on PATH" in (java_problem() or "")
