"""The chaos checker itself: each invariant fails on a ledger that breaks it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger import (
    INFINITY,
    CheckResult,
    Owner,
    check_converged,
    check_drained,
    check_durability,
    check_durability_floor,
    check_exclusive,
    check_fencing,
    check_standbys,
    commits_of,
    converged_since,
    first_stable_convergence,
    ownership_intervals,
    raw_intervals,
    read_ledger,
    reordered_commits,
)

A: Owner = ("w-a", 0)
B: Owner = ("w-b", 0)
R = ["orders", 0]


def ev(t: float, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "ev": kind, **fields}


def test_hand_over_after_revoke_is_fine_and_overlap_is_caught() -> None:
    events = {A: [ev(1, "assigned", res=[R]), ev(5, "revoked", res=[R]), ev(9, "exit")],
              B: [ev(5.5, "assigned", res=[R]), ev(9, "revoked", res=[R]), ev(9.1, "exit")]}
    intervals = ownership_intervals(events, {})
    assert check_exclusive(intervals) == []
    events[B][0] = ev(4.9, "assigned", res=[R])
    problems = check_exclusive(ownership_intervals(events, {}))
    assert len(problems) == 1 and "orders[0]" in problems[0] and "0.100s overlap" in problems[0]


def test_same_owner_reassigned_is_not_an_overlap() -> None:
    events = {A: [ev(1, "assigned", res=[R]), ev(2, "assigned", res=[R]),
                  ev(3, "lost", res=[R]), ev(4, "exit")]}
    assert check_exclusive(ownership_intervals(events, {})) == []


def test_safety_deadline_ends_a_frozen_owners_interval() -> None:
    # A is SIGSTOPped at ~2: its last deadline (3.5) passes while frozen; it
    # runs on_lost only at 6, after B took over at 4.
    a = [ev(1, "assigned", res=[R]), ev(1.1, "deadline", until=2.5),
         ev(1.6, "deadline", until=3.5), ev(6, "deadline", until=None),
         ev(6, "lost", res=[R]), ev(7, "exit")]
    b = [ev(4, "assigned", res=[R]), ev(7, "revoked", res=[R]), ev(7.1, "exit")]
    frozen = {A: [(2.0, 6.0)]}
    intervals = ownership_intervals({A: a, B: b}, {}, frozen)
    mine = [iv for iv in intervals if iv.owner == A]
    assert [(iv.end, iv.why) for iv in mine] == [(3.5, "deadline")]
    assert check_exclusive(intervals) == []
    # Had B started before A's deadline, that is a violation.
    b[0] = ev(3.0, "assigned", res=[R])
    assert len(check_exclusive(ownership_intervals({A: a, B: b}, {}, frozen))) == 1
    # Not frozen: A's own on_lost (at 6) is what counts.
    b[0] = ev(4, "assigned", res=[R])
    assert len(check_exclusive(ownership_intervals({A: a, B: b}, {}))) == 1


def test_a_renewal_logged_late_is_dated_by_its_answer() -> None:
    # The heartbeat sent at 2.0 was answered at 2.95, before the old deadline
    # (3.0); the poller only logged the new deadline (3.5) at 3.01.
    a = [ev(0, "start", session_timeout_ms=1500), ev(1, "assigned", res=[R]),
         ev(1.1, "deadline", until=3.0),
         ev(2.95, "call", api="heartbeat", sent=2.0, error=None),
         ev(3.01, "deadline", until=3.5), ev(3.4, "revoked", res=[R]), ev(4, "exit")]
    frozen = {A: [(2.9, 3.005)]}
    intervals = ownership_intervals({A: a}, {}, frozen)
    assert [(iv.end, iv.why) for iv in intervals] == [(3.4, "revoked")]
    # Without the call record the late log looks like an expiry at 3.0.
    late = [e for e in a if e["ev"] != "call"]
    assert [iv.why for iv in ownership_intervals({A: late}, {}, frozen)] == ["deadline"]


def test_a_suspended_deadline_does_not_end_ownership() -> None:
    # ``until: null`` (a join in flight): the member's rule does not expire it.
    a = [ev(1, "assigned", res=[R]), ev(1.1, "deadline", until=None),
         ev(6, "revoked", res=[R]), ev(7, "exit")]
    b = [ev(4, "assigned", res=[R]), ev(8, "exit")]
    assert len(check_exclusive(ownership_intervals({A: a, B: b}, {}))) == 1


def test_death_ends_ownership() -> None:
    a = [ev(1, "assigned", res=[R]), ev(1.5, "deadline", until=9.0)]
    b = [ev(4, "assigned", res=[R]), ev(8, "revoked", res=[R]), ev(8.5, "exit")]
    intervals = ownership_intervals({A: a, B: b}, {A: 3.0})
    assert [(iv.end, iv.why) for iv in intervals if iv.owner == A] == [(3.0, "killed")]
    assert check_exclusive(intervals) == []
    # Without the kill, A (still running, deadline 9) overlaps B.
    assert len(check_exclusive(ownership_intervals({A: a, B: b}, {}))) == 1


def test_convergence_needs_each_resource_exactly_once() -> None:
    r1, r2 = ("orders", 0), ("orders", 1)
    events = {A: [ev(1, "assigned", res=[list(r1)]), ev(20, "exit")],
              B: [ev(1, "assigned", res=[list(r2)]), ev(20, "exit")]}
    groups = {A: "g", B: "g"}
    intervals = ownership_intervals(events, {})
    assert check_converged(intervals, 10, {"g": {r1, r2}}, groups) == []
    missing = check_converged(intervals, 10, {"g": {r1, r2, ("orders", 2)}}, groups)
    assert len(missing) == 1 and "orders[2] has 0 owners" in missing[0]
    extra = check_converged(intervals, 10, {"g": {r1}}, groups)
    assert len(extra) == 1 and "outside the catalog" in extra[0]
    events[B].insert(0, ev(2, "assigned", res=[list(r1)]))
    double = check_converged(ownership_intervals(events, {}), 10, {"g": {r1, r2}}, groups)
    assert any("has 2 owners" in p for p in double)


def test_convergence_time_is_when_ownership_became_and_stayed_exactly_once() -> None:
    r1, r2 = ("orders", 0), ("orders", 1)
    groups = {A: "g", B: "g"}
    expected = {"g": {r1, r2}}
    events = {A: [ev(1, "assigned", res=[list(r1)]), ev(30, "exit")],
              B: [ev(3, "assigned", res=[list(r2)]), ev(4, "lost", res=[list(r2)]),
                  ev(6, "assigned", res=[list(r2)]), ev(30, "exit")]}
    intervals = ownership_intervals(events, {})
    assert converged_since(intervals, 0, 20, expected, groups) == 6
    assert converged_since(intervals, 7, 20, expected, groups) == 7
    events[B] = [ev(3, "assigned", res=[list(r2)]), ev(15, "lost", res=[list(r2)]),
                 ev(30, "exit")]
    disturbed = ownership_intervals(events, {})
    assert converged_since(disturbed, 0, 20, expected, groups) is None
    # It did converge at 3 and held for 12 s; the loss at 15 is one disturbance.
    assert first_stable_convergence(disturbed, 0, 20, expected, groups, 1.5) == (3, 1)
    assert first_stable_convergence(disturbed, 0, 20, expected, groups, 15) == (None, 0)


def _commit(t_sent: float, t: float, value: int, outcome: str) -> dict[str, Any]:
    return ev(t, "commit", sent=t_sent, res=[R], value=value, outcome=outcome,
              member="m", gen=1)


def test_a_zombie_commit_must_be_refused() -> None:
    a = [ev(1, "assigned", res=[R]), ev(1.1, "deadline", until=2.0),
         _commit(3.0, 3.1, 30, "refused"), ev(3.2, "lost", res=[R]), ev(4, "exit")]
    b = [ev(2.5, "assigned", res=[R]), ev(9, "exit")]
    events = {A: a, B: b}
    result = CheckResult()
    intervals = ownership_intervals(events, {})
    assert check_fencing(intervals, commits_of(events), result) == []
    assert (result.zombie_commits, result.zombie_commits_refused) == (1, 1)
    a[2] = _commit(3.0, 3.1, 30, "ok")
    result = CheckResult()
    problems = check_fencing(intervals, commits_of(events), result)
    assert len(problems) == 1 and "zombie commit acknowledged" in problems[0]


def test_acknowledged_checkpoints_must_survive_a_crash() -> None:
    a = [ev(1, "assigned", res=[R]), _commit(1.0, 1.1, 10, "ok"),
         _commit(2.0, 2.1, 20, "ok"), ev(2.9, "send", sent=2.9, res=[R], value=29)]
    commits = commits_of({A: a})
    key = ("orders", 0)
    assert check_durability(commits, 3.0, {key: 20}, final=True) == []
    # A commit in flight at the crash may or may not have been stored.
    assert check_durability(commits, 3.0, {key: 29}, final=True) == []
    lost = check_durability(commits, 3.0, {}, final=False)
    assert len(lost) == 1 and "lost" in lost[0]
    older = check_durability(commits, 3.0, {key: 10}, final=False)
    assert len(older) == 1 and "superseded" in older[0]
    # Before the second ack, the first value is enough.
    assert check_durability(commits, 1.5, {key: 10}, final=False) == []
    invented = check_durability(commits, 3.0, {key: 25}, final=True)
    assert any("never committed" in p for p in invented)
    # A refused commit's value must never be what is stored.
    refused = commits_of({A: [*a, _commit(4.0, 4.1, 40, "refused")]})
    assert any("never committed" in p
               for p in check_durability(refused, 3.0, {key: 40}, final=True))


def test_concurrent_commits_of_one_owner_are_unordered() -> None:
    # Two commits in flight at once (the work loop's and on_revoked's): the
    # later-sent one is answered first, so either value may be the last applied.
    a = [ev(1, "assigned", res=[R]), _commit(2.0, 2.3, 20, "ok"), _commit(2.1, 2.2, 21, "ok")]
    commits = commits_of({A: a})
    key = ("orders", 0)
    assert check_durability(commits, 3.0, {key: 20}, final=True) == []
    assert check_durability(commits, 3.0, {key: 21}, final=True) == []
    assert reordered_commits(commits) == 1
    # A commit sent after both were answered supersedes them.
    later = commits_of({A: [*a, _commit(2.5, 2.6, 25, "ok")]})
    assert check_durability(later, 3.0, {key: 20}, final=True) != []
    assert reordered_commits(later) == 1


def test_read_ledger_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps(ev(1, "start")) + "\n" + '{"t": 2, "ev": "assi')
    assert read_ledger(path) == [ev(1, "start")]
    assert INFINITY > 1e300


def test_floor_durability_after_a_database_restart() -> None:
    # Acknowledged 100 then 200 before the stop at 5; a later commit (300) may
    # already be stored when the harness reads: fine. Below 200, or nothing: lost.
    events = {A: [ev(1, "assigned", res=[R]),
                  ev(2, "commit", sent=1.9, res=[R], value=100, outcome="ok"),
                  ev(3, "commit", sent=2.9, res=[R], value=200, outcome="ok"),
                  ev(6, "commit", sent=5.9, res=[R], value=300, outcome="ok")]}
    commits = commits_of(events)
    assert check_durability_floor(commits, 5.0, {("orders", 0): 200}) == []
    assert check_durability_floor(commits, 5.0, {("orders", 0): 300}) == []
    low = check_durability_floor(commits, 5.0, {("orders", 0): 100})
    assert len(low) == 1 and "below the acknowledged 200" in low[0]
    assert len(check_durability_floor(commits, 5.0, {})) == 1
    # Only what was answered before the stop counts.
    assert check_durability_floor(commits, 2.5, {("orders", 0): 100}) == []


def _paused_run(tmp_path: Path, commit_url: str) -> list[str]:
    """A run whose one worker's commit, sent at 2.0, was acknowledged by
    ``commit_url``, while coordinator 0 at http://c0 was stopped from 1.5 to 3.0."""
    from harness import ChaosConfig, Pause, Run, Slot

    config = ChaosConfig.multi(3, groups=(("coop", "cooperative-sticky"),),
                               catalog=(("orders", 1),))
    run = Run(0, tmp_path, config)
    slot = Slot("coop-0", "coop", "cooperative-sticky", None, tmp_path / "ledger-coop-0.jsonl",
                tmp_path / "worker-coop-0.log")
    run.slots[slot.name] = slot
    base = {"w": "coop-0", "inc": 0}
    lines = [ev(0.9, "start", session_timeout_ms=4000, **base),
             ev(1.0, "assigned", res=[R], member="m", gen=1, **base),
             ev(2.0, "send", sent=2.0, res=[R], value=7, member="m", gen=1, **base),
             ev(2.9, "call", api="commit", sent=2.0, error=None, gen=1, url=commit_url,
                **base),
             ev(2.9, "commit", sent=2.0, res=[R], value=7, outcome="ok", member="m", gen=1,
                **base)]
    slot.ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run.pauses.append(Pause(0, "http://c0", 1.5, {}, 3.0))
    violations, _ = run.check(0.5, 20.0, 20.5, {"orders": 1}, 30.0)
    return violations


