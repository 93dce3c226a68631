"""Per-group series on /metrics (``--group-metrics N``): opt-in, at most N groups."""

from __future__ import annotations

from coordinator.core.views import GroupSummary
from coordinator.metrics import Metrics


def groups() -> list[GroupSummary]:
    return [GroupSummary("small", "Stable", "resources", "range", 3, 1),
            GroupSummary("big", "Stable", "resources", "range", 7, 9),
            GroupSummary("mid", "PreparingRebalance", "resources", "range", 2, 4)]


def test_off_by_default() -> None:
    metrics = Metrics()
    metrics.watch_groups(groups, lambda g: "OK", 0)
    assert "groupcoord_group_" not in metrics.render().decode()


def test_the_largest_groups_up_to_the_cap_and_the_rest_counted() -> None:
    metrics = Metrics()
    metrics.watch_groups(groups, lambda g: "STORM" if g == "mid" else "OK", 2)
    text = metrics.render().decode()
    assert 'groupcoord_group_members{group="big"} 9.0' in text
    assert 'groupcoord_group_generation{group="mid"} 2.0' in text
    assert 'groupcoord_group_state{group="mid",state="PreparingRebalance"} 1.0' in text
    assert 'groupcoord_group_health{group="mid",health="STORM"} 1.0' in text
    assert 'group="small"' not in text
    assert "groupcoord_group_metrics_omitted 1.0" in text
