"""KIP-211 retention: an Empty group and its checkpoints go ``group_retention_ms`` after
it became Empty (after its last commit, for a group that never formed a generation)."""

from __future__ import annotations

from typing import Any

import pytest
from coretest_kit import (
    G,
    Harness,
    cancelled,
    persisted,
    reply,
    scheduled,
    transitions,
)

from coordinator.config import resolve
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import GroupStateChanged, Persist, ScheduleTimer
from coordinator.core.records import CheckpointsWritten, GroupDeleted, GroupRecord, Snapshot
from coordinator.core.replay import fold
from protocol.errors import ErrorCode

R = 3_600_000  # one hour: short enough to read, far beyond every session in these tests
KEY = f"retention:{G}"


def _emptied(h: Harness) -> None:
    """A group that formed a generation, holds checkpoints, and whose members all left."""
    ids, generation = h.stable_group(2)
    h.put_resource("orders", 2)
    h.commit(ids[0], generation, [("orders", 0, 41), ("orders", 1, 42)])
    _rid, out = h.leave((ids[0], None), (ids[1], None))
    assert h.state() == "Empty"
    assert ("PreparingRebalance", "Empty", "all_members_left") in transitions(out)
    assert scheduled(out)[KEY] == h.now + R


def _restarted(h: Harness, *, at: int, snapshot: Snapshot | None = None,
               **config: Any) -> Harness:
    """A fresh coordinator restored, at time ``at``, from what ``h`` persisted."""
    config.setdefault("group_retention_ms", h.config.group_retention_ms)
    fresh = Harness(**config)
    fresh.now = at
    fresh._rid = h._rid + 1000
    fresh._mid = h._mid + 1000
    fresh.restore_from(fold(h.records) if snapshot is None else snapshot)
    return fresh


def test_an_empty_group_and_its_checkpoints_go_when_retention_runs_out() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    emptied_at = h.now
    assert h.advance(R - 1) == []
    assert h.state() == "Empty" and h.coord.checkpoints(G)
    out = h.advance(1)
    assert h.now == emptied_at + R
    # Durably deleted (the same record as an admin delete), then gone from memory,
    # with one state-change log line.
    assert persisted(out) == [GroupDeleted(G)]
    changes = [e for e in out if isinstance(e, GroupStateChanged)]
    assert changes == [GroupStateChanged(G, "Empty", "Dead", 2, "retention_expired")]
    assert h.coord.describe_group(G) is None
    assert h.coord.list_groups() == []
    assert h.coord.state_counts()["Empty"] == 0
    assert KEY not in h.timers


def test_checkpoint_fetch_after_expiry_answers_nothing() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    rid, out = h.fetch()
    assert reply(out, rid).checkpoints == (("orders", 0, 41), ("orders", 1, 42))
    h.advance(R)
    rid, out = h.fetch()
    assert reply(out, rid).error is None and reply(out, rid).checkpoints == ()
    rid, out = h.fetch([("orders", 0)])
    assert reply(out, rid).checkpoints == ()


