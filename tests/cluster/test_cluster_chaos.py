"""Three ``groupcoord serve`` processes on a real PostgreSQL, members in worker
processes, under the coordinator faults of docs/reliability.md's list, each a
scripted schedule of the chaos harness (tests/chaos/harness.py, several
coordinators) with its ledger checks: never two owners of a resource, the group
converges, no acknowledged checkpoint lost, no zombie commit acknowledged.

For the coordinator faults (kill -9, SIGSTOP past the lease, rolling SIGTERM)
the group must also not rebalance: a takeover resumes it at its generation
(docs/protocol.md, "Several coordinators sharing groups"), so its generation is the
same after the fault
as before, no rebalance journal row was written in between, and no member
called ``on_lost``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))

from harness import ChaosConfig, Fault, SeedResult, run_seed, summary_line
from pg_harness import PostgresServer

#: one busy group of three members (commits every 150 ms), faults aimed at the
#: coordinator owning its partition; a short watch after the faults (a session
#: timeout and a little: what did not move must stay put).
BUSY = "busy"


def config(fault_seconds: float, session_ms: int = 4000) -> ChaosConfig:
    return ChaosConfig.multi(
        3, groups=((BUSY, "cooperative-sticky"),), workers_per_group=3,
        max_extra_workers_per_group=0, catalog=(("orders", 6),),
        fault_seconds=fault_seconds, observe_s=session_ms / 1000 + 0.2,
        session_timeout_ms=session_ms)


def explain(result: SeedResult) -> str:
    return "\n".join([summary_line(result), *result.schedule, *result.violations[:20],
                      *result.notes, f"work directory: {result.workdir}"])


def assert_clean(result: SeedResult, faults: dict[str, int]) -> None:
    print(explain(result))
    assert result.violations == [], explain(result)
    assert dict(result.faults) == faults, explain(result)
    assert result.check.commits_ok > 0, explain(result)
    assert result.check.convergence_s >= 0, explain(result)


def assert_no_rebalance(result: SeedResult) -> None:
    """The coordinator fault cost the group nothing: same generation, no journal
    row, no member lost its membership."""
    assert result.generations_before.get(BUSY, 0) > 0, explain(result)
    assert result.generations_after == result.generations_before, explain(result)
    assert result.rebalances == [], explain(result)
    assert result.check.lost_events == 0, explain(result)


@pytest.mark.timeout(90)
async def test_kill_9_of_the_busy_groups_owner(postgres_server: PostgresServer,
                                               tmp_path: Path) -> None:
    schedule = [Fault(0.5, "kill_coordinator", "", 1.0, (("target", BUSY),))]
    result = await run_seed(1, tmp_path, config(3.0), postgres=postgres_server,
                            schedule=schedule)
    assert_clean(result, {"kill_coordinator": 1})
    # The read of the dead owner's checkpoints (while its leases still fenced
    # everyone out), and the final one through a coordinator started alone.
    assert result.check.durability_checks == 2, explain(result)
    assert_no_rebalance(result)


@pytest.mark.timeout(90)
async def test_sigstop_past_the_lease_then_sigcont(postgres_server: PostgresServer,
                                                   tmp_path: Path) -> None:
    lease_s = config(1).lease_ms / 1000
    schedule = [Fault(0.5, "pause_coordinator", "", 2 * lease_s + 0.3, (("target", BUSY),))]
    # A 6 s session, not the profile's 4 s: a member gives the paused owner
    # up after reply_ms ((6000 - 2 x 400) / 2 = 2.6 s) and reaches the new
    # owner at about 3.1 s, 2.9 s before its safety deadline instead of 1.5 s.
    # Under the whole suite's load (2 cores, Spark beside) 1.5 s was once not
    # enough: two members called on_lost (safely) and rejoined, a rebalance
    # this test says a takeover does not cause.
    result = await run_seed(2, tmp_path, config(4.0, session_ms=6000),
                            postgres=postgres_server, schedule=schedule)
    # The harness's checks at SIGCONT (its partitions taken over meanwhile, a
    # heartbeat sent straight to it answered NOT_COORDINATOR) and in the ledgers
    # (nothing sent to it while stopped acknowledged by it) are violations.
    assert_clean(result, {"pause_coordinator": 1})
    assert result.probes >= 1, explain(result)
    assert_no_rebalance(result)


@pytest.mark.timeout(90)
async def test_rolling_restart_of_all_three_with_sigterm(postgres_server: PostgresServer,
                                                         tmp_path: Path) -> None:
    schedule = [Fault(0.5 + 2.0 * i, "term_coordinator", "", 0.3, (("index", i),))
                for i in range(3)]
    result = await run_seed(3, tmp_path, config(6.0), postgres=postgres_server,
                            schedule=schedule)
    # Each exited 0 on SIGTERM (else a violation) and was restarted.
    assert_clean(result, {"term_coordinator": 3})
    assert_no_rebalance(result)


@pytest.mark.timeout(90)
async def test_postgres_restart_while_members_heartbeat(postgres_server: PostgresServer,
                                                        tmp_path: Path) -> None:
    schedule = [Fault(0.5, "restart_postgres")]
    result = await run_seed(4, tmp_path, config(3.0), postgres=postgres_server,
                            schedule=schedule)
    assert_clean(result, {"restart_postgres": 1})
    # The read after the restart (every checkpoint at least the last acknowledged
    # before the stop), and the final one.
    assert result.check.durability_checks == 2, explain(result)
