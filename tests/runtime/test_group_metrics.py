"""Per-group series on /metrics (``--group-metrics N``): opt-in, at most N groups."""

from __future__ import annotations

from coordinator.core.records import MemberRecord
from coordinator.core.views import GroupSummary, GroupView
from coordinator.metrics import Metrics
from protocol.resources import MemberMetadata, ResourceAssignment


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


def placed_view(group_id: str, generation: int, a_indexes: list[int]) -> GroupView:
    """Two members of a load-balancing assignor: ``a`` (capacity 2) reported a
    load of 3 on each of 0-2, ``b`` 1 on 3; ``a`` is given ``a_indexes``, ``b`` 3."""
    def member(name: str, metadata: MemberMetadata, given: list[int]) -> MemberRecord:
        return MemberRecord(name, None, name, "h", 10_000, 10_000,
                            (("balanced", metadata.encode()),),
                            ResourceAssignment({"s": given}, band=(0.0, 10.0)).encode())
    return GroupView(group_id, "Stable", "resources", "balanced", generation, "a", (
        member("a", MemberMetadata(("s",), capacity=2.0, load={"s": {0: 3.0, 1: 3.0, 2: 3.0}}),
               a_indexes),
        member("b", MemberMetadata(("s",), load={"s": {3: 1.0}}), [3])))


def test_load_imbalance_is_read_once_per_generation_and_kept_while_rebalancing() -> None:
    summaries = [GroupSummary("placed", "Stable", "resources", "balanced", 4, 2)]
    views = {4: placed_view("placed", 4, [0, 1, 2])}
    described: list[str] = []

    def describe(group_id: str) -> GroupView | None:
        described.append(group_id)
        return views[summaries[0].generation_id]

    metrics = Metrics()
    metrics.watch_groups(lambda: summaries, lambda g: "OK", 5, describe)

    def imbalance() -> str | None:
        for line in metrics.render().decode().splitlines():
            if line.startswith('groupcoord_group_load_imbalance{group="placed"}'):
                return line.split()[-1]
        return None

    # a: 9 per capacity 2 = 4.5; the group: 10 over capacity 3.
    assert imbalance() == repr(4.5 / (10 / 3))
    assert imbalance() == repr(4.5 / (10 / 3))
    assert described == ["placed"]
    # Rebalancing: the last figure stays, nothing is decoded.
    summaries[0] = GroupSummary("placed", "CompletingRebalance", "resources", "balanced", 5, 2)
    assert imbalance() == repr(4.5 / (10 / 3))
    assert described == ["placed"]
    # Generation 6 is Stable: read again (a has 0 and 1: 6 per capacity 2; b 1).
    views[6] = placed_view("placed", 6, [0, 1])
    summaries[0] = GroupSummary("placed", "Stable", "resources", "balanced", 6, 2)
    assert imbalance() == repr(3.0 / (7 / 3))
    assert described == ["placed", "placed"]
