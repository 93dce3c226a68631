"""Bugs the chaos runner found, pinned down as small deterministic tests.

Chaos seed 0 (benchmarks/chaos.py, 2026-11-22, under a load average of ~20):
worker ``coop-1`` was frozen (SIGSTOP) while the coordinator's answer to its
generation-1 sync sat in its socket. The coordinator expired it and gave its
resources to ``coop-x1`` in generation 2; two seconds later ``coop-1`` woke,
read the stale answer and ran ``on_assigned`` for resources ``coop-x1`` had
owned since -- then ``on_lost`` 0.4 ms later, when the safety rule caught up.
Two owners at once, however briefly: a worker may start processing in
``on_assigned``.

Why: the safety deadline is ``anchor + session timeout`` with the anchor at
the sync's *send* time, but it was only checked against what the member
already owned; an assignment that arrived after its own deadline was still
delivered. Fixed in the client (cfd51e8: such an answer is verified by a
heartbeat before delivery); this test keeps it fixed.
"""

from __future__ import annotations

from client.member_state import (
    Call,
    CallbackKind,
    InvokeListener,
    MemberConfig,
    MemberStateMachine,
)
from protocol.messages import JoinResponse, SyncResponse
from protocol.resources import ResourceAssignment

SESSION = 1_000


def test_an_assignment_received_after_its_deadline_is_never_delivered() -> None:
    m = MemberStateMachine(MemberConfig(group_id="g", sets=("s",),
                                        assignors=("cooperative-sticky",),
                                        session_timeout_ms=SESSION, heartbeat_interval_ms=300,
                                        rebalance_timeout_ms=5_000), rng=lambda: 0.5)
    join = m.next_action(0)
    assert isinstance(join, Call) and join.api == "join"
    m.receive(0, JoinResponse(None, 1, "resources", "cooperative-sticky", "leader", "m1"))
    sync = m.next_action(0)
    assert isinstance(sync, Call) and sync.api == "sync"
    # The process is frozen with the answer in flight; it reads it 5 s later,
    # long after the coordinator expired it (sent + session timeout = 1 s).
    late = 5_000
    m.receive(late, SyncResponse(None, "resources", "cooperative-sticky",
                                 ResourceAssignment({"s": [0, 1]}).encode()))
    delivered: set[tuple[str, int]] = set()
    for _ in range(10):
        action = m.next_action(late)
        if isinstance(action, InvokeListener):
            if action.kind is CallbackKind.ASSIGNED:
                delivered |= set(action.resources)
            m.listener_done(late)
            continue
        break
    assert delivered == set(), "on_assigned ran for resources whose lease had expired"
