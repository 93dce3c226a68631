"""Reading coordinator journals: SQLite files and PostgreSQL databases into Arrow,
and the Parquet export.

A coordinator's SQLite file (coordinator/storage/schema.py) is read with
Python's ``sqlite3``, a PostgreSQL coordinator database
(coordinator/storage/pg_schema.py, several coordinators sharing it) with
asyncpg, both straight into the same Arrow record batches (no JDBC: see
docs/pipeline.md, "Inputs"), which Spark then takes as a DataFrame.
``groupcoord journal export`` writes the same Arrow tables as Parquet, so
journals of many coordinators can be collected on shared storage and analysed
together. Both databases are only read: nothing is migrated or written.

The export layout (format 1)::

    OUT/journal/<source>-<first id>-<last id>.parquet       JOURNAL_SCHEMA
    OUT/generations/<source>-<count>.parquet                GENERATIONS_SCHEMA

``source`` names the coordinator a row came from; ``(source, id)`` identifies a
journal row, so exporting the same file twice into one directory does not count
its rebalances twice (the analysis drops the duplicates). All integer columns
are 64-bit (Spark ``LongType``): times are Unix milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, get_args, get_type_hints

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.core.records import JOURNAL_MEMBER_FIELDS, JournalMember
from coordinator.storage import pgurl
from coordinator.storage.pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from coordinator.storage.schema import SCHEMA_VERSION
from coordinator.storage.sqlite import StorageError, sqlite_path
from pipeline.errors import PipelineError

EXPORT_FORMAT = "1"
EXPORT_FORMAT_KEY = b"groupcoord.journal_export"
SQLITE_MAGIC = b"SQLite format 3\x00"
#: ``sqlite:///coord.db`` (relative) and ``sqlite:////var/lib/coord.db``
#: (absolute): the path is what follows the third slash, as in SQLAlchemy.
SQLITE_URL = "sqlite:///"
BATCH_ROWS = 50_000


def _arrow_type(name: str, hint: object) -> pa.DataType:
    """The Arrow type of a :class:`JournalMember` field: ``str`` or ``int``, maybe ``| None``."""
    kinds = [k for k in (get_args(hint) or (hint,)) if k is not type(None)]
    arrow = {str: pa.string(), int: pa.int64()}
    if len(kinds) != 1 or kinds[0] not in arrow:
        raise TypeError(f"JournalMember.{name}: no Arrow type for {hint!r}")
    return arrow[kinds[0]]


#: a journal member (coordinator.core.records.JournalMember): its fields, in its order.
MEMBER_TYPE = pa.struct([(name, _arrow_type(name, hint))
                         for name, hint in get_type_hints(JournalMember).items()])

JOURNAL_SCHEMA = pa.schema([
    ("source", pa.string()),
    ("id", pa.int64()),
    ("group_id", pa.string()),
    ("generation_id", pa.int64()),
    ("protocol_type", pa.string()),
    ("protocol_name", pa.string()),
    ("leader", pa.string()),
    ("member_count", pa.int64()),
    ("members", pa.list_(MEMBER_TYPE)),
    ("joined", pa.list_(pa.string())),
    ("left", pa.list_(pa.string())),
    ("reason", pa.string()),
    ("started_ms", pa.int64()),
    ("ended_ms", pa.int64()),
    # msgpack map member_id -> assignment bytes, exactly as the coordinator stored it
    ("assignments", pa.binary()),
], metadata={EXPORT_FORMAT_KEY: EXPORT_FORMAT.encode()})

GENERATIONS_SCHEMA = pa.schema([
    ("source", pa.string()),
    ("group_id", pa.string()),
    ("generation_id", pa.int64()),
    ("protocol_type", pa.string()),
    ("protocol_name", pa.string()),
    ("leader", pa.string()),
    ("formed_ms", pa.int64()),
    ("member_count", pa.int64()),
    # False: the generation formed but the leader's assignment never arrived
    # (superseded by another rebalance, or still in flight when read).
    ("has_assignments", pa.bool_()),
], metadata={EXPORT_FORMAT_KEY: EXPORT_FORMAT.encode()})

_JOURNAL_SQL = (
    "SELECT id, group_id, generation_id, protocol_type, protocol_name, leader, member_count, "
    "members, joined, left, reason, started_ms, ended_ms, assignments "
    "FROM rebalance_journal ORDER BY group_id, id"
)
_GENERATIONS_SQL = (
    "SELECT group_id, generation_id, protocol_type, protocol_name, leader, formed_ms, "
    "member_count, assignments IS NOT NULL FROM generations ORDER BY group_id, generation_id"
)
# The same columns and order from PostgreSQL: ``"left"`` is a reserved word
# there, and ``COLLATE "C"`` orders group ids by their UTF-8 bytes as SQLite's
# BINARY collation does, whatever the database's locale, so an export holds its
# rows in the same order from either database.
_PG_JOURNAL_SQL = (
    'SELECT id, group_id, generation_id, protocol_type, protocol_name, leader, member_count, '
    'members, joined, "left", reason, started_ms, ended_ms, assignments '
    'FROM rebalance_journal ORDER BY group_id COLLATE "C", id'
)
_PG_GENERATIONS_SQL = (
    'SELECT group_id, generation_id, protocol_type, protocol_name, leader, formed_ms, '
    'member_count, assignments IS NOT NULL FROM generations '
    'ORDER BY group_id COLLATE "C", generation_id'
)


@dataclass(frozen=True)
class SqliteJournal:
    """One coordinator file, opened and checked (see :func:`open_sqlite`)."""

    path: Path
    source: str
    schema_version: int
    rows: int

    @property
    def name(self) -> str:
        """How messages and the report name this input."""
        return str(self.path)

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class PostgresJournal:
    """One PostgreSQL coordinator database, checked (see :func:`open_postgres`)."""

    #: the URL as given, password included: only ever handed to the driver.
    url: str = field(repr=False)
    #: the URL without its password (``pgurl.redact``): for every message.
    name: str
    source: str
    schema_version: int
    rows: int
    #: the journal table's size on disk (``pg_total_relation_size``).
    size_bytes: int


#: A coordinator database the pipeline reads on the driver.
Journal = SqliteJournal | PostgresJournal


def is_database_input(spec: str | Path) -> bool:
    """Whether an input names a coordinator database by URL (not a path or export)."""
    text = str(spec)
    return pgurl.is_postgres_url(text) or text.lower().startswith(SQLITE_URL)


def open_database(spec: str | Path, source: str | None = None) -> Journal:
    """Check a coordinator database given as a SQLite path, a ``sqlite:///`` URL or a
    ``postgresql://`` URL; errors are :class:`PipelineError` lines naming it."""
    text = str(spec)
    if pgurl.is_postgres_url(text):
        return open_postgres(text, source)
    if text.lower().startswith("sqlite:"):
        try:
            path = sqlite_path(text)               # the rule `groupcoord serve --db` uses
        except StorageError as exc:
            raise PipelineError(str(exc)) from None
        return open_sqlite(path, source)
    return open_sqlite(spec, source)


