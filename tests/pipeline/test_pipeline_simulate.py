"""`groupcoord simulate`: the cell model by hand, the sweep file, and one small Spark sweep.

Hand figures, for 6 members on 2 sets x 9 (3 resources each), rounds of 200 ms,
a 10 s session timeout:
- one member leaves: 3 resources move (the minimum); an eager group has all 18
  unowned for the round (18 x 200 = 3,600 resource-ms), a cooperative one only
  the leaver's 3 (600);
- one crashes: its 3 are also unowned until the session expires: 3 x 10,000
  more (33,600 eager, 30,600 cooperative).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from client.assignors import get_assignor
from pipeline.errors import PipelineError
from pipeline.simcell import churn_timeline, names, simulate, subscriptions_for
from pipeline.simulate import CELL_FIGURES, CELL_KEYS, load_sweep, run_cell, simulate_sweep

SWEEPS = Path(__file__).resolve().parents[2] / "pipeline" / "sweeps"
SHARED_BENCH = Path(__file__).resolve().parents[3] / "shared" / "bench"


def small(assignor: str, events: list[dict[str, Any]]) -> Any:
    members = names("member", 6)
    sets = names("set", 2)
    subs = subscriptions_for(members, sets, {"kind": "uniform"}, 1)
    timeline = churn_timeline(members, events, 1, 10_000, 0)
    return simulate(get_assignor(assignor), dict.fromkeys(sets, 9), subs, timeline, None,
                    200, 10)


@pytest.mark.parametrize(("assignor", "unowned"), [("sticky", 3600),
                                                   ("cooperative-sticky", 600)])
def test_one_leaves(assignor: str, unowned: int) -> None:
    res = small(assignor, [{"kind": "leave", "pick": "middle"}])
    assert res.valid and res.converged
    (ep,) = res.episodes
    assert (ep.moved, ep.min_moves, ep.rounds, ep.unavailable_ms) == (3, 3, 1, unowned)
    assert ep.triggers == ["leave"]


@pytest.mark.parametrize(("assignor", "unowned"), [("sticky", 33_600),
                                                   ("cooperative-sticky", 30_600)])
def test_one_crashes_is_noticed_after_the_session_timeout(assignor: str, unowned: int) -> None:
    (ep,) = small(assignor, [{"kind": "crash"}]).episodes
    assert ep.triggers == ["crash", "expire"]
    assert ep.unavailable_ms == unowned
    assert ep.end_ms - ep.start_ms == 10_000 + 200


def test_cooperative_join_takes_a_follow_up_round() -> None:
    (ep,) = small("cooperative-sticky", [{"kind": "join"}]).episodes
    # 18 over 7 members: the joiner gets 2, revoked in round 1, handed over in round 2
    assert (ep.rounds, ep.moved, ep.min_moves) == (2, 2, 2)
    assert ep.unavailable_ms == 2 * 200
    (eager,) = small("sticky", [{"kind": "join"}]).episodes
    assert (eager.rounds, eager.moved) == (1, 2)


def test_rolling_restart_gives_one_episode_per_member_when_they_are_spaced_out() -> None:
    res = small("cooperative-sticky", [{"kind": "restart", "count": -1, "gap_ms": 60_000,
                                        "restart_ms": 5_000}])
    assert len(res.episodes) == 12  # a leave and a join per member
    assert res.final_balance == 0 and res.unassigned_at_end == 0


@pytest.mark.skipif(not (SHARED_BENCH / "scenarios.py").exists(),
                    reason="shared/bench is not beside the repository")
def test_random_subscriptions_match_the_benchmark_scenarios() -> None:
    sys.path.insert(0, str(SHARED_BENCH))
    try:
        import scenarios  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SHARED_BENCH))
    theirs = scenarios.e_fresh(n_members=50, n_topics=20, per_topic=5)["subscriptions"]
    ours = subscriptions_for(names("member", 50), names("set", 20),
                             {"kind": "random", "fraction": 0.2}, 615)
    assert {m: [t.replace("topic", "set") for t in s] for m, s in theirs.items()} == ours


def test_sweep_file_cells() -> None:
    sweep = load_sweep(SWEEPS / "tiny.toml")
    assert len(sweep.cells) == 6 * 2 * 3  # assignors x shapes x churn (1 group, 1 seed)
    bench = load_sweep(SWEEPS / "bench_scenarios.toml")
    full = load_sweep(SWEEPS / "bench_scenarios.toml", full=True)
    assert {c["group"] for c in bench.cells} == {"a", "c", "d", "e"}
    assert max(c["resources"] for c in full.cells) == 1_000_000
    assert max(c["resources"] for c in bench.cells) < 1_000_000


def test_sweep_file_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="no such file"):
        load_sweep(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('assignors = ["range", "magic"]\n[[groups]]\nname="g"\nmembers=1\nsets=1\n'
                   'partitions=1\n')
    with pytest.raises(PipelineError, match=r"unknown assignor.*magic"):
        load_sweep(bad)
    bad.write_text("[[groups]]\nname = 'g'\nmembers = 2\n")
    with pytest.raises(PipelineError, match="missing key 'sets'"):
        load_sweep(bad)


def test_sweep_on_spark(spark: Any, tmp_path: Path) -> None:
    sweep = load_sweep(SWEEPS / "tiny.toml")
    res = simulate_sweep(spark, sweep, tmp_path, progress=False)
    assert (res.cells, res.failed) == (30, 0)
    rows = {(r["assignor"], r["subscription"], r["churn"]): r.asDict()
            for r in spark.read.parquet(str(tmp_path / "cells")).collect()}
    assert len(rows) == 30
    assert all(r["valid"] and r["converged"] for r in rows.values())
    leave = rows["cooperative-sticky", "uniform", "one_leaves"]
    assert (leave["moved"], leave["min_moves"], leave["unavailable_ms"]) == (3, 3, 600)
    assert rows["sticky", "uniform", "one_crashes"]["unavailable_ms"] == 33_600
    # incremental-cooperative holds a leaver's resources for the 3 s delay of tiny.toml
    held = rows["incremental-cooperative", "uniform", "one_leaves"]
    assert (held["rounds"], held["unavailable_ms"]) == (2, 3 * (200 + 3000 + 200))
    # what Spark ran is what the cell function gives on its own
    cell = next(c for c in sweep.cells if (c["assignor"], c["subscription"], c["churn"]) ==
                ("range", "half", "two_join"))
    direct, _ = run_cell(cell)
    names_ = [k for k, _ in CELL_KEYS + CELL_FIGURES]
    got = rows["range", "half", "two_join"]
    for key in ("moved", "min_moves", "final_balance", "rounds", "unavailable_ms"):
        assert got[key] == direct[names_.index(key)], key
    assert spark.read.parquet(str(tmp_path / "episodes")).count() == sum(
        r["episodes"] for r in rows.values())
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5
    assert "incremental-cooperative" in page