def test_a_member_joining_before_expiry_cancels_it() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    first_deadline = h.timers[KEY]
    h.advance(R // 2)
    joined_at = h.now
    _member_id, _rid, out = h.join_dynamic()
    assert h.state() == "CompletingRebalance"
    assert KEY in cancelled(out) and KEY not in h.timers
    # The member never syncs nor heartbeats: it is removed and the group is
    # Empty again, its retention starting over from that moment.
    out = h.advance(30_000)
    assert h.state() == "Empty"
    emptied = [i for i, e in enumerate(out) if isinstance(e, GroupStateChanged)
               and e.new_state == "Empty"]
    assert len(emptied) == 1
    new_deadline = scheduled(out)[KEY]
    assert out[emptied[0] + 1:].count(ScheduleTimer(KEY, new_deadline)) == 1
    # Its 10 s session ran out first (no heartbeat, no sync).
    assert new_deadline == joined_at + 10_000 + R > first_deadline
    # Past the first deadline: the group, its generation and checkpoints stay.
    h.advance(first_deadline - h.now + 1)
    assert h.state() == "Empty"
    assert h.coord.checkpoints(G) == {("orders", 0): 41, ("orders", 1): 42}
    h.advance(new_deadline - h.now - 1)
    assert h.state() == "Empty"
    h.advance(1)
    assert h.state() is None


def test_a_first_join_pending_at_expiry_postpones_it_until_the_member_joins_or_expires() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    h.advance(R - 100)
    # MEMBER_ID_REQUIRED: a pending member (KIP-394), the group is still Empty.
    rid, out = h.join(session=10_000)
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED and h.state() == "Empty"
    h.advance(100)
    assert h.state() == "Empty"  # not deleted under the joining member
    assert h.timers[KEY] == h.now - 100 + 10_000
    # It never comes back: the pending id expires, then the group goes.
    out = h.advance(10_000)
    assert h.state() is None and GroupDeleted(G) in persisted(out)


def test_a_commit_to_an_empty_group_with_a_generation_does_not_extend_it() -> None:
    """Kafka (KIP-211): a group that had members expires from when it became Empty."""
    h = Harness(group_retention_ms=R)
    _emptied(h)
    deadline = h.timers[KEY]
    h.advance(R // 2)
    rid, out = h.commit("tool", -1, [("orders", 0, 99)])
    assert reply(out, rid).error is None and scheduled(out) == {}
    h.advance(deadline - h.now)
    assert h.state() is None


def test_a_group_without_a_generation_expires_after_its_last_commit() -> None:
    """KIP-211 for standalone consumers: retention counts from the last commit."""
    h = Harness(group_retention_ms=R)
    rid, out = h.commit("tool", -1, [("s", 0, 1)], group="simple")
    assert reply(out, rid).error is None
    assert scheduled(out) == {"retention:simple": h.now + R}
    assert [r.committed_ms for r in persisted(out)
            if isinstance(r, CheckpointsWritten)] == [h.now]
    h.advance(R // 2)
    last_commit = h.now
    _rid, out = h.commit("tool", -1, [("s", 1, 2)], group="simple")
    # No timer churn per commit: the armed timer finds the later deadline when it fires.
    assert scheduled(out) == {}
    out = h.advance(R // 2)
    assert h.state("simple") == "Empty"
    assert scheduled(out) == {"retention:simple": last_commit + R}
    h.advance(last_commit + R - h.now - 1)
    assert h.state("simple") == "Empty"
    out = h.advance(1)
    assert h.state("simple") is None and persisted(out) == [GroupDeleted("simple")]
    assert transitions(out) == [("Empty", "Dead", "retention_expired")]


def test_deleting_every_checkpoint_of_a_group_without_a_generation_cancels_it() -> None:
    h = Harness(group_retention_ms=R)
    h.commit("tool", -1, [("s", 0, 1)], group="simple")
    _rid, out = h.commit("tool", -1, [("s", 0, None)], group="simple")
    assert h.state("simple") is None and "retention:simple" in cancelled(out)
    assert "retention:simple" not in h.timers


def test_admin_delete_cancels_it() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    rid, out = h.delete_group()
    assert reply(out, rid).error is None
    assert KEY in cancelled(out) and KEY not in h.timers


def test_zero_keeps_empty_groups_forever() -> None:
    h = Harness(group_retention_ms=0)
    ids, generation = h.stable_group(1)
    h.put_resource("orders", 1)
    h.commit(ids[0], generation, [("orders", 0, 1)])
    h.leave((ids[0], None))
    h.commit("tool", -1, [("s", 0, 1)], group="simple")
    assert not [key for key in h.timers if key.startswith("retention:")]
    assert not [e for e in h.effects if isinstance(e, ScheduleTimer)
                and e.key.startswith("retention:")]
    h.advance(10 * 365 * 86_400_000)
    assert h.state() == "Empty" and h.state("simple") == "Empty"
    assert h.coord.checkpoints(G) == {("orders", 0): 1}


def test_default_is_seven_days_and_negative_is_refused() -> None:
    assert CoreConfig().group_retention_ms == 7 * 24 * 3_600_000
    with pytest.raises(ValueError, match="group_retention_ms"):
        GroupCoordinator(CoreConfig(group_retention_ms=-1))


def test_the_setting_reaches_the_core_from_flag_env_and_file(tmp_path: Any) -> None:
    assert resolve({}, {}).core_config().group_retention_ms == 604_800_000
    env = {"GROUPCOORD_GROUP_RETENTION_MS": "60000"}
    assert resolve({}, env).core_config().group_retention_ms == 60_000
    assert resolve({"group_retention_ms": "0"}, env).group_retention_ms == 0
    toml = tmp_path / "c.toml"
    toml.write_text("group_retention_ms = 123\n")
    assert resolve({}, {}, str(toml)).group_retention_ms == 123
    with pytest.raises(ValueError, match="group_retention_ms"):
        resolve({"group_retention_ms": "-5"}, {})


# ---------------------------------------------------------------- after a restart


def test_restore_rearms_with_the_time_that_was_left() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    emptied_at = h.now
    r = _restarted(h, at=emptied_at + R // 3)
    assert r.state() == "Empty" and r.coord.checkpoints(G)
    assert scheduled(r.effects) == {KEY: emptied_at + R}
    r.advance(emptied_at + R - r.now - 1)
    assert r.state() == "Empty"
    out = r.advance(1)
    assert r.state() is None and persisted(out) == [GroupDeleted(G)]
    rid, out = r.fetch()
    assert reply(out, rid).checkpoints == ()


def test_restore_of_an_already_expired_group_deletes_it_at_once() -> None:
    h = Harness(group_retention_ms=R)
    _emptied(h)
    emptied_at = h.now
    r = _restarted(h, at=emptied_at + 5 * R)
    # The deadline is in the past: the runtime fires it as soon as it is armed.
    assert scheduled(r.effects) == {KEY: emptied_at + R}
    out = r.advance(0)
    assert r.state() is None and persisted(out) == [GroupDeleted(G)]
    assert transitions(out) == [("Empty", "Dead", "retention_expired")]


def test_restore_uses_the_last_commit_of_a_group_without_a_generation() -> None:
    h = Harness(group_retention_ms=R)
    h.commit("tool", -1, [("s", 0, 1)], group="simple")
    h.advance(1_000)
    h.commit("tool", -1, [("s", 0, 2)], group="simple")
    last_commit = h.now
    snapshot = fold(h.records)
    assert snapshot.last_commit_ms == {"simple": last_commit}
    r = _restarted(h, at=last_commit + 10)
    assert scheduled(r.effects) == {"retention:simple": last_commit + R}
    # Unknown (a database written before schema version 2): counted from the restart.
    unknown = Snapshot(checkpoints=snapshot.checkpoints)
    r = _restarted(h, at=last_commit + 10, snapshot=unknown)
    assert scheduled(r.effects) == {"retention:simple": last_commit + 10 + R}


def test_restore_does_not_arm_retention_for_groups_with_members_or_when_off() -> None:
    h = Harness(group_retention_ms=R)
    h.stable_group(1, group="busy")
    _emptied(h)
    r = _restarted(h, at=h.now + 1)
    assert [k for k in scheduled(r.effects) if k.startswith("retention:")] == [KEY]
    off = _restarted(h, at=h.now + 1, group_retention_ms=0)
    assert not [k for k in scheduled(off.effects) if k.startswith("retention:")]
    off.advance(100 * R)
    assert off.state() == "Empty"


def test_an_empty_record_is_what_restore_counts_from() -> None:
    """The Empty GroupRecord's state_timestamp_ms is the moment the group became Empty."""
    h = Harness(group_retention_ms=R)
    _emptied(h)
    empty = [e.record for e in h.effects if isinstance(e, Persist)
             and isinstance(e.record, GroupRecord) and e.record.state == "Empty"]
    assert empty and empty[-1].state_timestamp_ms == h.now
