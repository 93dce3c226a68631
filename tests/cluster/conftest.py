"""A real PostgreSQL for the several-coordinators tests (tests/pg_harness.py)."""

from pg_harness import pg_url, postgres_server

__all__ = ["pg_url", "postgres_server"]
