"""The numpy facts (pipeline/facts.py) against the row-at-a-time reference
(pipeline/ownership.py), on the hand-made journals and on seeded random ones,
including matrices cut into blocks of a few cells (the state carried between
blocks); and the numpy aggregates against figures worked out by hand."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pipeline_journal_builder import COOP, EAGER, T0, Row, journal_rows

import pipeline.facts as facts_mod
from pipeline.aggregates import aggregate
from pipeline.facts import facts_for_chunk, input_table
from pipeline.ownership import FACTS_FIELDS, JournalRow, cooperative_names, facts_for_rows

IS_COOP = cooperative_names()


def _key(d: dict[str, Any]) -> tuple[Any, ...]:
    return (d["source"], d["group_id"], d["journal_id"])


def reference(rows: list[JournalRow], window_ms: int) -> list[dict[str, Any]]:
    return sorted((dict(zip(FACTS_FIELDS, f, strict=True))
                   for f in facts_for_rows(rows, IS_COOP, window_ms)), key=_key)


def vectorised(rows: list[JournalRow], window_ms: int) -> list[dict[str, Any]]:
    return sorted(facts_for_chunk(input_table(rows), IS_COOP, window_ms).to_pylist(), key=_key)


def _random_journal(rnd: random.Random) -> list[Row]:
    rows: list[Row] = []
    t, generation = T0, 0
    for _ in range(rnd.randint(1, 25)):
        members = [f"m{i}" for i in range(rnd.randint(0, 4))]
        owned: dict[str, dict[str, list[int]]] = {m: {} for m in members}
        for r in range(rnd.randint(0, 6)):
            if members and rnd.random() < 0.8:
                owned[rnd.choice(members)].setdefault(rnd.choice("ab"), []).append(r)
        generation = generation + 1 if rnd.random() < 0.9 else max(0, generation - 2)
        t += rnd.randint(-100, 3000)  # start times sometimes out of journal order
        rows.append(Row(
            "g", generation,
            rnd.choice(["join", "leave", "initial", "rejoin"]) if rnd.random() < 0.3 else "join",
            t, t + rnd.randint(0, 500), owned,
            protocol_name=rnd.choice(["range", "cooperative-sticky"]),
            protocol_type="resources" if rnd.random() < 0.9 else "custom",
            raw_assignments=b"\xc1bad" if rnd.random() < 0.05 else None))
    return rows


@pytest.mark.parametrize("cells", [4_000_000, 8, 3])
def test_matches_the_reference_on_the_hand_made_journals(
        cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_mod, "BLOCK_CELLS", cells)
    rows = sorted(journal_rows(EAGER + COOP), key=lambda r: (r.group_id, r.journal_id))
    assert vectorised(rows, 10_000) == reference(rows, 10_000)
    doubled = sorted(rows + rows, key=lambda r: (r.group_id, r.journal_id))
    assert vectorised(doubled, 10_000) == reference(rows, 10_000)  # counted once


@pytest.mark.parametrize("cells", [4_000_000, 8, 16])
@pytest.mark.parametrize(("dense", "probes"), [(1 << 26, 4), (0, 0), (1 << 26, 1)])
def test_matches_the_reference_on_random_journals(
        cells: int, dense: int, probes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with every path of the matrix code: resource columns marked or
    sorted; the next owner found by probing rows, or by a running minimum."""
    monkeypatch.setattr(facts_mod, "BLOCK_CELLS", cells)
    monkeypatch.setattr(facts_mod, "_DENSE_CELLS", dense)
    monkeypatch.setattr(facts_mod, "_PROBES", probes)
    rnd = random.Random(5)
    for _ in range(100):
        rows = journal_rows(_random_journal(rnd))
        assert vectorised(rows, 2_000) == reference(rows, 2_000)


def test_a_resource_given_to_two_members_is_an_assignment_error() -> None:
    rows = journal_rows([
        Row("g", 1, "initial", T0, T0 + 10, {"m1": {"a": [0]}}),
        Row("g", 2, "join", T0 + 20, T0 + 30, {"m1": {"a": [0]}, "m2": {"a": [0]}}),
    ])
    out = vectorised(rows, 1_000)
    assert [(r["revoked"], r["assignment_error"]) for r in out] == [(0, False), (None, True)]


def test_aggregates_per_group_hour_are_exact() -> None:
    rows = sorted(journal_rows(EAGER + COOP), key=lambda r: (r.group_id, r.journal_id))
    hours, groups = aggregate(facts_for_chunk(input_table(rows), IS_COOP, 600_000), 3)
    gh = {(r["group_id"], r["hour_start_ms"]): r for r in hours.to_pylist()}
    e = gh["eager", T0]  # durations 100, 300, 50, 10
    assert (e["rebalances"], e["revoked"], e["moved"], e["unavailable_ms"]) == (4, 12, 4, 1440)
    assert (e["duration_p50_ms"], e["duration_p95_ms"], e["duration_max_ms"]) == \
        (pytest.approx(75), pytest.approx(270), 300)
    by = {r["group_id"]: r for r in groups.to_pylist()}
    assert (by["eager"]["peak_window_rebalances"], by["eager"]["storm_rebalances"],
            by["coop"]["max_follow_ups"], by["coop"]["protocol_name"]) == \
        (4, 2, 1, "cooperative-sticky")


