"""Seeded random walks: bookkeeping invariants after every command, replay at the end.

The walk mixes every call (dynamic and static joins, syncs from leaders and
followers, long-poll heartbeats, leaves, commits, cancels, catalog changes) with
clock advances that fire timers, across two groups. After each step the core's
derived state (awaiting-join counter, protocol counts, static map, parked-request
index, timer targets) must match what it is derived from, and every parked
request must eventually be answered exactly once.
"""

from __future__ import annotations

import random

import pytest
from coretest_kit import Harness

from coordinator.core.effects import Reply
from coordinator.core.kernel import Kernel
from coordinator.core.replay import fold
from coordinator.core.states import (
    VALID_PREVIOUS,
    GroupState,
    IllegalTransition,
    check_transition,
)

GROUPS = ("ga", "gb")
#: the token of each group's callers (``None``: authentication off).
PRINCIPALS = {"ga": "a", "gb": None}
INSTANCES = ("i1", "i2", "i3")
PROTOCOL_SETS = ((("range", b"r"),), (("range", b"r2"),),
                 (("sticky", b"s"), ("range", b"r")))


def _check_invariants(k: Kernel) -> None:
    parked_seen: set[int] = set()
    for gid, g in k.groups.items():
        assert g.group_id == gid
        assert g.state is not GroupState.DEAD
        assert g.num_awaiting_join == sum(m.join_request is not None for m in g.members.values())
        counts: dict[str, int] = {}
        for m in g.members.values():
            for name, _ in m.record.protocols:
                counts[name] = counts.get(name, 0) + 1
            assert k.timers.get(m.session_key) is not None, (gid, m.member_id)
            for rid in (m.join_request, m.sync_request, *m.heartbeats):
                if rid is not None:
                    assert k.parked[rid].member_id == m.member_id
                    parked_seen.add(rid)
            if m.heartbeats:
                assert g.state is GroupState.STABLE
            if m.join_request is not None:
                assert g.state is GroupState.PREPARING_REBALANCE
            if m.sync_request is not None:
                assert g.state is GroupState.COMPLETING_REBALANCE
        assert counts == g.protocol_counts
        assert {m.record.group_instance_id: mid for mid, m in g.members.items()
                if m.record.group_instance_id is not None} == g.static_members
        assert g.pending_sync <= set(g.members)
        assert not (set(g.pending) & set(g.members))
        if g.state is GroupState.EMPTY:
            assert not g.members
        else:
            assert g.members or g.state is GroupState.PREPARING_REBALANCE
        if g.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert g.leader in g.members
            assert g.protocol_name is not None
        if g.state is GroupState.PREPARING_REBALANCE:
            assert g.join_key in k.timers
    assert parked_seen == set(k.parked)
    assert set(k.heartbeats) <= set(k.parked)
    by_principal: dict[str, int] = {}
    for parked in k.parked.values():
        if parked.principal is not None:
            assert parked.kind in ("join", "sync")
            by_principal[parked.principal] = by_principal.get(parked.principal, 0) + 1
    assert by_principal == k.parked_by
    # Each token's checkpoint bytes are those of the groups it created.
    held: dict[str, int] = {}
    for gid, store in k.checkpoints.items():
        owner = k.groups[gid].owner
        if owner is not None:
            held[owner] = held.get(owner, 0) + store.nbytes
    assert held == k.owned_bytes


