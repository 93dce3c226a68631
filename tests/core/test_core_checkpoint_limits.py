"""Checkpoints are bounded.

- ``resources`` groups: a set outside the catalog or an index beyond its
  partitions is ``INVALID_REQUEST`` naming the field; deletes always pass.
- every group: a value over ``max_checkpoint_value_bytes`` is ``INVALID_REQUEST``;
  a commit that would take the group over ``max_checkpoints_per_group`` or
  ``max_checkpoint_bytes_per_group`` is ``CHECKPOINT_LIMIT_REACHED``. Either way
  the whole commit is refused and nothing changes (no write, no group created,
  no session re-armed).
- a fetch answers at most ``MAX_FETCH_CHECKPOINTS``; more are read in pages.
"""

from __future__ import annotations

import time

from coretest_kit import G, Harness, persisted, reply
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.checkpoint_store import CheckpointStore
from coordinator.core.records import CheckpointsWritten
from coordinator.core.replay import fold
from protocol.errors import ErrorCode
from protocol.limits import MAX_FETCH_CHECKPOINTS
from protocol.messages import FetchRequest
from protocol.validate import checkpoint_size


def _stable(h: Harness, partitions: int = 4) -> tuple[str, int]:
    h.put_resource("orders", partitions)
    (member,), generation = h.stable_group(1)
    return member, generation


def test_a_resources_group_refuses_sets_outside_the_catalog() -> None:
    h = Harness()
    member, generation = _stable(h)
    rid, out = h.commit(member, generation, [("orders", 0, 1), ("junk", 0, 1)])
    answer = reply(out, rid)
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert answer.message == "checkpoints[1][0]: resource set 'junk' is not in the catalog"
    assert persisted(out) == [] and h.coord.checkpoints(G) == {}
    assert not [e for e in out if type(e).__name__ == "ScheduleTimer"]


def test_a_resources_group_refuses_indexes_beyond_the_partitions() -> None:
    h = Harness()
    member, generation = _stable(h, partitions=4)
    rid, out = h.commit(member, generation, [("orders", 3, 1), ("orders", 4, 1)])
    answer = reply(out, rid)
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert answer.message == ("checkpoints[1][1]: index 4 is beyond resource set 'orders' "
                              "(4 partitions: 0..3)")
    assert persisted(out) == [] and h.coord.checkpoints(G) == {}
    rid, out = h.commit(member, generation, [("orders", 3, 1)])
    assert reply(out, rid).error is None


def test_deletes_pass_even_for_sets_no_longer_in_the_catalog() -> None:
    h = Harness()
    member, generation = _stable(h, partitions=4)
    h.commit(member, generation, [("orders", 3, 1)])
    h.put_resource("orders", 2)  # shrunk: index 3 is gone
    rid, out = h.commit(member, generation, [("orders", 3, 2)])
    assert reply(out, rid).error is ErrorCode.INVALID_REQUEST
    rid, out = h.commit(member, generation, [("orders", 3, None)])
    assert reply(out, rid).error is None and h.coord.checkpoints(G) == {}


def test_simple_commits_to_a_group_without_a_protocol_type_take_any_set() -> None:
    h = Harness()
    rid, out = h.commit("tool", -1, [("anything", 10**6, 1)], group="offsets-only")
    assert reply(out, rid).error is None


def test_a_value_over_the_limit_is_refused_and_creates_nothing() -> None:
    h = Harness(max_checkpoint_value_bytes=8)
    rid, out = h.commit("tool", -1, [("s", 0, "12345678"), ("s", 1, "é" * 5)], group="new")
    answer = reply(out, rid)
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert answer.message == ("checkpoints[1][2]: a value of 10 bytes is over "
                              "--max-checkpoint-value-bytes (8)")
    assert out == [out[-1]] and h.coord.describe_group("new") is None
    rid, out = h.commit("tool", -1, [("s", 0, b"12345678"), ("s", 1, 2**62)], group="new")
    assert reply(out, rid).error is None


def test_the_count_cap_refuses_the_whole_commit_and_changes_nothing() -> None:
    h = Harness(max_checkpoints_per_group=10)
    member, generation = _stable(h, partitions=20)
    rid, out = h.commit(member, generation, [("orders", i, i) for i in range(8)])
    assert reply(out, rid).error is None
    before = h.coord.checkpoints(G)
    session = h.timers[f"session:{G}:{member}"]
    h.advance(1_000)
    rid, out = h.commit(member, generation, [("orders", i, -i) for i in range(5, 11)])
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert answer.message == (f"group {G!r} would hold 11 checkpoints, over "
                              "--max-checkpoints-per-group (10); nothing was written")
    assert out == [out[-1]]  # no write, no session re-arm: only the answer
    assert h.coord.checkpoints(G) == before and h.timers[f"session:{G}:{member}"] == session
    # Overwriting, deleting and filling up to the cap exactly all pass.
    rid, out = h.commit(member, generation, [("orders", 0, None)] +
                        [("orders", i, 0) for i in range(1, 11)])
    assert reply(out, rid).error is None and len(h.coord.checkpoints(G)) == 10


