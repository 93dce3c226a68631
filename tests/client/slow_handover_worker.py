"""``examples/worker.py`` with a slow hand-over, as a process for
test_worker_example.py: ``on_revoked`` takes ``REVOKE_S`` seconds (the
worker's tasks draining, say) before the example's own final commit, and
says when it starts."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import worker

from client import Resource


class SlowHandOver(worker.Worker):
    async def on_revoked(self, resources: set[Resource]) -> None:
        await self.stop(resources)
        worker.log.info("%s revoking %s", self.name, worker._fmt(resources))
        await asyncio.sleep(float(os.environ["REVOKE_S"]))
        await super().on_revoked(resources)


if __name__ == "__main__":
    worker.Worker = SlowHandOver  # type: ignore[misc]  # main() builds a Worker
    sys.exit(asyncio.run(worker.main()))