def unique_names(journals: Sequence[Journal]) -> list[Journal]:
    """Databases whose default source name another one shares get their full name
    (path, or URL without password) instead: two coordinators' rows must never be
    taken for one another's (a row is identified by ``(source, id)``)."""
    sources = [j.source for j in journals]
    return [replace(j, source=j.name) if sources.count(j.source) > 1 else j for j in journals]


def _connect(path: Path) -> sqlite3.Connection:
    # Read-only: the analysis must never change a coordinator's file, and a
    # running coordinator (WAL mode) can keep writing while we read.
    return sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)


def open_sqlite(path: str | Path, source: str | None = None) -> SqliteJournal:
    """Check that ``path`` is a coordinator database this version can read.

    Raises :class:`PipelineError` naming the file when it is missing, not a
    SQLite file, corrupt, from a newer schema version, or has no journal.
    """
    p = Path(path)
    if not p.exists():
        raise PipelineError(f"{p}: no such file")
    if p.is_dir():
        raise PipelineError(f"{p}: is a directory, not a coordinator SQLite file "
                            "(a directory must hold a `groupcoord journal export`)")
    try:
        with p.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise PipelineError(f"{p}: cannot read: {exc.strerror}") from exc
    if head != SQLITE_MAGIC:
        raise PipelineError(f"{p}: not a SQLite database (expected a coordinator's --db file)")
    try:
        con = _connect(p)
        try:
            version = int(con.execute("PRAGMA user_version").fetchone()[0])
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if version > SCHEMA_VERSION:
                raise PipelineError(
                    f"{p}: schema version {version} is newer than this groupcoord reads "
                    f"({SCHEMA_VERSION}); analyse it with the groupcoord that wrote it, or upgrade")
            if "rebalance_journal" not in tables:
                raise PipelineError(f"{p}: not a groupcoord database (no rebalance_journal table; "
                                    f"schema version {version})")
            rows = int(con.execute("SELECT count(*) FROM rebalance_journal").fetchone()[0])
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise PipelineError(f"{p}: corrupt or unreadable SQLite database: {exc}") from exc
    return SqliteJournal(p, source or p.stem, version, rows)


