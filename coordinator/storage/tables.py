"""The tables of both stores, declared once, and the SQL of each dialect rendered from them.

Both stores hold the same tables, columns and encodings (``schema.py`` for
SQLite, ``pg_schema.py`` for PostgreSQL, tell their history as migrations).
What differs is spelled here, in :class:`Dialect`, and nowhere else:

- placeholders: ``?`` (SQLite) or ``$1, $2, ...`` (PostgreSQL);
- column types: ``INTEGER``/``BLOB`` or ``BIGINT``/``BYTEA``, and the
  journal's increasing row id;
- words PostgreSQL reserves (``"left"`` is quoted there);
- the larger of two values: ``MAX(a, b)`` or ``GREATEST(a, b)``;
- the ``partition`` column of every group-owned row, PostgreSQL's only
  (:data:`PARTITION`; ``crc32(utf-8 group_id) % P``, see ``pg_schema.py``).

The statements a record becomes (:class:`Statements`) are rendered once per
dialect at import; their parameters are the table's columns in the order
declared here, ``partition`` last (:func:`insert`).

The migrations render the ``CREATE TABLE`` text of a table from its
declaration; a migration already shipped must render the same statements for
ever (tests/storage/test_storage_schema.py holds them to that): a column added
to a table here is a new migration (:func:`add_columns`), and the migrations
that created the table before render it ``until=`` the column before.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


class Type(enum.Enum):
    """A column's type, as both dialects spell it (:attr:`Dialect.types`)."""

    TEXT = "text"
    #: counts and partitions (32 bits are plenty).
    INT = "int"
    #: generations, indexes, Unix ms, the ``meta`` values (64 bits).
    BIGINT = "bigint"
    BLOB = "blob"
    #: the journal's row id: increasing, never reused; the table's primary key.
    IDENTITY = "identity"
    #: PostgreSQL only: a time of the database's clock.
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: Type
    not_null: bool = False
    #: part of the table's primary key.
    key: bool = False
    #: SQL text of the default value.
    default: str | None = None
    #: in partitioned stores only (PostgreSQL's :data:`PARTITION`).
    partitioned: bool = False


#: The partition of a group-owned row, in PostgreSQL's tables only.
PARTITION = Column("partition", Type.INT, not_null=True, partitioned=True)


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[Column, ...]

    @property
    def key(self) -> tuple[str, ...]:
        """The primary key's columns: the target of an upsert's ``ON CONFLICT``, the
        order rows are read in."""
        return tuple(c.name for c in self.columns if c.key)

    @property
    def partitioned(self) -> bool:
        """Whether the rows are a group's (carrying :data:`PARTITION` where partitioned)."""
        return any(c.partitioned for c in self.columns)

    @property
    def common(self) -> tuple[str, ...]:
        """The columns both stores have, in order (what a store reads back)."""
        return tuple(c.name for c in self.columns if not c.partitioned)

    def columns_in(self, dialect: Dialect) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if dialect.partitioned or not c.partitioned)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name} has no column {name!r}")


@dataclass(frozen=True, slots=True)
class Index:
    name: str
    table: Table
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Dialect:
    """What one database spells its own way."""

    name: str
    types: Mapping[Type, str]
    #: column names quoted where they appear (reserved words of the dialect).
    reserved: frozenset[str]
    #: ``$1, $2, ...`` rather than ``?``.
    numbered: bool
    #: the function giving the larger of two values.
    greatest: str
    #: whether group-owned rows carry their :data:`PARTITION`.
    partitioned: bool

    def ident(self, name: str) -> str:
        return f'"{name}"' if name in self.reserved else name

    def param(self, number: int) -> str:
        """The ``number``-th placeholder (from 1)."""
        return f"${number}" if self.numbered else "?"

    def params(self, count: int) -> str:
        return ", ".join(self.param(i) for i in range(1, count + 1))

    def names(self, names: Iterable[str]) -> str:
        return ", ".join(self.ident(n) for n in names)


