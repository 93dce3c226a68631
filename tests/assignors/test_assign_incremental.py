"""incremental-cooperative: deferred imbalance resolution (KIP-415) with the
state carried in user_data and time given as now_ms."""

from __future__ import annotations

import random

import pytest
from assignors_testkit import flat, owners, spread

from client.assignors import Assignment, Subscription, get_assignor, validate_assignment
from client.assignors.incremental_cooperative import IncrementalCooperativeAssignor

DELAY = 10_000
RES = {"t": 12, "u": 6}
SETS = ["t", "u"]


def assignor(**kw: int) -> IncrementalCooperativeAssignor:
    settings = {"scheduled_rebalance_max_delay_ms": DELAY, **kw}
    a = get_assignor("incremental-cooperative", **settings)
    assert isinstance(a, IncrementalCooperativeAssignor)
    return a


class Group:
    """Members that echo user_data and rejoin with what they were given."""

    def __init__(self, a: IncrementalCooperativeAssignor, members: list[str]) -> None:
        self.a = a
        self.subs = {m: Subscription(sets=SETS) for m in members}
        self.gen = 0
        self.last: dict[str, Assignment] = {}

    def round(self, now: int) -> dict[str, Assignment]:
        result = self.a.assign(RES, self.subs, now_ms=now)
        validate_assignment(RES, self.subs, result, cooperative=True)
        assert result == self.a.assign(RES, dict(self.subs), now_ms=now)  # deterministic
        self.gen += 1
        self.subs = {
            m: Subscription(
                sets=SETS,
                owned=result[m].assigned,
                generation=self.gen,
                user_data=result[m].user_data,
                group_instance_id=sub.group_instance_id,
            )
            for m, sub in self.subs.items()
        }
        self.last = result
        return result

    def leave(self, m: str) -> None:
        del self.subs[m]

    def join(self, m: str, instance: str | None = None) -> None:
        self.subs[m] = Subscription(sets=SETS, group_instance_id=instance)

    def complete(self) -> bool:
        return len(owners(self.last)) == sum(RES.values()) and spread(self.last) <= 1


def plain(result: dict[str, Assignment]) -> dict[str, tuple[dict[str, list[int]], int]]:
    """Without user_data (its sequence number moves every round)."""
    return {m: (a.assigned, a.delay_ms) for m, a in result.items()}


def settle(g: Group, now: int) -> None:
    """Complete, balanced, no timer, and the next round changes nothing;
    within three rounds."""
    for _ in range(3):
        first = plain(g.round(now))
        if g.complete() and all(d == 0 for _, d in first.values()):
            assert plain(g.round(now)) == first
            return
    raise AssertionError("did not settle")


def test_departure_is_deferred_and_the_member_gets_its_resources_back() -> None:
    g = Group(assignor(), ["a", "b", "c"])
    settle(g, 0)
    before = {m: flat(a) for m, a in g.last.items()}
    g.leave("b")
    r = g.round(1_000)
    assert all(a.delay_ms == DELAY for a in r.values())
    assert {m: flat(a) for m, a in r.items()} == {"a": before["a"], "c": before["c"]}
    # Another rebalance in the meantime keeps the deadline.
    r = g.round(4_000)
    assert all(a.delay_ms == DELAY - 3_000 for a in r.values())
    assert not any(flat(a) & before["b"] for a in r.values())
    # b comes back (a restarted process: it owns nothing) before the deadline.
    g.join("b")
    r = g.round(6_000)
    assert flat(r["b"]) == before["b"]
    assert all(a.delay_ms == 0 for a in r.values())
    assert g.complete()


def test_static_member_is_recognised_by_instance_id() -> None:
    g = Group(assignor(), [])
    for m, i in (("a-1", "east"), ("b-1", "west"), ("c-1", "north")):
        g.join(m, i)
    settle(g, 0)
    west = flat(g.last["b-1"])
    g.leave("b-1")
    g.round(10)
    g.join("b-2", "west")  # restarted: new member id, same instance id
    r = g.round(20)
    assert flat(r["b-2"]) == west


def test_after_the_delay_lost_resources_go_to_the_least_loaded() -> None:
    g = Group(assignor(), ["a", "b", "c", "d"])
    settle(g, 0)
    g.leave("c")
    g.round(1_000)
    r = g.round(1_000 + DELAY)
    assert all(a.delay_ms == 0 for a in r.values())
    assert len(owners(r)) == sum(RES.values()) and spread(r) <= 1
    assert plain(g.round(1_000 + DELAY)) == plain(r)


