"""Pause Python's cyclic garbage collector during a large assignment.

An assignment of a million resources allocates a million small lists, and
every few thousand allocations the collector runs; its older generations
re-traverse the whole heap (the caller's subscriptions included), which
doubled the run time of the 1,000,000-resource benchmark. The assignors
create no reference cycles, so nothing is lost by collecting afterwards.
The previous state is restored; small inputs are left alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LARGE", "paused_gc"]

LARGE = 50_000  # resources; below this the collector costs little


@contextmanager
def paused_gc(size: int) -> Iterator[None]:
    if size < LARGE or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