SQLITE = Dialect(
    name="sqlite",
    types={Type.TEXT: "TEXT", Type.INT: "INTEGER", Type.BIGINT: "INTEGER", Type.BLOB: "BLOB",
           Type.IDENTITY: "INTEGER PRIMARY KEY AUTOINCREMENT"},
    reserved=frozenset(), numbered=False, greatest="MAX", partitioned=False)

POSTGRES = Dialect(
    name="postgresql",
    types={Type.TEXT: "TEXT", Type.INT: "INTEGER", Type.BIGINT: "BIGINT", Type.BLOB: "BYTEA",
           Type.IDENTITY: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
           Type.TIMESTAMP: "TIMESTAMPTZ"},
    reserved=frozenset({"left"}), numbered=True, greatest="GREATEST", partitioned=True)


# ---------------------------------------------------------------- the tables
# What each table holds, and which migration brought each column, is told in
# schema.py (SQLite) and pg_schema.py (PostgreSQL).

_T, _I, _B, _BLOB = Type.TEXT, Type.INT, Type.BIGINT, Type.BLOB

GROUPS = Table("groups", (
    Column("group_id", _T, key=True),
    PARTITION,
    Column("state", _T, not_null=True),
    Column("generation_id", _B, not_null=True),
    Column("protocol_type", _T),
    Column("protocol_name", _T),
    Column("leader", _T),
    Column("state_timestamp_ms", _B, not_null=True),
    Column("members", _BLOB, not_null=True),
))

GENERATIONS = Table("generations", (
    Column("group_id", _T, key=True),
    Column("generation_id", _B, key=True),
    PARTITION,
    Column("protocol_type", _T),
    Column("protocol_name", _T),
    Column("leader", _T),
    Column("formed_ms", _B, not_null=True),
    Column("member_count", _I, not_null=True),
    Column("members", _T, not_null=True),
    Column("assignments", _BLOB),
))

CHECKPOINTS = Table("checkpoints", (
    Column("group_id", _T, key=True),
    Column("resource_set", _T, key=True),
    Column("idx", _B, key=True),
    PARTITION,
    Column("value", _BLOB, not_null=True),
    Column("committed_ms", _B),
    Column("member_id", _T),
    Column("generation_id", _B),
    Column("sequence", _B),
))

CATALOG = Table("catalog", (
    Column("name", _T, key=True),
    Column("partitions", _I, not_null=True),
    Column("weights", _T),
    Column("zones", _T),
))

META = Table("meta", (
    Column("key", _T, key=True),
    Column("value", _B, not_null=True),
))

JOURNAL = Table("rebalance_journal", (
    Column("id", Type.IDENTITY, key=True),
    Column("group_id", _T, not_null=True),
    PARTITION,
    Column("generation_id", _B, not_null=True),
    Column("protocol_type", _T),
    Column("protocol_name", _T),
    Column("leader", _T),
    Column("member_count", _I, not_null=True),
    Column("members", _T, not_null=True),
    Column("joined", _T, not_null=True),
    Column("left", _T, not_null=True),
    Column("reason", _T, not_null=True),
    Column("started_ms", _B, not_null=True),
    Column("ended_ms", _B, not_null=True),
    Column("assignments", _BLOB, not_null=True),
))

LAST_COMMITS = Table("last_commits", (
    Column("group_id", _T, key=True),
    PARTITION,
    Column("committed_ms", _B, not_null=True),
))

GROUP_OWNERS = Table("group_owners", (
    Column("group_id", _T, key=True),
    PARTITION,
    Column("owner", _T, not_null=True),
))

# PostgreSQL only: the partitions' leases and the coordinators that hold them
# (coordinator/storage/leases.py).

PARTITION_LEASES = Table("partition_leases", (
    Column("partition", _I, key=True),
    Column("owner_id", _T),
    Column("owner_url", _T),
    Column("epoch", _B, not_null=True, default="0"),
    Column("acquired_at", Type.TIMESTAMP),
    Column("expires_at", Type.TIMESTAMP, not_null=True, default="'-infinity'"),
))

