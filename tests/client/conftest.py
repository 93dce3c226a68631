"""Fixtures of the client tests; the helpers live in ``client_harness.py``.

This directory is named ``client`` like the package under test. Pytest puts
``tests/`` on ``sys.path`` (rootdir conftest, no ``__init__.py``), and the
editable install finds packages through a meta-path finder that runs after
the path scan, so ``import client`` can resolve to this directory as a
namespace package whose ``__init__`` never ran. A regular package anywhere on
``sys.path`` wins over a namespace portion, so the repository root is added
and a namespace ``client`` already imported is replaced by the real one.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def _real_client_package() -> None:
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.append(root)
    module = sys.modules.get("client")
    if module is not None and getattr(module, "__file__", None) is None:
        del sys.modules["client"]
    importlib.import_module("client")


_real_client_package()

from collections.abc import AsyncIterator, Awaitable, Callable  # noqa: E402

import pytest  # noqa: E402
from client_harness import InProcessCoordinator, MemoryStore  # noqa: E402

from coordinator.core import CoreConfig, GroupCoordinator  # noqa: E402
from coordinator.runtime.clock import WallClock  # noqa: E402
from coordinator.runtime.runtime import Runtime  # noqa: E402

MakeCoordinator = Callable[..., Awaitable[InProcessCoordinator]]


@pytest.fixture
async def make_coordinator() -> AsyncIterator[MakeCoordinator]:
    """A factory of in-process coordinators (the real core and runtime in
    this loop, in memory, no HTTP); each is stopped when the test ends."""
    started: list[Runtime] = []

    async def make(**settings: int) -> InProcessCoordinator:
        config = CoreConfig(**{"min_session_timeout_ms": 100,
                               "initial_rebalance_delay_ms": 0, **settings})
        runtime = Runtime(GroupCoordinator(config), MemoryStore(), WallClock())
        await runtime.start()
        started.append(runtime)
        return InProcessCoordinator(runtime)

    yield make
    for runtime in started:
        await runtime.stop()


@pytest.fixture
async def coordinator(make_coordinator: MakeCoordinator) -> InProcessCoordinator:
    return await make_coordinator()
