"""A worker that processes its share of a resource set and commits checkpoints.

Start a coordinator and a catalog, then as many workers as you like::

    groupcoord serve --db /tmp/g.db --initial-rebalance-delay-ms 0 &
    curl -X PUT localhost:9081/v1/resources/shards -d '{"partitions": 12}' \\
         -H 'Content-Type: application/json'
    python examples/worker.py --name w1 &
    python examples/worker.py --name w2 &

Each worker runs one task per owned resource. The task resumes from the
resource's checkpoint (``fetch``), "processes" one item per tick and commits
its position every second. The listener is where ownership changes hands:

- ``on_assigned``: start a task per new resource (cooperative: only the new
  ones arrive here; what the worker keeps keeps running);
- ``on_revoked``: stop those tasks and commit their final position -- the
  resource is still ours while this runs (the member keeps heartbeating
  meanwhile), and the next owner starts only after it returned;
- ``on_lost``: stop at once, commit nothing (someone else may own it now).

SIGTERM (a deploy, Kubernetes stopping the pod) drains first: the member
keeps serving what it owns while the others take it over, one resource after
another (``member.drain()``; with the ``balanced`` assignor and ``warmup``,
each new owner warms it up first), then leaves; after ``--drain-timeout-s``
it gives up the rest as Ctrl-C does. Ctrl-C stops the worker at once, also
before its first assignment (while it cannot reach the coordinator, say):
the member is closed -- everything is revoked (final commits) and the
worker leaves the group, so the others take over at once. Either way the
process exits with status 0. A fatal member error (e.g. FENCED_INSTANCE_ID) exits with status 1.
While the coordinator cannot be reached the member retries with backoff
(at most a second apart) and logs it with lines that back off too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from client import GroupCoordError, GroupMember, RebalanceListener, Resource
from client.member_state import MemberState

log = logging.getLogger("worker")


class Worker(RebalanceListener):
    def __init__(self, name: str) -> None:
        self.name = name
        self.member: GroupMember | None = None
        self.tasks: dict[Resource, asyncio.Task[None]] = {}
        self.position: dict[Resource, int] = {}

    # ------------------------------------------------------------ the listener

    async def on_assigned(self, resources: set[Resource]) -> None:
        assert self.member is not None
        if resources:
            saved = await self.member.fetch(resources)
            for r in sorted(resources):
                value = saved.get(r)
                self.position[r] = value if isinstance(value, int) else 0
                self.tasks[r] = asyncio.create_task(self.process(r))
        log.info("%s owns %s", self.name, _fmt(self.member.assignment))

    async def on_revoked(self, resources: set[Resource]) -> None:
        await self.stop(resources)
        assert self.member is not None
        try:
            await self.member.commit({r: self.position[r] for r in resources
                                      if r in self.position})
        except GroupCoordError:
            # Not stored: the member logged why at WARNING, naming the
            # resources; the next owner resumes from the last stored checkpoint.
            log.info("%s handed over %s without its final checkpoint", self.name,
                     _fmt(resources))
        else:
            log.info("%s handed over %s", self.name, _fmt(resources))
        for r in resources:
            self.position.pop(r, None)

    async def on_lost(self, resources: set[Resource]) -> None:
        await self.stop(resources)
        for r in resources:
            self.position.pop(r, None)
        log.warning("%s lost %s (no commit: they may be someone else's now)", self.name,
                    _fmt(resources))

    # ------------------------------------------------------------ the work

    async def process(self, resource: Resource) -> None:
        assert self.member is not None
        ticks = 0
        while True:
            await asyncio.sleep(0.1)  # one item of real work would go here
            self.position[resource] += 1
            ticks += 1
            if ticks % 10 == 0:
                # A refused commit means a rebalance is under way (the listener
                # decides what happens next); an unreachable coordinator is
                # retried by the next commit.
                with contextlib.suppress(GroupCoordError):
                    await self.member.commit({resource: self.position[resource]})

    async def stop(self, resources: set[Resource]) -> None:
        tasks = [self.tasks.pop(r) for r in resources if r in self.tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _fmt(resources: set[Resource] | frozenset[Resource]) -> str:
    return ", ".join(f"{s}[{i}]" for s, i in sorted(resources)) or "nothing"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:9080")
    parser.add_argument("--group", default="indexers")
    parser.add_argument("--set", dest="sets", action="append", default=None,
                        help="resource set to subscribe to (repeatable; default: shards)")
    parser.add_argument("--name", default=None, help="client id shown by the admin API")
    parser.add_argument("--instance-id", default=None,
                        help="static membership: a restart within the session timeout "
                             "gets the same resources back without a rebalance")
    parser.add_argument("--assignor", default="cooperative-sticky")
    parser.add_argument("--drain-timeout-s", type=float, default=60.0,
                        help="on SIGTERM, how long to hand resources over before giving up "
                             "the rest (keep it under Kubernetes' grace period)")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000,
                        help="the heartbeat interval is derived from it (docs/client.md, "
                             "timing rule)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    name = args.name or "worker"
    worker = Worker(name)
    member = GroupMember(args.url, group_id=args.group, sets=args.sets or ["shards"],
                         assignors=[args.assignor], listener=worker, client_id=args.name,
                         group_instance_id=args.instance_id,
                         session_timeout_ms=args.session_timeout_ms)
    worker.member = member
    # The handlers are in place before the member starts: a signal stops the
    # worker at any time, also before its first assignment (a wrong URL).
    stop = asyncio.Event()
    signals: list[signal.Signals] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_signal, stop, signals, sig)
    member.start()  # joins in the background; the listener starts the work
    stopping = asyncio.ensure_future(stop.wait())
    closed = asyncio.ensure_future(member.wait_closed())
    try:
        await asyncio.wait({stopping, closed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if closed.done() and not closed.cancelled():
            closed.exception()  # the failure is reported below
        closed.cancel()
        if signals[:1] == [signal.SIGTERM] and member.state in (
                MemberState.JOINING, MemberState.SYNCING, MemberState.STABLE):
            # A planned stop: hand over first (a second signal stops at once).
            drain = asyncio.ensure_future(member.drain(timeout_s=args.drain_timeout_s))
            stop.clear()
            again = asyncio.ensure_future(stop.wait())
            await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
            again.cancel()
            drain.cancel()  # done already, or stopped by the second signal
            if drain.done() and not drain.cancelled() and drain.exception() is None:
                log.info("%s drained: %s", name, "handed everything over" if drain.result()
                         else "timed out, gave up the rest")
        # Revokes everything (final commits) and leaves the group; before the
        # first assignment it only stops the join and its retries.
        await member.close()
    if member.failure is not None:
        log.error("%s stopped: %s", name, member.failure)
        return 1
    log.info("%s stopped", name)
    return 0


def _on_signal(stop: asyncio.Event, signals: list[signal.Signals],
               sig: signal.Signals) -> None:
    log.info("%s: stopping%s", sig.name, " (draining first)"
             if not signals and sig is signal.SIGTERM else "")
    signals.append(sig)
    stop.set()


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:  # before the handlers were in place: nothing started yet
        sys.exit(130)
