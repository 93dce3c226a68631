"""A fake runtime for core tests: a clock you set, request ids, and a timer wheel.

``Harness.run`` applies one command at ``now`` and records every effect; the
timer wheel mirrors ``ScheduleTimer`` / ``CancelTimer`` so ``advance`` can fire
due timers in deadline order, exactly as the runtime would (nothing sleeps).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coordinator.core.commands import (
    Cancelled,
    Command,
    Commit,
    DeleteGroup,
    DeleteResource,
    Fetch,
    Heartbeat,
    Join,
    Leave,
    PutResource,
    Sync,
    TimerFired,
)
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import (
    CancelTimer,
    Effect,
    GroupStateChanged,
    Persist,
    Reply,
    ScheduleTimer,
)
from coordinator.core.records import Record
from protocol.messages import (
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveMember,
    LeaveRequest,
    SyncAssignment,
    SyncRequest,
)

G = "g1"
PROTOS: tuple[tuple[str, bytes], ...] = (("range", b"meta-range"),)


class Harness:
    def __init__(self, **config: Any) -> None:
        config.setdefault("initial_rebalance_delay_ms", 0)
        self.config = CoreConfig(**config)
        self.coord = GroupCoordinator(self.config)
        self.now = 1_000_000
        self._rid = 0
        self._mid = 0
        self.effects: list[Effect] = []
        self.records: list[Record] = []
        self.timers: dict[str, int] = {}

    # ------------------------------------------------------------ plumbing

    def rid(self) -> int:
        self._rid += 1
        return self._rid

    def new_id(self) -> str:
        self._mid += 1
        return f"m{self._mid}"

    def run(self, command: Command) -> list[Effect]:
        out = self.coord.handle(self.now, command)
        self._absorb(out)
        return out

    def _absorb(self, out: Iterable[Effect]) -> None:
        for effect in out:
            self.effects.append(effect)
            if isinstance(effect, Persist):
                self.records.append(effect.record)
            elif isinstance(effect, ScheduleTimer):
                self.timers[effect.key] = effect.deadline_ms
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)

    def restore_from(self, snapshot: Any) -> list[Effect]:
        out = self.coord.restore(snapshot, self.now)
        self._absorb(out)
        return out

    def fire(self, key: str) -> list[Effect]:
        self.timers.pop(key, None)
        return self.run(TimerFired(key))

    def advance(self, ms: int) -> list[Effect]:
        """Move the clock by ``ms``, firing due timers in deadline order at their deadlines."""
        end = self.now + ms
        out: list[Effect] = []
        while True:
            due = [(deadline, key) for key, deadline in self.timers.items() if deadline <= end]
            if not due:
                break
            deadline, key = min(due)
            self.now = max(self.now, deadline)
            out += self.fire(key)
        self.now = end
        return out

    # ------------------------------------------------------------ calls

    def join(self, member_id: str = "", *, group: str = G, instance: str | None = None,
             protocols: tuple[tuple[str, bytes], ...] = PROTOS, session: int = 10_000,
             rebalance: int = 30_000, ptype: str = "resources",
             new_id: str | None = None, principal: str | None = None,
             incarnation: str | None = None, incarnation_ms: int | None = None
             ) -> tuple[int, list[Effect]]:
        rid = self.rid()
        req = JoinRequest(group, member_id, ptype, protocols, session, rebalance,
                          group_instance_id=instance, client_id="cli",
                          incarnation=incarnation, incarnation_ms=incarnation_ms)
        return rid, self.run(Join(rid, req, "10.0.0.1", new_id or self.new_id(), principal))

    def join_dynamic(self, *, group: str = G, **kw: Any) -> tuple[str, int, list[Effect]]:
        """MEMBER_ID_REQUIRED round, then the real join; returns (member id, rid, effects)."""
        rid, out = self.join("", group=group, **kw)
        member_id = reply(out, rid).member_id
        kw.pop("new_id", None)
        rid2, out2 = self.join(member_id, group=group, **kw)
        return member_id, rid2, out2

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
             *, group: str = G, instance: str | None = None, ptype: str | None = None,
             pname: str | None = None, principal: str | None = None
             ) -> tuple[int, list[Effect]]:
        rid = self.rid()
        req = SyncRequest(group, member_id, generation,
                          tuple(SyncAssignment(m, a) for m, a in (assignments or {}).items()),
                          instance, ptype, pname)
        return rid, self.run(Sync(rid, req, principal))

    def heartbeat(self, member_id: str, generation: int, *, group: str = G,
                  instance: str | None = None, wait_ms: int = 0) -> tuple[int, list[Effect]]:
        rid = self.rid()
        return rid, self.run(Heartbeat(rid, HeartbeatRequest(group, member_id, generation,
                                                             instance, wait_ms)))

    def leave(self, *members: tuple[str, str | None], group: str = G,
              principal: str | None = None) -> tuple[int, list[Effect]]:
        rid = self.rid()
        req = LeaveRequest(group, tuple(LeaveMember(m, i) for m, i in members))
        return rid, self.run(Leave(rid, req, principal))

    def commit(self, member_id: str, generation: int, checkpoints: Any, *, group: str = G,
               instance: str | None = None, principal: str | None = None
               ) -> tuple[int, list[Effect]]:
        rid = self.rid()
        req = CommitRequest(group, member_id, generation, tuple(checkpoints), instance)
        return rid, self.run(Commit(rid, req, principal))

    def fetch(self, resources: Any = None, *, group: str = G) -> tuple[int, list[Effect]]:
        rid = self.rid()
        return rid, self.run(Fetch(rid, FetchRequest(group, resources)))

    def cancel(self, request_id: int) -> list[Effect]:
        return self.run(Cancelled(request_id))

    def delete_group(self, group: str = G) -> tuple[int, list[Effect]]:
        rid = self.rid()
        return rid, self.run(DeleteGroup(rid, group))

    def put_resource(self, name: str, partitions: int) -> tuple[int, list[Effect]]:
        rid = self.rid()
        return rid, self.run(PutResource(rid, name, partitions))

    def delete_resource(self, name: str) -> tuple[int, list[Effect]]:
        rid = self.rid()
        return rid, self.run(DeleteResource(rid, name))

    # ------------------------------------------------------------ scenarios

    def stable_group(self, n: int, *, group: str = G, **kw: Any) -> tuple[list[str], int]:
        """n dynamic members joined and synced (first one leads); returns (ids, generation)."""
        # All first joins (pending members block the barrier), then the real joins:
        # the last one completes the join phase.
        ids: list[str] = []
        for _ in range(n):
            rid, out = self.join("", group=group, **kw)
            ids.append(reply(out, rid).member_id)
        for member_id in ids:
            self.join(member_id, group=group, **kw)
        view = self.coord.describe_group(group)
        assert view is not None
        if view.state == "PreparingRebalance":  # the initial delay
            self.advance(self.timers[f"join:{group}"] - self.now)
        view = self.coord.describe_group(group)
        assert view is not None and view.state == "CompletingRebalance", view
        leader = view.leader
        assert leader is not None
        generation = view.generation_id
        for member_id in ids:
            if member_id != leader:
                self.sync(member_id, generation, group=group)
        self.sync(leader, generation, {m: f"A-{m}".encode() for m in ids}, group=group)
        view = self.coord.describe_group(group)
        assert view is not None and view.state == "Stable"
        return ids, generation

    def state(self, group: str = G) -> str | None:
        view = self.coord.describe_group(group)
        return None if view is None else view.state


# ---------------------------------------------------------------- effect queries


def replies(effects: Iterable[Effect]) -> dict[int, Any]:
    return {e.request_id: e.response for e in effects if isinstance(e, Reply)}


def reply(effects: Iterable[Effect], request_id: int) -> Any:
    found = replies(effects)
    assert request_id in found, f"no reply to {request_id} in {list(effects)}"
    return found[request_id]


def no_reply(effects: Iterable[Effect], request_id: int) -> bool:
    return request_id not in replies(effects)


def persisted(effects: Iterable[Effect]) -> list[Record]:
    return [e.record for e in effects if isinstance(e, Persist)]


def transitions(effects: Iterable[Effect]) -> list[tuple[str | None, str, str]]:
    return [(e.old_state, e.new_state, e.reason) for e in effects
            if isinstance(e, GroupStateChanged)]


def scheduled(effects: Iterable[Effect]) -> dict[str, int]:
    return {e.key: e.deadline_ms for e in effects if isinstance(e, ScheduleTimer)}


def cancelled(effects: Iterable[Effect]) -> set[str]:
    return {e.key for e in effects if isinstance(e, CancelTimer)}


def index_of(effects: list[Effect], predicate: Any) -> int:
    for i, effect in enumerate(effects):
        if predicate(effect):
            return i
    raise AssertionError("no such effect")
