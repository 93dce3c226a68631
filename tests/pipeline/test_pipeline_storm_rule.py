"""One rebalance-storm rule (coordinator/core/storm.py) on both sides: the
coordinator's STORM health (coordinator/core/health.py) and ``groupcoord
analyze``'s storm counter and storm rebalances (pipeline/facts.py,
pipeline/group_figures.py). The same defaults wherever a user can meet
them, the same verdict on the same rebalances, and a routine deploy that is
not a storm on either side while a group that keeps rebalancing is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from coordinator.config import ServerConfig
from coordinator.core.config import CoreConfig
from coordinator.core.health import STORM, GroupHealth, assess
from coordinator.core.storm import STORM_RULE, StormRule
from pipeline.analyze import AnalyzeOptions
from pipeline.cli import register
from pipeline.errors import PipelineError
from pipeline.facts import facts_schema, window_counts
from pipeline.group_figures import group_rows

T0 = 1_795_000_000_000
SECOND = 1_000
MINUTE = 60 * SECOND


def rolling_restart(members: int, every_ms: int, t0: int = T0) -> list[int]:
    """Rebalance starts of a rolling restart with cooperative rebalancing at
    its worst, 2N: each member's restart is a rebalance (its leave and its
    replacement's join) and the cooperative follow-up that hands over what
    the others revoked, 2 s later; one member every ``every_ms``."""
    starts = []
    for i in range(members):
        starts += [t0 + i * every_ms, t0 + i * every_ms + 2 * SECOND]
    return starts


def crash_loop(every_ms: int, for_ms: int, t0: int = T0) -> list[int]:
    """A group that keeps rebalancing: a member that crashes (or misses its
    session timeout) and comes back, a rebalance every ``every_ms``."""
    return list(range(t0, t0 + for_ms, every_ms))


def coordinator_storms(starts: list[int], config: CoreConfig) -> list[bool]:
    """The coordinator's verdict as each rebalance starts: its health record
    of the group is fed the start, then asked."""
    record = GroupHealth()
    verdicts = []
    for t in starts:
        record.rebalance_started(t, config)
        health = assess(record, t, config, has_members=True, keeps_checkpoints=False)
        verdicts.append(health.status == STORM)
    return verdicts


def pipeline_storms(starts: list[int], rule: StormRule) -> tuple[list[bool], int, int]:
    """The pipeline's verdict per rebalance (``window_count`` reaching the
    threshold ``analyze`` passes its kernels), and the group's
    ``storm_rebalances`` and ``peak_window_rebalances`` from the per-group
    kernel that writes ``groups/``."""
    n = len(starts)
    started = np.array(starts, np.int64)
    counts = window_counts(np.zeros(n, np.int64), started, rule.window_ms)
    columns = {f.name: pa.nulls(n, f.type) for f in facts_schema()}
    columns |= {"source": pa.array(["coord"] * n), "group_id": pa.array(["g"] * n),
                "journal_id": pa.array(range(1, n + 1), pa.int64()),
                "reason": pa.array(["join"] * n), "started_ms": pa.array(started),
                "ended_ms": pa.array(started + 100), "duration_ms": pa.array([100] * n),
                "window_count": pa.array(counts)}
    facts = pa.table(columns, schema=facts_schema())
    row = group_rows(facts, rule.trips_at).to_pylist()[0]
    return ([bool(c >= rule.trips_at) for c in counts], row["storm_rebalances"],
            row["peak_window_rebalances"])


def test_every_default_is_the_one_rule() -> None:
    """The coordinator's settings (serve flags and the core's), analyze's
    options and its command-line defaults all give coordinator/core/storm.py's
    rule."""
    import argparse
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["analyze", "j.db", "-o", "out"])
    cli = StormRule(int(args.storm_window * 1000), args.storm_threshold)
    assert (CoreConfig().storm_rule == ServerConfig().core_config().storm_rule
            == AnalyzeOptions().storm_rule == cli == STORM_RULE)
    assert (STORM_RULE.window_ms, STORM_RULE.rebalances) == (10 * MINUTE, 30)


@pytest.mark.parametrize("members, every_ms", [(10, 2 * SECOND), (10, 20 * SECOND),
                                               (12, 25 * SECOND)])
def test_a_routine_rolling_restart_is_not_a_storm_on_either_side(members: int,
                                                                  every_ms: int) -> None:
    """Ten or twelve members restarted one after another, as fast as the
    client benchmark's (10 workers in 15-28 s) or at a Kubernetes pace, with
    two rebalances each: neither the coordinator nor analyze calls it a
    storm."""
    starts = rolling_restart(members, every_ms)
    assert len(starts) == 2 * members
    assert not any(coordinator_storms(starts, CoreConfig()))
    verdicts, storm_rebalances, peak = pipeline_storms(starts, STORM_RULE)
    assert not any(verdicts) and storm_rebalances == 0 and peak == 2 * members


@pytest.mark.parametrize("rule", [STORM_RULE, StormRule(60_000, 3), StormRule(60_000, 2),
                                  StormRule(600_000, 0)])
def test_both_sides_give_the_same_verdict_on_the_same_rebalances(rule: StormRule) -> None:
    """A deploy, a pause, a crash loop, a pause, two deploys back to back:
    at every rebalance the coordinator says STORM exactly when analyze counts
    it a storm rebalance, under the default rule, a stricter one and the
    rule switched off; the window's edge included (a rebalance exactly one
    window earlier no longer counts)."""
    starts = (rolling_restart(10, 15 * SECOND)
              + crash_loop(15 * SECOND, 12 * MINUTE, T0 + 20 * MINUTE)
              + rolling_restart(10, 10 * SECOND, T0 + 60 * MINUTE)
              + rolling_restart(10, 10 * SECOND, T0 + 64 * MINUTE)
              + [T0 + 80 * MINUTE + k * rule.window_ms for k in range(40)])
    config = CoreConfig(health_window_ms=rule.window_ms, health_storm_rebalances=rule.rebalances)
    coordinator = coordinator_storms(starts, config)
    pipeline, storm_rebalances, _ = pipeline_storms(starts, rule)
    assert coordinator == pipeline
    assert storm_rebalances == sum(pipeline)
    if rule.rebalances == 0:
        assert not any(coordinator)
    else:
        assert any(coordinator)


def test_a_group_that_keeps_rebalancing_is_a_storm_on_both_sides() -> None:
    """A rebalance every 15 s: a storm from the 30th, 7 min 15 s in, and for
    as long as it goes on; after 10 quiet minutes the group is well again."""
    starts = crash_loop(15 * SECOND, 12 * MINUTE)
    coordinator = coordinator_storms(starts, CoreConfig())
    assert coordinator.index(True) == 29 and all(coordinator[29:])
    verdicts, storm_rebalances, peak = pipeline_storms(starts, STORM_RULE)
    assert verdicts == coordinator and storm_rebalances == len(starts) - 29 and peak == 40
    record = GroupHealth()
    for t in starts:
        record.rebalance_started(t, CoreConfig())
    assert assess(record, starts[-1] + 10 * MINUTE, CoreConfig(), has_members=True,
                  keeps_checkpoints=False).status != STORM


def test_a_rule_that_cannot_be_is_refused_in_words() -> None:
    with pytest.raises(PipelineError, match=r"--storm-threshold\) must be 0 \(never\) or more"):
        AnalyzeOptions(storm_threshold=-1)
    with pytest.raises(PipelineError, match=r"--storm-window\) must be above 0"):
        AnalyzeOptions(storm_window_ms=0)
    with pytest.raises(ValueError, match="storm rebalances must be 0"):
        StormRule(rebalances=-2)
