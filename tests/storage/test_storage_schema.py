"""The migrations rendered from the table declarations (coordinator/storage/tables.py).

A migration that shipped is history: databases were made by the statements it
ran, and SQLite keeps each ``CREATE TABLE`` text in the file. The declarations
are shared with the statements of today, so an edit there could change what an
old migration runs; the digests below are of the statements each migration ran
when it shipped, and a change of any of them fails here. A new column or table
is a new migration (the old ones render the table ``until=`` the column before).
"""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from coordinator.storage import pg_schema, schema

#: sha256 (first 16 hex digits) of each migration's statements, stripped and
#: joined by ";\n", as each groupcoord release ran them.
SHIPPED = {
    "sqlite": ("aa94090d3c6a113c", "9d1ce5e5fdc5d8bc", "7864229d1158e749",
               "569e7981edd381ad", "b37c40144365176e", "d5dc8ed31d0af76d"),
    "postgresql": ("5c67f84a59462331", "b37c40144365176e", "1a102ba8faa0feb5"),
}


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _digest(script: str) -> str:
    return hashlib.sha256(";\n".join(_statements(script)).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("dialect", "migrations"), [("sqlite", schema.MIGRATIONS),
                                                     ("postgresql", pg_schema.MIGRATIONS)])
def test_shipped_migrations_run_the_statements_they_always_ran(
        dialect: str, migrations: tuple[str, ...]) -> None:
    shipped = SHIPPED[dialect]
    assert len(migrations) >= len(shipped), "a shipped migration was removed"
    for number, (script, digest) in enumerate(zip(migrations, shipped, strict=False), 1):
        assert _digest(script) == digest, (
            f"{dialect} migration {number} changed: databases were made by what it ran. "
            f"A column added to a declaration in tables.py goes in a new migration "
            f"(add_columns), the old ones creating the table until= the column before "
            f"it:\n{script}")


def test_the_sqlite_migrations_make_the_columns_the_store_checks() -> None:
    con = sqlite3.connect(":memory:")
    try:
        for script in schema.MIGRATIONS:
            for statement in _statements(script):
                con.execute(statement)
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        made = {t: tuple(r[1] for r in con.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        con.close()
    assert made == schema.COLUMNS
