"""What one seed runs: a configuration drawn from the valid space, and faults.

Everything is drawn from ``random.Random(seed)`` before the run starts (the
fault schedule against a model of which slots are up, as the chaos harness
does), so a seed names one configuration and one schedule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from client.lease import HEARTBEATS_PER_LEASE
from protocol.catalog import Placement, Weights, Zones

__all__ = ["Fault", "LoadChange", "SimConfig", "draw_config", "draw_drains", "draw_faults"]

EAGER_ASSIGNORS = ("range", "roundrobin", "sticky")
COOPERATIVE_ASSIGNORS = ("cooperative-sticky", "incremental-cooperative")
#: the KIP-429 upgrade: eager, then both (still eager), then cooperative only.
UPGRADE_STEPS = (("range",), ("cooperative-sticky", "range"), ("cooperative-sticky",))
#: the bound on a member clock's drift against the coordinator's (parts per million).
MAX_DRIFT_PPM = 100


@dataclass(frozen=True)
class Fault:
    at: int
    kind: str
    slot: str = ""
    duration: int = 0
    params: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.params)
        target = f" {self.slot}" if self.slot else ""
        dur = f" for {self.duration}ms" if self.duration else ""
        return f"t={self.at}ms {self.kind}{target}{dur}{extra}"


@dataclass(frozen=True)
class LoadChange:
    """From ``at`` on, resource ``(name, index)`` carries ``factor`` times its
    catalog weight (the application reports what it measures)."""

    at: int
    name: str
    index: int
    factor: float


#: ``BalancedAssignor.round_delay_ms`` (the default the seeds run with).
BALANCED_ROUND_DELAY_MS = 1_000
#: the zones of a placement seed (members get one as their ``rack``).
ZONES = ("za", "zb", "zc")


@dataclass(frozen=True)
class SimConfig:
    seed: int
    members: int
    static: tuple[bool, ...]
    assignors: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: None: derived by the client's timing rule.
    heartbeat_interval_ms: int | None
    request_timeout_ms: int
    initial_rebalance_delay_ms: int
    catalog: tuple[tuple[str, int], ...]
    #: sets every member subscribes to (may name sets the catalog gains later).
    sets: tuple[str, ...]
    incremental_delay_ms: int
    commit_interval_ms: int
    listener_ms: tuple[int, int]
    #: per member: (base, jitter, tail probability, tail) one-way latency, ms.
    latency: tuple[int, int, float, int]
    disk_ms: tuple[int, int]
    drift_ppm: tuple[int, ...]
    faulty: bool
    fault_ms: int
    upgrade: bool
    #: "space": drawn from the whole valid space; "plain": the same without the
    #: runtime's own draws (``runtime``: every seed as it was before they existed,
    #: the seeds that found a bug as they found it); "chaos": the chaos harness's
    #: settings; "cluster": several coordinators.
    profile: str = "space"
    faults: tuple[Fault, ...] = field(default=())
    #: several coordinators (sim.cluster; 1: the single server of every other seed).
    coordinators: int = 1
    #: the database's partitions, the lease length, each coordinator's clock drift.
    partitions: int = 1
    lease_ms: int = 0
    coord_drift_ppm: tuple[int, ...] = ()
    #: placement seeds (assignor ``balanced``): each set's weights and zones,
    #: each slot's capacity and rack, the assignor's ``max_moves``, the load
    #: changes the application reports, and its rejoin interval on load.
    placement: tuple[tuple[str, Placement], ...] = ()
    capacities: tuple[float, ...] = ()
    racks: tuple[str | None, ...] = ()
    max_moves: int | None = None
    loads: tuple[LoadChange, ...] = ()
    load_rejoin_interval_ms: int = 30_000
    #: one server: what only the real runtime meets, drawn in a third of the seeds
    #: of profile "space"
    #: (sim.server.RuntimeFaults): the parked-request limits (None: the server's
    #: defaults) and whose token each worker's calls carry ("each": its own,
    #: "shared": one for all), the idle storage check's interval (0: none), the
    #: runtime faults (``draw_faults``), and a second group "b" of simple commits
    #: that nothing of the group's faults may touch.
    runtime: bool = False
    limits: tuple[int, int] | None = None
    tokens: str = ""
    storage_check_ms: int = 0
    #: balanced seeds: ``warmup`` on with this ``warmup_timeout_ms`` (None: off).
    warmup_timeout_ms: int | None = None

    @property
    def placed(self) -> bool:
        return "balanced" in self.assignors

    @property
    def most_resources(self) -> int:
        """The most resources the catalog holds at any time of the run: the
        catalog faults may grow a set, or add one (seed 8257062: one resource
        at the start, seven after the faults)."""
        catalog = dict(self.catalog)
        most = sum(catalog.values())
        for fault in sorted((f for f in self.faults if f.kind == "catalog"),
                            key=lambda f: f.at):
            params = dict(fault.params)
            catalog[params["set"]] = params["partitions"]
            most = max(most, sum(catalog.values()))
        return most

    @property
    def round_bound(self) -> int:
        """Rebalance rounds after the last change within which a balanced group
        is where its plan wants it: every resource (the most the catalog
        holds, :attr:`most_resources`) may have to move once, at
        most ``max_moves`` a round, and each move takes a revoking round and a
        handing round; each worker (those of the run and the two a fault may
        add) may join once more (restarted at the end of the faults) and rejoin
        once on the load it then measures (nobody measured what it was handed);
        plus a few for the rounds a change itself starts."""
        total = self.most_resources
        moves = math.ceil(total / self.max_moves) if self.max_moves else 1
        # Warm-up: each batch of moves first gives standbys (a round), and each
        # receiver rejoins once to report them warm.
        warm = moves + self.members + 2 if self.warmup_timeout_ms is not None else 0
        return 2 * moves + 2 * (self.members + 2) + 4 + warm

    @property
    def warmup_ms(self) -> int:
        """Several coordinators start before the members, and share the
        partitions out first (an operator starts the cluster, then the workers)."""
        return 2 * self.lease_ms if self.coordinators > 1 else 0

    @property
    def convergence_bound_ms(self) -> int:
        """Faults over -> every resource owned exactly once: two
        session timeouts plus the rebalance timeout, plus the initial delay of
        a group that emptied and an incremental-cooperative assignor's delay."""
        extra = self.incremental_delay_ms if "incremental-cooperative" in self.assignors else 0
        # Several coordinators: a coordinator restarted at the end takes its share
        # back (a hand-off, a load, the members' find_coordinator), a failover
        # costs up to a lease and a round.
        cluster = 3 * self.lease_ms if self.coordinators > 1 else 0
        # balanced with max_moves: a plan of many moves takes a round per
        # max_moves of them, and each hand-over leaves its resources unowned
        # for a moment (the follow-up's rejoin, or the leader's round delay).
        moves = math.ceil(self.most_resources / self.max_moves) \
            if self.placed and self.max_moves else 0
        paced = moves * (BALANCED_ROUND_DELAY_MS + self.rebalance_timeout_ms)
        # Warm-up: a move waits for its receiver's warm report, at most the
        # warm-up timeout (a receiver that crashed, or restarted, never sends it).
        warm = (max(1, moves) * self.warmup_timeout_ms
                if self.placed and self.warmup_timeout_ms is not None else 0)
        # balanced: a member measures the load of what the faults' rounds handed
        # it, and rejoins on it once its load rejoin interval allows; the move
        # that rejoin plans leaves its resources unowned for a hand-over round
        # (seed 5017304).
        measured = (self.load_rejoin_interval_ms + self.rebalance_timeout_ms
                    if self.placed else 0)
        return (2 * self.session_timeout_ms + self.rebalance_timeout_ms
                + self.initial_rebalance_delay_ms + extra + cluster + paced + warm
                + measured)

    def describe(self) -> str:
        interval = (f"{self.heartbeat_interval_ms}" if self.heartbeat_interval_ms is not None
                    else "derived")
        return (f"seed={self.seed} members={self.members} static={list(self.static)} "
                f"assignors={list(self.assignors)} session={self.session_timeout_ms} "
                f"rebalance={self.rebalance_timeout_ms} interval={interval} "
                f"request_timeout={self.request_timeout_ms} "
                f"initial_delay={self.initial_rebalance_delay_ms} catalog={dict(self.catalog)} "
                f"sets={list(self.sets)} incremental_delay={self.incremental_delay_ms} "
                f"commit_interval={self.commit_interval_ms} listener={self.listener_ms} "
                f"latency={self.latency} disk={self.disk_ms} drift_ppm={list(self.drift_ppm)} "
                f"faulty={self.faulty} fault_ms={self.fault_ms} upgrade={self.upgrade}"
                + (f" coordinators={self.coordinators} partitions={self.partitions} "
                   f"lease={self.lease_ms} coord_drift_ppm={list(self.coord_drift_ppm)}"
                   if self.coordinators > 1 else "")
                + (f" runtime limits={self.limits} tokens={self.tokens or None} "
                   f"storage_check={self.storage_check_ms}" if self.runtime else "")
                + (f" placement={dict(self.placement)} capacities={list(self.capacities)} "
                   f"racks={list(self.racks)} max_moves={self.max_moves} "
                   f"loads={list(self.loads)} "
                   f"load_rejoin_interval={self.load_rejoin_interval_ms} "
                   f"warmup_timeout={self.warmup_timeout_ms}"
                   if self.placed else ""))


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def chaos_config(seed: int) -> SimConfig:
    """The real-process chaos harness's settings (tests/chaos/harness.py,
    ``ChaosConfig``): one cooperative-sticky group of three, orders 8 and
    users 4, session 1500, interval 400, rebalance 3000, initial delay 200,
    request timeout 5000, commits every 150 ms, 12 s of faults, a local
    network (well under a millisecond) and SQLite commits of a few ms."""
    rng = random.Random(seed)
    return SimConfig(
        seed=seed, members=3, static=(False,) * 5, assignors=("cooperative-sticky",),
        session_timeout_ms=1500, rebalance_timeout_ms=3000, heartbeat_interval_ms=400,
        request_timeout_ms=5000, initial_rebalance_delay_ms=200,
        catalog=(("orders", 8), ("users", 4)), sets=("orders", "users"),
        incremental_delay_ms=0, commit_interval_ms=150, listener_ms=(0, 5),
        latency=(0, 1, 0.01, 20), disk_ms=(1, 10),
        drift_ppm=tuple(rng.randint(-MAX_DRIFT_PPM, MAX_DRIFT_PPM) for _ in range(5)),
        faulty=True, fault_ms=12_000, upgrade=False, profile="chaos")


