"""A join and a crash in a group of members, in virtual time.

4 members share 64 resources, a 5th joins, then one is killed. The real
member (driver, machine) and the real runtime and core on one virtual clock,
each member behind a network with a round trip; a killed member's network
swallows everything from the instant it dies (a SIGKILLed process sends
nothing more), and from that instant the ledger counts it as holding nothing
and ignores whatever its abandoned object still does. The ledger of every
callback is replayed to check:

- at no instant do two members hold one resource;
- after the changes settle, every resource is owned exactly once;
- cooperative: a member never sees a resource revoked that it keeps, and
  revokes exactly what moved;
- eager: every member revokes everything it held on each rebalance.

The same scenario with real member processes (SIGKILL, the
``BlockingGroupMember`` newcomer, the real server) is the smoke test of the
drivers in test_member_processes.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from client_harness import InProcessCoordinator, Ledger, check_ledger
from virtual_time import LatencyTransport, in_process_coordinator, loop_ms, loop_s, run_virtual

from client.listener import Resource
from client.member import GroupMember

pytestmark = pytest.mark.timeout(60)

TOTAL = 64
SESSION_MS = 1_500
RTT_MS = 4
#: member_proc.py's settings for the same scenario.
SETTINGS: dict[str, Any] = dict(session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300,
                                rebalance_timeout_ms=10_000, retry_backoff_ms=50,
                                retry_backoff_max_ms=500)

Event = tuple[float, str, str, frozenset[Resource]]


class Killable(LatencyTransport):
    """``killed``: nothing is sent any more, nothing is answered."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        super().__init__(coordinator, RTT_MS)
        self.killed = False

    async def call(self, api: str, request: Any) -> Any:
        if self.killed:
            await asyncio.get_running_loop().create_future()
        return await super().call(api, request)


@dataclass
class Group:
    coordinator: InProcessCoordinator
    assignor: list[str]
    ledger: Ledger = field(default_factory=lambda: Ledger(clock=loop_s))
    members: dict[str, GroupMember] = field(default_factory=dict)
    nets: dict[str, Killable] = field(default_factory=dict)
    #: member -> (when it was killed, how many ledger events there were then)
    killed: dict[str, tuple[float, int]] = field(default_factory=dict)

    def start(self, name: str) -> None:
        self.nets[name] = Killable(self.coordinator)
        self.members[name] = GroupMember(self.nets[name], "g", ["s"], assignors=self.assignor,
                                         client_id=name, listener=self.ledger.listener(name),
                                         clock=loop_ms, **SETTINGS)
        self.members[name].start()

    def kill(self, name: str) -> None:
        self.killed[name] = (loop_s(), len(self.ledger.events))
        self.nets[name].killed = True

    def events(self) -> list[Event]:
        events = list(self.ledger.events)
        # A killed member stops processing the moment it dies.
        for name, (at, seen) in self.killed.items():
            held = check_ledger([e for e in events[:seen] if e[1] == name])
            events = [e for i, e in enumerate(events) if e[1] != name or i < seen]
            events.append((at, name, "lost", frozenset(held)))
        return events

    def holders(self) -> dict[Resource, str]:
        return check_ledger(self.events())

    async def wait_settled(self, members: set[str], timeout_s: float = 30.0) -> dict[
            Resource, str]:
        deadline = loop_s() + timeout_s
        last: Any = None
        stable_since = loop_s()
        while loop_s() < deadline:
            holders = self.holders()  # also checks no double ownership so far
            good = (len(holders) == TOTAL and set(holders.values()) == members)
            if holders != last:
                last, stable_since = holders, loop_s()
            elif good and loop_s() - stable_since > 0.8:
                return holders
            for name, member in self.members.items():
                if name not in self.killed and member.failure is not None:
                    raise AssertionError(f"member {name} failed: {member.failure!r}")
            await asyncio.sleep(0.1)
        raise AssertionError(f"not settled within {timeout_s}s: {len(last or {})} resources "
                             f"held by {sorted(set((last or {}).values()))}")

    async def stop_all(self) -> None:
        await asyncio.gather(*(m.close(timeout_s=10) for n, m in self.members.items()),
                             return_exceptions=True)

    def revoked_between(self, member: str, start: float, end: float) -> set[Resource]:
        return {r for t, m, k, rs in self.events() if m == member and start <= t < end
                and k in ("revoked", "lost") for r in rs}


async def _scenario(assignor: list[str]) -> tuple[Group, dict[str, Any]]:
    report: dict[str, Any] = {}
    async with in_process_coordinator() as coordinator:
        await coordinator.put_resource("s", TOTAL)
        group = Group(coordinator, assignor)
        try:
            first = {"m1", "m2", "m3", "m4"}
            for name in sorted(first):
                group.start(name)
            before_join = await group.wait_settled(first)
            t_join = loop_s()
            group.start("m5")
            after_join = await group.wait_settled(first | {"m5"})
            t_kill = loop_s()
            group.kill("m2")
            after_kill = await group.wait_settled({"m1", "m3", "m4", "m5"})
            report.update(before_join=before_join, after_join=after_join,
                          after_kill=after_kill, t_join=t_join, t_kill=t_kill, t_end=loop_s())
            # the merged ledger, checked once more in full, and every resource once at the end
            final = check_ledger(group.events())
            assert sorted(final) == [("s", i) for i in range(TOTAL)]
        finally:
            await group.stop_all()
    # after a clean stop nobody holds anything, and nothing was ever held twice
    assert check_ledger(group.events()) == {}
    return group, report


def test_cooperative_join_and_kill_never_revoke_what_a_member_keeps() -> None:
    group, rep = run_virtual(lambda: _scenario(["cooperative-sticky"]))
    for phase, (before, after, start, end) in {
        "join": (rep["before_join"], rep["after_join"], rep["t_join"], rep["t_kill"]),
        "kill": (rep["after_join"], rep["after_kill"], rep["t_kill"], rep["t_end"]),
    }.items():
        for member in sorted(set(before.values()) - set(group.killed)):
            kept = {r for r, m in after.items() if m == member} & {
                r for r, m in before.items() if m == member}
            revoked = group.revoked_between(member, start, end)
            assert not revoked & kept, f"{phase}: {member} revoked resources it kept"
            moved = {r for r, m in before.items() if m == member} - kept
            assert revoked == moved, f"{phase}: {member} revoked {revoked}, moved {moved}"
    # the newcomer took about a fifth, and only from the others' surplus
    assert 12 <= sum(1 for m in rep["after_join"].values() if m == "m5") <= 13


def test_eager_join_and_kill_revoke_everything() -> None:
    group, rep = run_virtual(lambda: _scenario(["range"]))
    for member in ("m1", "m3", "m4"):
        held = {r for r, m in rep["before_join"].items() if m == member}
        assert group.revoked_between(member, rep["t_join"], rep["t_kill"]) == held
        held = {r for r, m in rep["after_join"].items() if m == member}
        assert group.revoked_between(member, rep["t_kill"], rep["t_end"]) == held
