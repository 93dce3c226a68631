"""One seed's world: the coordinator, the members, the faults, the invariants.

The invariants, checked as the run goes:

safety
  * *exclusive*: no resource is in two members' ``assignment``
    (``owned_at(now)`` on each member's own clock) at the same instant --
    checked after every event of a member against every other live or paused
    member (ownership only grows through a member's own events);
  * *durable*: every checkpoint acknowledged to a member is in the
    coordinator's state after every restart (values grow, so ``>=``);
  * *fenced*: a commit the coordinator accepts is from the group's
    generation, by a member of it, and no other process holds one of its
    resources at that instant;
  * *deadline*: a member never acts on (processes, commits) a resource at or
    after its safety deadline;
  * *reply after commit*: a commit is answered without an error only once its
    checkpoints are durable (one server: checked as the answer is sent);
  * *parked*: every call parked in the core has a caller still waiting for
    it (a caller gone is cancelled there, freeing its slot of the limits),
    checked after every step of the coordinator;
  * *bystander*: a second group "b", committing on its own (seeds drawing
    the runtime's faults), is never answered an error while the coordinator
    serves, whatever the faults of group "g" (its core failures, refused
    records, limits), and its acknowledged checkpoints are durable.

liveness
  * without faults no member loses anything (``on_lost``) or stops, no call
    fails or is answered with an error (REBALANCE_IN_PROGRESS, the first
    join's MEMBER_ID_REQUIRED, and ILLEGAL_GENERATION to a commit that
    arrived after the group formed a newer generation with its member in
    it, aside), no session expires, and once
    the group settled (every worker of the run up, every member stable in
    the group's generation, every resource owned exactly once, no rejoin
    pending) no rebalance starts;
  * after the faults end, every resource of the catalog is owned exactly
    once within :attr:`SimConfig.convergence_bound_ms`, and stays so.

cooperative
  * a member never revokes a resource its new assignment keeps;
  * the moves are the assignor's plan: what a member revokes after a sync is
    what it claimed at its join minus what it was assigned, and everything
    planned is revoked before its next join (unless lost meanwhile);
  * the leader never hands a resource to a new owner while another member
    of the generation still claims it at the newest claimed generation.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from client.assignors import RebalanceProtocol
from client.errors import FatalMemberError
from client.member_state import CallbackKind, InvokeListener, MemberConfig, MemberState, Resource
from coordinator.core.commands import Command, Commit, Sync, command_group
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import Effect, GroupStateChanged, MemberExpired, Persist, Reply
from coordinator.core.records import CheckpointsWritten
from coordinator.runtime.machine import RuntimeMachine
from protocol.catalog import Placement, Weights, Zones
from protocol.errors import ErrorCode
from protocol.messages import CommitRequest, JoinRequest
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError
from sim.cluster import NODE_DOWN, NODE_PAUSED, Cluster, SimNode
from sim.events import DriftClock, Sim
from sim.member import DEAD, PAUSED, STOPPED, UP, SimMember
from sim.network import Link, Network
from sim.scenario import (
    BALANCED_ROUND_DELAY_MS,
    UPGRADE_STEPS,
    Fault,
    LoadChange,
    SimConfig,
    last_fault_end,
)
from sim.server import RuntimeFaults, SimCoordinator, SimServing

if TYPE_CHECKING:
    from sim.network import Conn

__all__ = ["BYSTANDER", "GROUP", "World"]

GROUP = "g"
#: the second group of a seed drawing the runtime's faults: simple commits only.
BYSTANDER = "b"
WALL_BASE_MS = 1_700_000_000_000
MAX_VIOLATIONS = 10
#: several coordinators: how long after the warm-up the members' start may wait
#: for the coordinators to share the partitions out (a lease is 5 rounds).
START_PLACEMENT_LEASES = 20


@dataclass(frozen=True)
class _Round:
    """One completed round of ``balanced``, as the coordinator handed it out:
    per member id, what it was assigned, its band and the ``delay_ms`` asked;
    and what the round revoked from the members' honoured claims."""

    assigned: dict[str, frozenset[Resource]]
    bands: dict[str, tuple[float, float] | None]
    delays: dict[str, int]
    revoked: dict[str, frozenset[Resource]]

    @property
    def moves(self) -> int:
        return sum(len(r) for r in self.revoked.values())


class Slot:
    """A worker slot: its current process and what a restart starts."""

    def __init__(self, name: str, index: int, assignors: tuple[str, ...]) -> None:
        self.name = name
        self.index = index
        self.assignors = assignors
        self.member: SimMember | None = None
        self.incarnation = -1
        #: should a process run here (False after a leave for good)
        self.want_up = True
        #: a process still closing when the faults ended: started again once it stops.
        self.restart_after: SimMember | None = None


