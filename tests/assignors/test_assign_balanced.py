"""The ``balanced`` assignor (docs/protocol.md, "The `balanced` assignor (client
side)"; docs/assignors.md, "balanced"): balance by load per capacity against a
brute-force optimum, KIP-429 safety, determinism, max_moves, home zones,
drain, warm-up and the why causes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from assignors_testkit import COOPERATIVE, Case, cases
from hypothesis import given, settings
from hypothesis import strategies as st

from client.assignors import (
    CAUSES,
    Assignment,
    ResourceSet,
    Subscription,
    get_assignor,
    validate_assignment,
)
from client.assignors._echo import read_echo
from client.assignors.balanced import BalancedAssignor

FAST = settings(max_examples=60, derandomize=True, deadline=None, database=None)
S = "s"


# ---------------------------------------------------------------- a small group


@dataclass(frozen=True)
class M:
    """A member as the test drives it: what it owns and echoes."""

    rack: str | None = None
    capacity: float = 1.0
    owned: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    user_data: bytes | None = None
    generation: int = -1
    draining: bool = False
    warm: Mapping[str, Sequence[int]] = field(default_factory=dict)
    sets: tuple[str, ...] = (S,)


def subs_of(
    group: Mapping[str, M], load: Mapping[int, float] | None = None
) -> dict[str, Subscription]:
    return {
        m: Subscription(
            sets=list(x.sets),
            owned={s: list(i) for s, i in x.owned.items() if i},
            generation=x.generation,
            rack=x.rack,
            user_data=x.user_data,
            capacity=x.capacity,
            load={S: {i: load[i] for i in x.owned.get(S, ())}} if load else {},
            warm=x.warm,
            draining=x.draining,
        )
        for m, x in group.items()
    }


def step(
    assignor: BalancedAssignor,
    resources: Mapping[str, int | ResourceSet],
    group: Mapping[str, M],
    load: Mapping[int, float] | None = None,
    now_ms: int | None = None,
) -> tuple[dict[str, M], dict[str, Assignment]]:
    """One cooperative round: assign, check KIP-429, members keep what they
    were given and echo user_data as the client does (docs/client.md,
    "Assignor state and time"): an assignment without it leaves the last."""
    subs = subs_of(group, load)
    result = assignor.assign(resources, subs, now_ms=now_ms)
    validate_assignment(resources, subs, result, cooperative=True)
    generation = 1 + max((x.generation for x in group.values()), default=0)
    nxt = {
        m: replace(
            x,
            owned={s: tuple(i) for s, i in result[m].assigned.items()},
            user_data=x.user_data if result[m].user_data is None else result[m].user_data,
            generation=generation,
        )
        for m, x in group.items()
    }
    return nxt, result


def settle(
    assignor: BalancedAssignor,
    resources: Mapping[str, int | ResourceSet],
    group: Mapping[str, M],
    load: Mapping[int, float] | None = None,
    rounds: int = 30,
) -> tuple[dict[str, M], list[dict[str, Assignment]]]:
    history = []
    current = dict(group)
    for _ in range(rounds):
        nxt, result = step(assignor, resources, current, load)
        history.append(result)
        if all(nxt[m].owned == current[m].owned for m in current):
            return nxt, history
        current = nxt
    raise AssertionError(f"no rest after {rounds} rounds")


def loads(group: Mapping[str, M], w: Sequence[float]) -> dict[str, float]:
    return {m: math.fsum(w[i] for i in x.owned.get(S, ())) for m, x in group.items()}


def busiest(group: Mapping[str, M], w: Sequence[float]) -> float:
    lo = loads(group, w)
    return max(lo[m] / x.capacity for m, x in group.items())


def why(results: Sequence[Mapping[str, Assignment]], member: str) -> list[tuple[str, int, str]]:
    return [entry for r in results for entry in r[member].why]


def owner_map(group: Mapping[str, M]) -> dict[int, str]:
    return {i: m for m, x in group.items() for i in x.owned.get(S, ())}


# ---------------------------------------------------------------- against the optimum


def optimum(w: Sequence[float], caps: Sequence[float]) -> float:
    """The least possible busiest load per capacity, by enumeration."""
    best = math.inf
    for placement in itertools.product(range(len(caps)), repeat=len(w)):
        per = [0.0] * len(caps)
        for i, m in enumerate(placement):
            per[m] += w[i]
        best = min(best, max(p / c for p, c in zip(per, caps, strict=True)))
    return best


WEIGHT = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 7.5, 20.0])


@FAST
@given(
    w=st.lists(WEIGHT, min_size=1, max_size=8),
    caps=st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=1, max_size=3),
    band=st.sampled_from([0.0, 0.05, 0.2]),
    owned_seed=st.lists(st.integers(-1, 2), max_size=8),
    zoned=st.booleans(),
)
def test_busiest_within_the_band_of_the_optimum_or_one_resource(
    w: list[float], caps: list[float], band: float, owned_seed: list[int], zoned: bool
) -> None:
    """After the cooperative rounds settle, the busiest member's load per
    capacity is within the band of the optimum, or above it by less than
    one resource on the smallest member (no single move would lower it)."""
    n = len(w)
    zones = {i: ("z0",) for i in range(0, n, 2)} if zoned else {}
    res = {S: ResourceSet(n, weights=dict(enumerate(w)), zones=zones)}
    group = {}
    for k, c in enumerate(caps):
        mine = tuple(i for i in range(n) if i < len(owned_seed) and owned_seed[i] == k)
        group[f"m{k}"] = M(rack=f"z{k % 2}", capacity=c, owned={S: mine},
                           generation=3 if mine else -1)
    final, _ = settle(get_assignor("balanced", band=band), res, group)
    assert sorted(owner_map(final)) == list(range(n))  # everything is served
    opt = optimum(w, caps)
    limit = max((1 + band) * opt, opt + max(w) / min(caps))
    assert busiest(final, w) <= limit * (1 + 1e-9) + 1e-12


@FAST
@given(case=cases(), seed=st.integers(0, 2**16), band=st.sampled_from([0.0, 0.05, 0.5]))
def test_valid_cooperative_and_deterministic_on_odd_input(
    case: Case, seed: int, band: float
) -> None:
    """Noisy claims (unknown sets, out of range, duplicates, two claimers,
    stale generations), weights, zones, capacities, a draining member: the
    result obeys every rule, KIP-429 included, and equal input gives equal
    output whatever the member order."""
    res: dict[str, int | ResourceSet] = {}
    for k, (name, n) in enumerate(sorted(case.resources.items())):
        if n > 0 and (seed >> k) & 1:
            res[name] = ResourceSet(n, weights={i: float((seed + i) % 5) for i in range(n)},
                                    zones={0: ("z1",)})
        else:
            res[name] = n
    subs = {
        m: replace(sub, rack=f"z{k % 2}", capacity=1.0 + k % 3, draining=(seed + k) % 5 == 0)
        for k, (m, sub) in enumerate(sorted(case.subs.items()))
    }
    assignor = get_assignor("balanced", band=band, max_moves=1 + seed % 4,
                            warmup=bool(seed & 32), warmup_timeout_ms=seed % 3 * 500)
    result = assignor.assign(res, subs, now_ms=seed)
    validate_assignment(res, subs, result, cooperative=True)
    assert result == assignor.assign(res, dict(reversed(list(subs.items()))), now_ms=seed)
    for m, a in result.items():
        assert all(cause in CAUSES for _, _, cause in a.why)
        owned_now = {(s, i) for s, idx in subs[m].owned.items() for i in idx}
        standby = {(s, i) for s, idx in a.standby.items() for i in idx}
        assigned = {(s, i) for s, idx in a.assigned.items() for i in idx}
        assert not standby & (owned_now | assigned)  # never owned and standby at once
        if subs[m].draining:
            # Nothing new, except of a set that no active member subscribes to.
            active_sets = {s for x in subs.values() if not x.draining for s in x.sets}
            new = {(s, i) for s, i in assigned - owned_now if s in active_sets}
            assert not new
            assert a.band is None


def test_balanced_is_a_cooperative_assignor_of_the_shared_tests() -> None:
    assert "balanced" in COOPERATIVE  # the shared property tests run on it too


# ---------------------------------------------------------------- stickiness and moves


def twenty(w: Sequence[float]) -> tuple[dict[str, ResourceSet], dict[str, M]]:
    res = {S: ResourceSet(len(w), weights=dict(enumerate(w)))}
    base, _ = settle(get_assignor("balanced"), res, {f"m{k:02d}": M() for k in range(20)})
    return res, base


WEIGHTS = [1.0 + (i * 7919) % 13 for i in range(400)]


def test_fresh_group_is_balanced_and_settled_group_stays() -> None:
    res, base = twenty(WEIGHTS)
    bound = max(sum(WEIGHTS) / 20, max(WEIGHTS))
    assert busiest(base, WEIGHTS) <= 1.05 * bound
    again, results = settle(get_assignor("balanced"), res, base)
    assert len(results) == 1 and again == {m: replace(x, generation=x.generation + 1)
                                           for m, x in base.items()}
    assert all(not a.why and a.delay_ms == 0 for a in results[0].values())


def test_join_moves_about_the_newcomers_fair_share_and_says_join() -> None:
    res, base = twenty(WEIGHTS)
    group = {**base, "new": M()}
    final, results = settle(get_assignor("balanced"), res, group)
    before, after = owner_map(base), owner_map(final)
    moved = [i for i in after if before.get(i) != after[i]]
    fair = sum(WEIGHTS) / 21
    assert sum(WEIGHTS[i] for i in moved) <= 1.3 * fair
    assert loads(final, WEIGHTS)["new"] >= 0.95 * fair
    assert busiest(final, WEIGHTS) <= 1.05 * fair
    # The donors said why in the first round, the newcomer in the follow-up.
    to_new = [i for i in moved if after[i] == "new"]
    losses = [e for m in base for e in results[0][m].why]
    assert {(s, i) for s, i, c in losses if c == "join"} == {(S, i) for i in to_new}
    assert {c for _, _, c in losses} <= {"join", "balance"}
    assert {c for _, _, c in why(results, "new")} == {"join"}
    assert len(why(results, "new")) == len(to_new)


def test_leave_moves_only_the_leavers_resources_and_says_leave() -> None:
    res, base = twenty(WEIGHTS)
    leaver = "m07"
    group = {m: x for m, x in base.items() if m != leaver}
    final, results = settle(get_assignor("balanced"), res, group)
    before, after = owner_map(base), owner_map(final)
    moved = {i for i in after if before[i] != after[i]}
    assert moved == set(base[leaver].owned[S])
    assert len(results) == 2  # handed out at once, nothing else revoked
    gains = [e for m in group for e in results[0][m].why]
    assert {c for _, _, c in gains} == {"leave"} and len(gains) == len(moved)


def test_a_hot_resource_moves_before_many_cold_ones_and_says_load() -> None:
    """``a`` measures 6 on resource 0 (catalog weight 1): it is over its band
    by more than one cold resource, and ``b`` has room for the hot one."""
    res = {S: 130}
    group = {
        "a": M(owned={S: tuple(range(0, 45))}, generation=4, user_data=b'{"balanced":1}'),
        "b": M(owned={S: tuple(range(45, 85))}, generation=4, user_data=b'{"balanced":1}'),
        "c": M(owned={S: tuple(range(85, 127))}, generation=4, user_data=b'{"balanced":1}'),
    }
    measured = {i: 1.0 for i in range(130)}
    measured[0] = 6.0
    res = {S: 127}
    final, results = settle(get_assignor("balanced"), res, group, load=measured)
    before, after = owner_map(group), owner_map(final)
    assert [i for i in after if before[i] != after[i]] == [0]
    assert results[0]["a"].why == ((S, 0, "load"),)
    assert results[1]["b"].why == ((S, 0, "load"),)
    w = [measured[i] for i in range(127)]
    assert busiest(final, w) <= 1.05 * sum(w) / 3


def test_measured_load_that_fits_nowhere_moves_the_fewest_cold_ones() -> None:
    res, base = twenty(WEIGHTS)
    owner = "m03"
    hot = min(base[owner].owned[S], key=lambda i: (WEIGHTS[i], i))
    measured = dict(enumerate(WEIGHTS))
    measured[hot] = 40.0  # 29 % of an ideal member: no member has that room
    final, results = settle(get_assignor("balanced"), res, base, load=measured)
    before, after = owner_map(base), owner_map(final)
    moved = [i for i in after if before[i] != after[i]]
    assert hot not in moved and all(before[i] == owner for i in moved)
    w = [measured[i] for i in range(len(WEIGHTS))]
    assert sum(w[i] for i in moved) <= w[hot]  # no more than the rise needs
    assert {c for _, _, c in results[0][owner].why} == {"load"}
    assert busiest(final, w) <= 1.05 * sum(w) / 20


def test_capacity_is_honoured_and_a_drop_says_capacity() -> None:
    w = [1.0] * 300
    res = {S: ResourceSet(300)}
    group = {f"m{k}": M(capacity=c) for k, c in enumerate([1.0, 2.0, 3.0])}
    final, _ = settle(get_assignor("balanced"), res, group)
    assert loads(final, w) == {"m0": 50.0, "m1": 100.0, "m2": 150.0}
    assert all(read_echo(x.user_data) is None for x in final.values())  # settled: no state
    shrunk = {**final, "m2": replace(final["m2"], capacity=1.0)}
    again, results = settle(get_assignor("balanced"), res, shrunk)
    assert busiest(again, w) <= 1.05 * 300 / 4
    # Nothing says what m2's capacity was: the move is put down to balance.
    assert {c for _, _, c in results[0]["m2"].why} == {"balance"}
    # With an echo from a round with a hand-over, it is known.
    known = {**shrunk, "m2": replace(shrunk["m2"], user_data=b'{"balanced":1,"capacity":3.0}')}
    _, result = step(get_assignor("balanced"), res, known)
    assert {c for _, _, c in result["m2"].why} == {"capacity"}


def test_max_moves_bounds_every_round_and_the_group_ends_balanced() -> None:
    res, base = twenty(WEIGHTS)
    group = {**base, **{f"new{k}": M() for k in range(4)}}
    assignor = get_assignor("balanced", max_moves=5)
    final, results = settle(assignor, res, group)
    current = group
    for r in results:
        revoked = sum(
            len(set(current[m].owned.get(S, ())) - set(r[m].assigned.get(S, ()))) for m in current
        )
        assert revoked <= 5
        current = {m: replace(x, owned={s: tuple(i) for s, i in r[m].assigned.items()})
                   for m, x in current.items()}
    assert len(results) > 4  # it took several rounds
    assert any(a.delay_ms > 0 for a in results[0].values())  # and asked for the next
    bound = max(sum(WEIGHTS) / 24, max(WEIGHTS))
    assert busiest(final, WEIGHTS) <= 1.05 * bound
    assert all(a.delay_ms == 0 for a in results[-1].values())


# ---------------------------------------------------------------- zones


def zoned(n: int, homes: Mapping[int, str]) -> dict[str, ResourceSet]:
    return {S: ResourceSet(n, zones={i: (z,) for i, z in homes.items()})}


def test_resources_go_home_when_the_zone_has_room_and_come_back() -> None:
    homes = {i: "abc"[i % 3] for i in range(90)}
    res = zoned(90, homes)
    group = {f"{z}{k}": M(rack=z) for z in "abc" for k in range(2)}
    final, _ = settle(get_assignor("balanced"), res, group)
    assert all(final_rack == homes[i] for i, final_rack in
               ((i, final[m].rack) for i, m in owner_map(final).items()))
    # Zone c loses its members: its resources are served elsewhere.
    lost = {m: x for m, x in final.items() if x.rack != "c"}
    gone, _ = settle(get_assignor("balanced"), res, lost)
    assert sorted(owner_map(gone)) == list(range(90))
    # It comes back: they go home, and the losers say why.
    back = {**gone, "c0": M(rack="c"), "c1": M(rack="c")}
    home_again, results = settle(get_assignor("balanced"), res, back)
    assert all(home_again[m].rack == homes[i] for i, m in owner_map(home_again).items())
    losses = [e for m in gone for e in results[0][m].why]
    assert losses and {c for _, _, c in losses} == {"zone"}


def test_balance_first_when_the_home_zone_has_no_room() -> None:
    """Zone a has one member, and half the load is homed there: that member
    takes what its band allows, the rest is served elsewhere, cause balance."""
    homes = {i: "a" for i in range(50)}
    res = zoned(100, homes)
    group = {"a0": M(rack="a"), "b0": M(rack="b"), "b1": M(rack="b"), "b2": M(rack="b")}
    final, results = settle(get_assignor("balanced"), res, group)
    w = [1.0] * 100
    assert busiest(final, w) <= 1.05 * 25
    assert loads(final, w)["a0"] >= 24
    assert all(i in homes for i in final["a0"].owned[S])
    astray = [e for m in ("b0", "b1", "b2") for e in why(results, m) if e[1] in homes]
    assert astray and {c for _, _, c in astray} == {"balance"}


# ---------------------------------------------------------------- drain


def test_a_draining_member_gets_nothing_new_and_hands_everything_over() -> None:
    res, base = twenty(WEIGHTS)
    group = {**base, "m05": replace(base["m05"], draining=True)}
    final, results = settle(get_assignor("balanced"), res, group)
    assert final["m05"].owned == {}
    assert results[0]["m05"].band is None
    assert {c for _, _, c in results[0]["m05"].why} == {"drain"}
    assert len(results[0]["m05"].why) == len(base["m05"].owned[S])
    gains = [e for m in base if m != "m05" for e in results[1][m].why]
    assert {c for _, _, c in gains} == {"drain"}
    assert busiest(final, WEIGHTS) <= 1.05 * sum(WEIGHTS) / 19


def test_a_draining_sole_subscriber_keeps_what_nobody_else_can_take() -> None:
    """Nobody else subscribes to "t": the draining member keeps t[0, 1] and
    takes the new t[2] too, so that no resource is left to nobody (the
    leader would start a follow-up rebalance after every round)."""
    res = {S: 4, "t": 3}
    group = {"a": M(sets=(S, "t"), owned={"t": (0, 1)}, generation=2, draining=True),
             "b": M(sets=(S,))}
    _, result = step(get_assignor("balanced"), res, group)
    assert result["a"].assigned == {"t": [0, 1, 2]}
    assert result["b"].assigned == {S: [0, 1, 2, 3]}
    assert result["a"].why == (("t", 2, "catalog"),)


# ---------------------------------------------------------------- warm-up


def test_a_join_is_given_its_share_as_standby_first_with_warmup() -> None:
    """A member that joins gets its share warm, as a drain's receivers do: the
    owner keeps serving until the newcomer reports it warm (a rolling restart
    with warm-up serves nothing cold)."""
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1), "b": M()}
    _, r1 = step(get_assignor("balanced", warmup=True), {S: 4}, group)
    assert r1["a"].assigned == {S: [0, 1, 2, 3]} and r1["b"].standby == {S: [2, 3]}
    assert r1["a"].why == () and r1["b"].assigned == {}
    # Without warm-up a join moves at once.
    _, r0 = step(get_assignor("balanced"), {S: 4}, group)
    assert r0["a"].assigned == {S: [0, 1]} and r0["b"].standby == {}
    assert {c for _, _, c in r0["a"].why} == {"join"}


ECHO = b'{"balanced":1}'  # a member that took part in an earlier round


def test_warmup_gives_a_standby_first_and_moves_once_warm() -> None:
    res = {S: 4}
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1, user_data=ECHO),
             "b": M(generation=1, user_data=ECHO)}
    assignor = get_assignor("balanced", warmup=True)
    nxt, r1 = step(assignor, res, group)
    assert r1["a"].assigned == {S: [0, 1, 2, 3]} and r1["a"].why == ()  # nothing revoked yet
    assert r1["b"].standby == {S: [2, 3]} and r1["b"].assigned == {}
    assert r1["b"].delay_ms > 0
    nxt, r2 = step(assignor, res, nxt)  # not warm yet: the same
    assert r2["a"].assigned == {S: [0, 1, 2, 3]} and r2["b"].standby == {S: [2, 3]}
    nxt = {**nxt, "b": replace(nxt["b"], warm={S: [2, 3]})}
    nxt, r3 = step(assignor, res, nxt)  # warm: the owner revokes
    assert r3["a"].assigned == {S: [0, 1]}
    assert r3["a"].why == ((S, 2, "balance"), (S, 3, "balance"))
    # In transit: still b's standby, so b keeps them warm (not "dropped").
    assert r3["b"].standby == {S: [2, 3]} and r3["b"].assigned == {}
    nxt = {**nxt, "b": replace(nxt["b"], warm={})}
    nxt, r4 = step(assignor, res, nxt)  # and the follow-up hands them over
    assert r4["b"].assigned == {S: [2, 3]} and r4["b"].standby == {}
    assert r4["b"].why == ((S, 2, "warm"), (S, 3, "warm"))
    assert all(a.delay_ms == 0 for a in r4.values())


def drain_a_into_b_then_c_joins(
    drained: tuple[int, ...], kept: tuple[int, ...]
) -> tuple[BalancedAssignor, dict[str, M], dict[str, Assignment]]:
    """``a`` (owning ``drained``) drains into ``b`` (owning ``kept``) with
    warm-up: ``b`` warms them, ``a`` revokes them and leaves, and ``c`` joins
    in the follow-up round. Returns that round (the group after it, the
    assignments)."""
    res = {S: 6}
    group = {"a": M(owned={S: drained}, generation=1, user_data=ECHO, draining=True),
             "b": M(owned={S: kept}, generation=1, user_data=ECHO)}
    assignor = get_assignor("balanced", warmup=True)
    assert isinstance(assignor, BalancedAssignor)
    nxt, r1 = step(assignor, res, group)
    assert r1["b"].standby == {S: list(drained)}
    nxt = {**nxt, "b": replace(nxt["b"], warm={S: list(drained)})}
    nxt, r2 = step(assignor, res, nxt)
    assert r2["a"].assigned == {} and r2["b"].standby == {S: list(drained)}
    nxt = {"b": replace(nxt["b"], warm={S: list(drained)}), "c": M()}  # a left, c joins
    nxt, r3 = step(assignor, res, nxt)
    return assignor, nxt, r3


def test_a_warm_hand_over_goes_to_its_receiver_though_the_revoker_left() -> None:
    """A drain: the owner revokes what its receivers warmed up, then leaves; the
    follow-up (which a newcomer joins) still gives each resource to the member
    that warmed it (its echo names it), never cold to another."""
    _, _, r3 = drain_a_into_b_then_c_joins((0, 1, 2), (3, 4, 5))
    assert r3["b"].assigned == {S: [0, 1, 2, 3, 4, 5]} and r3["c"].assigned == {}


def test_a_newcomer_of_the_round_a_hand_over_completes_gets_none_of_it_cold() -> None:
    """The same, the newcomer's share being what is handed over: the later
    passes do not take a hand-over from the member that warmed it for the
    newcomer, which would get it unowned, so at once and cold (a rolling
    restart's replacement joining in the round a drain's last revocation
    completes). It gets its share as standbys, warmed before they move."""
    assignor, nxt, r3 = drain_a_into_b_then_c_joins((3, 4, 5), (0, 1, 2))
    res = {S: 6}
    assert r3["b"].assigned == {S: [0, 1, 2, 3, 4, 5]} and r3["c"].assigned == {}
    assert len(r3["c"].standby.get(S, [])) == 3
    # c warms what it is given as standby, its owner revokes it, and the
    # follow-up hands it over: everything c gets comes warm
    last = r3
    for _ in range(4):
        nxt = {**nxt, "c": replace(nxt["c"], warm=last["c"].standby)}
        nxt, last = step(assignor, res, nxt)
        assert all(cause == "warm" for _, _, cause in last["c"].why), last["c"].why
        if len(last["c"].assigned.get(S, [])) == 3:
            break
    assert len(last["c"].assigned[S]) == 3 and len(last["b"].assigned[S]) == 3


def test_a_drains_standbys_stay_where_they_warm_up_round_after_round() -> None:
    """Each receiver's warm report is a round of its own; the other receivers
    keep their standbys (a warm-up is never restarted elsewhere)."""
    res = {S: 12}
    group = {"a": M(owned={S: tuple(range(6))}, generation=1, user_data=ECHO, draining=True),
             "b": M(owned={S: (6, 7)}, generation=1, user_data=ECHO),
             "c": M(owned={S: (8, 9)}, generation=1, user_data=ECHO),
             "d": M(owned={S: (10, 11)}, generation=1, user_data=ECHO)}
    assignor = get_assignor("balanced", warmup=True)
    nxt, r1 = step(assignor, res, group)
    first = {m: r1[m].standby for m in "bcd"}
    assert sorted(i for s in first.values() for i in s.get(S, [])) == list(range(6))
    for k, m in enumerate("bcd"):  # one receiver after another reports warm
        nxt = {**nxt, m: replace(nxt[m], warm=first[m])}
        nxt, r = step(assignor, res, nxt)
        waiting = "bcd"[k + 1:]
        assert all(r[o].standby == first[o] for o in waiting), (m, {o: r[o].standby
                                                                   for o in "bcd"})
        nxt = {o: replace(x, warm={}) for o, x in nxt.items()}


def test_warmup_timeout_moves_without_a_warm_report_when_time_is_given() -> None:
    res = {S: 4}
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1, user_data=ECHO),
             "b": M(generation=1, user_data=ECHO)}
    assignor = get_assignor("balanced", warmup=True, warmup_timeout_ms=5_000)
    nxt, r1 = step(assignor, res, group, now_ms=100_000)
    assert r1["b"].standby == {S: [2, 3]} and r1["b"].delay_ms == 5_000
    nxt, r2 = step(assignor, res, nxt, now_ms=103_000)
    assert r2["a"].assigned == {S: [0, 1, 2, 3]} and r2["b"].delay_ms == 2_000
    nxt, r3 = step(assignor, res, nxt, now_ms=105_000)
    assert r3["a"].assigned == {S: [0, 1]}
    # Moved cold, and said so: on the revoking side now, on the receiving side
    # in the follow-up round.
    assert sorted(r3["a"].why) == [(S, 2, "warm_timeout"), (S, 3, "warm_timeout")]
    _, r4 = step(assignor, res, nxt, now_ms=105_100)
    assert r4["b"].assigned == {S: [2, 3]}
    assert sorted(r4["b"].why) == [(S, 2, "warm_timeout"), (S, 3, "warm_timeout")]


# ---------------------------------------------------------------- causes and catalog


def test_causes_for_a_fresh_group_a_new_catalog_entry_and_an_expired_claim() -> None:
    assignor = get_assignor("balanced")
    group = {"a": M(sets=(S, "t")), "b": M(sets=(S, "t"))}
    nxt, r1 = step(assignor, {S: 4}, group)
    assert {c for m in r1 for _, _, c in r1[m].why} == {"join"}
    nxt, r2 = step(assignor, {S: 6, "t": 1}, nxt)  # the set grew, and a new one
    gained = [e for m in r2 for e in r2[m].why]
    assert sorted(gained) == [(S, 4, "catalog"), (S, 5, "catalog"), ("t", 0, "catalog")]
    # "a" comes back from an older generation claiming what it had.
    stale = {**nxt, "a": replace(nxt["a"], generation=0)}
    _, r3 = step(assignor, {S: 6, "t": 1}, stale)
    assert r3["a"].assigned == {}
    assert {c for _, _, c in r3["a"].why} == {"expired"}


def test_bands_are_absolute_and_contain_the_planned_load() -> None:
    res = {S: ResourceSet(3, weights={0: 10.0, 1: 1.0, 2: 1.0})}
    final, results = settle(get_assignor("balanced"), res,
                            {"a": M(), "b": M(), "c": M()})
    w = [10.0, 1.0, 1.0]
    for m in final:
        band = results[-1][m].band
        assert band is not None
        assert band[0] <= loads(final, w)[m] <= band[1]


# ---------------------------------------------------------------- the Python API


def test_resource_set_is_validated_and_other_assignors_use_its_partitions() -> None:
    with pytest.raises(ValueError, match=r"weights\[2\]"):
        ResourceSet(3, weights={2: -1.0})
    with pytest.raises(ValueError, match="weights"):
        ResourceSet(3, weights={3: 1.0})
    with pytest.raises(ValueError, match="default_weight"):
        ResourceSet(3, default_weight=math.inf)
    with pytest.raises(ValueError, match=r"zones\[0\]"):
        ResourceSet(3, zones={0: "eu-1a"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="capacity"):
        Subscription(sets=[S], capacity=0.0)
    with pytest.raises(ValueError, match="load"):
        Subscription(sets=[S], load={S: {0: math.nan}})
    subs = {"m1": Subscription(sets=[S, "t"]), "m2": Subscription(sets=[S])}
    for name in ("range", "roundrobin", "sticky", "cooperative-sticky", "incremental-cooperative"):
        a = get_assignor(name)
        plain = a.assign({S: 5, "t": 3}, subs)
        rich = a.assign({S: ResourceSet(5, weights={0: 9.0}), "t": ResourceSet(3)}, subs)
        assert plain == rich, name


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="band"):
        get_assignor("balanced", band=1.5)
    with pytest.raises(ValueError, match="max_moves"):
        get_assignor("balanced", max_moves=0)
    with pytest.raises(TypeError):
        get_assignor("balanced", colour="blue")


def test_protocol_md_example() -> None:
    assignor = get_assignor("balanced", band=0.05, max_moves=50)
    resources = {"orders": ResourceSet(partitions=1000, weights={3: 40.0, 7: 12.5},
                                       zones={3: ("eu-1a",)})}
    subs = {"m1": Subscription(sets=["orders"], rack="eu-1a", capacity=2.0,
                               owned={"orders": [3, 5]}, generation=7,
                               load={"orders": {3: 41.2, 5: 0.8}}),
            "m2": Subscription(sets=["orders"], rack="eu-1b")}
    result = assignor.assign(resources, subs)
    validate_assignment(resources, subs, result, cooperative=True)
    assert 3 in result["m1"].assigned["orders"]  # home zone, and m1 has room
    total = 41.2 + 0.8 + 12.5 + 997
    m1 = 41.2 + 0.8 + sum(12.5 if i == 7 else 1.0 for i in result["m1"].assigned["orders"]
                          if i not in (3, 5))
    assert abs(m1 / 2 - total / 3) <= 0.05 * total / 3


def test_the_leader_passes_the_v12_fields_both_ways() -> None:
    """The leader decodes capacity, load, warm and draining from the members'
    metadata, and sends standby, why and band in their assignments."""
    from client.leader import perform_assignment
    from protocol.messages import JoinMember
    from protocol.resources import MemberMetadata, ResourceAssignment

    metas = {
        "a": MemberMetadata((S,), {S: [0, 1, 2, 3]}, 4, capacity=1.0,
                            load={S: {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}}, draining=True),
        "b": MemberMetadata((S,), {S: [4, 5]}, 4, capacity=2.0, user_data=ECHO),
    }
    members = [JoinMember(m, None, meta.encode()) for m, meta in metas.items()]
    out = perform_assignment(get_assignor("balanced"), {S: 6}, members).assignments
    a = ResourceAssignment.decode(out["a"].encode())
    b = ResourceAssignment.decode(out["b"].encode())
    assert a.assigned == {} and {c for _, _, c in a.why} == {"drain"} and a.band is None
    assert b.assigned == {S: [4, 5]} and b.band is not None
    assert b.band[0] <= 6.0 <= b.band[1]  # all six will be b's


def test_a_resource_in_transit_keeps_its_measured_load() -> None:
    """The docs/assignors.md example: resource 1 measures 12 (catalog: 4).
    While it changes hands nobody reports it; the follow-up round still
    plans with 12, so every resource moves at most once and the group rests
    after the hand-over."""
    res = {"s": ResourceSet(8, weights={0: 8.0, 1: 4.0}, zones={0: ("eu-1a",)})}
    group = {"a": M(rack="eu-1a"), "b": M(rack="eu-1b"), "c": M(rack="eu-1b", capacity=2.0)}
    assignor = get_assignor("balanced")
    base, _ = settle(assignor, res, group)
    measured = {i: 1.0 for i in range(8)} | {0: 8.0, 1: 12.0}
    final, results = settle(assignor, res, base, load=measured)
    assert len(results) == 3  # revoke, hand over, rest
    before, after = owner_map(base), owner_map(final)
    moved = [i for i in after if before[i] != after[i]]
    gained = [(m, i) for r in results for m in r for _, i, _ in r[m].why if m == after[i]]
    assert sorted(i for _, i in gained) == sorted(moved)  # each moved once
    w = [measured[i] for i in range(8)]
    assert busiest(final, w) == 8.0  # the optimum: a member of capacity 1 holds resource 0


def test_a_standby_holder_gets_the_resource_when_its_owner_leaves() -> None:
    res = {S: 4}
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1, user_data=ECHO),
             "b": M(generation=1, user_data=ECHO), "c": M(generation=1, user_data=ECHO)}
    assignor = get_assignor("balanced", warmup=True)
    nxt, r1 = step(assignor, res, group)
    assert r1["b"].standby and r1["c"].standby  # both warm up part of a's
    # a crashes before anything is warm: the standbys are handed over where they were warming.
    _, r2 = step(assignor, res, {m: x for m, x in nxt.items() if m != "a"})
    for m in ("b", "c"):
        assert set(r1[m].standby.get(S, [])) <= set(r2[m].assigned.get(S, []))


def test_a_settled_member_echoes_nothing_so_a_static_restart_is_no_change() -> None:
    """KIP-345: a static member that restarts comes back without the echoed
    user_data. Once the group has settled nothing is echoed, so the
    coordinator sees the same subscription and hands back the assignment
    without a rebalance."""
    from coordinator.core.membership import subscription_changed
    from protocol.resources import MemberMetadata

    res, base = twenty(WEIGHTS)
    final, results = settle(get_assignor("balanced"), res, base)
    last = results[-1]["m04"]
    before = MemberMetadata((S,), final["m04"].owned, 9, user_data=last.user_data)
    restarted = MemberMetadata((S,))
    assert not subscription_changed(
        "resources", (("balanced", before.encode()),), (("balanced", restarted.encode()),))
    # While a hand-over is under way the state is echoed (and a restart then
    # is a change: the hand-over is not finished).
    group = {**base, "new": M()}
    _, r1 = step(get_assignor("balanced"), res, group)
    assert any(a.user_data for a in r1.values())


def test_a_hand_over_is_placed_before_a_resource_goes_home_so_the_group_rests() -> None:
    """Resource 0 (home zone a) is revoked from m0 for m2, the member of zone
    a. In the follow-up round resource 3 (home a too) is still away from
    home: were it sent home first, m2 would have no room left for 0, which
    would go back to m0, and the next round would start over, for ever."""
    res = {S: ResourceSet(6, weights={2: 5.0, 4: 5.0, 5: 10.0},
                          zones={0: ("a",), 3: ("a",)})}
    group = {"m0": M(rack="c"), "m1": M(rack="b"), "m2": M(rack="a", capacity=2.0),
             "m3": M(rack="c", capacity=4.0)}
    final, results = settle(get_assignor("balanced"), res, group, rounds=10)
    assert final["m2"].owned[S] == (0, 4)  # the hand-over arrived
    assert len(results) <= 4


def test_a_resource_handed_over_keeps_its_measured_load_until_its_new_owner_measures_it() -> None:
    """A draining member hands over a hot resource (measured 10, catalog 1),
    one move a round. Its receiver has not measured it yet when the next
    rounds are planned: they still count it at 10, so nothing more lands on
    the receiver, no member's actual load goes over the band it is given, and
    the group ends inside its bands."""
    measured = {0: 10.0}
    actual = [measured.get(i, 1.0) for i in range(6)]
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1, draining=True),
             "b": M(owned={S: (4,)}, generation=1), "c": M(owned={S: (5,)}, generation=1)}
    #: what each member has measured: what it owned at the start, only.
    knows = {m: set(x.owned.get(S, ())) for m, x in group.items()}
    assignor = BalancedAssignor(max_moves=1)
    for _ in range(6):
        subs = {m: Subscription(sets=[S], owned={S: list(x.owned[S])} if x.owned.get(S) else {},
                                generation=x.generation, user_data=x.user_data,
                                draining=x.draining,
                                load={S: {i: actual[i] for i in x.owned.get(S, ())
                                          if i in knows[m]}})
                for m, x in group.items()}
        result = assignor.assign({S: 6}, subs)
        validate_assignment({S: 6}, subs, result, cooperative=True)
        group = {m: replace(x, owned={S: tuple(result[m].assigned.get(S, []))},
                            user_data=result[m].user_data, generation=x.generation + 1)
                 for m, x in group.items()}
        for m in ("b", "c"):
            band = result[m].band
            assert band is not None
            load = math.fsum(actual[i] for i in group[m].owned[S])
            # Never over it (below it only while a hand-over to it is under way).
            assert load <= band[1], (m, load, band, group)
    assert not group["a"].owned[S]
    for m in ("b", "c"):
        band = result[m].band
        assert band is not None
        assert band[0] <= math.fsum(actual[i] for i in group[m].owned[S]) <= band[1]


def test_each_assignment_says_the_load_it_gives_and_the_members_fair_share() -> None:
    """``Assignment.load`` is ``(load of what is assigned, ideal)``: the weights
    as the assignor took them (a measured load over the catalog's weight), the
    ideal the group's load times the member's capacity over the capacity of
    the members sharing it."""
    res = {S: ResourceSet(4, weights={0: 3.0}), "t": 2}
    group = {"a": M(capacity=2.0), "b": M(), "c": M(sets=("t",))}
    _, first = step(BalancedAssignor(), res, group)
    weights = {0: 3.0, 1: 1.0, 2: 1.0, 3: 1.0}
    for a in first.values():
        assert a.load is not None
        assert a.load[0] == pytest.approx(sum(weights[i] for i in a.assigned.get(S, ()))
                                     + len(a.assigned.get("t", ())))
    # s (6.0) is shared by a (capacity 2) and b; t (2.0) by c alone: each set
    # its class, the ideal over every set's load and every sharing member.
    ideals = {m: a.load[1] for m, a in first.items() if a.load is not None}
    assert ideals == pytest.approx({"a": 8.0 * 2 / 4, "b": 8.0 / 4, "c": 8.0 / 4})
    # a measured load replaces the catalog's weight in the sum
    owned = {m: M(capacity=x.capacity, sets=x.sets, generation=1,
                  owned={s: tuple(i) for s, i in first[m].assigned.items()})
             for m, x in group.items()}
    holder = next(m for m, a in first.items() if 0 in a.assigned.get(S, ()))
    _, again = step(BalancedAssignor(band=0.9), res, owned, load={0: 3.5, 1: 1.0, 2: 1.0,
                                                                   3: 1.0})
    assert again[holder].load is not None
    assert again[holder].load[0] == pytest.approx(
        3.5 + sum(1.0 for i in again[holder].assigned.get(S, ()) if i != 0))


def test_in_a_hand_over_the_load_is_of_what_is_given_now() -> None:
    """A join: the first round revokes, the follow-up hands over. In every
    round each member's ``load`` is the weight of what that round's
    assignment gives it (what is being revoked is nobody's), and the ideals
    add up to the group's load."""
    res, base = twenty(WEIGHTS)
    _, history = settle(get_assignor("balanced"), res, {**base, "new": M()})
    assert len(history) >= 2 and any(a.why for a in history[0].values())
    for result in history:
        for a in result.values():
            assert a.load is not None
            assert a.load[0] == pytest.approx(sum(WEIGHTS[i] for i in a.assigned.get(S, ())))
        assert sum(a.load[1] for a in result.values() if a.load) == pytest.approx(sum(WEIGHTS))


def test_a_settled_group_echoes_no_hand_over_any_more() -> None:
    """The client keeps the last ``user_data`` an assignment carried until one
    carries another (docs/client.md). So once a hand-over is over, the assignor
    must hand its revoker an echo without it, not no echo: a stale one still
    named the old receiver and the load measured then, and the next hand-over
    of that resource went back to the old receiver, each round undoing the
    last (simulator seed 3014575)."""
    res = {S: ResourceSet(4, weights={0: 5.0})}
    group = {"a": M(owned={S: (0, 1, 2, 3)}, generation=1), "b": M(generation=1)}
    final, results = settle(get_assignor("balanced"), res, group)
    assert any(r["a"].why for r in results)  # a handed something over
    for m, x in final.items():
        echo = read_echo(x.user_data)
        assert echo is None or not echo.revoked, (m, echo)
    # Then b's hot resource moves on to a newcomer: it goes there, not back.
    hot = next(m for m, x in final.items() if 0 in x.owned.get(S, ()))
    joined = {**final, "c": M(generation=final[hot].generation, capacity=4.0)}
    settled, _ = settle(get_assignor("balanced"), res, joined)
    assert 0 in settled["c"].owned.get(S, ()), settled