COORDINATORS = Table("coordinators", (
    Column("id", _T, key=True),
    Column("url", _T, not_null=True),
    Column("admin_url", _T, not_null=True, default="''"),
    Column("started_at", Type.TIMESTAMP, not_null=True, default="now()"),
    Column("last_seen", Type.TIMESTAMP, not_null=True, default="now()"),
))

JOURNAL_BY_GROUP = Index("rebalance_journal_group", JOURNAL, ("group_id", "generation_id"))

#: The tables of a group's rows that go with the group (the journal stays: it is history).
GROUP_TABLES = (GROUPS, GENERATIONS, CHECKPOINTS, LAST_COMMITS, GROUP_OWNERS)

#: The tables a store's snapshot (``Storage.load``) is read from.
SNAPSHOT_TABLES = (GROUPS, CHECKPOINTS, CATALOG, META, LAST_COMMITS, GROUP_OWNERS)


# ---------------------------------------------------------------- DDL
# Laid out as the migrations' text always was: SQLite keeps the text of each
# CREATE TABLE (sqlite_master), and databases made before are laid out so.


def _column_ddl(dialect: Dialect, column: Column, *, one_key: bool) -> str:
    words = [dialect.ident(column.name), dialect.types[column.type]]
    if column.type is not Type.IDENTITY:  # its type says PRIMARY KEY
        if column.key and one_key:
            words.append("PRIMARY KEY")
        if column.not_null or (column.key and not one_key):
            words.append("NOT NULL")
    if column.default is not None:
        words.append(f"DEFAULT {column.default}")
    return " ".join(words)


def create_table(dialect: Dialect, table: Table, *, until: str | None = None) -> str:
    """``CREATE TABLE`` of ``table`` as the dialect has it; with ``until``, only the
    columns up to that one (those a later migration added are left out)."""
    columns = table.columns_in(dialect)
    if until is not None:
        columns = columns[:columns.index(table.column(until)) + 1]
    one_key = len(table.key) == 1
    lines = [_column_ddl(dialect, c, one_key=one_key) for c in columns]
    if not one_key:
        lines.append(f"PRIMARY KEY ({dialect.names(table.key)})")
    body = ",\n        ".join(lines)
    return f"CREATE TABLE {table.name} (\n        {body}\n    )"


def create_index(index: Index) -> str:
    return f"CREATE INDEX {index.name} ON {index.table.name} ({', '.join(index.columns)})"


def partition_index(table: Table) -> str:
    """The index on a partitioned table's :data:`PARTITION` (one partition's rows are
    loaded at a takeover)."""
    return create_index(Index(f"{table.name}_partition", table, (PARTITION.name,)))


def add_columns(dialect: Dialect, table: Table, *names: str) -> list[str]:
    """``ALTER TABLE ... ADD COLUMN`` of each named column, as declared."""
    return [f"ALTER TABLE {table.name} ADD COLUMN "
            f"{_column_ddl(dialect, table.column(n), one_key=len(table.key) == 1)}"
            for n in names]


def script(*statements: str | Sequence[str]) -> str:
    """One migration: its statements, ``;``-separated."""
    flat: list[str] = []
    for s in statements:
        flat += [s] if isinstance(s, str) else list(s)
    return ";\n".join(flat)


def columns_of(dialect: Dialect, tables: Iterable[Table]) -> dict[str, tuple[str, ...]]:
    """Each table's columns in the dialect (what a store checks when it opens)."""
    return {t.name: tuple(c.name for c in t.columns_in(dialect)) for t in tables}


# ---------------------------------------------------------------- DML


def _insert_columns(dialect: Dialect, table: Table) -> list[str]:
    """The columns an INSERT names, in parameter order: the declared order without the
    journal's id, and PARTITION last (so both stores build the same parameters and a
    partitioned one appends the partition)."""
    names = [c.name for c in table.columns
             if c.type is not Type.IDENTITY and not c.partitioned]
    return names + ([PARTITION.name] if dialect.partitioned and table.partitioned else [])