def test_a_commit_acknowledged_by_a_paused_coordinator_is_a_violation(tmp_path: Path) -> None:
    assert _paused_run(tmp_path, "http://c1") == []  # acknowledged by the new owner
    problems = _paused_run(tmp_path, "http://c0")
    assert len(problems) == 1 and "while it was stopped" in problems[0], problems


def test_several_coordinators_config_refuses_what_it_cannot_play() -> None:
    import pytest
    from harness import ChaosConfig

    with pytest.raises(ValueError, match="proxy faults"):
        ChaosConfig(coordinators=3, session_timeout_ms=4000)  # default weights: latency...
    with pytest.raises(ValueError, match="lease_ms 2000 is too long"):
        ChaosConfig.multi(3, lease_ms=2000)
    with pytest.raises(ValueError, match="only with several coordinators"):
        ChaosConfig(weights=(("pause_coordinator", 1.0),))
    assert ChaosConfig.multi(3).convergence_s == 11.2


R2 = ["orders", 1]


def test_a_standby_is_not_ownership() -> None:
    # B warms R up from 2 to 3, owns it from 5 (after A revoked it at 4.5):
    # the warm-up is no overlap, and the group converges on A alone before 4.5.
    a = [ev(1, "assigned", res=[R]), ev(4.5, "revoked", res=[R]), ev(9, "exit")]
    b = [ev(2, "standby", res=[R]), ev(3, "warm", res=[R]), ev(5, "assigned", res=[R]),
         ev(9, "exit")]
    events = {A: a, B: b}
    intervals = ownership_intervals(events, {})
    assert check_exclusive(intervals) == []
    assert {(iv.owner, iv.start) for iv in intervals} == {(A, 1), (B, 5)}
    group_of = {A: "g", B: "g"}
    assert converged_since(intervals, 1.5, 4.0, {"g": {("orders", 0)}}, group_of) == 1.5
    result = CheckResult()
    assert check_standbys(events, raw_intervals(events, {}), commits_of(events), result) == []
    assert (result.standbys, result.warmups_done) == (1, 1)


