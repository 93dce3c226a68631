"""One chaos seed in CI: real coordinator and worker processes under faults.

The seed plays ~8 s of faults (worker SIGKILLs, SIGSTOP zombies, coordinator
SIGKILL + restart on the same database, latency and partitions, joins and
leaves) and then checks the four invariants of ledger.py. It is the smoke
test of the real processes, the HTTP drivers, the fault proxy and SQLite's
durability across a SIGKILL; the protocol's logic under faults is explored by
the simulator's seeds (tests/sim, thousands per CI run), so one
seed here is enough (seed 7: every fault kind of this harness but catalog
changes, two coordinator kills). The longer runner is
``benchmarks/chaos.py --seeds N``.

A second seed plays drains and warm-ups (seed 89 of the ``balanced``
profile with ``--warmup --drains``: a drain by SIGUSR1 that hands over, a
drainer SIGKILLed mid-drain, an admin-route drain with another member of its
group SIGKILLed meanwhile, zombies and joins) and checks the standby and
drain invariants besides.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import DRAIN_WEIGHTS, ChaosConfig, run_seed, summary_line

CI_CONFIG = ChaosConfig(fault_seconds=8.0)
#: benchmarks/chaos.py --assignor balanced --warmup --drains, 8 s of faults.
DRAIN_CONFIG = ChaosConfig(
    fault_seconds=8.0, groups=(("coop", "balanced"), ("eager", "range")),
    weighted_catalog=True, capacities=(1.0, 2.0, 0.5), load_rejoin_interval_ms=2_000,
    warmup_timeout_ms=5_000, weights=ChaosConfig().weights + DRAIN_WEIGHTS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [7])
async def test_chaos_seed_has_no_violations(seed: int, tmp_path: Path) -> None:
    result = await run_seed(seed, tmp_path, CI_CONFIG)
    print(summary_line(result))
    assert result.violations == [], "\n".join(
        [summary_line(result), *result.schedule, *result.violations[:20]])
    # The seed must really have exercised the system.
    assert sum(result.faults.values()) >= 5, result.schedule
    assert result.check.commits_ok > 0
    assert result.check.durability_checks >= 2


@pytest.mark.timeout(120)
async def test_chaos_seed_with_drains_and_warmups(tmp_path: Path) -> None:
    result = await run_seed(89, tmp_path, DRAIN_CONFIG)
    print(summary_line(result))
    assert result.violations == [], "\n".join(
        [summary_line(result), *result.schedule, *result.violations[:20]])
    drains = sum(n for kind, n in result.faults.items() if kind.startswith("drain_"))
    assert drains >= 2, (result.faults, result.notes)
    assert result.check.drains_done >= 1, result.notes
    assert result.check.standbys >= 1 and result.check.warmups_done >= 1
    assert result.check.commits_ok > 0
