"""CPU work too long for the event loop, run on one worker thread.

The event loop answers every group's calls; whatever it runs in one go delays
all of them. A 1 MiB commit of 50,000 checkpoints costs the loop about 200 ms
of CPU if decoded, validated and encoded into SQL rows there, and another
group's heartbeat waited that long (several times that on a busy machine).
The parts that need no coordinator state (decoding and validating a large
body, turning a large batch of records into rows) run here instead.

Python threads share one interpreter lock, so the worker's work does not run
beside the loop's: they take turns, and the loop gets the lock back within
``sys.getswitchinterval()`` (5 ms) whenever it has something to do. So the
loop is held for milliseconds at a time instead of for the whole job. There is
one worker: two large jobs take turns with each other too, so the loop always
competes with at most one of them for the lock.

Callers run small jobs inline: handing work to a thread and back costs about
50-100 us, more than a heartbeat's whole work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")

log = logging.getLogger(__name__)

#: a request body at least this long is decoded and validated on the worker
#: (about 3,000 checkpoints, some 5 ms of the loop's CPU).
LARGE_BODY_BYTES = 64 * 1024
#: a batch of records making at least this many rows is encoded on the worker.
LARGE_BATCH_ROWS = 2_000

_worker: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _worker
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="groupcoord-offload")
    return _worker


async def run(fn: Callable[[], _T]) -> _T:
    """``fn()`` on the worker thread; its exception is raised here."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), fn)


def submit(fn: Callable[[], object]) -> None:
    """``fn()`` on the worker thread, not waited for (it must be safe to run
    there: e.g. counting into thread-safe metrics); what it raises is logged."""
    _executor().submit(fn).add_done_callback(_log_failure)


def _log_failure(done: Future[object]) -> None:
    exc = done.exception()
    if exc is not None:
        log.error("background job failed", exc_info=exc)
