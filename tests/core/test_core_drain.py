"""An operator's drain request in the core (docs/protocol.md, "Drain"): the
member's heartbeat answers say ``drain: true`` until it rejoins draining or
leaves; the request is part of the member's durable record."""

from __future__ import annotations

from coordinator.core.commands import DrainMember
from coordinator.core.effects import DrainRequested
from coordinator.core.records import GroupRecord
from coordinator.core.replay import fold
from protocol.errors import ErrorCode
from protocol.resources import MemberMetadata
from tests.core.coretest_kit import G, Harness, persisted, reply, transitions

META = (("balanced", MemberMetadata(sets=("s",)).encode()),)
DRAINING = (("balanced", MemberMetadata(sets=("s",), draining=True).encode()),)


def drain(h: Harness, member: str, group: str = G) -> tuple[object, list[object]]:
    rid = h.rid()
    out = h.run(DrainMember(rid, group, member))
    return reply(out, rid), out


def generation(h: Harness) -> int:
    view = h.coord.describe_group(G)
    assert view is not None
    return view.generation_id


def drain_flag(h: Harness, member: str) -> bool:
    rid, out = h.heartbeat(member, generation(h))
    answer = reply(out, rid)
    assert answer.error is None, answer
    return bool(answer.drain)


def record_of(records: list[object], member: str) -> object:
    group = [r for r in records if isinstance(r, GroupRecord)][-1]
    return next(m for m in group.members if m.member_id == member)


def test_the_member_asked_hears_drain_in_every_heartbeat_answer_and_the_others_do_not() -> None:
    h = Harness()
    (a, b), _ = h.stable_group(2, protocols=META)
    assert not drain_flag(h, b)
    answer, out = drain(h, b)
    assert answer.error is None and answer.member_id == b and not answer.draining
    # Durable at once (Stable): the group's record carries the request.
    assert record_of(persisted(out), b).drain_requested_ms == h.now
    assert [e for e in out if isinstance(e, DrainRequested)] == [DrainRequested(G, b)]
    assert transitions(out) == []  # nothing rebalances: the member decides when
    assert drain_flag(h, b) and drain_flag(h, b)
    assert not drain_flag(h, a)
    # Asked again: nothing new is written or counted.
    answer, out = drain(h, b)
    assert answer.error is None and persisted(out) == []
    assert not [e for e in out if isinstance(e, DrainRequested)]


def test_a_parked_long_poll_is_answered_at_once_with_drain() -> None:
    h = Harness()
    (a,), generation = h.stable_group(1, protocols=META)
    rid, out = h.heartbeat(a, generation, wait_ms=3_000)
    assert rid not in {e.request_id for e in out if hasattr(e, "request_id")}
    _, out = drain(h, a)
    assert reply(out, rid).drain is True


def test_rejoining_draining_clears_the_request_and_a_plain_rejoin_does_not() -> None:
    h = Harness()
    (a, b), _ = h.stable_group(2, protocols=META)
    drain(h, b)
    # A rejoin that is not draining (another reason): still asked, also while rebalancing.
    h.join(b, protocols=(("balanced", MemberMetadata(sets=("s", "t")).encode()),))
    assert h.state() == "PreparingRebalance"
    rid, out = h.heartbeat(b, generation(h))
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS and reply(out, rid).drain
    h.join(b, protocols=DRAINING)
    _, out = h.join(a, protocols=META)
    assert h.state() == "CompletingRebalance"
    assert record_of(persisted(out), b).drain_requested_ms is None
    rid, out = h.heartbeat(b, generation(h))
    assert reply(out, rid).drain is False
    # Asked while it drains already: nothing to ask.
    answer, out = drain(h, b)
    assert answer.error is None and answer.draining and persisted(out) == []


def test_a_static_member_is_named_by_its_instance_id_and_keeps_the_request_on_restart() -> None:
    h = Harness()
    (a,), _ = h.stable_group(1, protocols=META, instance="worker-1")
    answer, _ = drain(h, "worker-1")
    assert answer.error is None and (answer.member_id, answer.group_instance_id) == (
        a, "worker-1")
    # The instance restarts (a new member id, the same subscription): still asked.
    rid, out = h.join("", instance="worker-1", protocols=META)
    new_id = reply(out, rid).member_id
    assert new_id != a
    assert drain_flag(h, new_id)


def test_the_request_survives_a_coordinator_restart() -> None:
    h = Harness()
    (a, b), _ = h.stable_group(2, protocols=META)
    drain(h, b)
    restarted = Harness()
    restarted.restore_from(fold(h.records))
    assert restarted.state() == "Stable"
    rid, out = restarted.heartbeat(b, generation(h))
    assert reply(out, rid).drain is True
    rid, out = restarted.heartbeat(a, generation(h))
    assert reply(out, rid).drain is False


def test_refusals_name_what_is_wrong_and_change_nothing() -> None:
    h = Harness()
    h.stable_group(1, protocols=META)
    answer, out = drain(h, "nobody")
    assert answer.error is ErrorCode.UNKNOWN_MEMBER_ID and not answer.found
    assert "'nobody'" in answer.message and repr(G) in answer.message
    assert persisted(out) == []
    answer, _ = drain(h, "nobody", group="other")
    assert answer.error is ErrorCode.UNKNOWN_GROUP and "'other'" in answer.message
    (c,), _ = h.stable_group(1, group="consumers", ptype="consumer")
    answer, out = drain(h, c, group="consumers")
    assert answer.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "'consumer'" in answer.message and persisted(out) == []