def _members(raw: str, where: str) -> list[tuple[Any, ...]]:
    """A ``members`` column: a JSON array of :class:`JournalMember` arrays, each as a
    tuple. Arrow takes a struct's fields by position (:data:`MEMBER_TYPE`'s order,
    which is :class:`JournalMember`'s) and checks their number and types when the
    batch is built (:func:`_journal_batch`)."""
    try:
        items = json.loads(raw)
    except ValueError as exc:
        raise _bad_members(where, raw) from exc
    if type(items) is not list or not all(type(m) is list for m in items):
        raise _bad_members(where, raw)
    return [tuple(m) for m in items]


def _bad_members(where: str, raw: str) -> PipelineError:
    return PipelineError(f"{where}: members is not a JSON list of "
                         f"[{', '.join(JOURNAL_MEMBER_FIELDS)}]: {raw[:80]!r}")


def _id_list(raw: str, where: str, name: str) -> list[str]:
    try:
        items = json.loads(raw)
        if not isinstance(items, list):
            raise TypeError(name)
        return [str(m) for m in items]
    except (ValueError, TypeError) as exc:
        raise PipelineError(f"{where}: {name} is not a JSON list of member ids: "
                            f"{raw[:80]!r}") from exc


def _journal_batch(rows: Sequence[Sequence[Any]], source: str, name: str) -> pa.RecordBatch:
    """Rows of ``_JOURNAL_SQL`` (or ``_PG_JOURNAL_SQL``) as one ``JOURNAL_SCHEMA`` batch:
    the one conversion both databases go through."""
    cols: dict[str, list[Any]] = {n: [] for n in JOURNAL_SCHEMA.names}
    for r in rows:
        where = f"{name}: rebalance_journal id {r[0]}"
        cols["source"].append(source)
        cols["id"].append(r[0])
        cols["group_id"].append(r[1])
        cols["generation_id"].append(r[2])
        cols["protocol_type"].append(r[3])
        cols["protocol_name"].append(r[4])
        cols["leader"].append(r[5])
        cols["member_count"].append(r[6])
        cols["members"].append(_members(r[7], where))
        cols["joined"].append(_id_list(r[8], where, "joined"))
        cols["left"].append(_id_list(r[9], where, "left"))
        cols["reason"].append(r[10])
        cols["started_ms"].append(r[11])
        cols["ended_ms"].append(r[12])
        blob = r[13]
        cols["assignments"].append(bytes(blob) if blob is not None else None)
    try:
        return pa.RecordBatch.from_pydict(cols, schema=JOURNAL_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Find the row: a member of another number or type of fields than JournalMember's.
        for r, members in zip(rows, cols["members"], strict=True):
            try:
                pa.array([members], type=JOURNAL_SCHEMA.field("members").type)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise _bad_members(f"{name}: rebalance_journal id {r[0]}", r[7]) from exc
        raise


def _generations_table(rows: Sequence[Sequence[Any]], source: str) -> pa.Table:
    cols: dict[str, list[Any]] = {n: [] for n in GENERATIONS_SCHEMA.names}
    for r in rows:
        cols["source"].append(source)
        for n, value in zip(GENERATIONS_SCHEMA.names[1:], r, strict=True):
            cols[n].append(bool(value) if n == "has_assignments" else value)
    return pa.Table.from_pydict(cols, schema=GENERATIONS_SCHEMA)


def iter_journal_batches(journal: Journal,
                         batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The journal of one database as Arrow record batches (``JOURNAL_SCHEMA``)."""
    if isinstance(journal, PostgresJournal):
        yield from _pg_journal_batches(journal, batch_rows)
        return
    p = journal.path
    try:
        con = _connect(p)
        try:
            cur = con.execute(_JOURNAL_SQL)
            while True:
                rows = cur.fetchmany(batch_rows)
                if not rows:
                    return
                yield _journal_batch(rows, journal.source, journal.name)
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise PipelineError(f"{p}: corrupt or unreadable SQLite database: {exc}") from exc


def read_journal(journal: Journal) -> pa.Table:
    return pa.Table.from_batches(list(iter_journal_batches(journal)), schema=JOURNAL_SCHEMA)


def read_generations(journal: Journal) -> pa.Table:
    """The ``generations`` table (``GENERATIONS_SCHEMA``); empty if the file has none."""
    if isinstance(journal, PostgresJournal):
        return _pg_generations(journal)
    p = journal.path
    rows: list[Any] = []
    try:
        con = _connect(p)
        try:
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "generations" in tables:
                rows = con.execute(_GENERATIONS_SQL).fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise PipelineError(f"{p}: corrupt or unreadable SQLite database: {exc}") from exc
    return _generations_table(rows, journal.source)


# ---------------------------------------------------------------- PostgreSQL
#
# asyncpg is asynchronous and the pipeline is not: each read runs on an event
# loop of its own, in the calling thread. The driver is imported only here
# (it is a core dependency, needed on the driver only: executors never see a
# database). Every read is one READ ONLY, REPEATABLE READ transaction (one
# snapshot, and PostgreSQL itself refuses any write); the journal is read
# through a server-side cursor, BATCH_ROWS at a time, so an export needs no
# more memory for a PostgreSQL journal than for a SQLite one.

_T = TypeVar("_T")


class _PgReader:
    """One connection in a read-only transaction, on a private event loop.

    ``run`` turns every failure into one :class:`PipelineError` line that names
    the database without its password.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self.name = pgurl.redact(url)
        self._loop = asyncio.new_event_loop()
        self.conn: Any = None

    def run(self, step: Awaitable[_T], what: str) -> _T:
        from coordinator.storage import postgres
        from coordinator.storage.sqlite import StorageError
        try:
            return self._loop.run_until_complete(step)
        except StorageError as exc:  # connect(), read_schema_version(): redacted already
            raise PipelineError(pgurl.scrub(str(exc), self._url)) from None
        except postgres.database_errors() as exc:
            raise PipelineError(f"{self.name}: cannot read {what}: "
                                f"{postgres.describe_error(exc, self._url)}") from None

    def __enter__(self) -> _PgReader:
        from coordinator.storage import postgres
        try:
            self.conn = self.run(postgres.connect(self._url), "it")
            self.run(self.conn.transaction(isolation="repeatable_read", readonly=True).start(),
                     "it")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.conn is not None:
                # Nothing to keep: closing ends the read-only transaction.
                try:
                    self._loop.run_until_complete(self.conn.close(timeout=5))
                except Exception:
                    self.conn.terminate()  # the link is gone, or the server hangs
        finally:
            self._loop.close()


def open_postgres(url: str, source: str | None = None) -> PostgresJournal:
    """Check that ``url`` names a coordinator database this version can read.

    Changes nothing: no migration, and a read-only transaction. Raises
    :class:`PipelineError`, naming the hosts and database but never the
    password, when it does not connect, is not a groupcoord database, or has a
    newer schema. The default source name is the database's name, with the
    schema the tables are in when that is not ``public`` (installations
    sharing one database through ``?search_path=``).
    """
    from coordinator.storage.postgres import read_schema_version
    with _PgReader(url) as r:
        version = r.run(read_schema_version(r.conn, r.name), "its schema version")
        if version > PG_SCHEMA_VERSION:
            raise PipelineError(
                f"{r.name}: schema version {version} is newer than this groupcoord reads "
                f"({PG_SCHEMA_VERSION}); analyse it with the groupcoord that wrote it, "
                "or upgrade")
        has_journal = r.run(r.conn.fetchval(
            "SELECT to_regclass('rebalance_journal') IS NOT NULL"), "its tables")
        if version == 0 or not has_journal:
            missing = "meta" if version == 0 else "rebalance_journal"
            raise PipelineError(f"{r.name}: not a groupcoord database (no {missing} table "
                                "in the schemas of its search_path)")
        rows, size, database, schema = r.run(r.conn.fetchrow(
            "SELECT (SELECT count(*) FROM rebalance_journal), "
            "pg_total_relation_size('rebalance_journal'), current_database(), "
            "(SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            " WHERE c.oid = 'rebalance_journal'::regclass)"), "the rebalance journal")
    default = str(database) if schema == "public" else f"{database}.{schema}"
    return PostgresJournal(url, r.name, source or default, version, int(rows), int(size))


def _pg_journal_batches(journal: PostgresJournal, batch_rows: int) -> Iterator[pa.RecordBatch]:
    with _PgReader(journal.url) as r:
        cursor = r.run(r.conn.cursor(_PG_JOURNAL_SQL), "the rebalance journal")
        while True:
            rows = r.run(cursor.fetch(batch_rows), "the rebalance journal")
            if not rows:
                return
            yield _journal_batch(rows, journal.source, journal.name)


def _pg_generations(journal: PostgresJournal) -> pa.Table:
    with _PgReader(journal.url) as r:
        rows = r.run(r.conn.fetch(_PG_GENERATIONS_SQL), "generations")
    return _generations_table(rows, journal.source)


# ---------------------------------------------------------------- export


@dataclass(frozen=True)
class ExportResult:
    journal_rows: int
    generation_rows: int
    files: tuple[Path, ...]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "source"


def export(journal: Journal, out_dir: str | Path) -> ExportResult:
    """Write one coordinator database's journal and generations as Parquet under ``out_dir``."""
    out = Path(out_dir)
    (out / "journal").mkdir(parents=True, exist_ok=True)
    (out / "generations").mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    first: int | None = None
    last: int | None = None
    rows = 0
    tmp = out / "journal" / f".{_safe(journal.source)}.parquet.tmp"
    writer = pq.ParquetWriter(tmp, JOURNAL_SCHEMA, compression="zstd")
    try:
        for batch in iter_journal_batches(journal):
            lo, hi = pc.min_max(batch.column(1)).values()
            first = lo.as_py() if first is None else min(first, lo.as_py())
            last = hi.as_py() if last is None else max(last, hi.as_py())
            rows += batch.num_rows
            writer.write_batch(batch)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    if rows:
        # The name carries the id range: a second export of the same file
        # overwrites an identical one instead of piling up copies.
        final = out / "journal" / f"{_safe(journal.source)}-{first}-{last}.parquet"
        os.replace(tmp, final)
        files.append(final)
    else:
        tmp.unlink(missing_ok=True)
    gens = read_generations(journal)
    if gens.num_rows:
        final = out / "generations" / f"{_safe(journal.source)}.parquet"
        pq.write_table(gens, final, compression="zstd")
        files.append(final)
    return ExportResult(rows, gens.num_rows, tuple(files))


def check_export_dir(path: str | Path) -> tuple[list[Path], list[Path]]:
    """The journal and generations Parquet files of an export directory.

    Reads only each file's footer, to name a corrupt or foreign file before
    Spark starts on it. Raises :class:`PipelineError` naming the problem.
    """
    p = Path(path)
    if not p.exists():
        raise PipelineError(f"{p}: no such directory")
    jdir = p / "journal"
    if not jdir.is_dir():
        raise PipelineError(f"{p}: not a `groupcoord journal export` directory "
                            "(no journal/ subdirectory)")
    journal_files = sorted(f for f in jdir.glob("*.parquet") if f.is_file())
    gen_files = sorted(f for f in (p / "generations").glob("*.parquet") if f.is_file())
    for f, schema in [(f, JOURNAL_SCHEMA) for f in journal_files] + \
                     [(f, GENERATIONS_SCHEMA) for f in gen_files]:
        try:
            found = pq.read_schema(f)
        except (OSError, pa.ArrowException) as exc:
            raise PipelineError(f"{f}: corrupt or not a Parquet file: {exc}") from exc
        missing = [n for n in schema.names if n not in found.names]
        if missing:
            raise PipelineError(f"{f}: not a groupcoord journal export file "
                                f"(missing column(s) {', '.join(missing)})")
        meta = found.metadata or {}
        fmt = meta.get(EXPORT_FORMAT_KEY)
        if fmt is not None and fmt.decode() > EXPORT_FORMAT:
            raise PipelineError(f"{f}: export format {fmt.decode()} is newer than this "
                                f"groupcoord reads ({EXPORT_FORMAT})")
    return journal_files, gen_files
