"""One chaos worker process: a GroupMember that logs everything it does.

``python tests/chaos/worker.py --url URL[,URL...] --group G --assignor A --sets a,b
--ledger FILE --worker W --incarnation N [timeouts] [--capacity C]
[--load-rejoin-interval-ms MS]``

One URL: the coordinator (or the fault proxy in front of it), as before
v1.1. Several (the multi-coordinator mode): the bootstrap URLs of
coordinators sharing the groups; the member finds its group's coordinator
and follows it (client.transport.CoordinatorRouter, built here as
GroupMember builds it for a list of URLs, over one logging transport per
coordinator so each answer is logged with the coordinator that gave it).

It joins the group through the client library, and while it owns resources
it "processes" them: every ``--commit-interval-ms`` it commits a checkpoint
for each owned resource whose value is the monotonic clock in nanoseconds (so
a later owner's values are always larger: ledger.py, invariant 3). Its
rebalance listener commits the final checkpoints in ``on_revoked``, as a real
worker would. Every callback, commit and safety-deadline change is appended
to the ledger (JSON lines, flushed per line: a SIGKILL loses nothing written).
SIGTERM closes the member cleanly (revoke, leave) and exits 0. SIGUSR1
drains it (``member.drain(timeout_s=--drain-timeout-s)``, as
examples/worker.py does on SIGTERM): ``drain`` is logged when it starts and
``drained`` (``ok``: what ``drain()`` returned; ``owned``: what the member
still owned) when it ends, then it exits 0. A drain the coordinator asks for
(the admin route's ``drain: true`` heartbeat answers) is logged the same
way, its ``drain`` when the member says it drains, its ``drained`` once the
member has stopped on its own. The member id is logged (``member``) whenever
it changes, so the harness can name the member to the admin route.

With ``--warmup-timeout-ms`` the ``balanced`` assignor warms up
(``warmup=True``) and the worker's ``on_standby`` takes a time drawn from
``--warmup-s LO,HI``: ``standby`` is logged when it starts, ``warm`` when it
returns (``standby_cancelled`` if it was cancelled), ``standby_dropped`` from
``on_standby_dropped``. A standby is never committed: the worker commits
only ``member.assignment``.

For a load-balancing assignor (``balanced``) it may say its ``--capacity``,
and with ``--load-rejoin-interval-ms`` it measures a load (its
``load_callback``: :func:`measured_load` of each owned resource, every
heartbeat interval) and rejoins when that leaves its band, at most once per
that interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    GroupCoordError,
    MemberClosedError,
    NotOwnedError,
)
from client.listener import RebalanceListener, Resource
from client.member import GroupMember
from client.member_state import MemberConfig
from client.transport import AiohttpTransport, CoordinatorRouter, Transport


def resource_weight(name: str, index: int) -> float:
    """The catalog weight the harness gives resource ``index`` of a set (1 to 4)."""
    return 1.0 + (index * 7 + len(name)) % 4


def measured_load(resource: Resource) -> float:
    """What a worker measures on a resource: half as much again as its
    catalog weight, so the first report leaves every band the catalog's
    weights gave and the group rebalances by measured loads."""
    return 1.5 * resource_weight(*resource)


class Ledger:
    def __init__(self, path: Path, worker: str, incarnation: int) -> None:
        self._f: TextIO = path.open("a", encoding="utf-8")
        self._base = {"w": worker, "inc": incarnation, "pid": os.getpid()}

    def write(self, ev: str, **fields: Any) -> None:
        doc = {"t": time.monotonic(), "ev": ev, **self._base, **fields}
        self._f.write(json.dumps(doc) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _res(resources: set[Resource] | frozenset[Resource]) -> list[list[Any]]:
    return [[s, i] for s, i in sorted(resources)]


class Worker(RebalanceListener):
    def __init__(self, ledger: Ledger, warmup_s: tuple[float, float] = (0.0, 0.0),
                 rng: random.Random | None = None) -> None:
        self.ledger = ledger
        self.member: GroupMember | None = None
        self.warmup_s = warmup_s
        self.rng = rng or random.Random()

    def _ids(self) -> dict[str, Any]:
        assert self.member is not None
        return {"member": self.member.member_id, "gen": self.member.generation_id}

    async def on_assigned(self, resources: set[Resource]) -> None:
        self.ledger.write("assigned", res=_res(resources), **self._ids())

    async def on_revoked(self, resources: set[Resource]) -> None:
        # The hand-over: the final checkpoints, then the resources are given up.
        if resources:
            await self.commit(frozenset(resources))
        self.ledger.write("revoked", res=_res(resources), **self._ids())

    async def on_lost(self, resources: set[Resource]) -> None:
        self.ledger.write("lost", res=_res(resources), **self._ids())

    async def on_standby(self, resources: set[Resource]) -> None:
        # The warm-up: a drawn time, never a commit (a standby is not owned).
        took = self.rng.uniform(*self.warmup_s)
        self.ledger.write("standby", res=_res(resources), took=took, **self._ids())
        try:
            await asyncio.sleep(took)
        except asyncio.CancelledError:
            self.ledger.write("standby_cancelled", res=_res(resources), **self._ids())
            raise
        self.ledger.write("warm", res=_res(resources), **self._ids())

    async def on_standby_dropped(self, resources: set[Resource]) -> None:
        self.ledger.write("standby_dropped", res=_res(resources), **self._ids())

    async def commit(self, resources: frozenset[Resource]) -> None:
        assert self.member is not None
        if not resources:
            return
        ids = self._ids()
        value = time.monotonic_ns()
        sent = time.monotonic()
        # Written before sending: if the process dies with the commit in flight,
        # the checker still knows the value may have been stored.
        self.ledger.write("send", sent=sent, res=_res(resources), value=value, **ids)
        outcome: str = "unknown"
        error: str | None = "cancelled"
        try:
            await self.member.commit({r: value for r in resources})
            outcome, error = "ok", None
        except (NotOwnedError, MemberClosedError) as exc:
            outcome, error = "local", type(exc).__name__
        except CommitFailedError as exc:
            outcome, error = "refused", exc.code.value
        except CoordinatorUnavailableError as exc:
            outcome, error = "unknown", str(exc)[:200]
        except GroupCoordError as exc:
            outcome, error = "local", type(exc).__name__
        finally:
            self.ledger.write("commit", sent=sent, res=_res(resources), value=value,
                              outcome=outcome, error=error, **ids)


class LoggingTransport:
    """The library's own transport, logging each rebalance/heartbeat call's outcome.

    Only for diagnosis: the invariants are checked on the callbacks, commits
    and deadlines; this says what the coordinator answered, and when it was asked.
    """

    def __init__(self, inner: AiohttpTransport, ledger: Ledger, url: str | None = None) -> None:
        self.inner = inner
        self.ledger = ledger
        #: the one coordinator this transport talks to (multi mode), logged with
        #: every answer; its commits are logged too (which coordinator
        #: acknowledged a commit: the paused-coordinator check).
        self.url = url
        self.apis = ("join", "sync", "heartbeat", "leave") + (("commit",) if url else ())

    def _log(self, api: str, request: Any, sent: float, error: str | None, gen: Any) -> None:
        where = {"url": self.url} if self.url else {}
        self.ledger.write("call", api=api, sent=sent, error=error, gen=gen, **where)

    async def call(self, api: str, request: Any) -> Any:
        sent = time.monotonic()
        try:
            response = await self.inner.call(api, request)
        except BaseException as exc:
            if api in self.apis:
                self._log(api, request, sent, type(exc).__name__,
                          getattr(request, "generation_id", None))
            raise
        if api in self.apis:
            error = getattr(response, "error", None)
            self._log(api, request, sent, None if error is None else str(error),
                      getattr(request, "generation_id",
                              getattr(response, "generation_id", None)))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _safety_deadline(member: GroupMember) -> int | None:
    public = getattr(member, "safety_deadline_ms", None)
    if callable(public):
        value: int | None = public()
        return value
    # Until the library exposes it: the state machine's own rule.
    machine: Any = member._machine
    deadline: int | None = machine.safety_deadline_ms()
    return deadline


async def run(args: argparse.Namespace) -> int:
    ledger = Ledger(Path(args.ledger), args.worker, args.incarnation)
    lo, hi = (float(x) for x in args.warmup_s.split(","))
    worker = Worker(ledger, (lo, hi), random.Random(f"{args.worker}-{args.incarnation}"))
    urls = [u for u in args.url.split(",") if u]
    transport: Transport
    # One HTTP session for every coordinator (as GroupMember does for a list).
    http = AiohttpTransport(urls[0])
    if len(urls) == 1:
        transport = LoggingTransport(http, ledger)
    else:
        # find_coordinator awaited for the timing rule's reply_ms, as GroupMember does.
        reply_ms = MemberConfig(
            group_id=args.group, sets=args.sets.split(","),
            session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=args.heartbeat_interval_ms,
            request_timeout_ms=args.request_timeout_ms).timing.reply_ms
        transport = CoordinatorRouter(
            urls, args.group, lambda url: LoggingTransport(http.at(url), ledger, url),
            find_timeout_ms=reply_ms, name=f"{args.worker}-{args.incarnation}")
    member = GroupMember(
        transport, args.group, args.sets.split(","), assignors=[args.assignor],
        listener=worker, session_timeout_ms=args.session_timeout_ms,
        rebalance_timeout_ms=args.rebalance_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        client_id=f"{args.worker}-{args.incarnation}",
        request_timeout_ms=args.request_timeout_ms,
        capacity=args.capacity,
        load_callback=(None if args.load_rejoin_interval_ms is None else
                       lambda owned: {r: measured_load(r) for r in owned}),
        load_rejoin_interval_ms=args.load_rejoin_interval_ms or 30_000,
        assignor_settings=(None if args.warmup_timeout_ms is None else {"balanced": {
            "warmup": True, "warmup_timeout_ms": args.warmup_timeout_ms}}),
    )
    worker.member = member
    stop = asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, drain.set)
    ledger.write("start", group=args.group, session_timeout_ms=args.session_timeout_ms)
    member.start()

    async def watch_deadline() -> None:
        last: object = object()
        member_id = ""
        draining = False
        while True:
            deadline = _safety_deadline(member)
            if deadline != last:
                ledger.write("deadline", until=None if deadline is None else deadline / 1000)
                last = deadline
            if member.member_id != member_id:
                member_id = member.member_id
                ledger.write("member", member=member_id)
            if member.draining and not draining:
                draining = True
                ledger.write("drain", via="signal" if drain.is_set() else "coordinator",
                             **worker._ids())
            await asyncio.sleep(0.005)

    async def work() -> None:
        while True:
            await asyncio.sleep(args.commit_interval_ms / 1000)
            await worker.commit(member.assignment)

    tasks = [asyncio.create_task(watch_deadline()), asyncio.create_task(work())]
    stopped = asyncio.create_task(stop.wait())
    drained = asyncio.create_task(drain.wait())
    closed = asyncio.create_task(member.wait_closed())
    await asyncio.wait({stopped, drained, closed}, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if drained.done() and not closed.done() and not stopped.done():
        # A drain of our own (SIGUSR1); a SIGTERM meanwhile waits for its end.
        ok: bool | None = None
        try:
            ok = await member.drain(timeout_s=args.drain_timeout_s)
        except GroupCoordError as exc:
            ledger.write("drain_failed", error=repr(exc))
        if ok is not None:
            ledger.write("drained", ok=ok, owned=_res(member.assignment), **worker._ids())
        await member.close()
    elif closed.done() and member.failure is None and member.draining:
        # The coordinator asked for the drain: the member handed over, left, stopped.
        ledger.write("drained", ok=True, owned=_res(member.assignment), **worker._ids())
    elif closed.done():
        exc = closed.exception() or member.failure
        ledger.write("fatal", error=repr(exc))
        status = 3
    else:
        tasks[1].cancel()  # no commits of our own while closing: on_revoked commits
        await member.close()
    for task in (*tasks, stopped, drained, closed):
        task.cancel()
    await asyncio.gather(*tasks, stopped, drained, closed, return_exceptions=True)
    await http.aclose()  # the member does not close a transport it was given
    ledger.write("exit", status=status)
    ledger.close()
    return status


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--assignor", default="cooperative-sticky")
    p.add_argument("--sets", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--session-timeout-ms", type=int, default=1500)
    p.add_argument("--rebalance-timeout-ms", type=int, default=3000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=400)
    p.add_argument("--request-timeout-ms", type=int, default=5000)
    p.add_argument("--commit-interval-ms", type=int, default=150)
    p.add_argument("--capacity", type=float, default=None)
    p.add_argument("--load-rejoin-interval-ms", type=int, default=None,
                   help="measure a load each heartbeat interval (measured_load)")
    p.add_argument("--drain-timeout-s", type=float, default=8.0,
                   help="SIGUSR1's drain: give the rest up after this long")
    p.add_argument("--warmup-timeout-ms", type=int, default=None,
                   help="the balanced assignor warms up, moving cold after this long")
    p.add_argument("--warmup-s", default="0.2,1.5",
                   help="LO,HI: on_standby takes a time drawn from [LO, HI] seconds")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {args.worker}-{args.incarnation} %(levelname)s "
                               "%(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
