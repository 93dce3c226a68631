"""A PostgreSQL URL's password never shows: redact, scrub, is_postgres_url."""

from __future__ import annotations

import pytest

from coordinator.storage.pgurl import is_postgres_url, passwords, redact, scrub


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:secret@db:5432/coord", "postgresql://app:***@db:5432/coord"),
    ("postgresql://app:secret@db1:5432,db2:5432,db3/coord",
     "postgresql://app:***@db1:5432,db2:5432,db3/coord"),
    ("postgres://app@db/coord", "postgres://app@db/coord"),
    ("postgresql://db/coord", "postgresql://db/coord"),
    ("postgresql:///coord?host=/run/postgresql", "postgresql:///coord?host=/run/postgresql"),
    ("postgresql://app:secret@db/coord?sslmode=require&application_name=gc",
     "postgresql://app:***@db/coord?sslmode=require&application_name=gc"),
    ("postgresql://app@db/coord?password=secret&sslmode=require",
     "postgresql://app@db/coord?password=***&sslmode=require"),
    ("postgresql://app:p%40ss%2Fw@db:6432/coord", "postgresql://app:***@db:6432/coord"),
    # A password typed with raw separators still never shows (more is hidden instead).
    ("postgresql://app:pa@ss@db/coord", "postgresql://app:***@db/coord"),
    ("postgresql://app:pa/ss@db/coord", "postgresql://app:***@db/coord"),
    ("postgresql://app:pa?ss@db/coord", "postgresql://app:***@db/coord"),
    ("postgresql://[::1]:5432,[fe80::1]:5433/coord",
     "postgresql://[::1]:5432,[fe80::1]:5433/coord"),
])
def test_redact_keeps_hosts_user_and_db_and_hides_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown
    for secret in ("secret", "p%40ss%2Fw", "p@ss/w", "pa@ss", "pa/ss", "pa?ss"):
        assert secret not in redact(url)


def test_scrub_masks_the_password_anywhere_in_a_driver_message() -> None:
    url = "postgresql://app:p%40ss@db1:5432,db2:5432/coord"
    assert set(passwords(url)) == {"p%40ss", "p@ss"}
    message = f"could not connect with {url} (password p@ss rejected)"
    cleaned = scrub(message, url)
    assert "p@ss" not in cleaned and "p%40ss" not in cleaned
    assert "db1:5432,db2:5432/coord" in cleaned
    assert scrub("nothing secret", "postgresql://app@db/coord") == "nothing secret"


@pytest.mark.parametrize(("db", "expected"), [
    ("postgresql://db/coord", True), ("POSTGRES://db/coord", True),
    ("groupcoord.db", False), ("sqlite:///var/lib/g.db", False), ("/data/postgresql", False),
])
def test_is_postgres_url(db: str, expected: bool) -> None:
    assert is_postgres_url(db) is expected
