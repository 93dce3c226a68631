"""Per-group health (coordinator/core/health.py): STORM, REWIND, STALLED, OK."""

from __future__ import annotations

from coordinator.core.records import Snapshot
from tests.core.coretest_kit import G, Harness, reply


def health(h: Harness) -> tuple[str, tuple[str, ...]]:
    found = h.coord.health(G, h.now)
    return found.status, found.reasons


def test_a_quiet_group_is_ok_and_an_unknown_one_too() -> None:
    h = Harness()
    h.stable_group(2)
    assert health(h) == ("OK", ())
    assert h.coord.health("nobody", h.now).status == "OK"


def test_rebalances_within_the_window_make_a_storm_that_passes() -> None:
    h = Harness(health_storm_rebalances=3, health_window_ms=60_000)
    (a,), _ = h.stable_group(1)        # rebalance 1: the member joins
    assert health(h)[0] == "OK"
    h.leave((a, None))                 # rebalance 2: it leaves (the group rebalances)
    assert health(h)[0] == "OK"
    h.advance(1_000)
    (a,), _ = h.stable_group(1)        # rebalance 3: and comes back
    status, reasons = health(h)
    assert status == "STORM" and "in the last 60 s" in reasons[0]
    h.advance(61_000)
    assert health(h)[0] == "OK"


def test_an_integer_checkpoint_going_back_is_a_rewind() -> None:
    h = Harness(health_window_ms=60_000)
    rid, out = h.commit("tool", -1, [("s", 0, 100), ("s", 1, "text")])
    assert reply(out, rid).error is None
    h.commit("tool", -1, [("s", 0, 150), ("s", 1, "abc")])     # forward; text ignored
    assert health(h)[0] == "OK"
    h.commit("tool", -1, [("s", 0, 90)])
    status, reasons = health(h)
    assert status == "REWIND" and "s[0] went from 150 back to 90" in reasons[0]
    h.advance(61_000)
    assert health(h)[0] == "OK"


def test_members_that_stop_committing_are_stalled() -> None:
    h = Harness(health_stall_ms=30_000)
    h.put_resource("s", 2)
    (a,), generation = h.stable_group(1, session=120_000)
    h.advance(40_000)
    h.heartbeat(a, generation)
    assert health(h)[0] == "OK"                   # never committed: it keeps no checkpoints
    h.commit(a, generation, [("s", 0, 1)])
    h.advance(20_000)
    h.heartbeat(a, generation)
    assert health(h)[0] == "OK"
    h.advance(20_000)
    h.heartbeat(a, generation)
    status, reasons = health(h)
    assert status == "STALLED" and "no checkpoint committed for 40 s" in reasons[0]
    h.commit(a, generation, [("s", 0, 2)])
    assert health(h)[0] == "OK"


def test_the_most_urgent_status_wins_and_every_reason_is_listed() -> None:
    h = Harness(health_storm_rebalances=1, health_window_ms=60_000)
    h.put_resource("s", 2)
    (a,), generation = h.stable_group(1)
    h.commit(a, generation, [("s", 0, 5)])
    h.commit(a, generation, [("s", 0, 4)])
    status, reasons = health(h)
    assert status == "STORM" and len(reasons) == 2 and "went from 5 back to 4" in reasons[1]


def test_after_a_restart_the_last_commit_comes_from_storage() -> None:
    h = Harness(health_stall_ms=30_000)
    h.restore_from(Snapshot(checkpoints={G: {("s", 0): 1}}, last_commit_ms={G: h.now - 40_000}))
    assert health(h)[0] == "OK"        # no members: nobody is failing to make progress
    h.stable_group(1)
    status, reasons = health(h)
    assert status == "STALLED" and "for 40 s" in reasons[0]
