"""Timer kinds (coordinator/core/group.py ``TimerKind``): one handler each, and
every key the core arms names its kind, so the keys the runtime sees are the
strings they always were."""

from __future__ import annotations

from coretest_kit import Harness

from coordinator.core.dispatch import TABLE
from coordinator.core.group import (
    TimerKind,
    heartbeat_key,
    join_key,
    pending_key,
    session_key,
    sync_key,
)
from coordinator.core.kernel import retention_key


def test_every_timer_kind_has_one_handler() -> None:
    for row in TABLE.values():
        assert set(TimerKind) <= set(row)


def test_keys_are_the_kind_then_the_ids() -> None:
    assert session_key("g:1", "m") == "session:g:1:m"
    assert pending_key("g", "m") == "pending:g:m"
    assert join_key("g") == "join:g"
    assert sync_key("g") == "sync:g"
    assert heartbeat_key(42) == "heartbeat:42"
    assert retention_key("g") == "retention:g"
    assert all(type(key) is str for key in (session_key("g", "m"), heartbeat_key(1)))


def test_every_armed_target_is_keyed_by_its_kind() -> None:
    h = Harness()
    members, generation = h.stable_group(2)
    h.heartbeat(members[0], generation, wait_ms=1_000)  # parked: a hold timer
    h.join()  # a newcomer: MEMBER_ID_REQUIRED, a pending deadline (KIP-394)
    kinds = {target.kind for target in h.coord._k.timers.values()}
    assert {TimerKind.SESSION, TimerKind.HEARTBEAT, TimerKind.PENDING} <= kinds, kinds
    for key, target in h.coord._k.timers.items():
        assert isinstance(target.kind, TimerKind)
        assert key.startswith(f"{target.kind.value}:"), (key, target)
