"""A 1,000-member group rebalancing: from the last join to every member's sync answer.

Starts ``groupcoord serve`` pinned to one CPU (``--server-cpu``), pins this
process (the load generator) to another (``--client-cpu``), forms one group
of ``--members`` members, then runs ``--rounds`` rebalances: every member
sends its join at once, with changed metadata (so each join takes part in the
rebalance; the join phase completes when all have rejoined), the leader
answers with a trivial round-robin assignment as soon as its join answer
arrives, every follower syncs as soon as its own arrives. A round must end
with every member holding its sync answer with ``error: null`` and the
assignment the leader computed for it, within ``--round-timeout`` seconds;
otherwise the script exits 1 naming the member and the error.

Measured span ("from the last join"): from the moment the last join
request was handed to the kernel (its ``write`` returned) to the moment the
last sync answer was read. Printed with it: the server's CPU time in that
span (``/proc/PID/stat``), the time its event-loop thread ran and waited in a
run queue by the scheduler's count (``/proc/PID/task/PID/schedstat``; the
rest of the span the loop was idle: waiting for the load generator, the disk
or SQLite's thread), and this process's own
CPU time and run-queue wait in that span, so it is visible which side the
wall time belongs to, and how much of it was other tenants of the machine.

Two load generators (``--client``):

- ``raw`` (default): uvloop, one keep-alive ``asyncio.Protocol`` connection
  per member opened before the rounds, requests pre-encoded as bytes (a
  round's 1,000 joins are built before it and written in one loop; the sync
  body is built once per member, only the generation is appended), answers
  parsed minimally (end of head, ``Content-Length``, msgpack body), all driven
  from protocol callbacks (no task per member). Forms the group with the same
  client (first join -> ``MEMBER_ID_REQUIRED`` -> join with the minted id ->
  sync). Its CPU in the span is ~50-70 ms for 1,000 members (~25 us per
  request), a fifth of the server's, so one process is enough: splitting the
  members over several processes on the one free CPU would not shorten it.
- ``aiohttp``: the former load generator (aiohttp's client on asyncio's
  default loop, a coroutine per member, the span starting when the last
  join's headers were written: aiohttp trace), kept to compare with the
  earlier figures; its own CPU (~260 us per request) is most of its span.

    .venv/bin/python benchmarks/server_join.py --members 1000 --rounds 5
    .venv/bin/python benchmarks/server_join.py --members 1000 --rounds 5 --client aiohttp

Target (docs/benchmarks.md): < 500 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import (
    BenchMember,
    Server,
    client_session,
    form_group,
    post,
    sched_seconds,
    start_groupcoord,
)

SESSION_MS = 120_000
GROUP_ID = "bench-join"
RESOURCE_SET = "orders"


class BenchFailure(Exception):
    """A member got an error, a connection broke, or a round ran out of time."""


@dataclass(frozen=True)
class Sample:
    """CPU counters at one instant, seconds."""

    #: user + system time (``/proc/PID/stat``, 10 ms ticks).
    server_cpu: float
    #: the scheduler's own accounting (nanoseconds): ran (all threads: the event
    #: loop and SQLite's); the event loop's thread alone: ran, waited in a run queue.
    server_ran: float
    loop_ran: float
    loop_waited: float
    #: this process (the load generator).
    client_cpu: float
    client_waited: float

    @classmethod
    def take(cls, server: Server) -> Sample:
        ran = server.sched_seconds()[0]
        loop_ran, loop_waited = server.sched_seconds(main_thread_only=True)
        return cls(server.cpu_seconds(), ran, loop_ran, loop_waited, time.process_time(),
                   sched_seconds(os.getpid())[1])

    def __sub__(self, earlier: Sample) -> Sample:
        return Sample(self.server_cpu - earlier.server_cpu,
                      self.server_ran - earlier.server_ran,
                      self.loop_ran - earlier.loop_ran,
                      self.loop_waited - earlier.loop_waited,
                      self.client_cpu - earlier.client_cpu,
                      self.client_waited - earlier.client_waited)


@dataclass
class Round:
    """One rebalance, times in seconds."""

    #: last join sent -> last sync answer read (the issue's figure).
    span: float
    #: first join sent -> last sync answer read.
    from_first: float
    #: CPU counters over ``span``.
    used: Sample
    #: server CPU (``/proc/PID/stat``) from the first join sent to all synced.
    server_cpu_round: float
    #: last join sent -> first and last join answers read (raw client only).
    first_join_answer: float | None = None
    last_join_answer: float | None = None


def pin_self(cpu: int) -> None:
    if cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


# --------------------------------------------------------------------------- raw client

_HEAD = (b"POST /v1/%b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/msgpack\r\n"
         b"Content-Length: %d\r\n\r\n")
_OK = b"HTTP/1.1 200 "
_LENGTH = b"\r\nContent-Length: "
#: a response head longer than this without its blank line is an error.
_MAX_HEAD = 16 * 1024


def _pack(value: object) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def assignment_plan(member_ids: list[str], partitions: int) -> dict[str, bytes]:
    """The leader's trivial plan: partitions dealt round-robin over the sorted members.
    Not an assignor worth measuring: the benchmark is of the server."""
    ids = sorted(member_ids)
    n = len(ids)
    return {m: _pack({"v": 1, "assigned": {RESOURCE_SET: list(range(i, partitions, n))}})
            for i, m in enumerate(ids)}


class RebalanceRun:
    """State shared by the members during one join -> sync cycle."""

    def __init__(self, n: int, server: Server, partitions: int, metadata: bytes,
                 mint_ids: bool) -> None:
        self.n = n
        #: the members' metadata in this cycle (the join body of a minted id needs it).
        self.metadata = metadata
        self.server = server
        self.partitions = partitions
        #: formation only: a first join is answered MEMBER_ID_REQUIRED
        #: (docs/protocol.md, "POST /v1/join").
        self.mint_ids = mint_ids
        self.synced = 0
        #: when the first and the last successful join answers were read.
        self.first_join_ns = 0
        self.last_join_ns = 0
        self.last_sync_ns = 0
        self.end: Sample | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: the leader's plan, kept to check every member's answer after the round.
        self.plan: dict[str, bytes] = {}

    def fail(self, message: str) -> None:
        if not self.done.done():
            self.done.set_exception(BenchFailure(message))

    def member_synced(self) -> None:
        self.synced += 1
        if self.synced == self.n:
            # Sampled here, not after the awaiting task wakes up, so the end of the
            # span is the last answer's arrival.
            self.last_sync_ns = time.monotonic_ns()
            self.end = Sample.take(self.server)
            if not self.done.done():
                self.done.set_result(None)


class RawMember(asyncio.Protocol):
    """One member on its own keep-alive connection, one request in flight at a time."""

    IDLE, JOINING, SYNCING = 0, 1, 2

    def __init__(self, index: int, host_header: bytes) -> None:
        self.index = index
        self.host_header = host_header
        self.transport: asyncio.Transport | None = None
        self.member_id = ""
        self.generation_id = -1
        self.leader = ""
        self.assignment = b""
        self.state = self.IDLE
        self.run: RebalanceRun | None = None
        self.closing = False
        self._buf = b""
        self._need = -1  # body bytes still expected, -1 while reading a head
        #: the sync body up to the generation: ``generation_id`` is its last key,
        #: so a round only appends the packed generation.
        self._sync_prefix = b""

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not a subclass of asyncio.Transport, but is one.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing and self.run is not None:
            self.run.fail(f"member {self.index} ({self.member_id or 'no id yet'}): "
                          f"connection lost ({exc or 'closed by the server'})")
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            if self._need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        self._fatal("response head too long")
                    self._buf = buf
                    return
                if not buf.startswith(_OK):
                    self._fatal(f"HTTP answer {buf[:end]!r}")
                    return
                at = buf.find(_LENGTH, 0, end)
                if at < 0:  # a server may spell the field name in any case
                    at = buf[:end].lower().find(_LENGTH.lower())
                    if at < 0:
                        self._fatal(f"no Content-Length in {buf[:end]!r}")
                        return
                at += len(_LENGTH)
                self._need = int(buf[at:buf.index(b"\r\n", at)])
                buf = buf[end + 4:]
            if len(buf) < self._need:
                self._buf = buf
                return
            body, buf = buf[:self._need], buf[self._need:]
            self._need = -1
            try:
                self._answer(msgpack.unpackb(body))
            except Exception as exc:  # a malformed answer: report it, not just log it
                self._fatal(f"bad answer {body[:200]!r}: {exc!r}")
                return
            if not buf:
                self._buf = b""
                return

    # -- requests

    def send(self, api: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_HEAD % (api, self.host_header, len(body)) + body)

    def join_request(self, metadata: bytes) -> bytes:
        body = _pack({"group_id": GROUP_ID, "member_id": self.member_id,
                      "protocol_type": "resources", "protocols": [["range", metadata]],
                      "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": SESSION_MS,
                      "client_id": "bench"})
        return _HEAD % (b"join", self.host_header, len(body)) + body

    def _set_member_id(self, member_id: str) -> None:
        self.member_id = member_id
        self._sync_prefix = (b"\x84" + _pack("group_id") + _pack(GROUP_ID)
                             + _pack("member_id") + _pack(member_id)
                             + _pack("assignments") + _pack([]) + _pack("generation_id"))

    def _sync_body(self) -> bytes:
        return self._sync_prefix + _pack(self.generation_id)

    # -- answers

    def _fatal(self, what: str) -> None:
        if self.run is not None:
            self.run.fail(f"member {self.index} ({self.member_id or 'no id yet'}): {what}")
        if self.transport is not None:
            self.closing = True
            self.transport.abort()

    def _answer(self, doc: dict[str, Any]) -> None:
        run = self.run
        if run is None:
            self._fatal(f"unexpected answer {doc!r}")
            return
        error = doc.get("error")
        if self.state == self.JOINING:
            if error == "MEMBER_ID_REQUIRED" and run.mint_ids and not self.member_id:
                self._set_member_id(doc["member_id"])
                assert self.transport is not None
                self.transport.write(self.join_request(run.metadata))
                return
            if error is not None:
                self._fatal(f"join answered {error}")
                return
            run.last_join_ns = time.monotonic_ns()
            if not run.first_join_ns:
                run.first_join_ns = run.last_join_ns
            self.generation_id = doc["generation_id"]
            self.leader = doc["leader"]
            self.state = self.SYNCING
            if self.leader == self.member_id:
                # Client-side assignment (KIP-54 style): the leader alone gets the
                # member list and sends everyone's assignment with its sync.
                run.plan = assignment_plan([m["member_id"] for m in doc["members"]],
                                           run.partitions)
                body = _pack({"group_id": GROUP_ID, "member_id": self.member_id,
                              "generation_id": self.generation_id,
                              "assignments": [{"member_id": m, "assignment": a}
                                              for m, a in run.plan.items()]})
                self.send(b"sync", body)
            else:
                self.send(b"sync", self._sync_body())
        elif self.state == self.SYNCING:
            if error is not None:
                self._fatal(f"sync answered {error}")
                return
            self.assignment = doc["assignment"]
            self.state = self.IDLE
            run.member_synced()
        else:
            self._fatal(f"answer with no request in flight: {doc!r}")


def _metadata(round_no: int) -> bytes:
    # Changed every round: a member rejoining with the same metadata would get the
    # current generation back without a rebalance (Kafka's classic coordinator).
    return _pack({"v": 1, "sets": [RESOURCE_SET], "user_data": b"round %d" % round_no})


async def _wait(run: RebalanceRun, members: list[RawMember], timeout_s: float,
                what: str) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(run.done), timeout_s)
    except TimeoutError:
        run.done.cancel()  # answers or losses still to come have no one to report to
        states = [m.state for m in members]
        raise BenchFailure(
            f"{what}: not complete after {timeout_s:g} s: {run.synced} of {run.n} members "
            f"hold their sync answer, {states.count(RawMember.JOINING)} wait for a join "
            f"answer, {states.count(RawMember.SYNCING)} for a sync answer") from None


def _check_plan(run: RebalanceRun, members: list[RawMember], what: str) -> None:
    """Every member holds exactly what the leader assigned it, in one generation."""
    if set(run.plan) != {m.member_id for m in members}:
        raise BenchFailure(f"{what}: the leader's member list is not the {len(members)} "
                           f"members driven here ({len(run.plan)} in it)")
    generations = {m.generation_id for m in members}
    if len(generations) != 1:
        raise BenchFailure(f"{what}: members ended in generations {sorted(generations)}")
    for m in members:
        if m.assignment != run.plan[m.member_id]:
            raise BenchFailure(f"{what}: member {m.index} ({m.member_id}) got assignment "
                               f"{m.assignment!r}, the leader sent "
                               f"{run.plan[m.member_id]!r}")


async def _connect(server: Server, n: int) -> list[RawMember]:
    loop = asyncio.get_running_loop()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    host_header = f"{host}:{port}".encode()
    members = [RawMember(i, host_header) for i in range(n)]
    gate = asyncio.Semaphore(64)  # not 1,000 SYNs at once: no SYN retries to wait for

    async def connect(m: RawMember) -> None:
        async with gate:
            await loop.create_connection(lambda: m, host, int(port))

    await asyncio.gather(*(connect(m) for m in members))
    return members


async def run_raw(server: Server, n: int, rounds: int, partitions: int,
                  timeout_s: float) -> list[Round]:
    members = await _connect(server, n)
    try:
        # Formation (not measured): first join -> MEMBER_ID_REQUIRED -> join with the
        # minted id (parks through the initial rebalance delay) -> sync.
        run = RebalanceRun(n, server, partitions, _metadata(0), mint_ids=True)
        for m in members:
            m.run, m.state = run, RawMember.JOINING
            assert m.transport is not None
            m.transport.write(m.join_request(run.metadata))
        await _wait(run, members, timeout_s, "forming the group")
        _check_plan(run, members, "forming the group")

        out = []
        for round_no in range(1, rounds + 1):
            run = RebalanceRun(n, server, partitions, _metadata(round_no), mint_ids=False)
            requests = [m.join_request(run.metadata) for m in members]
            for m in members:
                m.run, m.state = run, RawMember.JOINING
            cpu0 = server.cpu_seconds()
            first_ns = time.monotonic_ns()
            for m, request in zip(members, requests, strict=True):
                assert m.transport is not None
                m.transport.write(request)
            last_ns = time.monotonic_ns()
            at_last = Sample.take(server)
            await _wait(run, members, timeout_s, f"round {round_no}")
            assert run.end is not None
            _check_plan(run, members, f"round {round_no}")
            out.append(Round(span=(run.last_sync_ns - last_ns) / 1e9,
                             from_first=(run.last_sync_ns - first_ns) / 1e9,
                             used=run.end - at_last,
                             server_cpu_round=run.end.server_cpu - cpu0,
                             first_join_answer=(run.first_join_ns - last_ns) / 1e9,
                             last_join_answer=(run.last_join_ns - last_ns) / 1e9))
        return out
    finally:
        for m in members:
            m.closing = True
            if m.transport is not None:
                m.transport.close()


# ------------------------------------------------------------------ former aiohttp client


async def run_aiohttp(server: Server, n: int, rounds: int, timeout_s: float) -> list[Round]:
    async with client_session() as http:
        members = await form_group(http, server.url, GROUP_ID, n, SESSION_MS)
    out = []
    for round_no in range(1, rounds + 1):
        try:
            out.append(await asyncio.wait_for(_aiohttp_round(server, members), timeout_s))
        except TimeoutError:
            raise BenchFailure(f"round {round_no}: not complete after {timeout_s:g} s") \
                from None
    return out


async def _aiohttp_round(server: Server, members: list[BenchMember]) -> Round:
    url = server.url
    trace = aiohttp.TraceConfig()
    #: (time, CPU counters) as each join's headers were written.
    sent: list[tuple[int, Sample]] = []

    async def on_headers(_s: Any, _ctx: SimpleNamespace, params: Any) -> None:
        if params.url.path.endswith("/join"):
            sent.append((time.monotonic_ns(), Sample.take(server)))

    trace.on_request_headers_sent.append(on_headers)
    synced: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace],
                                     timeout=aiohttp.ClientTimeout(total=120)) as http:
        # Open the connections first so connection set-up is not measured.
        await asyncio.gather(*(post(http, url, "heartbeat", m.heartbeat_body())
                               for m in members))
        sent.clear()
        cpu0 = server.cpu_seconds()

        async def rebalance(m: BenchMember) -> None:
            m.epoch += 1  # new metadata: every join takes part in the rebalance
            answer = await post(http, url, "join", m.join_body(SESSION_MS))
            if answer["error"] is not None:
                raise BenchFailure(f"member {m.member_id}: join answered {answer['error']}")
            m.generation_id = answer["generation_id"]
            m.leader = answer["leader"]
            m.peers = [p["member_id"] for p in answer["members"]]
            answer = await post(http, url, "sync", m.sync_body())
            if answer["error"] is not None:
                raise BenchFailure(f"member {m.member_id}: sync answered {answer['error']}")
            synced.append(time.monotonic_ns())

        await asyncio.gather(*(rebalance(m) for m in members))
        end = Sample.take(server)
    last_join, at_last_join = max(sent, key=lambda s: s[0])
    return Round(span=(max(synced) - last_join) / 1e9,
                 from_first=(max(synced) - min(s[0] for s in sent)) / 1e9,
                 used=end - at_last_join, server_cpu_round=end.server_cpu - cpu0)


# --------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                        help="load generator (default raw: uvloop protocol connections)")
    parser.add_argument("--partitions", type=int, default=None,
                        help=f"partitions of the '{RESOURCE_SET}' set the leader deals out "
                             "round-robin (raw client; default: one per member)")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1,
                        help="CPU this process is pinned to (-1: not pinned)")
    parser.add_argument("--round-timeout", type=float, default=60.0,
                        help="seconds a round (and the group's formation) may take")
    args = parser.parse_args()
    if args.members < 1 or args.rounds < 1:
        parser.error("--members and --rounds must be at least 1")
    pin_self(args.client_cpu)
    server, db_dir = start_groupcoord(args.server_cpu, initial_rebalance_delay_ms=2000,
                                      min_session_timeout_ms=1000)
    load_start = os.getloadavg()
    try:
        if args.client == "raw":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                results = runner.run(run_raw(server, args.members, args.rounds,
                                             args.partitions or args.members,
                                             args.round_timeout))
        else:
            results = asyncio.run(run_aiohttp(server, args.members, args.rounds,
                                              args.round_timeout))
    except (BenchFailure, RuntimeError, OSError, aiohttp.ClientError) as exc:
        print(f"server_join: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        status = server.stop()
        db_dir.cleanup()
    load_end = os.getloadavg()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {args.members} members, client "
          f"{args.client}; server on CPU {args.server_cpu}, client on CPU {args.client_cpu}; "
          f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    if status != 0:
        print(f"server_join: FAILED: the server exited with status {status}", file=sys.stderr)
        return 1
    for i, r in enumerate(results, 1):
        u = r.used
        joins = ""
        if r.first_join_answer is not None and r.last_join_answer is not None:
            joins = (f"; join answers read +{r.first_join_answer * 1000:.0f} to "
                     f"+{r.last_join_answer * 1000:.0f} ms")
        print(f"round {i}: last join -> all synced {r.span * 1000:6.1f} ms   in that span: "
              f"server CPU {u.server_cpu * 1000:.0f} ms (scheduler: ran "
              f"{u.server_ran * 1000:.0f} ms; its event loop ran {u.loop_ran * 1000:.0f} ms, "
              f"waited for a CPU {u.loop_waited * 1000:.0f} ms, idle "
              f"{(r.span - u.loop_ran - u.loop_waited) * 1000:.0f} ms), "
              f"client CPU {u.client_cpu * 1000:.0f} ms (waited {u.client_waited * 1000:.0f} ms)"
              f"{joins}; first join -> all synced {r.from_first * 1000:.1f} ms")
    med = statistics.median
    print(f"last join -> all synced: median {med(r.span for r in results) * 1000:.1f} ms, "
          f"max {max(r.span for r in results) * 1000:.1f} ms; medians in that span: server "
          f"CPU {med(r.used.server_cpu for r in results) * 1000:.0f} ms, its event loop "
          f"waited for a CPU {med(r.used.loop_waited for r in results) * 1000:.0f} ms; client CPU "
          f"{med(r.used.client_cpu for r in results) * 1000:.0f} ms, waited "
          f"{med(r.used.client_waited for r in results) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
