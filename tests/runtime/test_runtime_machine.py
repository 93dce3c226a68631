"""The runtime's machine on its own: calls with a time in, effects out, no event loop.

``RuntimeMachine`` is what both the server (``Runtime``) and the simulator run,
so what they rely on is pinned here without asyncio: a Stable group's
heartbeat is answered inside its own step with nothing to carry out; a reply
waits for the write it depends on and every record collected before the
driver begins the write shares its transaction; re-arming a session for later
arms no loop timer; a record the store refuses fails its group alone and
reloads it; a stop (also one abandoned midway) ends only once the write
outstanding returned.
"""

from __future__ import annotations

import itertools

from coordinator.core.commands import Commit, Heartbeat, Join, Sync
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.records import CheckpointsWritten, Record, Snapshot
from coordinator.runtime.effects import (
    Answer,
    Answered,
    ArmTimer,
    DisarmTimer,
    DisarmTimers,
    GroupEvicted,
    GroupReloaded,
    LoadGroup,
    MachineEffect,
    Stopped,
    WriteDue,
    WriteRecords,
)
from coordinator.runtime.machine import RuntimeMachine
from coordinator.storage.sqlite import RecordError
from protocol.errors import ErrorCode
from protocol.messages import (
    CommitRequest,
    HeartbeatRequest,
    JoinRequest,
    JoinResponse,
    SyncAssignment,
    SyncRequest,
)

T0 = 1_700_000_000_000
SESSION_MS = 10_000
CONFIG = CoreConfig(min_session_timeout_ms=100, max_session_timeout_ms=60_000,
                    initial_rebalance_delay_ms=0)


class Driver:
    """The least a driver does: keeps answers and armed loop timers, begins a
    write when asked; a write's outcome is the test's to report."""

    def __init__(self) -> None:
        self.machine = RuntimeMachine(GroupCoordinator(CONFIG))
        self.machine.start(T0, Snapshot())
        self.now = T0
        self.ids = itertools.count(1)
        self.answers: dict[int, Answer] = {}
        self.timers: dict[str, int] = {}
        self.writes: list[tuple[Record, ...]] = []
        self.seen: list[MachineEffect] = []
        self.run()

    def run(self) -> list[MachineEffect]:
        """Carry out what the machine emitted; returns those effects."""
        done: list[MachineEffect] = []
        machine = self.machine
        while machine.pending:
            for effect in machine.take():
                done.append(effect)
                match effect:
                    case Answered(request_id=rid, answer=answer):
                        self.answers[rid] = answer
                    case ArmTimer(key=key, deadline_ms=deadline_ms):
                        self.timers[key] = deadline_ms
                    case DisarmTimer(key=key):
                        self.timers.pop(key, None)
                    case DisarmTimers():
                        self.timers.clear()
                    case WriteDue():
                        machine.begin_write(self.now)
                    case WriteRecords(records=records):
                        self.writes.append(records)
        self.seen += done
        return done

    def next_id(self) -> int:
        return next(self.ids)

    def commit_all(self) -> None:
        """Report every outstanding write committed, until none is."""
        while self.machine.writing:
            self.machine.write_done(self.now, 0.001)
            self.run()

    def fire_due(self) -> None:
        for key, deadline in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if deadline <= self.now and self.timers.get(key) == deadline:
                del self.timers[key]
                self.machine.timer_due(self.now, key)
                self.run()


def join(d: Driver, group: str, member_id: str = "") -> tuple[int, Answer | None]:
    rid = d.next_id()
    req = JoinRequest(group_id=group, member_id=member_id, protocol_type="test",
                      protocols=(("range", b"meta"),), session_timeout_ms=SESSION_MS,
                      rebalance_timeout_ms=SESSION_MS, group_instance_id=None, client_id="t")
    answer = d.machine.request(d.now, rid, Join(rid, req, "127.0.0.1", f"m-{group}-{rid}"))
    d.run()
    return rid, answer


def stable(d: Driver, group: str) -> tuple[str, int]:
    """One member through join, rejoin and sync: (member_id, generation)."""
    _, first = join(d, group)
    assert isinstance(first, JoinResponse) and first.error is ErrorCode.MEMBER_ID_REQUIRED
    rid, answer = join(d, group, first.member_id)
    d.fire_due()
    d.commit_all()
    joined = answer if answer is not None else d.answers.pop(rid)
    assert isinstance(joined, JoinResponse) and joined.error is None, joined
    rid = d.next_id()
    sync = SyncRequest(group_id=group, member_id=joined.member_id,
                       generation_id=joined.generation_id,
                       assignments=(SyncAssignment(joined.member_id, b"A"),))
    answer = d.machine.request(d.now, rid, Sync(rid, sync))
    d.run()
    d.commit_all()
    synced = answer if answer is not None else d.answers.pop(rid)
    assert synced.error is None, synced
    return joined.member_id, joined.generation_id


def heartbeat(d: Driver, group: str, member: str, generation: int
              ) -> tuple[int, Answer | None]:
    rid = d.next_id()
    req = HeartbeatRequest(group_id=group, member_id=member, generation_id=generation)
    answer = d.machine.request(d.now, rid, Heartbeat(rid, req))
    return rid, answer


