"""The per-token checkpoint budget holds across a restart of a real runtime on SQLite:
the bytes are counted again from the checkpoints and group owners on disk."""

from __future__ import annotations

from pathlib import Path

from coordinator.core.commands import Commit
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.runtime.clock import FakeClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.errors import ErrorCode
from protocol.messages import CommitRequest, CommitResponse
from protocol.validate import checkpoint_size

T0 = 1_700_000_000_000
SIZE = checkpoint_size("s", 0)
CONFIG = CoreConfig(max_checkpoint_bytes_per_token=10 * SIZE)


async def _commit(runtime: Runtime, group: str, indexes: range, principal: str
                  ) -> CommitResponse:
    req = CommitRequest(group, "tool", -1, tuple(("s", i, i) for i in indexes))
    answer = await runtime.call(Commit(runtime.new_request_id(), req, principal))
    assert isinstance(answer, CommitResponse)
    return answer


async def test_the_budget_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    for restarted in (False, True):
        storage = await Storage.open(path)
        runtime = Runtime(GroupCoordinator(CONFIG), storage, FakeClock(T0))
        try:
            await runtime.start()
            if not restarted:
                assert (await _commit(runtime, "a-1", range(6), "alice")).error is None
                assert (await _commit(runtime, "a-2", range(3), "alice")).error is None
            # Before the restart and after it, "alice" holds 9 of her 10: two more
            # are refused, while "bob" has his own 10.
            answer = await _commit(runtime, "a-3", range(2), "alice")
            assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
            assert f"holds {9 * SIZE} bytes" in answer.message
            assert (await _commit(runtime, "b-1", range(10), "bob")).error is None
        finally:
            await runtime.stop()
            await storage.close()