def test_a_standby_of_an_owned_resource_is_caught() -> None:
    a = [ev(1, "assigned", res=[R, R2]), ev(2, "standby", res=[R]), ev(9, "exit")]
    problems = check_standbys({A: a}, raw_intervals({A: a}, {}), [], CheckResult())
    assert len(problems) == 1 and "as standby" in problems[0] and "orders', 0" in problems[0]


def test_a_commit_of_a_standby_is_caught() -> None:
    # B commits R while it is only its standby: acted on without owning it.
    b = [ev(1, "assigned", res=[R2]), ev(2, "standby", res=[R]), _commit(2.5, 2.6, 25, "ok"),
         ev(9, "exit")]
    problems = check_standbys({B: b}, raw_intervals({B: b}, {}), commits_of({B: b}),
                              CheckResult())
    assert len(problems) == 1 and "orders[0] (a standby)" in problems[0]
    # Refused by the library before sending: nothing was acted on.
    b[2] = _commit(2.5, 2.6, 25, "local")
    assert check_standbys({B: b}, raw_intervals({B: b}, {}), commits_of({B: b}),
                          CheckResult()) == []
    # Once owned (the standby became an assignment), its commits are the owner's.
    b[2:3] = [ev(2.4, "assigned", res=[R]), _commit(2.5, 2.6, 25, "ok")]
    assert check_standbys({B: b}, raw_intervals({B: b}, {}), commits_of({B: b}),
                          CheckResult()) == []