@pytest.mark.parametrize("seed", range(12))
def test_random_walk_keeps_bookkeeping_consistent(seed: int) -> None:
    rnd = random.Random(seed)
    h = Harness(initial_rebalance_delay_ms=rnd.choice([0, 0, 500]),
                group_max_size=rnd.choice([0, 0, 4]))
    known: dict[str, list[tuple[str, str | None]]] = {g: [] for g in GROUPS}
    outstanding: set[int] = set()
    answered: set[int] = set()

    def note(rid: int, out: list[object]) -> None:
        outstanding.add(rid)
        for effect in out:
            if isinstance(effect, Reply):
                assert effect.request_id not in answered, "answered twice"
                answered.add(effect.request_id)
                outstanding.discard(effect.request_id)

    def absorb(out: list[object]) -> None:
        for effect in out:
            if isinstance(effect, Reply):
                assert effect.request_id not in answered, "answered twice"
                answered.add(effect.request_id)
                outstanding.discard(effect.request_id)

    for _ in range(400):
        group = rnd.choice(GROUPS)
        view = h.coord.describe_group(group)
        generation = view.generation_id if view else 0
        members = [(m.member_id, m.group_instance_id) for m in view.members] if view else []
        pick = rnd.choice(members) if members else (rnd.choice(known[group])
                                                      if known[group] else ("nobody", None))
        action = rnd.random()
        token = PRINCIPALS[group]
        kw = {"group": group, "protocols": rnd.choice(PROTOCOL_SETS),
              "session": rnd.choice([6_000, 20_000]), "rebalance": rnd.choice([5_000, 15_000]),
              "principal": token}
        if action < 0.12:
            instance = rnd.choice((None, None, *INSTANCES))
            rid, out = h.join("", instance=instance, **kw)  # type: ignore[arg-type]
            note(rid, out)
            for effect in out:
                if isinstance(effect, Reply) and effect.request_id == rid:
                    member_id = effect.response.member_id
                    if member_id:
                        known[group].append((member_id, instance))
        elif action < 0.30:
            rid, out = h.join(pick[0], instance=pick[1], **kw)  # type: ignore[arg-type]
            note(rid, out)
        elif action < 0.45:
            assignments = {m: bytes([i]) for i, (m, _) in enumerate(members)
                           if rnd.random() < 0.8}
            rid, out = h.sync(pick[0], generation, assignments, group=group, instance=pick[1],
                              principal=PRINCIPALS[group])
            note(rid, out)
        elif action < 0.62:
            rid, out = h.heartbeat(pick[0], generation, group=group, instance=pick[1],
                                   wait_ms=rnd.choice([0, 0, 3_000]))
            note(rid, out)
        elif action < 0.67:
            rid, out = h.leave(pick, group=group, principal=token)
            note(rid, out)
        elif action < 0.74:
            rid, out = h.commit(pick[0], rnd.choice([generation, generation - 1, -1]),
                                [("s", rnd.randrange(4), rnd.choice([1, None, "x"]))],
                                group=group, instance=pick[1], principal=token)
            note(rid, out)
        elif action < 0.78 and outstanding:
            absorb(h.cancel(rnd.choice(sorted(outstanding))))  # type: ignore[arg-type]
            outstanding.clear()
            outstanding.update(h.coord._k.parked)
        elif action < 0.80:
            rid, out = h.put_resource("orders", rnd.randrange(1, 5))
            note(rid, out)
        else:
            absorb(h.advance(rnd.choice([100, 1_000, 3_000, 7_000])))  # type: ignore[arg-type]
        _check_invariants(h.coord._k)
        assert outstanding == set(h.coord._k.parked)

    # Everything parked is answered eventually once members stop talking.
    absorb(h.advance(200_000))  # type: ignore[arg-type]
    assert outstanding == set()
    _check_invariants(h.coord._k)

    # Replay round-trip: a restored coordinator has the same durable state.
    restored = Harness()
    restored.now = h.now
    restored.restore_from(fold(h.records))
    for group in GROUPS:
        before, after = h.coord.describe_group(group), restored.coord.describe_group(group)
        if before is None or before.state == "Empty":
            assert after is None or (after.state == "Empty" and after.members == ())
        else:
            assert after is not None and after.members == before.members
        assert restored.coord.checkpoints(group) == h.coord.checkpoints(group)
    assert restored.coord.catalog() == h.coord.catalog()
    assert restored.coord.resources_epoch == h.coord.resources_epoch
    _check_invariants(restored.coord._k)


def test_state_table_matches_kafka() -> None:
    assert VALID_PREVIOUS[GroupState.STABLE] == {GroupState.COMPLETING_REBALANCE}
    assert VALID_PREVIOUS[GroupState.COMPLETING_REBALANCE] == {
        GroupState.PREPARING_REBALANCE}
    assert VALID_PREVIOUS[GroupState.PREPARING_REBALANCE] == {
        GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE}
    assert VALID_PREVIOUS[GroupState.EMPTY] == {GroupState.PREPARING_REBALANCE}
    with pytest.raises(IllegalTransition):
        check_transition("g", GroupState.EMPTY, GroupState.STABLE)
    with pytest.raises(IllegalTransition):
        check_transition("g", GroupState.STABLE, GroupState.EMPTY)
    check_transition("g", GroupState.STABLE, GroupState.PREPARING_REBALANCE)
