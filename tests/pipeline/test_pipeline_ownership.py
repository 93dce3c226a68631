"""The per-rebalance accounting (docs/pipeline.md), on hand-made journals, without Spark."""

from __future__ import annotations

from typing import Any

from pipeline_journal_builder import COOP, EAGER, HOUR, T0, Row, journal_rows

from pipeline.ownership import FACTS_FIELDS, cooperative_names, decode_resources, facts_for_rows
from protocol.resources import ResourceAssignment


def run(rows: list[Row], window_ms: int = 10_000) -> list[dict[str, Any]]:
    facts = facts_for_rows(journal_rows(rows), cooperative_names(), window_ms)
    return [dict(zip(FACTS_FIELDS, f, strict=True)) for f in facts]


def pick(rows: list[dict[str, Any]], *keys: str) -> list[tuple[Any, ...]]:
    return [tuple(r[k] for k in keys) for r in rows]


def test_eager_group_revokes_everything_every_rebalance() -> None:
    out = run(EAGER)
    assert [r["generation_id"] for r in out] == [1, 2, 3, 4, 5]
    assert not any(r["cooperative"] for r in out)
    # (revoked, moved, unavailable resource-ms, first_assigned)
    assert pick(out, "revoked", "moved", "unavailable_ms", "first_assigned") == [
        (0, 0, 0, 4),          # initial: nothing was owned
        (4, 2, 4 * 300, 0),    # a1, a3 go to m3; all four unowned for 300 ms
        (4, 2, 4 * 50, 0),     # a1, a3 come back from m3
        (4, 0, 4 * 10, 0),     # same assignment again: still revoked for 10 ms (eager)
        (4, 2, 4 * 500, 0),    # m2's a2, a3 move to m1
    ]
    assert pick(out, "owned_before", "owned_after") == [(0, 4), (4, 4), (4, 4), (4, 4), (4, 4)]
    assert all(r["follow_ups"] == 0 and not r["is_follow_up"] for r in out)
    assert pick(out, "duration_ms", "joined", "left") == [
        (100, 2, 0), (300, 1, 0), (50, 0, 1), (10, 0, 0), (500, 0, 1)]


def test_cooperative_group_books_the_follow_up_on_the_revoking_rebalance() -> None:
    out = run(COOP)
    assert all(r["cooperative"] for r in out)
    assert pick(out, "revoked", "moved", "unavailable_ms", "follow_ups", "is_follow_up",
                "converged_ms") == [
        (0, 0, 0, 0, False, T0 + 100),
        # b2, b3 revoked at T0+1000, owned by m2 at the follow-up's end T0+1400
        (2, 2, 2 * 400, 1, False, T0 + 1400),
        (0, 0, 0, 0, True, T0 + 1400),
        # m1 left: b0, b1 unowned from T0+2000 to T0+2100
        (2, 2, 2 * 100, 0, False, T0 + 2100),
    ]
    assert pick(out, "owned_before", "owned_after") == [(0, 4), (4, 2), (2, 4), (4, 4)]


def test_storm_window_counts_rebalances_started_in_the_last_window() -> None:
    assert [r["window_count"] for r in run(EAGER, window_ms=10_000)] == [1, 2, 3, 4, 1]
    assert [r["window_count"] for r in run(EAGER, window_ms=5_000)] == [1, 2, 2, 2, 1]


def test_resource_never_assigned_again_counts_until_the_last_rebalance() -> None:
    rows = [
        Row("g", 1, "initial", T0, T0 + 10, {"m1": {"a": [0]}, "m2": {"a": [1]}},
            protocol_name="cooperative-sticky"),
        Row("g", 2, "leave", T0 + 100, T0 + 110, {"m1": {"a": [0]}},
            protocol_name="cooperative-sticky"),
        Row("g", 3, "join", T0 + 500, T0 + 600, {"m1": {"a": [0]}, "m3": {}},
            protocol_name="cooperative-sticky"),
    ]
    out = run(rows)
    # a1 (m2's) is revoked at T0+100 and never owned again: unowned until T0+600
    assert pick(out, "revoked", "moved", "unavailable_ms", "unowned_at_end") == [
        (0, 0, 0, 0), (1, 0, 500, 1), (0, 0, 0, 0)]


def test_initial_and_generation_reset_restart_the_history() -> None:
    rows = [
        Row("g", 5, "join", T0, T0 + 10, {"m1": {"a": [0, 1]}}),
        # the group emptied and came back: nothing counts as revoked
        Row("g", 7, "initial", T0 + HOUR, T0 + HOUR + 20, {"m9": {"a": [0, 1]}}),
        # deleted and created again: generation numbers restart
        Row("g", 1, "join", T0 + 2 * HOUR, T0 + 2 * HOUR + 30, {"m8": {"a": [0, 1]}}),
    ]
    out = run(rows)
    assert pick(out, "revoked", "moved", "first_assigned") == [(0, 0, 2), (0, 0, 2), (0, 0, 2)]


def test_other_protocol_types_and_corrupt_bytes_report_no_ownership() -> None:
    rows = [
        Row("g", 1, "initial", T0, T0 + 10, {}, protocol_type="custom",
            raw_assignments=b"\x81\xa2m1\xc4\x03xyz"),
        Row("g", 2, "join", T0 + 20, T0 + 30, {}, raw_assignments=b"\xc1not msgpack"),
        Row("g", 3, "join", T0 + 40, T0 + 50, {"m1": {"a": [0]}}),
    ]
    out = run(rows)
    assert pick(out, "revoked", "moved", "assignment_error") == [
        (None, None, False), (None, None, True), (0, 0, False)]
    assert out[0]["duration_ms"] == 10


def test_duplicate_journal_rows_count_once() -> None:
    rows = journal_rows(EAGER)
    doubled = sorted(rows + rows, key=lambda r: r.journal_id)
    facts = list(facts_for_rows(doubled, cooperative_names(), 10_000))
    assert len(facts) == len(EAGER)


def test_decode_resources_reads_what_the_client_encodes() -> None:
    data = ResourceAssignment(assigned={"x": [3, 1], "y": [0]}).encode()
    assert decode_resources(data) == {("x", 1), ("x", 3), ("y", 0)}
    assert decode_resources(b"") == frozenset()


def test_cooperative_names_come_from_the_assignors() -> None:
    is_coop = cooperative_names(["my-own"])
    assert is_coop("cooperative-sticky")
    assert is_coop("my-own")
    assert not is_coop("range")
    assert not is_coop(None)