def draw_config(seed: int, profile: str = "space") -> SimConfig:
    if profile == "chaos":
        return chaos_config(seed)
    rng = random.Random(seed)
    session = _log_uniform(rng, 300, 30_000)
    rebalance = max(session // 2, _log_uniform(rng, session // 2 + 1, 3 * session))
    lease = min(session, rebalance)
    bound = lease // HEARTBEATS_PER_LEASE
    interval: int | None = None if rng.random() < 0.4 else rng.randint(max(1, bound // 3), bound)
    effective = interval if interval is not None else min(3000, bound)
    request_timeout = rng.choice([30_000, rng.randint(max(lease // 3, 1), 30_000)])
    members = rng.choice([1, 2, 2, 3, 3, 3, 4, 4, 5, 6])
    upgrade = rng.random() < 0.1
    assignors: tuple[str, ...]
    if upgrade:
        assignors = UPGRADE_STEPS[0]
    elif rng.random() < 0.5:
        assignors = (rng.choice(COOPERATIVE_ASSIGNORS),)
    else:
        assignors = (rng.choice(EAGER_ASSIGNORS),)
        if rng.random() < 0.2:
            other = rng.choice([a for a in EAGER_ASSIGNORS if a != assignors[0]])
            assignors = (assignors[0], other)
    static_mode = rng.random()
    static = tuple((static_mode > 0.7) or (static_mode > 0.5 and rng.random() < 0.5)
                   for _ in range(members + 2))
    n_sets = rng.randint(1, 3)
    catalog = tuple((f"s{i}", rng.randint(1, 12)) for i in range(n_sets))
    sets = tuple(f"s{i}" for i in range(n_sets + (1 if rng.random() < 0.3 else 0)))
    # A healthy network answers well within the timing rule's reply allowance
    # (client/lease.py): round trip under a quarter of it.
    reply_ms = min(request_timeout, max(1, (lease - 2 * effective) // 2))
    one_way_max = max(1, reply_ms // 8)
    base = rng.randint(0, max(0, min(20, one_way_max // 2)))
    jitter = rng.randint(0, max(0, min(30, one_way_max - base)))
    tail = rng.choice([0.0, 0.0, 0.01, 0.05])
    tail_ms = max(0, one_way_max - base - jitter)
    faulty = rng.random() < 0.8
    listener_hi = max(0, min(effective // 4, 200))
    # Profile "cluster": the same draws, and several coordinators drawn apart
    # (so every seed of the other profiles is as it was before they existed).
    crng = random.Random(seed * 1_000_003 + 17)
    crng.random()
    coordinators = crng.choice([2, 3]) if profile == "cluster" else 1
    partitions = crng.choice([1, 2, 3, 4, 8])
    # The lease sized as docs/operations.md says: a failover (a lease, a load, a
    # retry) well inside the member's budget, min(session, rebalance) - 2 intervals;
    # never under 100 ms (the real floor is 1000 ms; the simulator scales down).
    budget = max(1, lease - 2 * effective)
    lease_ms = max(100, crng.randint(budget // 4 + 1, max(budget // 4 + 1, budget // 2)))
    coord_drift = tuple(crng.randint(-MAX_DRIFT_PPM, MAX_DRIFT_PPM) for _ in range(coordinators))
    if coordinators == 1:
        partitions, lease_ms, coord_drift = 1, 0, ()
    # A quarter of the seeds place by load (``balanced``), drawn apart too: the
    # other seeds are as they were; an upgrade keeps its own assignors.
    prng = random.Random(seed * 2_000_029 + 41)
    placed = prng.random() < 0.25 and not upgrade
    extra: dict[str, Any] = {}
    if placed:
        assignors = ("balanced",)
        extra = _draw_placement(prng, catalog, members + 2, session)
        # Half of them warm moving resources up first, drawn apart again.
        wrng = random.Random(seed * 5_000_011 + 67)
        if wrng.random() < 0.5:
            extra["warmup_timeout_ms"] = wrng.randint(max(1, session // 2), 3 * session)
    if profile == "space":
        extra.update(_draw_runtime(random.Random(seed * 3_000_017 + 59), members, session))
    return SimConfig(
        seed=seed, members=members, static=static, assignors=assignors,
        session_timeout_ms=session, rebalance_timeout_ms=rebalance,
        heartbeat_interval_ms=interval, request_timeout_ms=request_timeout,
        initial_rebalance_delay_ms=rng.choice([0, 0, rng.randint(0, min(3000, rebalance))]),
        catalog=catalog, sets=sets,
        incremental_delay_ms=rng.randint(0, session),
        commit_interval_ms=rng.randint(max(1, effective), max(1, 3 * effective)),
        listener_ms=(0, listener_hi),
        latency=(base, jitter, tail, tail_ms),
        disk_ms=(rng.randint(0, 2), rng.randint(2, max(2, min(50, reply_ms // 8)))),
        drift_ppm=tuple(rng.randint(-MAX_DRIFT_PPM, MAX_DRIFT_PPM) for _ in range(members + 2)),
        faulty=faulty or upgrade,
        fault_ms=rng.randint(2, 5) * session,
        upgrade=upgrade,
        coordinators=coordinators, partitions=partitions, lease_ms=lease_ms,
        coord_drift_ppm=coord_drift, profile=profile, **extra,
    )


def _draw_runtime(rng: random.Random, members: int, session: int) -> dict[str, Any]:
    """A third of the one-server seeds, drawn apart (the others are as they were):
    parked-request limits the group fills (one parked join, sync or long-poll per
    worker at most, so the limit of all is at least the workers a run may have,
    and a join or sync at it releases a parked long-poll), tokens, the storage
    check."""
    if rng.random() >= 1 / 3:
        return {}
    slots = members + 2
    limits: tuple[int, int] | None = None
    tokens = ""
    if rng.random() < 0.7:
        tokens = rng.choice(["each", "shared"])
        per_token = rng.choice([1, 2]) if tokens == "each" else slots
        limits = (rng.randint(slots, 2 * slots), per_token)
    check = rng.randint(max(1, session // 4), 2 * session) if rng.random() < 0.5 else 0
    return {"runtime": True, "limits": limits, "tokens": tokens, "storage_check_ms": check}


def _draw_placement(rng: random.Random, catalog: tuple[tuple[str, int], ...], slots: int,
                    session: int) -> dict[str, Any]:
    """Weights (some heavy resources), zones (some resources homed), each slot's
    capacity and rack, ``max_moves`` (sometimes), and load changes (sometimes one
    resource much hotter) while the faults run (they run two sessions at least)."""
    placement: list[tuple[str, Placement]] = []
    for name, n in catalog:
        weights = Weights()
        zones = Zones()
        if rng.random() < 0.6:
            heavy = sorted(rng.sample(range(n), rng.randint(1, max(1, n // 3))))
            weights = Weights(rng.choice([1.0, 1.0, 0.5, 2.0]),
                              tuple((i, float(rng.choice([3, 5, 10]))) for i in heavy))
        if rng.random() < 0.5:
            homed = sorted(rng.sample(range(n), rng.randint(1, n)))
            zones = Zones(None, tuple((i, (rng.choice(ZONES),)) for i in homed))
        p = Placement(weights, zones)
        if not p.is_default:
            placement.append((name, p))
    capacities = tuple(float(rng.choice([1, 1, 1, 2, 4])) for _ in range(slots))
    racks = tuple(rng.choice(ZONES) if rng.random() < 0.8 else None for _ in range(slots))
    max_moves = rng.choice([None, None, 1, 2, 3])
    loads: list[LoadChange] = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        name, n = rng.choice(catalog)
        loads.append(LoadChange(session + rng.randint(0, 2 * session), name, rng.randrange(n),
                                float(rng.choice([0.2, 2, 5, 20]))))
    loads.sort(key=lambda c: c.at)
    return {"placement": tuple(placement), "capacities": capacities, "racks": racks,
            "max_moves": max_moves, "loads": tuple(loads),
            "load_rejoin_interval_ms": rng.randint(max(1, session // 2), 2 * session)}


#: the chaos harness's own fault kinds and weights (its proxy never loses a message).
CHAOS_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("kill", 2), ("zombie", 2), ("coord_crash", 1.5), ("latency", 1.5), ("partition", 2),
    ("catalog", 1), ("join", 1), ("leave", 1),
    # What a loaded machine adds (its notes: slow SQLite commits, a stalled
    # harness loop stalling every proxy at once).
    ("slow_disk", 1), ("stall", 1),
)
FAULT_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("kill", 2), ("zombie", 2), ("coord_crash", 1.5), ("slow_disk", 1), ("latency", 1.5),
    ("drops", 1), ("reset", 1), ("partition", 2), ("catalog", 1), ("join", 1), ("leave", 1),
    ("stall", 0.5),
)
#: several coordinators: their own faults as well (a crash is of one of them).
CLUSTER_WEIGHTS: tuple[tuple[str, float], ...] = (
    *FAULT_WEIGHTS, ("coord_pause", 1.5), ("db_cut", 1.5), ("coord_stop", 1),
)


#: the runtime's own faults (one server, ``SimConfig.runtime``), drawn apart.
RUNTIME_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("core_fail", 3), ("refuse", 2), ("write_fail", 1), ("check_fail", 1), ("crowd", 2),
    ("coord_stop", 1),
)


def draw_runtime_faults(config: SimConfig) -> list[Fault]:
    """One to four faults of the runtime in the fault window: the core failing over
    the group (before or after its handler changed it), the store refusing one of
    its records (saying whose or not), a write failing (committed or not) or the
    storage check failing (the server exits; started again after ``duration``),
    the parked-request limits cut to a few for ``duration`` (other groups' calls
    fill them), a graceful stop and start."""
    rng = random.Random(config.seed * 4_000_037 + 71)
    s = config.session_timeout_ms
    table = [(k, w) for k, w in RUNTIME_WEIGHTS
             if k != "check_fail" or config.storage_check_ms]
    kinds = [k for k, _ in table]
    weights = [w for _, w in table]
    faults = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choices(kinds, weights)[0]
        at = s + rng.randint(0, config.fault_ms)
        params: tuple[tuple[str, Any], ...] = ()
        duration = rng.randint(1, s)
        if kind == "core_fail":
            params, duration = (("after", rng.random() < 0.5),), 0
        elif kind == "refuse":
            params, duration = (("says", rng.random() < 0.5),), 0
        elif kind == "write_fail":
            params = (("committed", rng.random() < 0.5),)
        elif kind == "crowd":
            params = (("requests", rng.randint(1, config.members)),
                      ("per_token", rng.randint(1, config.members)))
        faults.append(Fault(at, kind, "", duration, params))
    return faults


def draw_faults(config: SimConfig) -> tuple[Fault, ...]:
    """The schedule against a model of which slots are up (one always stays up),
    and the runtime's own faults (``draw_runtime_faults``)."""
    if not config.faulty:
        return ()
    rng = random.Random(config.seed * 7919 + 1)
    s = config.session_timeout_ms
    slots = [f"w{i}" for i in range(config.members)]
    busy_until = dict.fromkeys(slots, 0)
    left: set[str] = set()
    extra = 0
    coord_up_at = 0
    table = (CHAOS_WEIGHTS if config.profile == "chaos" else
             CLUSTER_WEIGHTS if config.coordinators > 1 else FAULT_WEIGHTS)
    nodes = [f"c{i}" for i in range(config.coordinators)]
    node_busy = dict.fromkeys(nodes, 0)
    kinds = [k for k, _ in table]
    weights = [w for _, w in table]
    faults: list[Fault] = []
    start = s  # let the group form first
    if config.upgrade:
        # Rolling upgrade: each slot bounces in turn, twice (KIP-429).
        gap = max(1, s // 2)
        t = start
        for step in (1, 2):
            for slot in slots:
                faults.append(Fault(t, "upgrade", slot, rng.randint(1, max(1, s // 4)),
                                    (("step", step),)))
                busy_until[slot] = max(busy_until[slot], t + s // 4 + 1)
                t += gap
            t += 2 * s + config.rebalance_timeout_ms
        return tuple(faults)
    t = start + rng.randint(0, s // 2)
    end = start + config.fault_ms
    mean_gap = 800 if config.profile == "chaos" else max(1, s // 2)
    while t < end:
        kind = rng.choices(kinds, weights)[0]

        def up(slot: str, now: int = t) -> bool:
            return slot not in left and busy_until[slot] <= now

        live = sorted(x for x in slots if up(x))
        spare = live if len(live) > 1 else []
        fault: Fault | None = None
        if kind == "kill" and spare:
            slot = rng.choice(spare)
            down = rng.randint(1, 2 * s)
            fault = Fault(t, kind, slot, down)
            busy_until[slot] = t + down
        elif kind == "zombie" and spare:
            slot = rng.choice(spare)
            frozen = int(s * rng.uniform(1.3, 2.5))
            fault = Fault(t, kind, slot, frozen)
            busy_until[slot] = t + frozen
        elif kind in ("coord_crash", "coord_pause", "db_cut", "coord_stop") \
                and config.coordinators > 1:
            # One coordinator at a time is hit (the others carry its partitions).
            idle = [n for n in nodes if node_busy[n] <= t]
            if len(idle) == len(nodes):
                node = rng.choice(nodes)
                lease_ms = config.lease_ms
                dur = (rng.randint(1, s) if kind in ("coord_crash", "coord_stop") else
                       int(lease_ms * rng.uniform(1.2, 3.0)) if kind == "coord_pause" else
                       rng.randint(1, 3 * lease_ms))
                # A pause may wait for the coordinator's next write and strike
                # between its fence and its COMMIT; it may be of the group's owner.
                params: tuple[tuple[str, Any], ...] = (
                    (("owner", rng.random() < 0.6), ("mid_write", rng.random() < 0.5))
                    if kind == "coord_pause" else ())
                fault = Fault(t, kind, node, dur, params)
                node_busy[node] = t + dur
        elif kind == "coord_crash" and coord_up_at <= t:
            down = rng.randint(1, s)
            fault = Fault(t, kind, "", down)
            coord_up_at = t + down
        elif kind == "slow_disk":
            fault = Fault(t, kind, "", rng.randint(1, s), (("factor", rng.choice([5, 20, 100])),))
        elif kind == "latency" and live:
            fault = Fault(t, kind, rng.choice(live), rng.randint(1, 2 * s),
                          (("ms", rng.choice([s // 20, s // 5, s // 2, s])),))
        elif kind == "drops" and live:
            fault = Fault(t, kind, rng.choice(live), rng.randint(1, 2 * s),
                          (("p", rng.choice([0.05, 0.2, 0.5])),))
        elif kind == "stall":
            # Every member's network stalls at once (delivered late, not lost).
            fault = Fault(t, kind, "", rng.randint(1, max(1, s // 3)))
        elif kind == "reset" and live:
            fault = Fault(t, kind, rng.choice(live))
        elif kind == "partition" and spare:
            slot = rng.choice(spare)
            dur = rng.randint(1, int(2.5 * s))
            fault = Fault(t, kind, slot, dur, (("cut", rng.random() < 0.5),))
            busy_until[slot] = t + dur
        elif kind == "catalog":
            name = rng.choice(config.sets)
            fault = Fault(t, kind, "", 0, (("set", name), ("partitions", rng.randint(1, 12))))
        elif kind == "join" and extra < 2:
            slot = f"w{config.members + extra}"
            extra += 1
            slots.append(slot)
            busy_until[slot] = t
            fault = Fault(t, kind, slot)
        elif kind == "leave" and spare:
            slot = rng.choice(spare)
            back = rng.random() < 0.5
            fault = Fault(t, kind, slot, rng.randint(1, s) if back else 0, (("back", back),))
            if back:
                busy_until[slot] = t + fault.duration
            else:
                left.add(slot)
        if fault is not None:
            faults.append(fault)
        t += max(1, int(rng.expovariate(1 / mean_gap)))
    if config.runtime:
        faults = sorted(faults + draw_runtime_faults(config), key=lambda f: f.at)
    return tuple(faults) + draw_drains(config, len(slots))


def draw_drains(config: SimConfig, slots: int) -> tuple[Fault, ...]:
    """Planned restarts among the faults, drawn apart (the other faults are as
    they were): a worker drains (``machine.drain``), is given ``duration`` to
    hand everything over (then it closes, giving up the rest, as
    ``GroupMember.drain``'s timeout does) and starts again. Sometimes it is
    killed mid-drain or mid-warm-up (``kill`` right after)."""
    rng = random.Random(config.seed * 4_000_037 + 73)
    if rng.random() >= 0.3:
        return ()
    s = config.session_timeout_ms
    out: list[Fault] = []
    for _ in range(rng.choice([1, 1, 2])):
        # Over, and a worker closed at its end restarted (a session later), before
        # the faults end.
        duration = rng.randint(s, min(4 * s, config.fault_ms - s))
        at = s + rng.randint(0, config.fault_ms - s - duration)
        slot = f"w{rng.randrange(min(slots, config.members))}"
        out.append(Fault(at, "drain", slot, duration))
        if rng.random() < 0.25:
            out.append(Fault(at + rng.randint(0, s), "kill", slot, rng.randint(1, s)))
    return tuple(out)


def last_fault_end(config: SimConfig) -> int:
    """When the last fault is over, at the latest: then every fault is ended."""
    if not config.faults:
        return 0
    return max(f.at + f.duration for f in config.faults) if config.upgrade else \
        config.session_timeout_ms + config.fault_ms