@pytest.mark.parametrize("chunk_rows", [10, 1_000_000])
def test_chunks_from_a_partition_in_any_order_keep_groups_whole(chunk_rows: int) -> None:
    """Spark does not sort a partition: partition_chunks orders its rows by
    group and id and cuts chunks between groups. Rows come shuffled over
    batches, journal ids interleave across groups, two coordinators have
    groups of the same name, and some rows arrive twice."""
    import dataclasses

    rnd = random.Random(11)
    per_group = [journal_rows([dataclasses.replace(x, group_id=f"g{g % 4}")
                               for x in _random_journal(rnd)]) for g in range(7)]
    # Journal ids interleaved across groups (one coordinator journals them all).
    order = sorted((k, g) for g in range(7) for k in range(len(per_group[g])))
    rows = [dataclasses.replace(per_group[g][k], journal_id=i, source=f"c{int(g >= 4)}")
            for i, (k, g) in enumerate(order, start=1)]
    arrived = rows + rnd.sample(rows, 5)
    rnd.shuffle(arrived)
    batches = input_table(arrived).to_batches(max_chunksize=7)
    chunks = list(facts_mod.partition_chunks(batches, rows=chunk_rows))
    groups_of = [{(s, g) for s, g in zip(c["source"].to_pylist(), c["group_id"].to_pylist(),
                                         strict=True)} for c in chunks]
    assert sum(len(g) for g in groups_of) == len(set().union(*groups_of)) == 7
    assert (len(chunks) == 1) if chunk_rows > len(arrived) else (len(chunks) > 1)
    for c in chunks:  # each group contiguous, in journal order
        keys = list(zip(c["source"].to_pylist(), c["group_id"].to_pylist(),
                        c["id"].to_pylist(), strict=True))
        runs = [k[:2] for i, k in enumerate(keys) if i == 0 or keys[i - 1][:2] != k[:2]]
        assert len(runs) == len(set(runs))
        assert keys == sorted(keys, key=lambda k: (runs.index(k[:2]), k[2]))
    got = [r for c in chunks for r in facts_for_chunk(c, IS_COOP, 2_000).to_pylist()]
    by_group = sorted(rows, key=lambda r: (r.source, r.group_id, r.journal_id))
    assert sorted(got, key=_key) == reference(by_group, 2_000)


def test_an_empty_partition_gives_no_chunk() -> None:
    assert list(facts_mod.partition_chunks(iter([]))) == []


def test_fleet_percentiles_from_duration_cells_are_exact() -> None:
    """Fleet-wide percentiles come from (hour, duration) counts summed over
    tasks; they must equal linear-interpolation percentiles of the raw values."""
    import numpy as np
    import pyarrow as pa

    from pipeline.aggregates import (
        HOUR_MS,
        _sum_cells,
        cell_histogram,
        cell_percentiles,
        merge_cells,
    )
    rnd = np.random.default_rng(3)
    hour = rnd.integers(0, 3, 5_000) * HOUR_MS
    duration = rnd.integers(0, 400, 5_000)
    ones = np.ones(5_000, np.int64)
    parts = [_sum_cells(hour[i::3], duration[i::3], ones[i::3]) for i in range(3)]
    cells = merge_cells(parts)
    assert cells.num_rows == len(set(zip(hour.tolist(), duration.tolist(), strict=True)))
    got = cell_percentiles(*(np.asarray(cells[c].to_numpy()) for c in
                             ("hour_start_ms", "duration_ms", "rebalances")))
    for h in range(3):
        values = duration[hour == h * HOUR_MS]
        for p, name in ((50, "duration_p50_ms"), (95, "duration_p95_ms"),
                        (99, "duration_p99_ms")):
            assert got[h * HOUR_MS][name] == pytest.approx(np.percentile(values, p))
        assert got[h * HOUR_MS]["duration_max_ms"] == values.max()
    # p95 of 10, 50, 100, 300 interpolates (270), as group_hours/ does
    four = cell_percentiles(np.zeros(4, np.int64), np.array([10, 50, 100, 300]),
                            np.ones(4, np.int64))
    assert four[0]["duration_p95_ms"] == pytest.approx(270)
    hist = dict(cell_histogram(pa.table({"duration_ms": [0, 1, 9, 10, 99, 100],
                                         "rebalances": [1, 1, 2, 1, 1, 3]})))
    assert hist == {0: 2, 4: 2, 5: 1, 9: 1, 10: 3}


