"""One group's state given up after a failure: ``CoreFailure`` names the group, and
``evict_group`` forgets it whole (parked calls, their per-token count, timers,
checkpoints) while every other group is left as it was. The runtime reloads it
(tests/runtime/test_runtime_group_failure.py)."""

from __future__ import annotations

import pytest
from coretest_kit import G, Harness, reply

from coordinator.core import coordinator as core_module
from coordinator.core.commands import TimerFired
from coordinator.core.coordinator import CoreFailure
from coordinator.core.group import session_key
from coordinator.core.kernel import Kernel
from protocol.errors import ErrorCode


def test_evicting_a_group_forgets_it_whole_and_nothing_else() -> None:
    h = Harness()
    ids, generation = h.stable_group(2, principal="a")
    h.commit(ids[0], generation, [("orders", 0, 5)])
    others, generation_b = h.stable_group(1, group="g2", principal="b")
    h.join(ids[0], principal="a", protocols=(("range", b"changed"),))  # parks: a rebalance
    h.heartbeat(others[0], generation_b, group="g2", wait_ms=1_000)   # parks: a long-poll
    assert h.coord.parked_by("a") == 1 and h.coord.parked_request_count() == 2
    before_g2 = h.coord.describe_group("g2")
    h._absorb(h.coord.evict_group(G, h.now))
    assert h.coord.describe_group(G) is None
    assert h.coord.checkpoints(G) == {}
    assert h.coord.parked_by("a") == 0 and h.coord.parked_request_count() == 1
    assert "a" not in h.coord._k.owned_groups and "a" not in h.coord._k.owned_bytes
    assert h.coord._k.owned_groups == {"b": 1}
    # Its timers are cancelled (sessions, the join barrier); g2's stay.
    assert not [key for key in h.timers if G in key]
    assert session_key("g2", others[0]) in h.timers
    assert [key for key in h.timers if key.startswith("heartbeat:")]  # g2's long-poll
    assert h.coord.describe_group("g2") == before_g2
    # g2 goes on as before.
    answer = reply(h.heartbeat(others[0], generation_b, group="g2")[1], h._rid)
    assert answer.error is None


def test_a_handler_that_raises_names_its_group_and_keeps_none_of_its_effects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness()
    ids, _ = h.stable_group(1)

    def raises(k: Kernel, command: TimerFired) -> None:
        k.reply(0, None)  # type: ignore[arg-type]  # an effect that must not survive
        raise KeyError("a bug")

    monkeypatch.setitem(core_module._HANDLERS, TimerFired, raises)
    with pytest.raises(CoreFailure) as raised:
        h.coord.handle(h.now, TimerFired(session_key(G, ids[0])))
    assert raised.value.group_id == G  # a timer's group, known before it ran
    assert isinstance(raised.value.cause, KeyError)
    monkeypatch.undo()
    # The next command starts from no leftover effect.
    rid, out = h.join(group="other")
    assert [e.request_id for e in out if hasattr(e, "request_id")] == [rid]
    assert reply(out, rid).error is ErrorCode.MEMBER_ID_REQUIRED