def test_the_byte_cap_counts_names_indexes_and_values() -> None:
    size = checkpoint_size("s", b"x" * 100)
    assert size == 1 + 8 + 100
    h = Harness(max_checkpoint_bytes_per_group=3 * size)
    rid, out = h.commit("tool", -1, [("s", i, b"x" * 100) for i in range(3)])
    assert reply(out, rid).error is None
    rid, out = h.commit("tool", -1, [("s", 0, b"x" * 101)])
    answer = reply(out, rid)
    assert answer.error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert f"would hold {3 * size + 1} bytes" in answer.message
    rid, out = h.commit("tool", -1, [("s", 0, b"x" * 99)])
    assert reply(out, rid).error is None


def test_a_new_group_over_a_cap_is_not_created() -> None:
    h = Harness(max_checkpoints_per_group=2)
    rid, out = h.commit("tool", -1, [("s", i, 1) for i in range(3)], group="new")
    assert reply(out, rid).error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    assert out == [out[-1]] and h.coord.describe_group("new") is None


def test_a_group_over_a_lowered_cap_may_still_shrink() -> None:
    h = Harness()
    h.commit("tool", -1, [("s", i, 1) for i in range(5)], group="big")
    lowered = Harness(max_checkpoints_per_group=3)
    lowered.now = h.now
    lowered.restore_from(fold(h.records))
    rid, out = lowered.commit("tool", -1, [("s", 9, 1)], group="big")
    assert reply(out, rid).error is ErrorCode.CHECKPOINT_LIMIT_REACHED
    rid, out = lowered.commit("tool", -1, [("s", 0, None), ("s", 1, 2)], group="big")
    assert reply(out, rid).error is None
    assert len(lowered.coord.checkpoints("big")) == 4


# ---------------------------------------------------------------- fetch pages


def _fill(h: Harness, n: int, group: str = "big") -> list[tuple[str, int, int]]:
    everything = sorted((f"set-{i % 3}", i, i) for i in range(n))
    for start in range(0, n, 5_000):
        rid, out = h.commit("tool", -1, everything[start:start + 5_000], group=group)
        assert reply(out, rid).error is None
    return everything


def _fetch(h: Harness, request: FetchRequest) -> object:
    from coordinator.core.commands import Fetch
    rid = h.rid()
    return reply(h.run(Fetch(rid, request)), rid)


def test_a_big_group_is_fetched_in_pages() -> None:
    h = Harness()
    everything = _fill(h, 2 * MAX_FETCH_CHECKPOINTS + 500)
    pages = []
    request = FetchRequest("big", paged=True)
    while True:
        answer = _fetch(h, request)
        assert answer.error is None and len(answer.checkpoints) <= MAX_FETCH_CHECKPOINTS
        pages.append(answer.checkpoints)
        if answer.next is None:
            break
        assert answer.next == answer.checkpoints[-1][:2]
        request = FetchRequest("big", paged=True, after=answer.next)
    assert [len(p) for p in pages] == [MAX_FETCH_CHECKPOINTS, MAX_FETCH_CHECKPOINTS, 500]
    assert [c for page in pages for c in page] == everything


def test_a_v1_fetch_of_a_big_group_is_refused_and_a_small_one_answered_whole() -> None:
    h = Harness()
    _fill(h, MAX_FETCH_CHECKPOINTS + 1)
    answer = _fetch(h, FetchRequest("big"))
    assert answer.error is ErrorCode.INVALID_REQUEST
    assert "read them in pages: send after: []" in answer.message
    small = _fill(h, MAX_FETCH_CHECKPOINTS, group="small")
    answer = _fetch(h, FetchRequest("small"))
    assert answer.error is None and list(answer.checkpoints) == small and answer.next is None


def test_pages_follow_changes_between_calls() -> None:
    h = Harness()
    _fill(h, 1_500)
    first = _fetch(h, FetchRequest("big", paged=True))
    cursor = first.next
    # The cursor's own checkpoint goes and one before it comes: the next page
    # starts right after the cursor all the same.
    h.commit("tool", -1, [(cursor[0], cursor[1], None), ("a-set", 0, 5)], group="big")
    second = _fetch(h, FetchRequest("big", paged=True, after=cursor))
    assert second.checkpoints[0][:2] > cursor and second.next is None
    assert len(first.checkpoints) == 1_000 and len(second.checkpoints) == 500
    assert ("a-set", 0, 5) not in second.checkpoints