def test_a_drained_worker_must_own_nothing() -> None:
    a = [ev(1, "assigned", res=[R, R2]), ev(2, "drain"), ev(3, "revoked", res=[R, R2]),
         ev(3.5, "drained", ok=True, owned=[]), ev(3.6, "exit")]
    result = CheckResult()
    assert check_drained({A: a}, raw_intervals({A: a}, {}), result) == []
    assert (result.drains, result.drains_done, result.drains_timed_out) == (1, 1, 0)
    # Revoked only in part: what is left is still owned when drain() returned True.
    a[2] = ev(3, "revoked", res=[R])
    problems = check_drained({A: a}, raw_intervals({A: a}, {}), CheckResult())
    assert len(problems) == 1 and "still owned [('orders', 1)]" in problems[0]
    # The worker's own report counts too.
    a[2:4] = [ev(3, "revoked", res=[R, R2]), ev(3.5, "drained", ok=True, owned=[R2])]
    assert len(check_drained({A: a}, raw_intervals({A: a}, {}), CheckResult())) == 1
    # A drain that timed out gave the rest up the way close() does: not judged here.
    a[3] = ev(3.5, "drained", ok=False, owned=[R2])
    result = CheckResult()
    assert check_drained({A: a}, raw_intervals({A: a}, {}), result) == []
    assert result.drains_timed_out == 1