def insert(dialect: Dialect, table: Table) -> str:
    columns = _insert_columns(dialect, table)
    return (f"INSERT INTO {table.name} ({dialect.names(columns)}) "
            f"VALUES ({dialect.params(len(columns))})")


def upsert(dialect: Dialect, table: Table, *, keep: Sequence[str] = (),
           merge: Mapping[str, str] | None = None) -> str:
    """:func:`insert`, updating the row of the same key instead: each column but the
    key, :data:`PARTITION` (the key's function) and ``keep`` takes the new value, or
    ``merge``'s expression of ``{old}`` and ``{new}`` (``{greatest}``: the dialect's
    function for the larger)."""
    merge = merge or {}
    sets = []
    for name in _insert_columns(dialect, table):
        if name in table.key or name == PARTITION.name or name in keep:
            continue
        column = dialect.ident(name)
        new, old = f"excluded.{column}", f"{table.name}.{column}"
        value = (merge[name].format(old=old, new=new, greatest=dialect.greatest)
                 if name in merge else new)
        sets.append(f"{column} = {value}")
    return (f"{insert(dialect, table)} ON CONFLICT ({dialect.names(table.key)}) "
            f"DO UPDATE SET {', '.join(sets)}")


def where(dialect: Dialect, columns: Sequence[str], first: int = 1) -> str:
    """`` WHERE a = ? AND b = ?`` (nothing for no columns)."""
    if not columns:
        return ""
    return " WHERE " + " AND ".join(f"{dialect.ident(c)} = {dialect.param(first + i)}"
                                    for i, c in enumerate(columns))


def delete(dialect: Dialect, table: Table, *columns: str) -> str:
    return f"DELETE FROM {table.name}{where(dialect, columns)}"


def select(dialect: Dialect, table: Table, columns: Sequence[str], *,
           by: Sequence[str] = (), order: str = "", limit: bool = False) -> str:
    """``SELECT columns FROM table`` where each of ``by`` equals a parameter, in
    ``order`` (default: the key's), with ``limit`` as many as the last parameter."""
    sql = (f"SELECT {dialect.names(columns)} FROM {table.name}{where(dialect, by)} "
           f"ORDER BY {order or ', '.join(table.key)}")
    return f"{sql} LIMIT {dialect.param(len(by) + 1)}" if limit else sql


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements records become, in one dialect (parameters: :func:`insert`)."""

    upsert_group: str
    # ``formed_ms`` keeps the time the generation formed; later records of the same
    # generation (the leader's assignment, a static member replaced) update the
    # rest, and the assignments once known stay.
    upsert_generation: str
    upsert_checkpoint: str
    delete_checkpoint: str
    # The largest time wins: a wall-clock step back must not bring an expiry forward.
    upsert_last_commit: str
    upsert_owner: str
    insert_journal: str
    upsert_catalog: str
    delete_catalog: str
    set_meta: str
    #: one ``DELETE ... WHERE group_id =`` per table of :data:`GROUP_TABLES`.
    delete_group: tuple[str, ...]

    @classmethod
    def of(cls, d: Dialect) -> Statements:
        return cls(
            upsert_group=upsert(d, GROUPS),
            upsert_generation=upsert(d, GENERATIONS, keep=("formed_ms",),
                                     merge={"assignments": "COALESCE({new}, {old})"}),
            upsert_checkpoint=upsert(d, CHECKPOINTS),
            delete_checkpoint=delete(d, CHECKPOINTS, *CHECKPOINTS.key),
            upsert_last_commit=upsert(d, LAST_COMMITS,
                                      merge={"committed_ms": "{greatest}({old}, {new})"}),
            upsert_owner=upsert(d, GROUP_OWNERS),
            insert_journal=insert(d, JOURNAL),
            upsert_catalog=upsert(d, CATALOG),
            delete_catalog=delete(d, CATALOG, *CATALOG.key),
            set_meta=upsert(d, META),
            delete_group=tuple(delete(d, t, "group_id") for t in GROUP_TABLES),
        )