def test_a_page_of_a_full_group_takes_a_few_milliseconds() -> None:
    h = Harness()
    _fill(h, 100_000)
    request = FetchRequest("big", paged=True, after=("set-1", 50_000))
    started = time.perf_counter()
    for _ in range(10):
        answer = _fetch(h, request)
    per_page_ms = (time.perf_counter() - started) * 100
    assert len(answer.checkpoints) == MAX_FETCH_CHECKPOINTS
    # (measured ~0.5 ms; the bound leaves room for a busy machine)
    assert per_page_ms < 20, per_page_ms


# ---------------------------------------------------------------- the store


_KEYS = st.tuples(st.sampled_from(["a", "b", "é"]), st.integers(0, 60))
_VALUES = st.one_of(st.none(), st.integers(), st.binary(max_size=4), st.text(max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_KEYS, _VALUES), max_size=80), max_size=6))
def test_the_store_matches_a_plain_dict(commits: list[list[tuple[tuple[str, int], object]]]
                                        ) -> None:
    store = CheckpointStore()
    model: dict[tuple[str, int], object] = {}
    for changes in commits:
        expected = dict(model)
        for key, value in changes:
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        plan = store.plan((s, i, v) for (s, i), v in changes)  # type: ignore[misc]
        assert (plan.total, plan.nbytes) == (
            len(expected), sum(checkpoint_size(k[0], v) for k, v in expected.items()))  # type: ignore[arg-type]
        store.apply(plan)
        model = expected
        assert store.values == model and list(store) == sorted(model)
        assert store.nbytes == sum(checkpoint_size(k[0], v) for k, v in model.items())  # type: ignore[arg-type]
        page, cursor = store.page(None, 7)
        assert page == [(s, i, model[(s, i)]) for s, i in sorted(model)[:7]]
        assert cursor == (sorted(model)[6] if len(model) > 7 else None)


def test_commits_are_written_whole_after_the_checks() -> None:
    h = Harness()
    rid, out = h.commit("tool", -1, [("s", 0, 1), ("s", 0, None), ("s", 1, 2)])
    assert reply(out, rid).error is None
    assert next(r for r in persisted(out) if isinstance(r, CheckpointsWritten)).checkpoints == (
        ("s", 0, 1), ("s", 0, None), ("s", 1, 2))
    assert h.coord.checkpoints(G) == {("s", 1): 2}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_KEYS, _VALUES), max_size=80), max_size=6),
       st.integers(1, 6))
def test_chunked_keys_stay_sorted_and_page_through_everything(
        commits: list[list[tuple[tuple[str, int], object]]], chunk: int) -> None:
    """Chunks of a few keys, so commits split, merge and empty them."""
    store = CheckpointStore(chunk=chunk)
    model: dict[tuple[str, int], object] = {}
    for changes in commits:
        for key, value in changes:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        store.apply(store.plan((s, i, v) for (s, i), v in changes))  # type: ignore[misc]
        assert list(store) == sorted(model)
        pages: list[tuple[str, int]] = []
        after = None
        while True:
            page, after = store.page(after, 5)
            pages += [(s, i) for s, i, _ in page]
            assert len(page) == 5 or after is None
            if after is None:
                break
        assert pages == sorted(model)
        rebuilt = CheckpointStore(dict(model), chunk=chunk)  # type: ignore[arg-type]
        assert list(rebuilt) == sorted(model)


class _Index(int):
    """An index that counts the work done with it: each comparison for equality
    (a sorted search or merge compares the set names, then the indexes) and each
    hash (a dict or set lookup)."""

    work = 0

    def __eq__(self, other: object) -> bool:
        _Index.work += 1
        return int(self) == other

    def __hash__(self) -> int:
        _Index.work += 1
        return hash(int(self))


def _work_of_a_commit(held: int, changes: list[tuple[str, int, object]]) -> int:
    store = CheckpointStore()
    store.apply(store.plan(("s", _Index(2 * i), 1) for i in range(held)))
    _Index.work = 0
    store.apply(store.plan(changes))  # type: ignore[arg-type]
    return _Index.work


def test_a_commits_work_does_not_grow_with_what_the_group_holds() -> None:
    """A commit of 100 new keys, or of 100 deletes, spread over the group: the work
    is about the same in a group of 1,000 and one of 100,000 (one sorted list made
    it ~100 times more: a re-sort, or a filter, of every key)."""
    def added(held: int) -> list[tuple[str, int, object]]:
        return [("s", _Index(2 * (held // 100) * j + 1), 1) for j in range(100)]

    def deleted(held: int) -> list[tuple[str, int, object]]:
        return [("s", _Index(2 * (held // 100) * j), None) for j in range(100)]

    for changes in (added, deleted):
        small = _work_of_a_commit(1_000, changes(1_000))
        large = _work_of_a_commit(100_000, changes(100_000))
        assert large < 3 * small, (changes.__name__, small, large)