class World:
    def __init__(self, config: SimConfig, *, keep_trace: bool = False) -> None:
        self.config = config
        self.sim = Sim(keep_trace=keep_trace)
        seed = config.seed
        self.net = Network(self.sim, random.Random(seed * 31 + 7))
        self.member_rng = random.Random(seed * 131 + 3)
        core = CoreConfig(min_session_timeout_ms=min(300, config.session_timeout_ms),
                          initial_rebalance_delay_ms=config.initial_rebalance_delay_ms)
        #: one coordinator (``server``), or several and their database (``cluster``).
        self.server: SimCoordinator | None = None
        self.cluster: Cluster | None = None
        if config.coordinators > 1:
            self.cluster = Cluster(
                self.sim, self.net, coordinators=config.coordinators,
                partitions=config.partitions, lease_ms=config.lease_ms,
                drift_ppm=config.coord_drift_ppm, seed=seed, core=core,
                db_ms=config.disk_ms, catalog=dict(config.catalog), group=GROUP,
                placement=dict(config.placement))
            self.cluster.on_runtime = self._wire_runtime
            self.cluster.db.on_violation = self.violation
        else:
            limits: dict[str, Any] = {}
            if config.limits is not None:
                limits = {"max_parked_requests": config.limits[0],
                          "max_parked_per_token": config.limits[1]}
            slots = [f"w{i}" for i in range(config.members + 2)]
            tokens = ({w: f"token-{w}" for w in slots} if config.tokens == "each" else
                      dict.fromkeys(slots, "token") if config.tokens == "shared" else {})
            server = SimCoordinator(self.sim, self.net, random.Random(seed * 17 + 5), core,
                                    disk_ms=config.disk_ms, tokens=tokens,
                                    storage_check_ms=config.storage_check_ms, **limits)
            self.server = server
            self.net.server = server
            server.on_effects = self._on_effects
            server.on_restored = self._check_durable
            server.on_sent = self._check_reply_durable
            server.on_step = self._check_parked
            server.on_exit = self._server_exited
        self.net.on_cut = self._cut
        self.net.on_lost_call = self._lost_call
        #: several coordinators: a commit's checks, made when it is applied, kept
        #: until its answer is sent (a write fenced meanwhile never counts).
        self._pending_commits: dict[tuple[SimServing, int], tuple[
            CommitRequest, SimMember | None, list[str], list[str]]] = {}
        #: the connections of commits answered without being applied (superseded).
        self._superseded: set[int] = set()
        self.slots: dict[str, Slot] = {}
        #: the members' metrics (GroupMember's), one registry for the seed.
        self.registry = CollectorRegistry()
        self.links: dict[str, Link] = {}
        self.clocks: dict[str, DriftClock] = {}
        self.live: list[SimMember] = []
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.value = 0
        self.acked: dict[Resource, int] = {}
        #: the bystander group's checkpoint value acknowledged.
        self.bystander_acked = 0
        #: checkpoints durable so far, (group, set, index) -> largest value (read from
        #: the committed records, which only grow, up to ``_durable_seen``:
        #: ``server.durable``, or the group's partition in the cluster's database).
        self._durable: dict[tuple[str, str, int], int] = {}
        self._durable_seen = 0
        #: how long the server stays down after exiting on a failure the world caused.
        self._downtime = 0
        #: several coordinators start first (members and faults come after).
        self.t0 = config.warmup_ms
        #: when every fault is ended (the run restarts, resumes and heals everything).
        self.t_end = self.t0 + last_fault_end(config)
        #: when the last fault's effect is over: the end, or a hung call's timeout.
        self.quiet_at = self.t_end
        self.check_at = self.t_end + config.convergence_bound_ms
        self.end = self.check_at + config.session_timeout_ms
        self.settled_at: int | None = None
        self.converged_since: int | None = None
        self.applied: dict[str, int] = {}
        self.skipped = 0
        #: resource -> (largest value applied, the process that committed it).
        self.applied_max: dict[Resource, tuple[int, SimMember | None]] = {}
        #: commits applied after a later commit of the same process (known limit).
        self.reordered = 0
        #: commits refused ILLEGAL_GENERATION because the group had formed a newer
        #: generation with their member in it (the id of their connection).
        self._raced_rejoin: set[int] = set()
        self.rebalances_after_settle = 0
        #: placement seeds: each resource's load as a multiple of its catalog
        #: weight (the load changes), when the last one happened, and each
        #: balanced round completed: (time, generation, its plan).
        self.load_factor: dict[Resource, float] = {}
        self.loads_changed_at = 0
        self.rounds: list[tuple[int, int, _Round]] = []
        #: how the drains ended (drained, timed out, restarted meanwhile).
        self.drains: dict[str, int] = {}
        if config.placed:
            # Rounds after the last change: each a round delay and a hand-over.
            self.end += config.round_bound * (BALANCED_ROUND_DELAY_MS + config.session_timeout_ms)

    # ------------------------------------------------------------ plumbing

    def wall_ms(self) -> int:
        return WALL_BASE_MS + self.sim.now

    def next_value(self) -> int:
        self.value += 1
        return self.value

    def violation(self, text: str) -> None:
        line = f"t={self.sim.now}ms {text}"
        self.sim.log(f"VIOLATION {text}")
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(line)

    # ------------------------------------------------------------ members

    def _member_config(self, slot: Slot) -> MemberConfig:
        c = self.config
        static = c.static[slot.index]
        settings: dict[str, dict[str, object]] = {}
        if "incremental-cooperative" in slot.assignors:
            settings["incremental-cooperative"] = {
                "scheduled_rebalance_max_delay_ms": c.incremental_delay_ms}
        if c.placed and c.max_moves is not None:
            settings["balanced"] = {"max_moves": c.max_moves}
        if c.placed and c.warmup_timeout_ms is not None:
            settings.setdefault("balanced", {}).update(
                warmup=True, warmup_timeout_ms=c.warmup_timeout_ms)
        return MemberConfig(
            group_id=GROUP, sets=c.sets, assignors=slot.assignors,
            capacity=c.capacities[slot.index] if c.capacities else None,
            rack=c.racks[slot.index] if c.racks else None,
            load_rejoin_interval_ms=c.load_rejoin_interval_ms,
            group_instance_id=slot.name if static else None,
            session_timeout_ms=c.session_timeout_ms,
            rebalance_timeout_ms=c.rebalance_timeout_ms,
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            client_id=slot.name, request_timeout_ms=c.request_timeout_ms,
            assignor_settings=settings)

    def add_slot(self, name: str) -> Slot:
        index = len(self.slots)
        slot = Slot(name, index, self.config.assignors)
        self.slots[name] = slot
        base, jitter, tail, tail_ms = self.config.latency
        self.links[name] = Link(base, jitter, tail, tail_ms)
        self.clocks[name] = DriftClock(self.member_rng.randint(0, 10**9),
                                       self.config.drift_ppm[index])
        return slot

    def spawn(self, slot: Slot) -> None:
        current = slot.member
        if current is not None and current.state in (UP, PAUSED):
            return
        if current is not None and current in self.live:
            self.live.remove(current)
        slot.incarnation += 1
        c = self.config
        member = SimMember(self, slot.name, slot.incarnation, self._member_config(slot),
                           self.clocks[slot.name], self.links[slot.name],
                           random.Random(self.member_rng.getrandbits(64)),
                           commit_interval_ms=c.commit_interval_ms, listener_ms=c.listener_ms,
                           registry=self.registry)
        slot.member = member
        self.live.append(member)
        member.start()

    def member_stopped(self, member: SimMember, error: FatalMemberError | None) -> None:
        if member in self.live:
            self.live.remove(member)
        slot = self.slots.get(member.name)
        if slot is not None and slot.restart_after is member:
            slot.restart_after = None
            if slot.member is member and slot.want_up:
                # Its close was a fault still under way: the faults end now, and the
                # convergence bound counts from here. Started as an event of its own
                # (this runs on the stopped process's event loop).
                self._quiet_from(self.sim.now)
                self.sim.after(0, self._spawn_event, slot)
        if self.sim.now >= self.t_end and self.config.faulty:
            self._watch_convergence()
        if error is not None:
            self.violation(f"{member.tag} stopped with a fatal error: {error}")

    # ------------------------------------------------------------ the run

    def run(self) -> None:
        c = self.config
        if self.server is not None:
            self.server.start()
            placement = dict(c.placement)
            for name, partitions in c.catalog:
                p = placement.get(name)
                self.server.put_resource(name, partitions, p.weights if p else None,
                                         p.zones if p else None)
        else:
            assert self.cluster is not None
            self.cluster.start()
            # The operator starts the workers once the cluster serves every
            # partition from its share (the coordinators' start-up hand-offs are
            # over), which the warm-up usually covers; the members and the faults
            # move later with it when it does not (seeds 10096, 1000027).
            self.sim.run_until(self.t0)
            limit = self.t0 + START_PLACEMENT_LEASES * c.lease_ms
            while not self.cluster.placed() and self.sim.now < limit:
                self.sim.run_until(self.sim.now + max(1, c.lease_ms // 10))
            if not self.cluster.placed():
                self.violation(f"liveness: the coordinators had not shared out the partitions "
                               f"{START_PLACEMENT_LEASES} leases after the warm-up")
            self._shift_start(self.sim.now - self.t0)
        t0 = self.t0
        for i in range(c.members):
            slot = self.add_slot(f"w{i}")
            # Workers start within a few milliseconds of each other.
            self.sim.at(t0 + self.member_rng.randint(0, 20), self._spawn_event, slot)
        for fault in c.faults:
            self.sim.at(t0 + fault.at, self._apply, fault)
        for change in c.loads:
            self.sim.at(t0 + change.at, self._load_change, change)
        if c.runtime and self.server is not None:
            self.sim.at(t0 + 1, self._bystander_commit)
        if c.faults:
            self.sim.at(self.t_end, self._end_faults)
        while self.sim.now < self.end:
            self.sim.run_until(self.end)  # the end moves when a hung call extends the faults
        self._final_checks()
        for shut_down in self.sim.at_end:
            shut_down()

    def _shift_start(self, by: int) -> None:
        """Move the members' start, the faults and every bound after them by ``by`` ms."""
        self.t0 += by
        self.t_end += by
        self.quiet_at += by
        self.check_at += by
        self.end += by

    def _spawn_event(self, slot: Slot) -> None:
        if slot.want_up:
            self.spawn(slot)

    # ------------------------------------------------------------ faults

    def _apply(self, fault: Fault) -> None:
        if self.sim.now >= self.t_end and fault.kind != "upgrade":
            return
        slot = self.slots.get(fault.slot)
        member = slot.member if slot is not None else None
        up = member is not None and member.state == UP
        params = dict(fault.params)
        kind = fault.kind
        applied = True
        if kind == "kill" and up and member is not None and slot is not None:
            member.crash()
            self.sim.after(fault.duration, self._spawn_event, slot)
        elif kind == "zombie" and up and member is not None:
            member.pause()
            self.sim.after(fault.duration, member.resume)
        elif self.cluster is not None and kind in ("coord_crash", "coord_pause", "db_cut",
                                                     "coord_stop", "slow_disk", "catalog"):
            applied = self._apply_cluster(fault)
        elif kind == "coord_crash" and self.server is not None and self.server.up:
            self.server.crash()
            self.sim.after(fault.duration, self._restart_server)
        elif kind in ("core_fail", "refuse", "write_fail", "check_fail", "crowd",
                      "coord_stop") and self.server is not None:
            applied = self._apply_runtime(fault)
        elif kind == "slow_disk" and self.server is not None:
            self.server.slow_disk_until = self.sim.now + fault.duration
            self.server.slow_disk_factor = params["factor"]
        elif kind == "latency" and slot is not None:
            link = self.links[slot.name]
            link.extra_ms = params["ms"]
            link.extra_until = self.sim.now + fault.duration
        elif kind == "drops" and slot is not None:
            self.links[slot.name].drop = params["p"]
            self.sim.after(fault.duration, self._undrop, slot.name)
        elif kind == "reset" and up and member is not None:
            member.reset_connections()
        elif kind == "partition" and slot is not None:
            self.net.partition(self.links[slot.name], fault.duration, params["cut"])
        elif kind == "stall":
            for link in self.links.values():
                self.net.partition(link, fault.duration, False)
        elif kind == "catalog":
            placement = self._placement_for(params["set"], params["partitions"])
            applied = (self.server is not None
                       and self.server.put_resource(
                           params["set"], params["partitions"],
                           placement.weights if placement else None,
                           placement.zones if placement else None))
        elif kind == "join":
            new = self.add_slot(fault.slot)
            self.spawn(new)
        elif kind == "leave" and up and member is not None and slot is not None:
            member.close()
            if params["back"]:
                self.sim.after(fault.duration, self._spawn_event, slot)
            else:
                slot.want_up = False
        elif kind == "drain" and up and member is not None and slot is not None \
                and not member.machine.closing:
            member.drain()
            self.sim.after(fault.duration, self._drain_end, (slot, member))
        elif kind == "upgrade" and slot is not None:
            slot.assignors = UPGRADE_STEPS[params["step"]]
            if member is not None and member.state == UP:
                member.close()
            self.sim.after(fault.duration, self._respawn_after_close, (slot, member))
        else:
            applied = False
        self.sim.log(f"FAULT {fault.describe()}" + ("" if applied else " (skipped)"))
        if applied:
            self.applied[kind] = self.applied.get(kind, 0) + 1
        else:
            self.skipped += 1

    def _apply_runtime(self, fault: Fault) -> bool:
        """A fault of the runtime (one server; sim.server.RuntimeFaults)."""
        server = self.server
        assert server is not None
        machine, core = server.machine, server.core
        if not server.up or machine is None or core is None:
            return False
        params = dict(fault.params)
        kind = fault.kind
        if kind == "core_fail":
            core.fail_next = (GROUP, params["after"])
        elif kind == "refuse":
            server.faults.refuse = (GROUP, params["says"])
        elif kind == "write_fail":
            server.faults.fail_write = params["committed"]
            self._downtime = fault.duration
        elif kind == "check_fail":
            server.faults.fail_check = True
            self._downtime = fault.duration
        elif kind == "crowd":
            # Other groups' calls fill the limits: the group gets what is left.
            machine.max_parked_requests = params["requests"]
            machine.max_parked_per_token = params["per_token"]
            self.sim.after(fault.duration, self._uncrowd, machine)
        else:  # coord_stop: a graceful stop, started again after the fault's duration
            until = self.sim.now + fault.duration
            server.stop(lambda: self.sim.at(until if self.sim.now < self.t_end
                                            else self.sim.now, self._restart_server),
                        ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return True

    def _uncrowd(self, machine: RuntimeMachine) -> None:
        server = self.server
        assert server is not None
        machine.max_parked_requests = server.max_parked_requests
        machine.max_parked_per_token = server.max_parked_per_token

    def _server_exited(self) -> None:
        """The server exited on a failure: a supervisor starts it again."""
        self.sim.after(self._downtime if self.sim.now < self.t_end else 0,
                       self._restart_server)

    def _placement_for(self, name: str, partitions: int) -> Placement | None:
        """What an admin sends with a catalog change of a placement seed: the
        drawn weights and zones of the set, without the overrides beyond its
        new size (the coordinator refuses a PUT that would keep one)."""
        drawn = dict(self.config.placement).get(name)
        if drawn is None:
            return None
        w, z = drawn.weights, drawn.zones
        return Placement(Weights(w.default, tuple(o for o in w.overrides if o[0] < partitions)),
                         Zones(z.default, tuple(o for o in z.overrides if o[0] < partitions)))

    def _load_change(self, change: LoadChange) -> None:
        self.sim.log(f"LOAD {change.name}/{change.index} x{change.factor}")
        self.load_factor[(change.name, change.index)] = change.factor
        self.loads_changed_at = self.sim.now
        self.settled_at = None  # a change: the group may rebalance again

    def _placement(self) -> Mapping[str, Placement]:
        if self.cluster is not None:
            return self.cluster.db.placement
        core = self.group_core()
        return core.catalog_placement() if core is not None else {}

    def true_loads(self, resources: Iterable[Resource]) -> dict[Resource, float]:
        """What the application measures on ``resources``: catalog weight times
        the load change's factor."""
        placement = self._placement()
        out: dict[Resource, float] = {}
        for r in resources:
            p = placement.get(r[0])
            weight = 1.0 if p is None else p.weights.as_dict().get(r[1], p.weights.default)
            out[r] = weight * self.load_factor.get(r, 1.0)
        return out

    def _apply_cluster(self, fault: Fault) -> bool:
        """A fault of several coordinators (or of their database)."""
        cluster = self.cluster
        assert cluster is not None
        kind = fault.kind
        params = dict(fault.params)
        if kind == "slow_disk":
            cluster.db.slow_until = self.sim.now + fault.duration
            cluster.db.slow_factor = params["factor"]
            return True
        if kind == "catalog":
            cluster.change_catalog(params["set"], params["partitions"],
                                   self._placement_for(params["set"], params["partitions"]))
            return True
        node = cluster.node(fault.slot)
        if kind == "coord_pause" and params.get("owner"):
            node = cluster.group_owner() or node
        if node is None or node.state != "up" or node.stopping:
            return False
        if kind == "coord_crash":
            node.crash()
            self.sim.after(fault.duration, self._start_node, node)
        elif kind == "coord_pause" and params.get("mid_write"):
            # The zombie mid-write: paused once its next write's fence answered.
            node.pause_mid_write = fault.duration
            self.sim.after(fault.duration, node.disarm_pause)
        elif kind == "coord_pause":
            node.pause()  # the zombie: its leases run out meanwhile
            self.sim.after(fault.duration, node.resume)
        elif kind == "db_cut":
            cluster.db.cut_off(node, fault.duration)
        else:  # coord_stop: a graceful stop (hand-offs), started again later
            until = self.sim.now + fault.duration
            node.stop(lambda: self.sim.at(until if self.sim.now < self.t_end else self.sim.now,
                                          self._start_node, node))
        return True

    def _drain_end(self, arg: tuple[Slot, SimMember]) -> None:
        """A drain's window is over: a member still at it gives up the rest (it
        closes); then the worker starts again (a rolling restart)."""
        slot, member = arg
        if slot.member is not member:
            self.drains["restarted"] = self.drains.get("restarted", 0) + 1
            return  # killed and restarted meanwhile
        if member.state == STOPPED and member.machine.drained:
            self.drains["drained"] = self.drains.get("drained", 0) + 1
        elif member.state == UP:
            self.drains["timed out"] = self.drains.get("timed out", 0) + 1
            member.close()
            self.sim.after(self.config.session_timeout_ms, self._respawn_after_close,
                           (slot, member))
            return
        if slot.want_up and self.sim.now < self.t_end:
            self.spawn(slot)

    def _start_node(self, node: SimNode) -> None:
        if node.state == NODE_DOWN:
            node.start()

    def _respawn_after_close(self, arg: tuple[Slot, SimMember | None]) -> None:
        slot, closed = arg
        member = slot.member
        if member is not closed:
            return  # restarted meanwhile (the end of the faults)
        if member is not None and member.state == UP:
            # Not closed yet (a revocation waiting on a slow commit): kill it.
            member.crash()
        self.spawn(slot)

    def _lost_call(self, conn: Conn) -> None:
        """A join or sync lost on a hung connection. A member with a generation
        heartbeats on the side channel meanwhile, and the coordinator's answers
        there tell it when the call can no longer be answered (client/
        member_state/heartbeat.py, "a call the coordinator is done with"): that is the
        member's to recover within the convergence bound. A member without a
        generation (a first join, a join after a reset) has no side channel and
        learns only at the call's timeout (the rebalance timeout + max(5000,
        session), as Kafka's consumer): the convergence bound counts from then
        (the fault lasts until it ends: docs/reliability.md)."""
        member = conn.member.member
        if member.member_id and member.generation_id >= 0:
            return
        c = self.config
        timeout = c.rebalance_timeout_ms + max(5000, c.session_timeout_ms)
        self._quiet_from(self.sim.now + timeout)

    def _quiet_from(self, until: int) -> None:
        c = self.config
        if until > self.quiet_at:
            self.quiet_at = until
            self.check_at = until + c.convergence_bound_ms
            self.end = max(self.end, self.check_at + c.session_timeout_ms)

    def _cut(self, link: Link) -> None:
        for slot in self.slots.values():
            if self.links[slot.name] is link and slot.member is not None:
                slot.member.reset_connections()

    def _undrop(self, name: str) -> None:
        self.links[name].drop = 0.0

    def _restart_server(self, _: Any = None) -> None:
        if self.server is not None and not self.server.up:
            self.server.start()

    def _end_faults(self, _: Any = None) -> None:
        self.sim.log("FAULTS END")
        self._restart_server()
        if self.server is not None:
            # Runtime faults armed and not yet struck never strike.
            self.server.faults = RuntimeFaults()
            if self.server.core is not None:
                self.server.core.fail_next = None
            if self.server.machine is not None:
                self._uncrowd(self.server.machine)
            self.server.slow_disk_until = -1
            if self.server.up and self.server.inflight_done_at > self.quiet_at:
                # A write started on the slow disk ends when it ends.
                self._quiet_from(self.server.inflight_done_at)
        if self.cluster is not None:
            self.cluster.db.slow_until = -1
            self.cluster.db.heal_all()
            for node in self.cluster.nodes:
                if node.state == NODE_PAUSED:
                    node.resume()
                elif node.state == NODE_DOWN:
                    node.start()
        for link in self.links.values():
            self.net.heal(link)
        for slot in self.slots.values():
            member = slot.member
            if member is not None and member.state == PAUSED:
                member.resume()
        for slot in self.slots.values():
            member = slot.member
            if slot.want_up and (member is None or member.state in (DEAD, STOPPED)):
                self.spawn(slot)
            elif slot.want_up and member is not None and member.state == UP \
                    and member.machine.closing:
                # A leave or a drain whose restart came before its close was done (a
                # close slowed by a fault: a revocation waiting on a commit, a slow
                # link) is still closing: the worker starts again once it has stopped.
                slot.restart_after = member
            elif member is not None and member.state == UP:
                self._join_backoff(member)
        self._watch_convergence()

    def _join_backoff(self, member: SimMember) -> None:
        """A member without a generation waiting out the backoff of a join that
        could not reach the coordinator (up to ``retry_backoff_max_ms``, as
        Kafka's consumer) has no side channel to learn that the coordinator is
        back: the convergence bound counts from its retry (the fault lasts
        until it ends; seed 10095990)."""
        machine = member.machine
        schedule = machine._schedule
        if machine.generation_id < 0 and schedule.retry_pending \
                and schedule.due_ms > member.local():
            self._quiet_from(member.clock.global_at(schedule.due_ms))

    # ------------------------------------------------------------ invariant hooks

    def _others(self, member: SimMember) -> Iterable[SimMember]:
        return (o for o in self.live if o is not member and o.state in (UP, PAUSED))

    def touched(self, member: SimMember) -> None:
        """After an event of ``member``: exclusivity, then the liveness watch.

        A member's ``owned_at`` grows only through its own events (time only
        shrinks it), so exclusivity is checked when it grew since this
        member's last check: an overlap is always caught at the event of
        whichever member acquired the resource last."""
        mine = (member.member.assignment if member.state in (UP, PAUSED)
                else frozenset())
        both = member.member.standby & member.machine.owned
        if both:
            self.violation(f"standby: {member.tag} has {sorted(both)} owned and standby at once")
        if mine == member.seen:
            if not self.config.faulty and self.settled_at is None and self._settled():
                self.settled_at = self.sim.now
                self.sim.log("SETTLED")
            return
        grew = not mine <= member.seen
        member.seen = mine
        if grew:
            for other in self._others(member):
                both = mine & other.member.assignment
                if both:
                    self.violation(f"exclusive: {sorted(both)} owned by {member.tag} and "
                                   f"{other.tag} at once")
        if not self.config.faulty and self.settled_at is None and self._settled():
            self.settled_at = self.sim.now
            self.sim.log("SETTLED")
        if self.sim.now >= self.t_end and self.config.faulty:
            self._watch_convergence()

    def group_core(self) -> GroupCoordinator | None:
        """The core serving the group now (several coordinators: of the newest epoch)."""
        if self.server is not None:
            return self.server.core
        assert self.cluster is not None
        runtime = self.cluster.group_runtime()
        return runtime.core if runtime is not None else None

    @property
    def core_errors(self) -> list[str]:
        if self.server is not None:
            return self.server.core_errors
        assert self.cluster is not None
        return self.cluster.core_errors

    def _catalog(self) -> dict[str, int] | None:
        if self.cluster is not None:
            return self.cluster.db.catalog
        core = self.group_core()
        return dict(core.catalog()) if core is not None else None

    def _exactly_once(self) -> bool:
        catalog = self._catalog()
        if catalog is None:
            return False
        expected = {(name, i) for name, n in catalog.items()
                    if name in self.config.sets for i in range(n)}
        seen: set[Resource] = set()
        total = 0
        for m in self.live:
            if m.state != UP:
                continue
            owned = m.member.assignment
            total += len(owned)
            seen |= owned
        return total == len(seen) and seen == expected

    def _watch_convergence(self) -> None:
        if self._exactly_once():
            if self.converged_since is None:
                self.converged_since = self.sim.now
        elif self.converged_since is not None:
            self.sim.log("CONVERGENCE LOST")
            self.converged_since = None

    def _settled(self) -> bool:
        core = self.group_core()
        if core is None:
            return False
        view = core.describe_group(GROUP)
        if view is None or view.state != "Stable":
            return False
        # Every worker of the run is up: members start at different times, and
        # a group of the early ones is not settled while a later one is still
        # to join (its join rebalances the group; simulator seed 94895).
        for slot in self.slots.values():
            if slot.want_up and (slot.member is None or slot.member not in self.live
                                 or slot.member.state != UP):
                return False
        for m in self.live:
            if (m.member.state is not MemberState.STABLE
                    or m.member.generation_id != view.generation_id
                    or m.machine.rejoin_requested or m.listener is not None):
                return False
        if self.config.placed and (not self.rounds or self._out_of_band(self.rounds[-1][2])):
            # Balanced: settled once its newest round moves nothing, asks for no
            # follow-up and leaves every member's measured load inside its band
            # (until then a member rejoins on its load, or the leader's delay).
            return False
        return self._exactly_once()

    def on_listener(self, member: SimMember, action: InvokeListener) -> None:
        kind = action.kind
        if (kind is CallbackKind.REVOKED and member.member.draining
                and member.machine.closing and not member.asked_to_close):
            # A drain ends owning nothing: it closes (and leaves) only then.
            self.violation(f"drain: {member.tag} closes owning {sorted(action.resources)} "
                           f"before its drain handed them over")
        if kind is CallbackKind.LOST and not self.config.faulty:
            self.violation(f"liveness: {member.tag} lost {sorted(action.resources)} without "
                           f"any fault ({member.member.last_error})")
        machine = member.machine
        if (kind is CallbackKind.REVOKED and machine.protocol is RebalanceProtocol.COOPERATIVE
                and not machine.closing):
            kept = action.resources & (member.last_assigned or frozenset())
            if kept:
                self.violation(f"cooperative: {member.tag} revokes {sorted(kept)} which its "
                               "new assignment keeps")
            planned = member.planned_revoke
            if planned is not None and not action.resources <= planned:
                self.violation(f"cooperative: {member.tag} revokes "
                               f"{sorted(action.resources - planned)} the assignor did not move")

    def on_warmup(self, member: SimMember, resources: frozenset[Resource]) -> None:
        """A standby is never owned: never warmed up while owned."""
        if resources & member.machine.owned:
            self.violation(f"standby: {member.tag} warms {sorted(resources)} up while it "
                           f"owns {sorted(resources & member.machine.owned)}")

    def on_join_sent(self, member: SimMember, request: JoinRequest) -> None:
        machine = member.machine
        for protocol, data in request.protocols:
            if protocol == "balanced":
                warm = MemberMetadata.decode(data).warm
                early = sorted((name, i) for name, indexes in warm.items() for i in indexes
                               if member.latest_warmup.get((name, i))
                               not in member.warmups_ended)
                if early:
                    self.violation(f"warm-up: {member.tag} reports {early} warm before its "
                                   f"latest warm-up of them ended")
        planned = member.planned_revoke
        if (planned and machine.protocol is RebalanceProtocol.COOPERATIVE
                and planned & machine.owned):
            self.violation(f"cooperative: {member.tag} rejoins still owning "
                           f"{sorted(planned & machine.owned)} that the assignor moved")

    def on_response(self, member: SimMember, conn: Conn, response: Any) -> None:
        """Without faults no call fails and no member is told it is not one."""
        error = response if isinstance(response, Exception) else getattr(response, "error", None)
        if error is None or error in (ErrorCode.REBALANCE_IN_PROGRESS,
                                      ErrorCode.MEMBER_ID_REQUIRED):
            return
        if (error is ErrorCode.ILLEGAL_GENERATION and conn.api == "commit"
                and conn.id in self._raced_rejoin):
            # A commit that reached the coordinator after the join phase of a
            # rebalance the member had itself joined (seed 121489: sent after
            # the member's own follow-up join). Refusing it is the fence
            # working; the member must take it in stride (no loss, no reset:
            # the LOST and stop checks hold it to that; docs/client.md).
            self._raced_rejoin.discard(conn.id)
            return
        if (error is ErrorCode.ILLEGAL_GENERATION and member.on_side_channel(conn)
                and (member.member.state is MemberState.JOINING
                     or conn.request.generation_id != member.member.generation_id)):
            # The join phase completed with us while (or before) our join's
            # answer came: a side-channel heartbeat still carried the old
            # generation (the machine ignores this answer; client/member_state/machine.py).
            return
        self.violation(f"liveness: {member.tag}'s {conn.api} answered {error} without any fault")

    def on_act(self, member: SimMember, owned: frozenset[Resource], now: int) -> None:
        if owned - member.handed:
            self.violation(f"listener: {member.tag} sees {sorted(owned - member.handed)} in "
                           "its assignment, which its listener was not given or has given up")
        if owned:
            deadline = member.member.safety_deadline_ms()
            if deadline is not None and now >= deadline:
                self.violation(f"deadline: {member.tag} acts on {sorted(owned)} at {now}, "
                               f"its safety deadline was {deadline}")

    def on_commit_sent(self, member: SimMember, request: CommitRequest, now: int) -> None:
        untold = sorted({(name, index) for name, index, _ in request.checkpoints}
                        - member.handed)
        if untold:
            self.violation(f"listener: {member.tag} commits {untold}, which its listener "
                           "was not given or has given up")
        deadline = member.member.safety_deadline_ms()
        if deadline is None or now >= deadline:
            self.violation(f"deadline: {member.tag} commits at {now} past its safety deadline "
                           f"{deadline}")
        if request.generation_id != member.member.generation_id:
            # What makes a refused commit that raced a rejoin excusable
            # (on_response): it carried the newest generation the member knew.
            self.violation(f"fenced: {member.tag} commits at generation "
                           f"{request.generation_id}, its own is "
                           f"{member.member.generation_id}")

    def on_fetched(self, member: SimMember, floors: dict[Resource, int],
                   found: Mapping[Resource, object]) -> None:
        """A fetch reads each checkpoint at least at the value acknowledged
        before it was sent (``floors``), unless an older commit of the same
        process was applied over it since: a v1 member's, which carries no commit
        sequence (:meth:`_commit_applied` lowers what counts as acknowledged)."""
        for key, floor in sorted(floors.items()):
            floor = min(floor, self.acked.get(key, floor))
            got = found.get(key)
            if not isinstance(got, int) or got < floor:
                self.violation(f"durable: {member.tag} fetched {key} = {got!r}, acknowledged "
                               f"at {floor} before the fetch")

    def on_commit_acked(self, member: SimMember, request: CommitRequest, value: int) -> None:
        for name, index, _ in request.checkpoints:
            key = (name, index)
            if self.acked.get(key, 0) < value:
                self.acked[key] = value

    def _check_durable(self, core: GroupCoordinator | None = None) -> None:
        core = core if core is not None else self.group_core()
        assert core is not None
        stored = core.checkpoints(GROUP)
        for key, value in sorted(self.acked.items()):
            got = stored.get(key)
            if not isinstance(got, int) or got < value:
                self.violation(f"durable: checkpoint {key} acknowledged at {value}, "
                               f"the restarted coordinator has {got!r}")
        if self.bystander_acked:
            got = core.checkpoints(BYSTANDER).get(("s0", 0))
            if not isinstance(got, int) or got < self.bystander_acked:
                self.violation(f"durable: group b's checkpoint acknowledged at "
                               f"{self.bystander_acked}, the coordinator has {got!r}")

    def _durable_value(self, group_id: str, name: str, index: int) -> int | None:
        """The largest value of a checkpoint that storage holds: the one server's
        disk, or (several coordinators) the group's partition in the database."""
        server, cluster = self.server, self.cluster
        if server is not None:
            durable = server.durable
        else:
            assert cluster is not None
            durable = cluster.db.records[cluster.group_partition]
        for record in durable[self._durable_seen:]:
            if type(record) is CheckpointsWritten:
                for n, i, v in record.checkpoints:
                    if isinstance(v, int):
                        key = (record.group_id, n, i)
                        if self._durable.get(key, -1) < v:
                            self._durable[key] = v
        self._durable_seen = len(durable)
        return self._durable.get((group_id, name, index))

    def _check_reply_durable(self, conn: Conn, answer: Any) -> None:
        """Reply after commit: a commit answered without an error is durable."""
        request = conn.request
        if isinstance(request, CommitRequest) and getattr(answer, "error", 1) is None \
                and conn.id not in self._superseded:
            self._check_commit_durable(request, conn.member.tag)

    def _check_commit_durable(self, request: CommitRequest, who: str) -> None:
        for name, index, value in request.checkpoints:
            if not isinstance(value, int):
                continue
            durable = self._durable_value(request.group_id, name, index)
            if durable is None or durable < value:
                self.violation(f"reply after commit: {who}'s commit of {(name, index)} = "
                               f"{value} (group {request.group_id}) answered while the "
                               f"coordinator's storage holds {durable!r}")

    def _check_parked(self) -> None:
        """Every call parked in the core has a caller still waiting for it."""
        server = self.server
        core = server.core if server is not None else None
        machine = server.machine if server is not None else None
        if server is None or core is None or machine is None or not machine.ready:
            return  # stopped serving: every waiting call was answered, the core is moot
        for rid, parked in core._k.parked.items():
            if not server.awaited(rid):
                self.violation(f"parked: call {rid} of group {parked.group_id} is still "
                               f"parked in the core ({core.parked_request_count()} parked), "
                               f"its caller gone")
                return

    def _bystander_commit(self, _: Any = None) -> None:
        """Group "b": a simple commit of a growing value, every few hundred ms."""
        server = self.server
        if server is None or self.sim.now >= self.end - self.config.session_timeout_ms:
            return
        self.sim.after(max(50, self.config.session_timeout_ms // 3), self._bystander_commit)
        self.value += 1
        value = self.value
        request = CommitRequest(BYSTANDER, "", -1, (("s0", 0, value),))
        server.call(Commit(server.new_request_id(), request),
                    lambda answer: self._bystander_answered(request, value, answer))

    def _bystander_answered(self, request: CommitRequest, value: int, answer: Any) -> None:
        server = self.server
        assert server is not None
        error = getattr(answer, "error", None)
        if error is None:
            self._check_commit_durable(request, "group b")
            self.bystander_acked = max(self.bystander_acked, value)
            return
        machine = server.machine
        if machine is not None and machine.ready:
            self.violation(f"bystander: group b's commit answered {error} while the "
                           f"coordinator serves")

    def _wire_runtime(self, runtime: SimServing, serves_group: bool) -> None:
        """Several coordinators: the checks of a partition's runtime, as of the one server."""
        if not serves_group:
            return
        runtime.on_effects = lambda command, effects, conn: self._on_effects(
            command, effects, conn, runtime)
        runtime.on_restored = lambda: self._check_durable(runtime.core)
        runtime.on_sent = self._check_reply_durable
        runtime.on_resolved = lambda rid, answer: self._resolved(runtime, rid, answer)

    def _resolved(self, runtime: SimServing, request_id: int, answer: Any) -> None:
        pending = self._pending_commits.pop((runtime, request_id), None)
        if pending is not None and getattr(answer, "error", 1) is None:
            request, sender, stale, overlaps = pending
            self._commit_applied(request, sender, stale, overlaps)

    def _on_effects(self, command: Command, effects: list[Effect], conn: Conn | None,
                    runtime: SimServing | None = None) -> None:
        core = runtime.core if runtime is not None else self.group_core()
        assert core is not None
        if command_group(command) == BYSTANDER:
            return
        if isinstance(command, Commit):
            self._check_commit(command, effects, conn, core, runtime)
        elif isinstance(command, Sync):
            self._check_assignment(command, effects, core)
        if not self.config.faulty:
            for effect in effects:
                if isinstance(effect, MemberExpired) or (
                        isinstance(effect, GroupStateChanged)
                        and effect.reason in ("sync_timeout", "join_timeout")):
                    self.violation(f"liveness: a member lost its membership without any "
                                   f"fault ({effect})")
        if self.settled_at is not None and not self.config.faulty:
            for effect in effects:
                if (isinstance(effect, GroupStateChanged)
                        and effect.new_state == "PreparingRebalance"):
                    self.rebalances_after_settle += 1
                    self.violation(f"liveness: rebalance ({effect.reason}) after the group "
                                   f"settled at {self.settled_at}ms, without any fault")

    def _check_commit(self, command: Commit, effects: list[Effect], conn: Conn | None,
                      core: GroupCoordinator, runtime: SimServing | None = None) -> None:
        """A commit the core accepted: judged now (its generation, who else owns
        its resources), counted once it is answered (at once with one coordinator;
        with several, when its write committed: a fenced one never counts)."""
        request = command.request
        answer = next((e.response for e in effects
                       if isinstance(e, Reply) and e.request_id == command.request_id), None)
        error = getattr(answer, "error", 1) if answer is not None else 1
        if error is ErrorCode.ILLEGAL_GENERATION and conn is not None:
            view = core.describe_group(GROUP)
            if view is not None and view.generation_id > request.generation_id and any(
                    m.member_id == request.member_id for m in view.members):
                # The group formed a newer generation with this member in it
                # before the commit arrived: it raced the member's own rejoin.
                self._raced_rejoin.add(conn.id)
        if error is not None or not request.checkpoints:
            return
        if not any(isinstance(e, Persist) and isinstance(e.record, CheckpointsWritten)
                   for e in effects):
            # Answered without being applied: by the commit sequence, a later
            # commit of the same member was applied first (docs/coordinator-
            # semantics.md, "The commit sequence"). Only a caller that gave up
            # on it may be answered so: it neither counts as applied nor is
            # held to be durable.
            if conn is not None:
                if not conn.closed:
                    self.violation(f"commit sequence: {conn.member.tag}'s commit "
                                   f"{request.sequence} answered without being applied "
                                   f"while its caller still waits")
                self._superseded.add(conn.id)
            return
        stale: list[str] = []
        view = core.describe_group(GROUP)
        if view is None or view.generation_id != request.generation_id or not any(
                m.member_id == request.member_id for m in view.members):
            stale.append(f"fenced: commit of {request.member_id} generation "
                         f"{request.generation_id} accepted")
        sender = conn.member if conn is not None else None
        resources = {(s, i) for s, i, _ in request.checkpoints}
        overlaps: list[str] = []
        for other in self.live:
            if other is sender or other.state not in (UP, PAUSED):
                continue
            both = resources & other.member.assignment
            if both:
                overlaps.append(f"fenced: commit of {sorted(both)} by "
                                f"{sender.tag if sender else request.member_id} accepted while "
                                f"{other.tag} owns them")
        if runtime is not None:
            self._pending_commits[(runtime, command.request_id)] = (request, sender, stale,
                                                                    overlaps)
            return
        self._commit_applied(request, sender, stale, overlaps)

    def _commit_applied(self, request: CommitRequest, sender: SimMember | None,
                        stale: list[str], overlaps: list[str]) -> None:
        for line in stale:
            self.violation(line)
        for name, index, value in request.checkpoints:
            key = (name, index)
            if not isinstance(value, int):
                continue
            before = self.applied_max.get(key)
            if before is None or before[0] < value:
                self.applied_max[key] = (value, sender)
            elif before[0] == value:
                continue   # the value again: nothing older overwrites anything
            elif before[1] is sender:
                # One process's commit that it gave up on (timeout, reset)
                # arrived after its next one and was applied: counted.
                self.reordered += 1
                self.sim.log(f"REORDERED commit {key} value {value} after {before[0]}")
                if self.acked.get(key, 0) <= value:
                    # The newer value was never acknowledged (its write was
                    # refused or failed, and the group reloaded from what is
                    # stored: seeds 9002842, 9009711): nothing acknowledged is lost.
                    continue
                if request.sequence is not None:
                    # Over an acknowledged value: the commit's sequence, stored
                    # with the checkpoints, should have stopped it, across
                    # restarts, hand-offs and reloads too
                    # (docs/coordinator-semantics.md, "The commit sequence").
                    self.violation(f"reordered: {key} value {value} of "
                                   f"{sender.tag if sender else '?'} (commit sequence "
                                   f"{request.sequence}) applied over its acknowledged "
                                   f"value {self.acked[key]}")
                else:
                    # A v1 member's (an upgrade's): nothing on the wire orders its
                    # commits, so the older value overwrites even an acknowledged
                    # newer one; what counts as acknowledged is lowered.
                    self.acked[key] = value
            else:
                self.violation(f"fenced: {key} value {value} from "
                               f"{sender.tag if sender else request.member_id} applied after "
                               f"value {before[0]} of "
                               f"{before[1].tag if before[1] else '?'}")
        for line in overlaps:
            self.violation(line)

    def _check_assignment(self, command: Sync, effects: list[Effect],
                          core: GroupCoordinator) -> None:
        """The leader's assignment completing a generation: no resource to a new
        owner while a member still claims it (cooperative assignors)."""
        if not any(isinstance(e, GroupStateChanged) and e.new_state == "Stable"
                   for e in effects):
            return
        group = core._k.groups.get(GROUP)
        if group is None or group.protocol_name not in ("cooperative-sticky",
                                                        "incremental-cooperative", "balanced"):
            return
        protocol = group.protocol_name
        if protocol == "balanced":
            self._check_round(group, core)
        claims: dict[Resource, list[tuple[int, str]]] = {}
        for member in group.members.values():
            try:
                meta = MemberMetadata.decode(member.metadata_for(protocol))
            except (ValidationError, KeyError):
                continue
            for name, indexes in meta.owned.items():
                for i in indexes:
                    claims.setdefault((name, i), []).append((meta.generation, member.member_id))
        for member in group.members.values():
            try:
                assignment = ResourceAssignment.decode(member.assignment or b"")
            except ValidationError:
                continue
            for name, indexes in assignment.assigned.items():
                for i in indexes:
                    claimers = claims.get((name, i), [])
                    if not claimers:
                        continue
                    newest = max(g for g, _ in claimers)
                    holders = [mid for g, mid in claimers if g == newest]
                    if member.member_id not in holders:
                        self.violation(
                            f"cooperative: generation {group.generation_id} gives {(name, i)} "
                            f"to {member.member_id} while {holders} still claim it")

    def _check_round(self, group: Any, core: GroupCoordinator) -> None:
        """A round of ``balanced``: recorded for the band check at the end, and
        no more than ``max_moves`` of the members' honoured claims revoked (a
        claim is honoured when made at the newest generation claimed, by one
        member only, of a resource in the catalog; docs/assignors.md)."""
        catalog = dict(core.catalog())
        metas: dict[str, MemberMetadata] = {}
        for member in group.members.values():
            try:
                metas[member.member_id] = MemberMetadata.decode(member.metadata_for("balanced"))
            except (ValidationError, KeyError):
                continue
        top = max((m.generation for m in metas.values() if m.owned), default=-1)
        claimers: dict[Resource, list[str]] = {}
        for mid, meta in metas.items():
            if meta.generation != top:
                continue
            for name, indexes in meta.owned.items():
                for i in indexes:
                    if name in self.config.sets and 0 <= i < catalog.get(name, 0):
                        claimers.setdefault((name, i), []).append(mid)
        rnd = _Round({}, {}, {}, {})
        for member in group.members.values():
            mid = member.member_id
            try:
                a = ResourceAssignment.decode(member.assignment or b"")
            except ValidationError:
                continue
            assigned = frozenset((n, i) for n, idx in a.assigned.items() for i in idx)
            rnd.assigned[mid] = assigned
            rnd.bands[mid] = a.band
            rnd.delays[mid] = a.delay_ms
            honoured = {r for r, who in claimers.items() if who == [mid]}
            # Revoked because the leader's catalog no longer had it (a catalog
            # change may undo that before this check): no planned move
            # (seed 6154540).
            gone = {(n, i) for n, i, cause in a.why if cause == "catalog"}
            if honoured - assigned - gone:
                rnd.revoked[mid] = frozenset(honoured - assigned - gone)
        self.rounds.append((self.sim.now, group.generation_id, rnd))
        limit = self.config.max_moves
        if limit is not None and rnd.moves > limit:
            self.violation(f"placement: generation {group.generation_id} revokes {rnd.moves} "
                           f"resources, over max_moves={limit}: "
                           f"{ {m: sorted(r) for m, r in sorted(rnd.revoked.items())} }")

    def _out_of_band(self, rnd: _Round) -> list[str]:
        """Why a round is not where the plan wants the group: it moves something,
        asks for a follow-up, or leaves a member's measured load outside its band."""
        why = [f"revokes {sorted(r)} from {m}" for m, r in sorted(rnd.revoked.items())]
        why += [f"asks {m} for a round in {d}ms" for m, d in sorted(rnd.delays.items()) if d]
        for m, band in sorted(rnd.bands.items()):
            if band is None:
                continue
            load = sum(self.true_loads(rnd.assigned.get(m, frozenset())).values())
            low, high = band
            slack = 1e-6 * max(1.0, high)
            if not low - slack <= load <= high + slack:
                why.append(f"{m} carries {load:g} outside its band [{low:g}, {high:g}]")
        return why

    def _check_placement(self) -> None:
        """After the last change (faults over, loads changed), the group's rounds
        reach its plan within :attr:`SimConfig.round_bound` rounds: the newest round
        moves nothing, asks for no follow-up, and every member's measured load
        is inside the band it was given; and rounds not there are at most the bound."""
        c = self.config
        since = max(self.quiet_at, self.t0 + max((x.at for x in c.loads), default=0))
        if not self.rounds:
            self.violation("placement: no balanced round completed")
            return
        _, generation, last = self.rounds[-1]
        why = self._out_of_band(last)
        if why:
            self.violation(f"placement: the last round (generation {generation}) is not "
                           f"balanced at the end: {'; '.join(why)}")
        after = [(t, g, r) for t, g, r in self.rounds if t >= since]
        unsettled = [g for _, g, r in after if self._out_of_band(r)]
        if len(unsettled) > c.round_bound:
            self.violation(f"placement: {len(unsettled)} rounds after the last change at "
                           f"{since}ms were not balanced, over the bound of {c.round_bound}: "
                           f"generations {unsettled[:5]}...{unsettled[-3:]}")

    def _final_checks(self) -> None:
        c = self.config
        if self.group_core() is not None:
            self._check_durable()
        if c.placed:
            self._check_placement()
        if not c.faulty:
            if self.settled_at is None:
                self.violation("liveness: the group never settled without any fault")
            return
        bound = c.convergence_bound_ms
        if self.converged_since is None:
            self.violation(f"liveness: not converged {self.end - self.quiet_at}ms after the "
                           f"faults ended (bound {bound}ms): {self._ownership_summary()}")
        elif self.converged_since > self.check_at:
            self.violation(f"liveness: converged {self.converged_since - self.quiet_at}ms after "
                           f"the faults ended, over the bound of {bound}ms")

    def _ownership_summary(self) -> str:
        core = self.group_core()
        catalog = self._catalog() or {}
        owners: dict[Resource, list[str]] = {}
        for m in self.live:
            if m.state == UP:
                for r in m.member.assignment:
                    owners.setdefault(r, []).append(m.tag)
        expected = {(name, i) for name, n in catalog.items() if name in self.config.sets
                    for i in range(n)}
        unowned = sorted(expected - set(owners))
        twice = sorted(r for r, o in owners.items() if len(o) > 1)
        outside = sorted(set(owners) - expected)
        states = ", ".join(f"{m.tag}:{m.member.state.value}/gen{m.member.generation_id}"
                           for m in self.live)
        view = core.describe_group(GROUP) if core is not None else None
        group = f"{view.state} gen {view.generation_id}" if view is not None else "none"
        return (f"unowned {unowned}, owned twice {twice}, owned outside the catalog {outside}; "
                f"group {group}; members {states}")