def test_fleet_hour_sums_add_up_over_tasks_like_spark_sums() -> None:
    """Each task sums its groups' group_hours per hour; the driver adds the
    tasks' sums up. The result is what Spark's groupBy(hour).sum() over all
    group_hours gave: nulls skipped, null only where a whole hour is null;
    ``groups`` counts group-hours, ``storming_groups`` those with a storm."""
    import pyarrow as pa

    from pipeline.aggregates import (
        FLEET_SUMS,
        HOUR_MS,
        duration_cells,
        group_hours_schema,
        hour_sums,
        merge_hour_sums,
        split_task_results,
        task_result,
    )
    schema = group_hours_schema()

    def hours(rows: list[dict[str, Any]]) -> pa.Table:
        base = {f.name: 0 for f in schema} | {"source": "db"}
        return pa.Table.from_pylist([base | r for r in rows], schema=schema)

    task1 = hours([
        {"group_id": "a", "hour_start_ms": 0, "rebalances": 3, "moved": 5,
         "follow_up_rebalances": None, "storm_rebalances": 2},
        {"group_id": "a", "hour_start_ms": HOUR_MS, "rebalances": 1, "moved": 1,
         "follow_up_rebalances": None}])
    task2 = hours([
        {"group_id": "b", "hour_start_ms": 0, "rebalances": 2, "moved": 7,
         "follow_up_rebalances": 1, "reason_join": 2}])
    no_facts = facts_for_chunk(input_table([]), IS_COOP, 600_000)
    fleet = {r["hour_start_ms"]: r for r in
             merge_hour_sums([hour_sums(task1, no_facts),
                              hour_sums(task2, no_facts)]).to_pylist()}
    assert list(fleet) == [0, HOUR_MS]
    assert {k: fleet[0][k] for k in ("rebalances", "moved", "follow_up_rebalances",
                                     "reason_join", "groups", "storming_groups")} == \
        {"rebalances": 5, "moved": 12, "follow_up_rebalances": 1, "reason_join": 2,
         "groups": 2, "storming_groups": 1}
    assert fleet[HOUR_MS]["follow_up_rebalances"] is None  # every group-hour null
    assert (fleet[HOUR_MS]["rebalances"], fleet[HOUR_MS]["groups"]) == (1, 1)
    assert set(FLEET_SUMS) <= set(fleet[0])

    # What a task returns carries both, and splits back into each.
    rows = sorted(journal_rows(EAGER + COOP), key=lambda r: (r.group_id, r.journal_id))
    facts = facts_for_chunk(input_table(rows), IS_COOP, 600_000)
    gh, _ = aggregate(facts, 3)
    cells, sums = duration_cells(facts), hour_sums(gh, facts)
    back_cells, back_sums = split_task_results(pa.concat_tables(
        [task_result(cells, sums), task_result(cells.slice(0, 0), sums.slice(0, 0))]))
    assert back_cells.equals(cells) and back_sums.equals(sums)
    merged = merge_hour_sums([hour_sums(task1, no_facts), hour_sums(task2, no_facts)])
    assert split_task_results(task_result(cells, merged))[1].equals(merged)  # nulls kept
    # The counts taken from the facts, per hour.
    per_hour = sums.to_pylist()
    for name, column in (("assignment_errors", "assignment_error"),
                         ("cooperative_rebalances", "cooperative")):
        assert sum(r[name] for r in per_hour) == sum(bool(x) for x in facts[column].to_pylist())
    assert sum(r["unreadable"] for r in per_hour) == facts["revoked"].null_count
    assert sum(r["cooperative_rebalances"] for r in per_hour) > 0


def test_shared_dictionary_unifies_chunks_that_do_not_share_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """partition_chunks relies on one dictionary for all chunks of a column;
    Arrow gives that today, and if a chunk ever had its own, the codes are
    unified instead of read against the wrong dictionary."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pa.chunked_array([pa.array(["a", "b"]), pa.array(["c", "a", None])])
    codes, dictionary = facts_mod._shared_dictionary(values)
    assert dictionary.take(pa.array(codes)).to_pylist() == values.to_pylist()

    encode = pc.dictionary_encode

    def own_dictionaries(column: Any, **kw: Any) -> Any:
        if not isinstance(column, pa.ChunkedArray):
            return encode(column, **kw)
        return pa.chunked_array([encode(c, **kw) for c in column.chunks])
    monkeypatch.setattr(pc, "dictionary_encode", own_dictionaries)
    codes, dictionary = facts_mod._shared_dictionary(values)
    assert dictionary.take(pa.array(codes)).to_pylist() == values.to_pylist()


def test_an_index_listed_twice_by_one_member_is_owned_once() -> None:
    """Both readings of an assignment (the reference's decode_resources and
    the numpy facts) take a member's resources as a set: an index the leader
    listed twice for the same member is one owned resource, not a resource
    given to two members."""
    from protocol.codec import encode
    twice = encode({"m1": encode({"v": 1, "assigned": {"a": [0, 0, 1]}})})
    rows = journal_rows([
        Row("g", 1, "initial", T0, T0 + 10, {"m1": {"a": [0, 1]}}),
        Row("g", 2, "join", T0 + 20, T0 + 30, {}, raw_assignments=twice),
        Row("g", 3, "join", T0 + 40, T0 + 50, {"m2": {"a": [0, 1]}}),
    ])
    got = vectorised(rows, 1_000)
    assert got == reference(rows, 1_000)
    assert [(r["owned_after"], r["assignment_error"]) for r in got] == \
        [(2, False), (2, False), (2, False)]
