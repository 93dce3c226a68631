"""The owner's local lease rule and the balance of partitions, without a database."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.storage.leases import LocalLease, Plan, balance, quotas


class FakeClock:
    """A monotonic clock that moves only when told (as Harness.advance does)."""

    def __init__(self) -> None:
        self.ms = 0.0

    @property
    def now(self) -> float:
        return 1000.0 + self.ms / 1000

    def advance(self, ms: float) -> None:
        self.ms += ms


def test_local_lease_counts_from_the_time_the_request_was_sent() -> None:
    clock = FakeClock()
    sent = clock.now
    clock.advance(300)  # the acquire took 300 ms to come back
    lease = LocalLease.granted(partition=3, epoch=7, lease_ms=5000, sent_at=sent)
    clock.advance(4_699.99)
    assert lease.valid(clock.now)
    assert lease.remaining(clock.now) == pytest.approx(0.00001)
    clock.advance(0.02)  # 5,000 ms after the SEND, 4,700 after the answer: stop answering
    assert not lease.valid(clock.now)
    assert lease.remaining(clock.now) == 0.0


def test_renewal_extends_from_its_send_time_and_never_shortens() -> None:
    clock = FakeClock()
    lease = LocalLease.granted(0, 1, 1000, clock.now)
    clock.advance(600)
    first_sent = clock.now
    clock.advance(200)
    second_sent = clock.now
    clock.advance(100)
    # The second renewal's answer arrives first, then the first one's.
    lease = lease.renewed(second_sent).renewed(first_sent)
    assert lease.valid_until == pytest.approx(second_sent + 1.0)
    assert (lease.partition, lease.epoch) == (0, 1)
    clock.advance(899.99)
    assert lease.valid(clock.now)
    clock.advance(0.02)
    assert not lease.valid(clock.now)


def test_an_unanswered_renewal_does_not_extend() -> None:
    clock = FakeClock()
    lease = LocalLease.granted(0, 1, 1000, clock.now)
    clock.advance(500)  # a renewal is sent here and never answered: nothing to apply
    clock.advance(500)
    assert not lease.valid(clock.now)


def test_quotas_are_even_and_agreed_by_everyone() -> None:
    assert quotas(["b", "a", "c"], 64) == {"a": 22, "b": 21, "c": 21}
    assert quotas(["a"], 8) == {"a": 8}
    assert quotas(["a", "b", "c"], 2) == {"a": 1, "b": 1, "c": 0}
    assert quotas([], 8) == {}


def test_a_lone_coordinator_takes_every_free_partition() -> None:
    plan = balance("a", ["a"], {}, 8)
    assert sorted(plan.acquire) == list(range(8))
    assert plan.release == ()
    assert balance("a", [], {p: "a" for p in range(8)}, 8) == Plan()


def test_a_newcomer_is_fed_by_exactly_the_excess_of_the_others() -> None:
    owners = {p: ("a" if p < 32 else "b") for p in range(64)}
    live = ["a", "b", "c"]
    a, b, c = (balance(cid, live, owners, 64) for cid in live)
    assert a.acquire == b.acquire == c.acquire == ()  # nothing is free
    assert c.release == ()
    assert len(a.release) == 32 - 22 and len(b.release) == 32 - 21
    assert all(owners[p] == "a" for p in a.release)
    assert all(owners[p] == "b" for p in b.release)


def test_nothing_is_released_that_free_partitions_can_fill() -> None:
    # a has 6 of 8 (its quota is 4), b has none, and 2 are free: b takes the free
    # ones first, a releases only the 2 that b still lacks.
    owners = {p: "a" for p in range(6)}
    plan = balance("a", ["a", "b"], owners, 8)
    assert len(plan.release) == 2
    assert sorted(balance("b", ["a", "b"], owners, 8).acquire) == [6, 7]


def test_partitions_of_a_departed_owner_are_waited_for_not_taken_from_others() -> None:
    # d died holding 4 leases that have not expired yet; b is short by 4: a keeps its
    # share (no hand-off), b gets d's partitions when their leases run out.
    owners = {**{p: "a" for p in range(4)}, **{p: "d" for p in range(4, 8)}}
    assert balance("a", ["a", "b"], owners, 8) == Plan()
    assert balance("b", ["a", "b"], owners, 8) == Plan()
    # ...and once they expired (absent from owners: free), b takes them.
    owners = {p: "a" for p in range(4)}
    assert sorted(balance("b", ["a", "b"], owners, 8).acquire) == [4, 5, 6, 7]


def _simulate(partitions: int, live: list[str], owners: dict[int, str],
              rng: random.Random) -> tuple[dict[int, str], int]:
    """Rounds of every live coordinator (in a random order) applying its plan, as the
    database would let it: an acquire wins only if the partition is still free."""
    releases = 0
    for _ in range(20):
        changed = False
        for cid in rng.sample(live, len(live)):
            plan = balance(cid, live, owners, partitions)
            for p in plan.release:
                assert owners[p] == cid
                del owners[p]
                releases += 1
                changed = True
            for p in plan.acquire:
                if p not in owners:
                    owners[p] = cid
                    changed = True
        if not changed:
            break
    return owners, releases


@settings(max_examples=200, deadline=None)
@given(partitions=st.integers(1, 70), before=st.integers(0, 5), after=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
def test_live_coordinators_converge_to_even_shares_with_minimal_hand_offs(
        partitions: int, before: int, after: int, seed: int) -> None:
    rng = random.Random(seed)
    old = [f"c{i}" for i in range(before)]
    owners = ({p: old[rng.randrange(before)] for p in range(partitions)
               if rng.random() < 0.8} if old else {})
    live = [f"c{i}" for i in range(after)]  # some old ones left, new ones came
    # The leases of those that left have expired.
    owners = {p: o for p, o in owners.items() if o in live}
    share = quotas(live, partitions)
    needed = sum(max(0, sum(1 for o in owners.values() if o == cid) - share[cid])
                 for cid in live)
    final, releases = _simulate(partitions, live, dict(owners), rng)
    counts = [sum(1 for o in final.values() if o == cid) for cid in live]
    assert len(final) == partitions
    assert max(counts) - min(counts) <= 1
    assert releases == needed  # only excess is handed off, once
