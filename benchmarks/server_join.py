"""A 1,000-member group rebalancing: from the last join to every member's sync answer.

Forms one group of ``--members`` members (server pinned to one CPU), then runs
``--rounds`` rebalances: every member sends its join at once, with changed
metadata (so each join takes part in the rebalance; the join phase completes
when all have rejoined), the leader answers with a trivial assignment as soon as its join
answer arrives, every follower syncs as soon as its own arrives. Measured from
the moment the last join request's headers were written on its socket (aiohttp
trace) to the moment the last member holds its sync answer. The load is
generated from this process (Python client), so the figure includes
client-side overhead; the server's CPU time in the same span (from /proc,
sampled as the last join is written) shows what the server itself spent.

    .venv/bin/python benchmarks/server_join.py --members 1000 --rounds 5

Target (issue 2): < 500 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server_common import (
    BenchMember,
    Server,
    client_session,
    form_group,
    post,
    start_groupcoord,
)

SESSION_MS = 120_000


#: last join -> all synced, first join -> all synced, server CPU in the round,
#: server CPU from the last join to all synced, this (client) process's CPU in that span.
Round = tuple[float, float, float, float, float]


async def run(server: Server, n: int, rounds: int) -> list[Round]:
    """Per round: last join -> all synced, first join -> all synced, server CPU seconds
    in the round, server CPU seconds from the last join to all synced."""
    async with client_session() as http:
        members = await form_group(http, server.url, "bench-join", n, SESSION_MS)
    out = []
    for _ in range(rounds):
        cpu = server.cpu_seconds()
        after_last, after_first, cpu_after_last, client_cpu = await one_round(server, members)
        out.append((after_last, after_first, server.cpu_seconds() - cpu, cpu_after_last,
                    client_cpu))
    return out


async def one_round(server: Server, members: list[BenchMember]
                    ) -> tuple[float, float, float, float]:
    url = server.url
    trace = aiohttp.TraceConfig()
    #: (time, server CPU seconds, client CPU seconds) as each join's headers were written.
    sent: list[tuple[float, float, float]] = []

    async def on_headers(_s: Any, _ctx: SimpleNamespace, params: Any) -> None:
        if params.url.path.endswith("/join"):
            sent.append((time.perf_counter(), server.cpu_seconds(), time.process_time()))

    trace.on_request_headers_sent.append(on_headers)
    sent.clear()
    synced: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace],
                                     timeout=aiohttp.ClientTimeout(total=120)) as http:
        # Open the connections first so connection set-up is not measured.
        await asyncio.gather(*(post(http, url, "heartbeat", m.heartbeat_body())
                               for m in members))
        sent.clear()

        async def rebalance(m: BenchMember) -> None:
            m.epoch += 1  # new metadata: every join takes part in the rebalance
            answer = await post(http, url, "join", m.join_body(SESSION_MS))
            assert answer["error"] is None, answer
            m.generation_id = answer["generation_id"]
            m.leader = answer["leader"]
            m.peers = [p["member_id"] for p in answer["members"]]
            answer = await post(http, url, "sync", m.sync_body())
            assert answer["error"] is None, answer
            synced.append(time.perf_counter())

        await asyncio.gather(*(rebalance(m) for m in members))
        cpu_end = server.cpu_seconds()
        client_end = time.process_time()
    last_join, cpu_at_last_join, client_at_last_join = max(sent)
    first_join = min(sent)[0]
    return (max(synced) - last_join, max(synced) - first_join, cpu_end - cpu_at_last_join,
            client_end - client_at_last_join)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server-cpu", type=int, default=0)
    args = parser.parse_args()
    server, db_dir = start_groupcoord(args.server_cpu, initial_rebalance_delay_ms=2000,
                                      min_session_timeout_ms=1000)
    try:
        results = asyncio.run(run(server, args.members, args.rounds))
    finally:
        server.stop()
        db_dir.cleanup()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {args.members} members, "
          f"server on CPU {args.server_cpu}; load average {os.getloadavg()[0]:.1f}")
    for i, (after_last, after_first, cpu, cpu_after_last, client) in enumerate(results, 1):
        print(f"round {i}: last join -> all synced {after_last * 1000:7.1f} ms   "
              f"(server CPU in that span {cpu_after_last * 1000:.0f} ms, client CPU "
              f"{client * 1000:.0f} ms; "
              f"first join -> all synced {after_first * 1000:7.1f} ms; "
              f"server CPU {cpu * 1000:.0f} ms for the whole round)")
    lasts = [r[0] * 1000 for r in results]
    print(f"last join -> all synced: median {statistics.median(lasts):.1f} ms, "
          f"max {max(lasts):.1f} ms; server CPU in that span: median "
          f"{statistics.median(r[3] * 1000 for r in results):.0f} ms, client CPU "
          f"{statistics.median(r[4] * 1000 for r in results):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
