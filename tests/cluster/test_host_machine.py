"""The partition host's decisions without a database (coordinator/cluster/host_machine.py):
the machine is stepped by hand here, as PartitionHost and the simulator step it."""

from __future__ import annotations

from datetime import UTC, datetime

from coordinator.cluster import host_effects as hx
from coordinator.cluster.host_machine import HostMachine
from coordinator.storage.leases import CoordinatorRow, LeaseRow
from coordinator.storage.postgres import CatalogState
from protocol.errors import ErrorCode
from protocol.messages import NotCoordinatorAnswer

LEASE_MS = 1_000
P = 4
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Runtime:
    """What the machine hands back: any object stands for a partition's runtime."""


def row(partition: int, owner: str | None = None, epoch: int = 0,
        left_ms: int = -1) -> LeaseRow:
    return LeaseRow(partition, owner, f"http://{owner}" if owner else None, epoch, left_ms,
                    None, f"http://{owner}:1" if owner else None)


def live(*ids: str) -> list[CoordinatorRow]:
    return [CoordinatorRow(cid, f"http://{cid}", T0, 0) for cid in ids]


def step(machine: HostMachine[Runtime]) -> hx.Step:
    outstanding = machine.step
    assert outstanding is not None
    return outstanding


def started(machine: HostMachine[Runtime], now: float, rows: list[LeaseRow],
            coordinators: list[CoordinatorRow]) -> list[object]:
    """Start through the first round's cluster read; the effects since."""
    machine.start(now)
    machine.done(now, step(machine))                                  # register
    machine.done(now, step(machine), CatalogState({"orders": 2}, {}, 1))
    assert isinstance(step(machine), hx.ReadCluster)                  # nothing held yet
    machine.done(now, step(machine), (coordinators, rows))
    return list(machine.take())


def test_a_lone_coordinator_acquires_every_partition_and_serves_once_loaded() -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", P, LEASE_MS)
    started(m, 0.0, [row(p) for p in range(P)], live("a"))
    epochs = {}
    while isinstance(s := step(m), hx.Acquire):
        epochs[s.partition] = 7
        m.done(0.1, s, 7)
    assert sorted(epochs) == list(range(P))
    effects = m.take()
    assert sorted(e.partition for e in effects if isinstance(e, hx.Load)) == list(range(P))
    # Loading: calls are answered "load in progress"; find_coordinator names itself.
    assert m.route(0.2, 0) == NotCoordinatorAnswer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "")
    assert m.find_coordinator(0).url == "http://a"
    runtime = Runtime()
    m.loaded(0.3, 0, 7, runtime)
    serve = m.take()
    assert len(serve) == 1 and isinstance(serve[0], hx.Serve)
    assert serve[0].adoption.resources_epoch == 1
    assert m.route(0.4, 0) is runtime
    # The round ends with the catalog read and the next round a tick later.
    assert step(m) == hx.ReadCatalog(1)
    m.done(0.5, step(m), None)
    assert hx.NextRound(0.5 + LEASE_MS / 5 / 1000) in m.take()
    assert m.step is None


def test_a_lease_not_renewed_is_dropped_and_freed_and_its_expiry_drops_the_rest() -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", P, LEASE_MS)
    started(m, 0.0, [row(p) for p in range(2)] + [row(p, "b", 1, 900) for p in (2, 3)],
            live("a", "b"))
    for _ in (0, 1):
        s = step(m)
        assert isinstance(s, hx.Acquire) and s.partition in (0, 1)
        m.done(0.0, s, 3)
    m.done(0.0, step(m), None)                                        # the catalog
    runtimes = {n: Runtime() for n in (0, 1)}
    for number, runtime in runtimes.items():
        m.loaded(0.1, number, 3, runtime)
    m.take()
    m.begin_round(0.2)
    assert step(m) == hx.Renew(((0, 3), (1, 3)))
    m.done(0.25, step(m), {1})
    effects = m.take()
    assert hx.Drop(0, 3, runtimes[0], "its lease was not renewed (another coordinator took "
                   "it over, or it ran out)") in effects
    assert hx.FreeDropped(0, 3) in effects
    # Partition 1's lease was renewed as of the round's start: valid until 1.2 s.
    assert hx.ArmExpiry(0.2 + LEASE_MS / 1000) in effects
    assert m.route(1.19, 1) is runtimes[1]
    m.expire(1.2)
    assert [e for e in m.take() if isinstance(e, hx.Drop)] == [
        hx.Drop(1, 3, runtimes[1], "its lease ran out by this coordinator's clock")]
    assert m.route(1.3, 1) == NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, "")


def test_the_owner_named_is_the_lease_holder_whether_or_not_it_is_live() -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", P, LEASE_MS)
    rows = [row(p, "b", 1, 60_000) for p in range(P)]
    started(m, 0.0, rows, live("a"))
    assert m.route(0.0, 2) == NotCoordinatorAnswer(ErrorCode.NOT_COORDINATOR, "http://b")
    assert m.find_coordinator(2).url == "http://b"
    other = m.other_owner(2)
    assert other is not None and other.owner_admin_url == "http://b:1"
    # b is not live, but its leases run a minute more: the next round is a tick later.
    m.done(0.0, step(m), None)
    assert hx.NextRound(0.0 + LEASE_MS / 5 / 1000) in m.take()


def test_a_round_that_cannot_renew_ends_and_keeps_nothing_past_its_lease() -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", 1, LEASE_MS)
    started(m, 0.0, [row(0)], live("a"))
    m.done(0.0, step(m), 1)
    m.done(0.0, step(m), None)
    m.take()
    m.begin_round(0.9)
    m.failed(1.05, step(m), "database gone")
    effects = m.take()
    assert hx.RoundFailed("database gone") in effects
    assert any(isinstance(e, hx.Drop) and e.partition == 0 for e in effects)
    assert m.step is None and m.partitions == {}


def test_a_stop_hands_off_every_partition_even_one_a_cancelled_round_was_handing_off(
        ) -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", 2, LEASE_MS)
    started(m, 0.0, [row(0), row(1)], live("a"))
    m.done(0.0, step(m), 1)
    m.done(0.0, step(m), 1)
    m.done(0.0, step(m), None)
    runtimes = [Runtime(), Runtime()]
    m.loaded(0.1, 0, 1, runtimes[0])
    m.loaded(0.1, 1, 1, runtimes[1])
    # b joins: a hands partition 1 off, and is stopped while the runtime drains.
    m.begin_round(0.2)
    m.done(0.2, step(m), {0, 1})
    m.done(0.2, step(m), (live("a", "b"), [row(0, "a", 1, 1000), row(1, "a", 1, 1000)]))
    assert step(m) == hx.HandOff(1, 1, runtimes[1])
    m.take()
    m.stop(0.3)
    handed = []
    while (s := m.step) is not None:
        if isinstance(s, hx.HandOff):
            handed.append(s.partition)
        m.done(0.3, s, True)
    assert handed == [0, 1]
    assert hx.Stopped((0, 1)) in m.take()
    assert m.partitions == {}


def test_a_start_whose_register_fails_fails() -> None:
    m: HostMachine[Runtime] = HostMachine("a", "http://a", 2, LEASE_MS)
    m.start(0.0)
    m.failed(0.0, step(m), "refused")
    assert m.take()[-1] == hx.StartFailed("refused")
    assert m.step is None
