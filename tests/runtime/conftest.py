"""Fixtures of the runtime's tests (runtime_kit.py holds the harness itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runtime_kit import Harness, make_harness


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """A runtime on a real SQLite file whose writes a test can hold
    (``storage.gate``); released, stopped and closed at the end."""
    h = await make_harness(tmp_path / "g.db")
    yield h
    h.storage.gate.set()
    await h.runtime.stop()
    await h.storage.inner.close()