def commit(d: Driver, group: str, member: str, generation: int, value: int
           ) -> tuple[int, Answer | None]:
    rid = d.next_id()
    req = CommitRequest(group_id=group, member_id=member, generation_id=generation,
                        checkpoints=(("orders", 0, value),))
    answer = d.machine.request(d.now, rid, Commit(rid, req))
    return rid, answer


def test_a_stable_heartbeat_is_answered_in_its_step_with_nothing_to_carry_out() -> None:
    d = Driver()
    member, generation = stable(d, "g")
    d.now += 1000
    _, answer = heartbeat(d, "g", member, generation)
    assert answer is not None and answer.error is None
    assert not d.machine.pending, "the hot path emits nothing: no future, no loop timer"


def test_a_reply_waits_for_its_write_and_records_collected_before_it_begins_share_it(
) -> None:
    d = Driver()
    a_member, a_gen = stable(d, "a")
    b_member, b_gen = stable(d, "b")
    d.writes.clear()
    # Both commits are applied before the driver begins the write.
    rid_a, answer_a = commit(d, "a", a_member, a_gen, 1)
    rid_b, answer_b = commit(d, "b", b_member, b_gen, 1)
    assert answer_a is None and answer_b is None
    effects = d.machine.take()
    assert effects == [WriteDue()], "one write is due, none begun"
    d.machine.begin_write(d.now)
    d.run()
    [records] = d.writes
    assert {r.group_id for r in records if isinstance(r, CheckpointsWritten)} == {"a", "b"}
    assert rid_a not in d.answers and rid_b not in d.answers
    d.commit_all()
    assert d.answers[rid_a].error is None and d.answers[rid_b].error is None


def test_a_later_session_deadline_arms_no_loop_timer_and_an_early_one_re_arms_itself(
) -> None:
    d = Driver()
    member, generation = stable(d, "g")
    key = next(k for k in d.timers if k.startswith("session:"))
    first_deadline = d.timers[key]
    for _ in range(10):
        d.now += 100
        _, answer = heartbeat(d, "g", member, generation)
        assert answer is not None and answer.error is None
        assert not d.machine.pending
    d.now = first_deadline
    d.fire_due()
    # The loop timer went off before the latest deadline: it re-arms for it and the
    # member keeps its session.
    assert d.timers[key] == first_deadline + 10 * 100
    view = d.machine.core.describe_group("g")
    assert view is not None and [m.member_id for m in view.members] == [member]


def test_a_record_the_store_refuses_fails_its_group_alone_and_the_group_is_reloaded(
) -> None:
    d = Driver()
    good_member, good_gen = stable(d, "good")
    bad_member, bad_gen = stable(d, "bad")
    d.writes.clear()
    rid_bad, _ = commit(d, "bad", bad_member, bad_gen, 1)
    rid_good, _ = commit(d, "good", good_member, good_gen, 1)
    d.run()
    d.machine.write_refused(d.now, RecordError("g.db", "bad", "a value out of range"))
    effects = d.run()
    [retry] = [e for e in effects if isinstance(e, WriteRecords)]
    assert {getattr(r, "group_id", None) for r in retry.records} == {"good"}
    d.machine.write_done(d.now, 0.001)
    effects = d.run()
    assert d.answers[rid_good].error is None
    assert d.answers[rid_bad].error is ErrorCode.UNKNOWN_SERVER_ERROR
    assert GroupEvicted("bad", "storage", "the store refused its records: a value out of "
                        "range") in effects
    assert LoadGroup("bad") in effects
    # Until it is back its calls are answered LOAD_IN_PROGRESS, others are served.
    _, answer = heartbeat(d, "bad", bad_member, bad_gen)
    assert answer is not None and answer.error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    _, answer = heartbeat(d, "good", good_member, good_gen)
    assert answer is not None and answer.error is None
    d.now += 7
    d.machine.group_loaded(d.now, "bad", Snapshot())
    effects = d.run()
    assert GroupReloaded("bad", 7, "nothing durable: it starts anew") in effects
    _, answer = heartbeat(d, "bad", bad_member, bad_gen)
    assert answer is not None and answer.error is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_stop_ends_once_the_outstanding_write_returned() -> None:
    d = Driver()
    member, generation = stable(d, "g")
    rid, _ = commit(d, "g", member, generation, 1)
    d.run()
    assert d.machine.writing
    d.machine.stop(d.now, ErrorCode.NOT_COORDINATOR)
    assert Stopped() not in d.run()
    _, answer = heartbeat(d, "g", member, generation)
    assert answer is not None and answer.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    d.machine.write_done(d.now, 0.001)
    effects = d.run()
    assert d.answers[rid].error is None, "its write committed: the commit is acknowledged"
    assert effects[-1] == Stopped()


def test_a_stop_abandoned_midway_ends_when_the_write_returns_and_answers_not_available(
) -> None:
    d = Driver()
    member, generation = stable(d, "g")
    rid, _ = commit(d, "g", member, generation, 1)
    d.run()
    d.machine.stop(d.now, ErrorCode.NOT_COORDINATOR)
    d.run()
    d.machine.abandon(d.now)
    effects = d.run()
    assert d.answers[rid].error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert Stopped() not in effects
    d.machine.write_failed(d.now, "fenced")
    assert d.run() == [Stopped()]
    assert not d.machine.failed, "a write of an abandoned runtime changes nothing"
