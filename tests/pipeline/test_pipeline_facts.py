"""The numpy facts (pipeline/facts.py) against the row-at-a-time reference
(pipeline/ownership.py), on the hand-made journals and on seeded random ones,
including matrices cut into blocks of a few cells (the state carried between
blocks). The reference's storm counter only looks back in journal order,
the numpy one (``facts.window_counts``) by start time as Spark's window
function does (tests/pipeline/test_pipeline_group_figures.py): ``window_count``
is left out here."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pipeline_journal_builder import COOP, EAGER, T0, Row, journal_rows

import pipeline.facts as facts_mod
from pipeline.facts import facts_for_chunk, input_table
from pipeline.ownership import FACTS_FIELDS, JournalRow, cooperative_names, facts_for_rows

IS_COOP = cooperative_names()


def _key(d: dict[str, Any]) -> tuple[Any, ...]:
    return (d["source"], d["group_id"], d["journal_id"])


def reference(rows: list[JournalRow], window_ms: int) -> list[dict[str, Any]]:
    facts = (dict(zip(FACTS_FIELDS, f, strict=True))
             for f in facts_for_rows(rows, IS_COOP, window_ms))
    return sorted(({k: v for k, v in f.items() if k != "window_count"} for f in facts),
                  key=_key)


def _no_window(facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in f.items() if k != "window_count"} for f in facts]


def vectorised(rows: list[JournalRow], window_ms: int) -> list[dict[str, Any]]:
    return sorted(_no_window(facts_for_chunk(input_table(rows), IS_COOP, window_ms)
                             .to_pylist()), key=_key)


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
    got = _no_window([r for c in chunks for r in facts_for_chunk(c, IS_COOP, 2_000).to_pylist()])
    by_group = sorted(rows, key=lambda r: (r.source, r.group_id, r.journal_id))
    assert sorted(got, key=_key) == reference(by_group, 2_000)


def test_an_empty_partition_gives_no_chunk() -> None:
    assert list(facts_mod.partition_chunks(iter([]))) == []


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