def test_zero_delay_spreads_at_once() -> None:
    g = Group(assignor(scheduled_rebalance_max_delay_ms=0), ["a", "b", "c"])
    settle(g, 0)
    g.leave("a")
    r = g.round(5)
    assert len(owners(r)) == sum(RES.values()) and r["b"].delay_ms == 0


def test_new_member_is_balanced_cooperatively() -> None:
    g = Group(assignor(), ["a", "b"])
    settle(g, 0)
    g.join("c")
    first = g.round(100)
    assert flat(first["c"]) == set()  # everything for c is still owned: revoked first
    second = g.round(100)
    assert len(flat(second["c"])) == 6 and g.complete()


def test_back_to_back_revoking_rounds_back_off() -> None:
    g = Group(assignor(revocation_backoff_ms=2_000), ["a", "b"])
    settle(g, 0)
    g.join("c")
    before = g.round(100)  # revokes for c
    g.join("d")  # before the follow-up: another revoking change
    r = g.round(200)
    held = [m for m, a in r.items() if len(flat(a)) > len(flat(g.last[m]))]
    assert not held
    assert all(a.delay_ms == 2_000 - 100 for a in r.values())
    # Owners kept what they had: nothing was revoked in this round.
    for m in ("a", "b"):
        assert flat(r[m]) >= flat(before[m])
    # Once the back-off ran out, the revocation goes ahead and the group settles.
    settle(g, 2_100)
    assert g.complete()


def test_foreign_or_garbage_user_data_is_ignored() -> None:
    subs = {
        "a": Subscription(sets=SETS, user_data=b"\x00not json"),
        "b": Subscription(sets=SETS, user_data=b'{"v": 7}'),
    }
    r = assignor().assign(RES, subs, now_ms=0)
    assert len(owners(r)) == sum(RES.values())


def test_leader_change_keeps_the_state() -> None:
    """The state is in every member's user_data: whoever leads next knows
    about the departure (the assignor has no memory of its own)."""
    g = Group(assignor(), ["a", "b", "c"])
    settle(g, 0)
    gone = flat(g.last["a"])
    g.leave("a")
    g.round(50)
    fresh_assignor = assignor()  # another process, the new leader
    g.a = fresh_assignor
    r = g.round(60)
    assert not any(flat(x) & gone for x in r.values())
    assert r["b"].delay_ms == DELAY - 10


@pytest.mark.parametrize("seed", [7, 8])
def test_random_churn_stays_valid_and_settles(seed: int) -> None:
    rng = random.Random(seed)
    g = Group(assignor(revocation_backoff_ms=500), ["m0", "m1", "m2"])
    now, n = 0, 3
    for _ in range(30):
        event = rng.choice(["join", "leave", "nothing", "wait"])
        if event == "join" or len(g.subs) <= 1:
            g.join(f"m{n}")
            n += 1
        elif event == "leave":
            g.leave(rng.choice(sorted(g.subs)))
        elif event == "wait":
            now += DELAY
        now += rng.randrange(0, 3_000)
        g.round(now)
    # Left alone long enough, the group ends complete and balanced.
    now += 2 * DELAY
    settle(g, now)


def test_state_survives_a_copy_holder_leaving() -> None:
    """Only a few members carry the group state; losing one of them (here
    the first in identity order) still leaves a copy."""
    g = Group(assignor(), [f"m{k}" for k in range(7)])
    settle(g, 0)
    holders = [m for m, a in g.last.items() if a.user_data and b'"group"' in a.user_data]
    assert 1 <= len(holders) <= 3
    gone = flat(g.last["m0"])
    g.leave("m0")
    r = g.round(100)
    assert r["m1"].delay_ms == DELAY
    assert not any(flat(a) & gone for a in r.values())


def test_returning_member_over_its_share_leaves_nothing_unassigned() -> None:
    """Simulator seed 112: a member comes back (restarted, owning nothing)
    to a group that grew meanwhile, so its old resources exceed its share.
    Its claim on them is the assignor's own bookkeeping, not ownership: what
    the plan does not give back to it must go to the others in this round
    (nobody revokes it, so no follow-up rebalance would ever hand it out)."""
    g = Group(assignor(), ["a", "b"])
    settle(g, 0)
    g.leave("b")
    r = g.round(1_000)
    assert r["a"].delay_ms == DELAY
    # Everyone restarts at once, and c is new: nobody owns anything.
    g.subs = {m: Subscription(sets=SETS, user_data=sub.user_data)
              for m, sub in g.subs.items()}
    g.join("b")
    g.join("c")
    r = g.round(2_000)
    assert len(owners(r)) == sum(RES.values()), (
        f"unassigned with no follow-up asked for: {plain(r)}")
    assert spread(r) <= 1
