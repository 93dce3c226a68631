"""A group member as its own process, for the integration tests and the
benchmark: ``python member_proc.py URL NAME LEDGER [options]``.

Every listener callback is appended to LEDGER as one JSON line
``{"t": time.time(), "member": NAME, "kind": ..., "resources": [[set, i], ...]}``
and flushed before the callback returns, so the file is the ledger of what
this process believed it owned and when. SIGTERM closes the member cleanly
(revoke, leave unless static); SIGKILL is a crash. ``--blocking`` uses
``BlockingGroupMember`` instead of the asyncio member.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any, TextIO

from client import BlockingGroupMember, GroupMember, RebalanceListener, Resource


class FileLedger(RebalanceListener):
    def __init__(self, out: TextIO, name: str, warmup_s: float = 0.0) -> None:
        self.out = out
        self.name = name
        self.warmup_s = warmup_s
        self.lock = threading.Lock()

    def _write(self, kind: str, resources: set[Resource]) -> None:
        line = json.dumps({"t": time.time(), "member": self.name, "kind": kind,
                           "resources": sorted([s, i] for s, i in resources)})
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    async def on_assigned(self, resources: set[Resource]) -> None:
        # A worker that loads some state per resource before it processes it.
        if self.warmup_s and resources:
            await asyncio.sleep(self.warmup_s * len(resources))
        self._write("assigned", resources)

    async def on_revoked(self, resources: set[Resource]) -> None:
        self._write("revoked", resources)

    async def on_lost(self, resources: set[Resource]) -> None:
        self._write("lost", resources)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(group_id=args.group, sets=args.sets, assignors=args.assignor,
                client_id=args.name, group_instance_id=args.instance_id,
                session_timeout_ms=args.session_ms, heartbeat_interval_ms=args.heartbeat_ms,
                rebalance_timeout_ms=args.rebalance_ms, retry_backoff_ms=50,
                retry_backoff_max_ms=500)


async def run_async(args: argparse.Namespace, ledger: FileLedger) -> int:
    member = GroupMember(args.url, listener=ledger, **_settings(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    member.start()
    stopper = asyncio.ensure_future(stop.wait())
    closed = asyncio.ensure_future(member.wait_closed())
    await asyncio.wait({stopper, closed}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    await member.close()
    if member.failure is not None:
        print(f"{args.name}: failed: {member.failure}", file=sys.stderr)
        return 1
    return 0


def run_blocking(args: argparse.Namespace, ledger: FileLedger) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    member = BlockingGroupMember(args.url, listener=ledger, **_settings(args))
    member.start(wait_assigned=False)
    while not stop.wait(0.1):
        if member.failure is not None:
            break
    member.close()
    return 1 if member.failure is not None else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("ledger")
    parser.add_argument("--group", default="g")
    parser.add_argument("--sets", nargs="+", default=["s"])
    parser.add_argument("--assignor", nargs="+", default=["cooperative-sticky"])
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--session-ms", type=int, default=1_500)
    parser.add_argument("--heartbeat-ms", type=int, default=300)
    parser.add_argument("--rebalance-ms", type=int, default=10_000)
    parser.add_argument("--warmup-ms", type=float, default=0.0,
                        help="per-resource work in on_assigned before processing starts")
    parser.add_argument("--blocking", action="store_true")
    args = parser.parse_args(argv)
    with open(args.ledger, "a", encoding="utf-8") as out:
        ledger = FileLedger(out, args.name, args.warmup_ms / 1000)
        if args.blocking:
            return run_blocking(args, ledger)
        return asyncio.run(run_async(args, ledger))


if __name__ == "__main__":
    sys.exit(main())
