"""Durable state in SQLite through aiosqlite (WAL)."""
