"""The chaos harness: real processes, a seeded fault schedule, checked invariants.

One seed's run (``await run_seed(seed, workdir, config)``):

1. start ``groupcoord serve`` on 127.0.0.1 with a fresh SQLite file and a
   catalog; one :class:`~proxy.FaultProxy` per worker slot in front of it;
2. start the worker processes (``worker.py``), in two groups by default: one
   cooperative (``cooperative-sticky``), one eager (``range``);
3. play the seed's fault schedule for ``fault_seconds``: SIGKILL of a worker
   (restarted later as a new incarnation), SIGSTOP of a worker for longer
   than its session timeout then SIGCONT (a zombie), SIGKILL of the
   coordinator and restart on the same database, latency and partitions on a
   worker's proxy, catalog changes, extra workers joining, clean leaves,
   and (when the config weighs them) drains: a worker drains (SIGUSR1, or
   the admin route ``POST /v1/groups/{g}/members/{m}/drain`` naming it),
   exits once drained and is restarted later; some drains are crashed into
   (the draining worker SIGKILLed mid-drain, or another member of its group
   -- with warm-up, one warming a standby up if one does within 3 s --
   SIGKILLed while it hands over);
4. end every fault (restart what is down, heal every proxy) and wait two
   session timeouts plus the rebalance timeout (plus the initial rebalance
   delay of a group that emptied): every resource must then be owned exactly
   once;
5. stop the workers cleanly, SIGKILL the coordinator one last time, restart
   it and read every checkpoint;
6. check the ledgers (ledger.py) and return what was run and found.

The schedule is drawn from ``random.Random(seed)`` before the run starts,
against a model of which slots are up, so the same seed plays the same
faults at the same offsets (``SeedResult.schedule`` lists them).

**Several coordinators** (``ChaosConfig.multi(3)``, ``coordinators > 1``):
the run starts a throw-away PostgreSQL (tests/pg_harness.py; or uses the
``PostgresServer`` it is given, in a schema of its own) and that many
``groupcoord serve --db postgresql://... --partitions P --lease-ms L``
processes on it, each on a port it keeps across restarts; every worker is
given the list of all their URLs and follows its group's coordinator. There
is no fault proxy: a ``NOT_COORDINATOR`` answer names the owner's advertised
URL, which a proxy in front of one coordinator cannot stand in for, so the
latency and partition faults are not played (the config refuses them). The
worker faults stay (kill, zombie, join, leave; catalog changes go through
any live coordinator's admin listener), and coordinator faults join them,
each aimed at the coordinator owning one group's partition, never two at
once:

* ``kill_coordinator``: SIGKILL, restarted later on the same database and
  port. Right after the kill, the checkpoints of its partitions' groups are
  read from the database in one snapshot with the leases; while the leases
  still name the dead coordinator at its epoch nobody else can have written
  them, so that read is exactly what it left (durability, as the one-process
  mode's read after a restart);
* ``pause_coordinator``: SIGSTOP for 1.5 to 2.5 leases, then SIGCONT. Before
  the SIGCONT its partitions must have been taken over (new epoch or owner in
  the database); right after it a heartbeat sent to it directly for each of
  those partitions must be answered ``NOT_COORDINATOR``; and no commit sent
  to it while it was stopped may have been acknowledged by it (the workers
  log which coordinator answered each call);
* ``term_coordinator``: SIGTERM (it hands its partitions off and must exit
  0), restarted later: a rolling restart, one at a time;
* ``restart_postgres``: ``pg_ctl stop -m fast`` and start again on the same
  port while members heartbeat; after it every checkpoint is read, and each
  must be at least the last value acknowledged before the stop (values are
  clock readings: later commits only store larger ones).

At the end the workers stop, every coordinator is killed, one is started
alone and every checkpoint is fetched through it once it serves the groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from protocol import codec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger import (
    INFINITY,
    CheckResult,
    Owner,
    Resource,
    check_converged,
    check_drained,
    check_durability,
    check_durability_floor,
    check_exclusive,
    check_fencing,
    check_standbys,
    commits_of,
    first_stable_convergence,
    ownership_intervals,
    raw_intervals,
    read_ledger,
    reordered_commits,
)
from pgdb import ClusterDB, LeaseState, group_in_partition
from proxy import FaultProxy
from worker import resource_weight

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pg_harness import PostgresServer

WORKER = Path(__file__).resolve().parent / "worker.py"
#: How long a coordinator may take to print its listening line: a bound on a
#: process start (imports, opening the database), not on anything under test;
#: on a loaded machine (several pytest-xdist workers) one took over 20 s.
START_TIMEOUT_S = 60.0


def _die_with_parent() -> None:
    """Run in each child before exec: SIGKILL it when the harness goes away.

    Linux's PR_SET_PDEATHSIG: however the harness ends (an interrupted run,
    a crash, a cancelled spawn), no worker or coordinator outlives it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))


@dataclass(frozen=True)
class ChaosConfig:
    #: (group id, assignor) pairs; every group subscribes to every set.
    groups: tuple[tuple[str, str], ...] = (("coop", "cooperative-sticky"), ("eager", "range"))
    workers_per_group: int = 3
    max_extra_workers_per_group: int = 2
    catalog: tuple[tuple[str, int], ...] = (("orders", 8), ("users", 4))
    session_timeout_ms: int = 1500
    heartbeat_interval_ms: int = 400
    rebalance_timeout_ms: int = 3000
    initial_rebalance_delay_ms: int = 200
    request_timeout_ms: int = 5000
    commit_interval_ms: int = 150
    fault_seconds: float = 12.0
    #: mean gap between two faults (exponential).
    mean_fault_gap_s: float = 0.8
    #: the catalog's sets carry weights (``worker.resource_weight``), for a
    #: load-balancing assignor; a catalog change keeps them for the new count.
    weighted_catalog: bool = False
    #: the workers' capacities, by slot number within the group, cycled
    #: (empty: none said).
    capacities: tuple[float, ...] = ()
    #: > 0: workers measure a load (``worker.measured_load``) each heartbeat
    #: interval and rejoin when it leaves their band, at most once per this.
    load_rejoin_interval_ms: int = 0
    #: > 0: the ``balanced`` assignor warms up (``warmup=True`` with this
    #: ``warmup_timeout_ms``) and the workers' ``on_standby`` take a time drawn
    #: from ``warmup_s`` (seconds).
    warmup_timeout_ms: int = 0
    warmup_s: tuple[float, float] = (0.2, 1.5)
    #: a drain fault's ``drain(timeout_s=...)``.
    drain_timeout_s: float = 8.0
    #: relative weights of the fault kinds (``DRAIN_WEIGHTS`` adds drains).
    weights: tuple[tuple[str, float], ...] = (
        ("kill_worker", 2), ("zombie", 2), ("kill_coordinator", 1.5), ("latency", 1.5),
        ("partition", 2), ("catalog", 1), ("join", 1), ("leave", 1),
    )
    #: 1: one SQLite coordinator behind per-worker fault proxies; more: that many
    #: coordinators on PostgreSQL (see the module docs; ``ChaosConfig.multi``).
    coordinators: int = 1
    #: several coordinators: ``serve --lease-ms`` and ``--partitions``.
    lease_ms: int = 1200
    partitions: int = 8
    #: seconds the run watches after the faults end (None: twice ``convergence_s``,
    #: to tell "converged late" from "never").
    observe_s: float | None = None

    def __post_init__(self) -> None:
        if self.coordinators < 1:
            raise ValueError(f"coordinators must be at least 1, got {self.coordinators}")
        kinds = {k for k, _ in self.weights}
        if self.coordinators > 1:
            if kinds & PROXY_FAULTS:
                raise ValueError(
                    f"{sorted(kinds & PROXY_FAULTS)}: proxy faults cannot be played with "
                    "several coordinators (a member follows NOT_COORDINATOR to the owner's "
                    "own URL); use ChaosConfig.multi()")
            # A failover (lease run out, loaded by another, found by the member after
            # its heartbeat's hold and reply_ms) must fit well inside the session.
            if 2 * self.lease_ms + self.heartbeat_interval_ms >= self.session_timeout_ms:
                raise ValueError(
                    f"lease_ms {self.lease_ms} is too long for session_timeout_ms "
                    f"{self.session_timeout_ms}: a failover must fit in the session "
                    "(2 x lease + heartbeat interval < session)")
        elif kinds & COORDINATOR_FAULTS - {"kill_coordinator"}:
            raise ValueError(f"{sorted(kinds & COORDINATOR_FAULTS - {'kill_coordinator'})}: "
                             "only with several coordinators")

    @classmethod
    def multi(cls, coordinators: int = 3, **changes: Any) -> ChaosConfig:
        """The several-coordinators profile (docs/reliability.md, "Several
        coordinators"): a 4 s session and a 1.2 s lease. A killed owner's lease
        runs out within 1.2 s and another loads the partition at once (its loop
        wakes at that moment); a paused owner is given up by its members after
        a heartbeat's hold plus ``reply_ms`` ((4000 - 2 x 400) / 2 = 1600 ms), by
        which time its lease has run out and the partition has moved: the
        member's next call reaches the new owner at about 2.1 s, well before
        its safety deadline of 4 s after its last answered heartbeat."""
        fields: dict[str, Any] = {
            "coordinators": coordinators, "session_timeout_ms": 4000,
            "heartbeat_interval_ms": 400, "lease_ms": 1200, "weights": MULTI_WEIGHTS}
        fields.update(changes)
        return cls(**fields)

    @property
    def convergence_s(self) -> float:
        return (2 * self.session_timeout_ms + self.rebalance_timeout_ms
                + self.initial_rebalance_delay_ms) / 1000

    @property
    def observe_for_s(self) -> float:
        return 2 * self.convergence_s if self.observe_s is None else self.observe_s


#: faults of the per-worker proxies (one coordinator only).
PROXY_FAULTS = frozenset({"latency", "partition"})
#: faults of coordinators and of their database.
COORDINATOR_FAULTS = frozenset({"kill_coordinator", "pause_coordinator", "term_coordinator",
                                "restart_postgres"})
#: the weight of the drain fault, added to a config's weights for drains.
DRAIN_WEIGHTS: tuple[tuple[str, float], ...] = (("drain", 4),)
MULTI_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("kill_worker", 2), ("zombie", 2), ("catalog", 1), ("join", 1), ("leave", 1),
    ("kill_coordinator", 1.5), ("pause_coordinator", 1.5), ("term_coordinator", 1),
    ("restart_postgres", 0.7),
)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    slot: str = ""
    duration: float = 0.0
    params: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params)
        target = f" {self.slot}" if self.slot else ""
        dur = f" for {self.duration:.2f}s" if self.duration else ""
        return f"t+{self.at:5.2f}s {self.kind}{target}{dur} {extra}".rstrip()


@dataclass
class SeedResult:
    seed: int
    schedule: list[str]
    faults: Counter[str]
    violations: list[str]
    check: CheckResult
    seconds: float
    workdir: Path
    notes: list[str] = field(default_factory=list)
    #: several coordinators: each group's generation once stable before the first
    #: fault and once the faults were over and it had converged, and the
    #: rebalance journal rows written between the two (group, generation, reason).
    generations_before: dict[str, int] = field(default_factory=dict)
    generations_after: dict[str, int] = field(default_factory=dict)
    rebalances: list[tuple[str, int, str]] = field(default_factory=list)
    #: heartbeats sent straight to a coordinator just continued after a pause
    #: (each answered NOT_COORDINATOR, or a violation says what it answered)
    probes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


# ---------------------------------------------------------------- the schedule


def make_schedule(seed: int, config: ChaosConfig) -> list[Fault]:
    """Draw the seed's faults against a model of what is up when."""
    rng = random.Random(seed)
    st = config.session_timeout_ms / 1000
    slots = {f"{g}-{i}": g for g, _ in config.groups for i in range(config.workers_per_group)}
    extra = Counter[str]()
    busy_until: dict[str, float] = dict.fromkeys(slots, 0.0)  # down, stopped or leaving
    left: set[str] = set()
    coord_up_at = 0.0
    multi = config.coordinators > 1
    lease = config.lease_ms / 1000
    kinds = [k for k, _ in config.weights]
    weights = [w for _, w in config.weights]
    faults: list[Fault] = []
    t = rng.uniform(0.5, 1.5)
    while t < config.fault_seconds:
        kind = rng.choices(kinds, weights)[0]

        def up(slot: str, now: float = t) -> bool:
            return slot not in left and busy_until[slot] <= now

        def spare(group: str, now: float = t) -> list[str]:
            """Slots of ``group`` that may be taken down: one must stay up."""
            live = sorted(s for s, g in slots.items() if g == group and up(s, now))
            return live if len(live) > 1 else []

        group = rng.choice(config.groups)[0]
        candidates = spare(group)
        fault: Fault | None = None
        if kind == "kill_worker" and candidates:
            slot = rng.choice(candidates)
            down = rng.uniform(0.3, 2.0)
            fault = Fault(t, kind, slot, down)
            busy_until[slot] = t + down
        elif kind == "zombie" and candidates:
            slot = rng.choice(candidates)
            # Longer than the session timeout: the coordinator expires it and
            # hands its resources on while it is frozen.
            frozen = st * rng.uniform(1.3, 2.5)
            fault = Fault(t, kind, slot, frozen)
            busy_until[slot] = t + frozen
        elif kind == "kill_coordinator" and coord_up_at <= t and not multi:
            down = rng.uniform(0.2, 1.5)
            fault = Fault(t, kind, "", down)
            coord_up_at = t + down
        elif kind in COORDINATOR_FAULTS and coord_up_at <= t:
            # Several coordinators: one coordinator fault at a time, each aimed at the
            # owner of ``group``'s partition; the next waits until the one restarted
            # has taken its share back (a lease and a little).
            target = (("target", group),)
            if kind == "kill_coordinator":
                down = rng.uniform(0.3, 1.5)
                fault = Fault(t, kind, "", down, target)
            elif kind == "pause_coordinator":
                down = lease * rng.uniform(1.5, 2.5)
                fault = Fault(t, kind, "", down, target)
            elif kind == "term_coordinator":
                down = rng.uniform(0.2, 1.0)
                fault = Fault(t, kind, "", down, target)
            else:  # restart_postgres: about a second down (a fast stop, a start)
                down = 1.5
                fault = Fault(t, kind)
            coord_up_at = t + down + lease + 0.5
        elif kind == "latency":
            live = [s for s in slots if up(s)]
            if live:
                slot = rng.choice(live)
                ms = rng.choice([50, 150, 400, 900])
                fault = Fault(t, kind, slot, rng.uniform(1.0, 3.0), (("ms", ms),))
        elif kind == "partition" and candidates:
            slot = rng.choice(candidates)
            dur = rng.uniform(0.3, 2.5 * st)
            cut = rng.random() < 0.5
            fault = Fault(t, kind, slot, dur, (("cut", cut),))
            busy_until[slot] = t + dur
        elif kind == "catalog" and (coord_up_at <= t or multi):
            name, _ = rng.choice(config.catalog)
            fault = Fault(t, kind, "", 0.0, (("set", name), ("partitions", rng.randint(1, 12))))
        elif kind == "join" and extra[group] < config.max_extra_workers_per_group:
            extra[group] += 1
            slot = f"{group}-x{extra[group]}"
            slots[slot] = group
            busy_until[slot] = 0.0
            fault = Fault(t, kind, slot)
        elif kind == "drain" and candidates:
            slot = rng.choice(candidates)
            via = rng.choice(["signal", "admin"])
            # A crash into the drain: the drainer itself, or another member of the
            # group (a receiver) -- only while two others stay up.
            crash = rng.choices(["", "drainer", "receiver"], [2, 1, 1])[0]
            if crash == "receiver" and len(candidates) < 3:
                crash = ""
            back = rng.uniform(0.3, 1.5)
            fault = Fault(t, kind, slot, back, (("via", via), ("crash", crash),
                                                ("crash_after", round(rng.uniform(0.05, 1.5), 3))))
            busy_until[slot] = t + config.drain_timeout_s + back
            if crash == "receiver":
                receivers = [s for s in candidates if s != slot]
                # Which one is hit is chosen at run time: keep them all up meanwhile.
                for other in receivers:
                    busy_until[other] = max(busy_until[other], t + 3.5 + back)
        elif kind == "leave" and candidates:
            slot = rng.choice(candidates)
            back = rng.random() < 0.5
            fault = Fault(t, kind, slot, rng.uniform(0.5, 2.0) if back else 0.0,
                          (("rejoin", back),))
            if back:
                busy_until[slot] = t + fault.duration
            else:
                left.add(slot)
        if fault is not None:
            faults.append(fault)
        t += rng.expovariate(1 / config.mean_fault_gap_s)
    return faults


# ---------------------------------------------------------------- processes


class Coordinator:
    """One ``groupcoord serve`` process (restarted as often as the faults say).

    One coordinator: on a SQLite file, on a new port at every start (the
    proxies are pointed at it). Several (``db`` a ``postgresql://`` URL):
    ``--partitions`` and ``--lease-ms`` of the config, and the ports of its
    first start kept across restarts, so the URLs the workers were given stay
    true (a restart on a port taken meanwhile falls back to a new one).
    """

    def __init__(self, workdir: Path, config: ChaosConfig, index: int = 0,
                 db: str | None = None) -> None:
        self.index = index
        self.multi = db is not None
        self.db = db if db is not None else str(workdir / "groupcoord.db")
        self.log = workdir / (f"coordinator-{index}.log" if self.multi else "coordinator.log")
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.port = 0
        #: the admin listener (catalog changes, /metrics).
        self.admin_url = ""
        self.admin_port = 0
        #: several coordinators: the URL the workers were given (kept across restarts).
        self.home_url = ""
        #: SIGSTOPped (several coordinators' pause fault).
        self.stopped = False

    async def start(self) -> None:
        try:
            await self._start(keep_ports=self.multi and self.port > 0)
        except RuntimeError:
            if not (self.multi and self.port > 0):
                raise
            # The kept port was taken meanwhile: a new one (members follow the owners'
            # URLs they are told; only this bootstrap URL goes stale).
            await self._start(keep_ports=False)

    async def _start(self, keep_ports: bool) -> None:
        c = self.config
        # An instance whose start was cancelled half-way (end_faults cancels a pending
        # restart) may still run: it would hold the database, and a second server on
        # the same file is refused. Never leave one behind.
        await self.kill()
        ports = ["--port", str(self.port if keep_ports else 0),
                 "--admin-port", str(self.admin_port if keep_ports else 0)]
        cluster = (["--partitions", str(c.partitions), "--lease-ms", str(c.lease_ms)]
                   if self.multi else [])
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                GROUPCOORD, "serve", "--host", "127.0.0.1", *ports,
                "--db", self.db, *cluster, "--min-session-timeout-ms", "100",
                "--initial-rebalance-delay-ms", str(c.initial_rebalance_delay_ms),
                "--log-level", "WARNING",
                stdout=asyncio.subprocess.PIPE, stderr=log, preexec_fn=_die_with_parent)
        self.stopped = False
        assert self.proc.stdout is not None
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                line = await asyncio.wait_for(self.proc.stdout.readline(),
                                              deadline - time.monotonic())
                if not line:
                    break
                text = line.decode().strip()
                if text.startswith("admin listening on "):  # printed first
                    self.admin_url = text[len("admin listening on "):]
                    self.admin_port = int(self.admin_url.rsplit(":", 1)[1])
                elif text.startswith("listening on "):
                    self.url = text[len("listening on "):]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    self.home_url = self.home_url or self.url
                    return
            raise RuntimeError(f"the coordinator did not start; see {self.log}")
        except BaseException:
            # Cancelled or failed before it was ready: the process must not outlive
            # this call (the next start would find the database held).
            await asyncio.shield(self.kill())
            raise

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.stopped = False

    def signal(self, sig: signal.Signals) -> bool:
        if self.proc is None or self.proc.returncode is not None:
            return False
        self.proc.send_signal(sig)
        return True

    async def terminate(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and bool(self.url)

    @property
    def serving(self) -> bool:
        """Up and not paused."""
        return self.up and not self.stopped


class Slot:
    """One worker slot: its proxy (one coordinator) or the coordinators' URLs
    (several), and its current process (an incarnation)."""

    def __init__(self, name: str, group: str, assignor: str, proxy: FaultProxy | None,
                 ledger: Path, log: Path, urls: str = "", capacity: float | None = None
                 ) -> None:
        self.name = name
        self.group = group
        self.assignor = assignor
        self.capacity = capacity
        self.proxy = proxy
        self.urls = urls
        self.ledger = ledger
        self.log = log
        self.incarnation = -1
        self.proc: asyncio.subprocess.Process | None = None
        self.stopped = False

    @property
    def owner(self) -> Owner:
        return (self.name, self.incarnation)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self, config: ChaosConfig) -> None:
        self.incarnation += 1
        sets = ",".join(name for name, _ in config.catalog)
        url = self.proxy.url if self.proxy is not None else self.urls
        placement: list[str] = []
        if self.capacity is not None:
            placement += ["--capacity", str(self.capacity)]
        if config.load_rejoin_interval_ms > 0:
            placement += ["--load-rejoin-interval-ms", str(config.load_rejoin_interval_ms)]
        if config.warmup_timeout_ms > 0:
            placement += ["--warmup-timeout-ms", str(config.warmup_timeout_ms),
                          "--warmup-s", ",".join(str(x) for x in config.warmup_s)]
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, str(WORKER), *placement, "--url", url, "--group", self.group,
                "--assignor", self.assignor, "--sets", sets, "--ledger", str(self.ledger),
                "--worker", self.name, "--incarnation", str(self.incarnation),
                "--session-timeout-ms", str(config.session_timeout_ms),
                "--rebalance-timeout-ms", str(config.rebalance_timeout_ms),
                "--heartbeat-interval-ms", str(config.heartbeat_interval_ms),
                "--request-timeout-ms", str(config.request_timeout_ms),
                "--commit-interval-ms", str(config.commit_interval_ms),
                "--drain-timeout-s", str(config.drain_timeout_s),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=log, preexec_fn=_die_with_parent)
        self.stopped = False

    def signal(self, sig: signal.Signals) -> bool:
        if not self.running:
            return False
        assert self.proc is not None
        self.proc.send_signal(sig)
        return True


@dataclass
class Pause:
    """One SIGSTOP of a coordinator: when, and the leases it held then."""

    index: int
    url: str
    stop_at: float
    owned: dict[int, LeaseState]
    cont_at: float = INFINITY


# ---------------------------------------------------------------- the run

_pg_schemas = itertools.count()


class Run:
    def __init__(self, seed: int, workdir: Path, config: ChaosConfig, *,
                 postgres: PostgresServer | None = None, pg_url: str | None = None,
                 schedule: list[Fault] | None = None) -> None:
        self.seed = seed
        self.workdir = workdir
        self.config = config
        self.multi = config.coordinators > 1
        #: several coordinators: the PostgreSQL given (restartable), or one of our own.
        self.postgres = postgres
        self.own_postgres = False
        self.pg_url = pg_url
        self.db: ClusterDB | None = None
        self.coordinators: list[Coordinator] = [] if self.multi else [
            Coordinator(workdir, config)]
        self.slots: dict[str, Slot] = {}
        self.deaths: dict[Owner, float] = {}
        #: (SIGSTOP, SIGCONT) times of each incarnation
        self.frozen: dict[Owner, list[tuple[float, float]]] = {}
        self.faults: Counter[str] = Counter()
        self.notes: list[str] = []
        #: (crash time, {group: {resource: value}}) read after each restart (one
        #: coordinator), or right after each kill for its partitions' groups (several)
        self.stored: list[tuple[float, dict[str, dict[Resource, Any]]]] = []
        #: (PostgreSQL stop time, {group: {resource: value}}) read after its restart
        self.floors: list[tuple[float, dict[str, dict[Resource, Any]]]] = []
        #: the pause faults of coordinators
        self.pauses: list[Pause] = []
        #: what the harness saw break while the faults ran (several coordinators)
        self.run_violations: list[str] = []
        self.catalog: dict[str, int] = dict(config.catalog)
        self.pending: set[asyncio.Task[None]] = set()
        self.coordinator_lock = asyncio.Lock()
        self.session: aiohttp.ClientSession | None = None
        self.given_schedule = schedule
        self.schedule: list[Fault] = []
        self.max_loop_lag: tuple[float, float] = (0.0, 0.0)
        self.lag_watch: asyncio.Task[None] | None = None
        self.last_crash = 0.0
        self.generations_before: dict[str, int] = {}
        self.generations_after: dict[str, int] = {}
        self.rebalances: list[tuple[str, int, str]] = []
        self.probes = 0

    @property
    def coordinator(self) -> Coordinator:
        """The one coordinator (or the first of several)."""
        return self.coordinators[0]

    @property
    def groups(self) -> list[str]:
        return [g for g, _ in self.config.groups]

    # ------------------------------------------------------------ helpers

    def later(self, delay: float, coro_fn: Any, *args: Any) -> None:
        async def go() -> None:
            await asyncio.sleep(delay)
            await coro_fn(*args)
        task = asyncio.create_task(go())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def put_catalog(self, name: str, partitions: int, via: int = 0) -> bool:
        assert self.session is not None
        # Several coordinators: any live one takes a catalog change (it is shared).
        live = [c for c in self.coordinators if c.serving] or self.coordinators
        target = live[via % len(live)]
        try:
            doc: dict[str, Any] = {"partitions": partitions}
            if self.config.weighted_catalog:
                doc["weights"] = {"default": 1.0, "overrides": [
                    [i, resource_weight(name, i)] for i in range(partitions)]}
            async with self.session.put(f"{target.admin_url}/v1/resources/{name}",
                                        json=doc) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def fetch_all(self, url: str | None = None, *, retry_s: float = 0.0
                        ) -> dict[str, dict[Resource, Any]]:
        """Every group's checkpoints through ``url`` (the coordinator's). ``retry_s``:
        answers that send the call elsewhere or say the partition is loading (a
        coordinator started alone waits for the dead ones' leases to run out) are
        retried for that long."""
        assert self.session is not None
        out: dict[str, dict[Resource, Any]] = {}
        deadline = time.monotonic() + retry_s
        for group, _ in self.config.groups:
            while True:
                status, doc = 0, {}
                try:
                    async with self.session.post(
                            f"{url or self.coordinator.url}/v1/fetch",
                            data=codec.encode({"group_id": group}),
                            headers={"Content-Type": codec.CONTENT_TYPE}) as resp:
                        status, doc = resp.status, codec.decode(await resp.read())
                except (aiohttp.ClientError, TimeoutError) as exc:
                    doc = {"error": repr(exc)}
                if status == 200 and doc.get("error") is None:
                    break
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"fetch {group}: HTTP {status} {doc}")
                await asyncio.sleep(0.1)
            out[group] = {(s, i): v for s, i, v in doc["checkpoints"]}
        return out

    def add_slot(self, name: str, group: str) -> Slot:
        assignor = dict(self.config.groups)[group]
        ledger, log = self.workdir / f"ledger-{name}.jsonl", self.workdir / f"worker-{name}.log"
        caps = self.config.capacities
        number = sum(1 for s in self.slots.values() if s.group == group)
        capacity = caps[number % len(caps)] if caps else None
        if self.multi:
            urls = ",".join(c.home_url for c in self.coordinators)
            slot = Slot(name, group, assignor, None, ledger, log, urls, capacity)
        else:
            slot = Slot(name, group, assignor,
                        FaultProxy("127.0.0.1", self.coordinator.port, seed=self.seed),
                        ledger, log, capacity=capacity)
        self.slots[name] = slot
        return slot

    async def kill_slot(self, slot: Slot) -> None:
        if slot.signal(signal.SIGKILL):
            self.deaths[slot.owner] = time.monotonic()
            assert slot.proc is not None
            await slot.proc.wait()

    async def respawn(self, slot: Slot) -> None:
        if not slot.running:
            await slot.spawn(self.config)

    async def cont(self, slot: Slot) -> None:
        if slot.stopped:
            slot.signal(signal.SIGCONT)
            slot.stopped = False
            periods = self.frozen.get(slot.owner, [])
            if periods and periods[-1][1] == INFINITY:
                periods[-1] = (periods[-1][0], time.monotonic())

    async def restart_coordinator(self, crash_at: float) -> None:
        async with self.coordinator_lock:
            if self.coordinator.up:
                return
            await self.coordinator.start()
            # Read what survived the crash before any worker can reach the new
            # instance: the proxies still point at the dead one, so no commit made
            # after the restart can slip into this snapshot (with a fast server,
            # workers re-committed between the re-pointing and a later read).
            self.stored.append((crash_at, await self.fetch_all()))
            for slot in self.slots.values():
                assert slot.proxy is not None
                slot.proxy.set_upstream("127.0.0.1", self.coordinator.port)

    async def crash_coordinator(self, down: float) -> None:
        async with self.coordinator_lock:
            await self.coordinator.kill()
            crash_at = self.last_crash = time.monotonic()
            self.coordinator.url = ""
        self.later(down, self.restart_coordinator, crash_at)

    # ------------------------------------------------------------ several coordinators

    async def start_cluster(self) -> None:
        """PostgreSQL (ours, or a schema of the one given) and the coordinators."""
        if self.pg_url is None:
            if self.postgres is None:
                await self._own_postgres()
            server = self.postgres
            schema = f"chaos_{os.getpid()}_{self.seed}_{next(_pg_schemas)}"
            await asyncio.to_thread(server.psql, f"CREATE SCHEMA {schema}", "groupcoord")
            self.pg_url = server.url("groupcoord") + f"?search_path={schema}"
        self.db = ClusterDB(self.pg_url, self.config.partitions)
        self.coordinators = [Coordinator(self.workdir, self.config, i, self.pg_url)
                             for i in range(self.config.coordinators)]
        # All at once (the schema's first migration is safe to race).
        began = time.monotonic()
        await asyncio.gather(*(c.start() for c in self.coordinators))
        up = time.monotonic()
        await self.wait_spread()
        self.notes.append(f"coordinators up in {up - began:.1f}s, every partition owned "
                          f"{time.monotonic() - up:.1f}s later")

    async def _own_postgres(self) -> None:
        """A throw-away PostgreSQL, removed by ``run``'s cleanup whatever happens:
        the server is a daemon (it outlives a killed harness), so a start that is
        cancelled half-way still finishes and is then removed."""
        made: list[PostgresServer] = []

        def make() -> None:
            server = PostgresServer()
            made.append(server)
            server.start()

        started = asyncio.ensure_future(asyncio.to_thread(make))
        try:
            await asyncio.shield(started)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await started
            raise
        finally:
            if made:
                self.postgres, self.own_postgres = made[0], True

    async def wait_spread(self, timeout_s: float = 30.0) -> None:
        """Until every partition is held by a live coordinator."""
        assert self.db is not None
        deadline = time.monotonic() + timeout_s
        urls = {c.url for c in self.coordinators if c.up}
        while time.monotonic() < deadline:
            leases = await self.db.leases()
            if len(leases) == self.config.partitions and all(
                    st.held and st.owner_url in urls for st in leases.values()):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the partitions were not all owned within {timeout_s:.0f}s")

    async def owner_of(self, group: str) -> Coordinator | None:
        """The live coordinator holding ``group``'s partition's lease now."""
        assert self.db is not None
        st = (await self.db.leases()).get(self.db.partition_of(group))
        if st is None or not st.held:
            return None
        return next((c for c in self.coordinators if c.serving and c.url == st.owner_url),
                    None)

    async def kill_one(self, coord: Coordinator, down: float) -> None:
        """SIGKILL; the checkpoints of its groups as it left them; a restart later."""
        assert self.db is not None
        async with self.coordinator_lock:
            before = await self.db.leases()
            await coord.kill()
            crash_at = self.last_crash = time.monotonic()
            owned = {n: st for n, st in before.items()
                     if st.held and st.owner_url == coord.url}
            groups = [g for g in self.groups if self.db.partition_of(g) in owned]
            if groups:
                leases, stored = await self.db.snapshot(groups)
                # Read while every lease of it still names it at the same epoch: nobody
                # else can have written those groups since the kill (fencing).
                if all(leases[n].owner_url == coord.url and leases[n].epoch == st.epoch
                       for n, st in owned.items()):
                    self.stored.append((crash_at, stored))
                else:
                    self.notes.append(f"durability read after killing coordinator "
                                      f"{coord.index} came after a takeover; not counted")
        self.later(down, self.restart_one, coord)

    async def restart_one(self, coord: Coordinator) -> None:
        async with self.coordinator_lock:
            if not coord.up:
                await coord.start()

    async def pause_one(self, coord: Coordinator, frozen_s: float) -> None:
        assert self.db is not None
        before = await self.db.leases()
        owned = {n: st for n, st in before.items() if st.held and st.owner_url == coord.url}
        if not coord.signal(signal.SIGSTOP):
            return
        coord.stopped = True
        pause = Pause(coord.index, coord.url, time.monotonic(), owned)
        self.pauses.append(pause)
        self.later(frozen_s, self.unpause, coord, pause)

    async def unpause(self, coord: Coordinator, pause: Pause) -> None:
        """SIGCONT, with the checks: taken over while stopped, and at once answering
        ``NOT_COORDINATOR`` for those partitions."""
        assert self.db is not None and self.session is not None
        if not coord.stopped:
            return
        stopped_for = time.monotonic() - pause.stop_at
        try:
            now = await self.db.leases()
        except Exception as exc:  # the database restarting: checked no further
            now = None
            self.notes.append(f"leases unreadable before continuing coordinator "
                              f"{coord.index}: {exc!r}")
        coord.signal(signal.SIGCONT)
        coord.stopped = False
        pause.cont_at = time.monotonic()
        if stopped_for * 1000 < self.config.lease_ms:
            self.notes.append(f"coordinator {coord.index} paused for only {stopped_for:.2f}s "
                              "(shorter than its lease): not checked")
            return
        where = f"coordinator {coord.index} ({coord.url}) paused for {stopped_for:.2f}s"
        for number, st in sorted(pause.owned.items()):
            if now is not None and now[number].owner_url == coord.url \
                    and now[number].epoch == st.epoch:
                self.run_violations.append(
                    f"{where}: partition {number} still held by it at epoch {st.epoch} "
                    f"(lease {self.config.lease_ms} ms): not taken over")
            group = next((g for g in self.groups if self.db.partition_of(g) == number),
                         None) or group_in_partition(number, self.config.partitions)
            answer = await self._probe_heartbeat(coord.url, group)
            self.probes += 1
            if answer.get("error") != "NOT_COORDINATOR":
                self.run_violations.append(
                    f"{where}: a heartbeat for group {group!r} (partition {number}) sent "
                    f"right after SIGCONT was answered {answer!r}, not NOT_COORDINATOR")

    async def _probe_heartbeat(self, url: str, group: str) -> dict[str, Any]:
        assert self.session is not None
        try:
            async with self.session.post(
                    f"{url}/v1/heartbeat",
                    data=codec.encode({"group_id": group, "member_id": "chaos-probe",
                                       "generation_id": 1}),
                    headers={"Content-Type": codec.CONTENT_TYPE}) as resp:
                doc: dict[str, Any] = codec.decode(await resp.read())
                return {"status": resp.status, **doc}
        except (aiohttp.ClientError, TimeoutError) as exc:
            return {"error": repr(exc)}

    async def term_one(self, coord: Coordinator, down: float) -> None:
        async with self.coordinator_lock:
            status = await coord.terminate()
        if status != 0:
            self.run_violations.append(f"coordinator {coord.index} exited {status} on SIGTERM "
                                       "(it must hand its partitions off and exit 0)")
        self.later(down, self.restart_one, coord)

    async def restart_postgres(self) -> bool:
        server = self.postgres
        if server is None:
            return False
        async with self.coordinator_lock:
            port = server.port
            stop_at = time.monotonic()
            await asyncio.to_thread(server.stop, "fast")
            await asyncio.to_thread(server.start)
            if server.port != port:
                raise RuntimeError(f"PostgreSQL came back on port {server.port}, not {port}")
        assert self.db is not None
        _, stored = await self.db.snapshot(self.groups)
        self.floors.append((stop_at, stored))
        return True

    async def apply_multi(self, fault: Fault) -> bool | None:
        """A coordinator fault (several coordinators): applied, or None if not one."""
        params = dict(fault.params)
        if fault.kind not in COORDINATOR_FAULTS:
            return None
        # Never two coordinator faults at once: the last one's restart (slow on a
        # loaded machine) is over and the partitions are spread again first, so a
        # rolling restart is one coordinator at a time.
        deadline = time.monotonic() + 60
        while not all(c.up for c in self.coordinators) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.wait_spread()
        if fault.kind == "restart_postgres":
            return await self.restart_postgres()
        if "index" in params:
            target: Coordinator | None = self.coordinators[params["index"]]
            if target is not None and not target.serving:
                target = None
        else:
            target = await self.owner_of(params["target"])
        if target is None:
            return False
        if fault.kind == "kill_coordinator":
            await self.kill_one(target, fault.duration)
        elif fault.kind == "pause_coordinator":
            await self.pause_one(target, fault.duration)
        else:
            await self.term_one(target, fault.duration)
        return True

    async def wait_stable(self, timeout_s: float = 30.0, hold_s: float = 0.5) -> None:
        """Until every group has settled: each resource owned exactly once (by the
        ledgers), every running member owning some (when there are enough), and
        the generations in the database unchanged for ``hold_s``."""
        assert self.db is not None
        expected = {g: {(s, i) for s, n in self.catalog.items() for i in range(n)}
                    for g in self.groups}
        deadline = time.monotonic() + timeout_s
        settled: tuple[float, dict[str, int]] | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            events, group_of = self._events()
            intervals = ownership_intervals(events, self.deaths, self.frozen)
            owning = {iv.owner for iv in intervals if iv.start <= now < iv.end}
            members_own = all(
                s.owner in owning for s in self.slots.values()
                if s.running and len(expected[s.group]) >= sum(
                    t.running for t in self.slots.values() if t.group == s.group))
            generations = await self.db.generations(self.groups)
            if members_own and not check_converged(intervals, now, expected, group_of):
                if settled is None or settled[1] != generations:
                    settled = (now, generations)
                elif now - settled[0] >= hold_s:
                    return
            else:
                settled = None
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the groups did not settle within {timeout_s:.0f}s "
                           "before the first fault")

    def _events(self) -> tuple[dict[Owner, list[dict[str, Any]]], dict[Owner, str]]:
        events: dict[Owner, list[dict[str, Any]]] = {}
        group_of: dict[Owner, str] = {}
        for slot in self.slots.values():
            if not slot.ledger.exists():
                continue
            for e in read_ledger(slot.ledger):
                owner = (e["w"], e["inc"])
                events.setdefault(owner, []).append(e)
                group_of[owner] = slot.group
        return events, group_of

    # ------------------------------------------------------------ faults

    async def apply(self, fault: Fault) -> None:
        slot = self.slots.get(fault.slot)
        params = dict(fault.params)
        applied = True
        multi_applied = await self.apply_multi(fault) if self.multi else None
        if multi_applied is not None:
            applied = multi_applied
        elif fault.kind == "kill_worker" and slot is not None and slot.running:
            await self.kill_slot(slot)
            self.later(fault.duration, self.respawn, slot)
        elif fault.kind == "zombie" and slot is not None and slot.running and not slot.stopped:
            slot.signal(signal.SIGSTOP)
            slot.stopped = True
            self.frozen.setdefault(slot.owner, []).append((time.monotonic(), INFINITY))
            self.later(fault.duration, self.cont, slot)
        elif fault.kind == "kill_coordinator" and self.coordinator.up:
            await self.crash_coordinator(fault.duration)
        elif fault.kind == "latency" and slot is not None and slot.proxy is not None:
            slot.proxy.set_latency(params["ms"])
            self.later(fault.duration, self._no_latency, slot)
        elif fault.kind == "partition" and slot is not None and slot.proxy is not None:
            slot.proxy.partition(fault.duration, cut=params["cut"])
        elif fault.kind == "catalog" and (self.multi or self.coordinator.up):
            applied = await self.put_catalog(params["set"], params["partitions"],
                                              via=int(fault.at * 1000))
            if applied:
                self.catalog[params["set"]] = params["partitions"]
        elif fault.kind == "join":
            group = fault.slot.rsplit("-", 1)[0]
            new = self.add_slot(fault.slot, group)
            if new.proxy is not None:
                await new.proxy.start()
            await new.spawn(self.config)
        elif fault.kind == "drain" and slot is not None and slot.running and not slot.stopped:
            # Once its SIGUSR1 handler is in place (a start is slow on a loaded machine).
            self.later(0.0, self.start_drain, slot, fault)
            return  # counted as drain_signal or drain_admin, or noted as skipped
        elif fault.kind == "leave" and slot is not None and slot.running and not slot.stopped:
            slot.signal(signal.SIGTERM)
            if params["rejoin"]:
                self.later(fault.duration, self._rejoin, slot)
        else:
            applied = False
        if applied:
            self.faults[fault.kind] += 1
        else:
            self.notes.append(f"skipped: {fault.describe()}")

    async def start_drain(self, slot: Slot, fault: Fault) -> None:
        """A drain of ``slot``'s worker: through the admin route naming its member
        (or SIGUSR1 when it has no member id yet or the coordinator is down);
        the crash the fault says, if any; a restart once it has exited."""
        owner = slot.owner
        # Once it has been given its first assignment: a drain drawn while its
        # worker is still starting (slow on a loaded machine) hands nothing over.
        deadline = time.monotonic() + 5.0
        while not self._assigned(slot) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if slot.owner != owner or not slot.running or slot.stopped or not self._started(slot):
            self.notes.append(f"skipped: {fault.describe()} (its worker had not started, "
                              "or stopped)")
            return
        params = dict(fault.params)
        via = params["via"]
        if via == "admin" and not await self._admin_drain(slot):
            self.notes.append(f"{slot.name}: drained by SIGUSR1 instead of the admin route")
            via = "signal"
        if via == "signal":
            slot.signal(signal.SIGUSR1)
        self.faults[f"drain_{via}"] += 1
        crash = params["crash"]
        if crash == "drainer":
            self.later(params["crash_after"], self._crash_drainer, slot, owner)
        elif crash == "receiver":
            self.later(0.0, self._crash_receiver, slot, params["crash_after"], fault.duration)
        self.later(0.0, self._restart_drained, slot, owner, fault.duration)

    def _assigned(self, slot: Slot) -> bool:
        """``slot``'s incarnation has run ``on_assigned`` (its first assignment)."""
        return slot.ledger.exists() and any(
            e["ev"] == "assigned" and e["inc"] == slot.incarnation
            for e in read_ledger(slot.ledger))

    def _member_id(self, slot: Slot) -> str:
        """The member id ``slot``'s incarnation last logged ("": not joined yet)."""
        # Its ledger is not there yet while the process starts.
        events = read_ledger(slot.ledger) if slot.ledger.exists() else []
        return next((e["member"] for e in reversed(events)
                     if e["ev"] == "member" and e["inc"] == slot.incarnation
                     and e["member"]), "")

    async def _admin_drain(self, slot: Slot) -> bool:
        assert self.session is not None
        member = self._member_id(slot)
        live = [c for c in self.coordinators if c.serving]
        if not member or not live:
            return False
        try:
            async with self.session.post(
                    f"{live[0].admin_url}/v1/groups/{slot.group}/members/{member}/drain"
                    ) as resp:
                if resp.status == 200:
                    return True
                self.notes.append(f"admin drain of {slot.name} ({member}): HTTP {resp.status} "
                                  f"{(await resp.text())[:200]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.notes.append(f"admin drain of {slot.name}: {exc!r}")
        return False

    async def _crash_drainer(self, slot: Slot, owner: Owner) -> None:
        """SIGKILL the draining incarnation ``owner`` if it still runs."""
        if slot.owner == owner and slot.running and not slot.stopped:
            await self.kill_slot(slot)
            self.faults["kill_draining"] += 1
        else:
            self.notes.append(f"{owner}: drained before its crash")

    async def _crash_receiver(self, drainer: Slot, after: float, down: float) -> None:
        """SIGKILL another member of the drainer's group while the drain hands over:
        with warm-up, the first one seen warming a standby up within 3 s; else (or
        when none does) any that runs, ``after`` seconds into the drain."""
        others = [s for s in self.slots.values()
                  if s.group == drainer.group and s is not drainer]
        began = time.monotonic()
        deadline = began + (3.0 if self.config.warmup_timeout_ms > 0 else 0.0)
        target: Slot | None = None
        warming = False
        while target is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            for s in others:
                if s.running and not s.stopped and self._warming(s):
                    target, warming = s, True
                    break
        if target is None:
            await asyncio.sleep(max(0.0, began + after - time.monotonic()))
            up = [s for s in others if s.running and not s.stopped]
            if len(up) < 2:
                self.notes.append(f"no receiver of {drainer.name}'s drain to crash")
                return
            target = up[0]
        await self.kill_slot(target)
        self.faults["kill_warming" if warming else "kill_receiver"] += 1
        self.later(down, self.respawn, target)

    def _warming(self, slot: Slot) -> bool:
        """``slot``'s incarnation has an ``on_standby`` running."""
        running = 0
        for e in read_ledger(slot.ledger) if slot.ledger.exists() else []:
            if e["inc"] != slot.incarnation:
                continue
            if e["ev"] == "standby":
                running += 1
            elif e["ev"] in ("warm", "standby_cancelled"):
                running -= 1
        return running > 0

    async def _restart_drained(self, slot: Slot, owner: Owner, down: float) -> None:
        """Once the drained incarnation exits (or after its drain's timeout and a
        little, killed), a new one ``down`` seconds later."""
        if slot.owner != owner or slot.proc is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(slot.proc.wait(), self.config.drain_timeout_s + 5)
        if slot.owner != owner:
            return
        if slot.running:
            self.notes.append(f"{owner} had not exited {self.config.drain_timeout_s + 5:.0f}s "
                              "after its drain began; killed")
            await self.kill_slot(slot)
        await asyncio.sleep(down)
        if slot.owner == owner and not slot.running:
            await slot.spawn(self.config)

    async def _no_latency(self, slot: Slot) -> None:
        if slot.proxy is not None:
            slot.proxy.set_latency(0)

    async def _rejoin(self, slot: Slot) -> None:
        if slot.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.proc.wait(), 10)
        if slot.running:  # did not leave in time: it counts as a crash
            await self.kill_slot(slot)
        await slot.spawn(self.config)

    async def end_faults(self) -> None:
        """Restore everything now: one coordinator, pending restorations cancelled;
        several, the pending ones played to their end (a pause cut short of its
        lease would check nothing)."""
        if self.multi:
            while self.pending:
                await asyncio.gather(*list(self.pending), return_exceptions=True)
            for coord in self.coordinators:
                if not coord.up:
                    await self.restart_one(coord)
        else:
            for task in list(self.pending):
                task.cancel()
            await asyncio.gather(*self.pending, return_exceptions=True)
            if not self.coordinator.up:
                await self.restart_coordinator(self.last_crash)
        for slot in self.slots.values():
            if slot.proxy is not None:
                slot.proxy.reset_faults()
            await self.cont(slot)
        left = {f.slot for f in self.schedule if f.kind == "leave"
                and not dict(f.params)["rejoin"]}
        for slot in self.slots.values():
            if slot.name in left:
                continue
            if not slot.running:
                await slot.spawn(self.config)
        # Quiet once every process that should run has started its member.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(self._started(s) for s in self.slots.values()
                   if s.running and s.name not in left):
                return
            await asyncio.sleep(0.05)
        self.notes.append("some workers took over 20s to start")

    def _started(self, slot: Slot) -> bool:
        if not slot.ledger.exists():
            return False
        return any(e["ev"] == "start" and e["inc"] == slot.incarnation
                   for e in read_ledger(slot.ledger))

    # ------------------------------------------------------------ the whole seed

    async def run(self) -> SeedResult:
        started = time.monotonic()
        self.schedule = (make_schedule(self.seed, self.config) if self.given_schedule is None
                         else list(self.given_schedule))
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            return await self._run(started)
        finally:
            # Signals first (no await in between), so an interrupted cleanup
            # still leaves no process behind.
            for task in [*self.pending, *([self.lag_watch] if self.lag_watch else [])]:
                task.cancel()
            for slot in self.slots.values():
                slot.signal(signal.SIGCONT)
                slot.signal(signal.SIGKILL)
            for coord in self.coordinators:
                coord.signal(signal.SIGKILL)
            for slot in self.slots.values():
                if slot.proc is not None:
                    await slot.proc.wait()
                if slot.proxy is not None:
                    await slot.proxy.stop()
            for coord in self.coordinators:
                await coord.kill()
            await self.session.close()
            if self.own_postgres and self.postgres is not None:
                await asyncio.to_thread(self.postgres.remove)

    async def _watch_loop_lag(self) -> None:
        """The harness's own event loop runs every proxy: a stall here stalls the
        network of every worker, so it is measured and reported."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.05)
            lag = time.monotonic() - before - 0.05
            if lag > self.max_loop_lag[0]:
                self.max_loop_lag = (lag, before)

    async def _slow_commits(self) -> str:
        """Storage transactions over 0.5 s, from the coordinators' own histograms."""
        assert self.session is not None
        below_half = below_one = total = 0.0
        for coord in self.coordinators:
            if not coord.serving:
                continue
            try:
                async with self.session.get(f"{coord.admin_url}/metrics") as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                return "?"
            for line in text.splitlines():
                if line.startswith("groupcoord_storage_commit_duration_seconds_bucket"):
                    value = float(line.rsplit(" ", 1)[1])
                    if 'le="0.5"' in line:
                        below_half += value
                    elif 'le="1.0"' in line:
                        below_one += value
                    elif 'le="+Inf"' in line:
                        total += value
        return (f"{int(total - below_half)} of {int(total)} (over 1 s: "
                f"{int(total - below_one)})")

    async def _run(self, started: float) -> SeedResult:
        c = self.config
        self.lag_watch = asyncio.create_task(self._watch_loop_lag())
        if self.multi:
            await self.start_cluster()
        else:
            await self.coordinator.start()
        for name, partitions in c.catalog:
            if not await self.put_catalog(name, partitions):
                raise RuntimeError("could not create the catalog")
        for group, _ in c.groups:
            for i in range(c.workers_per_group):
                slot = self.add_slot(f"{group}-{i}", group)
                if slot.proxy is not None:
                    await slot.proxy.start()
                await slot.spawn(c)
        self.notes.append(f"started in {time.monotonic() - started:.1f}s")
        if self.multi:
            # Offsets count from a settled start: the generations and journal rows
            # counted from here on are the faults' (several coordinators only: the
            # one-coordinator runs keep their timing).
            await self.wait_stable()
            self.notes.append(f"settled at {time.monotonic() - started:.1f}s")
        journal_before = 0
        if self.db is not None:
            self.generations_before = await self.db.generations(self.groups)
            journal_before = len(await self.db.journal(self.groups))
        t0 = time.monotonic()
        for fault in self.schedule:
            wait = t0 + fault.at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.apply(fault)
        await asyncio.sleep(max(0.0, t0 + c.fault_seconds - time.monotonic()))
        await self.end_faults()
        quiet_at = time.monotonic()
        self.notes.append(f"faults over at {quiet_at - started:.1f}s")
        check_at = quiet_at + c.convergence_s
        # Watch for as long again, to tell "converged late" from "never".
        observed_until = quiet_at + c.observe_for_s
        await asyncio.sleep(observed_until - time.monotonic())
        catalog_at_check = dict(self.catalog)
        self.notes.append(f"storage commits over 0.5 s since the last restart: "
                          f"{await self._slow_commits()}")
        lag, lag_at = self.max_loop_lag
        self.notes.append(f"harness loop lag max {lag * 1000:.0f} ms at "
                          f"t{lag_at - quiet_at:+.1f}s "
                          "(relative to the end of the faults)")
        if self.db is not None:
            self.generations_after = await self.db.generations(self.groups)
            self.rebalances = (await self.db.journal(self.groups))[journal_before:]
        # Stop the workers cleanly, then one last crash of the coordinator(s).
        for slot in self.slots.values():
            slot.signal(signal.SIGTERM)
        for slot in self.slots.values():
            if slot.proc is not None:
                try:
                    await asyncio.wait_for(slot.proc.wait(), 15)
                except TimeoutError:
                    self.notes.append(f"{slot.name} did not exit on SIGTERM; killed")
                    await self.kill_slot(slot)
        if self.multi:
            # Every coordinator killed, one started alone: it takes every partition
            # once the others' leases ran out, loads them and answers the fetches.
            async with self.coordinator_lock:
                for coord in self.coordinators:
                    await coord.kill()
                final_crash = self.last_crash = time.monotonic()
                await self.coordinator.start()
            self.stored.append((final_crash, await self.fetch_all(
                self.coordinator.url, retry_s=3 * c.lease_ms / 1000 + 20)))
        else:
            await self.crash_coordinator(0)
            for task in list(self.pending):
                await task
            final_crash = self.stored[-1][0]
        self.notes.append(f"final read done at {time.monotonic() - started:.1f}s")
        # In a thread: reading ledgers and checking takes a while, and this
        # loop also runs the proxies of any other seed running alongside.
        violations, check = await asyncio.to_thread(
            self.check, quiet_at, check_at, observed_until, catalog_at_check, final_crash)
        await self.coordinator.terminate()
        return SeedResult(self.seed, [f.describe() for f in self.schedule], self.faults,
                          violations, check, time.monotonic() - started, self.workdir,
                          self.notes, self.generations_before, self.generations_after,
                          self.rebalances, self.probes)

    def save(self, quiet_at: float, check_at: float, observed_until: float,
             catalog: dict[str, int], final_crash: float) -> None:
        """What the harness knows that the ledgers do not, for ``recheck``."""
        def stored_doc(entries: list[tuple[float, dict[str, dict[Resource, Any]]]]
                       ) -> list[Any]:
            return [[crash, {g: [[r[0], r[1], v] for r, v in m.items()]
                             for g, m in stored.items()}] for crash, stored in entries]
        doc = {
            "seed": self.seed, "quiet_at": quiet_at, "check_at": check_at,
            "observed_until": observed_until, "catalog": catalog, "final_crash": final_crash,
            "deaths": [[list(o), t] for o, t in self.deaths.items()],
            "frozen": [[list(o), [[a, min(b, 1e300)] for a, b in p]]
                       for o, p in self.frozen.items()],
            "stored": stored_doc(self.stored), "floors": stored_doc(self.floors),
            "pauses": [[p.index, p.url, p.stop_at, min(p.cont_at, 1e300)]
                       for p in self.pauses],
            "run_violations": self.run_violations,
            "slots": {n: s.group for n, s in self.slots.items()},
            "schedule": [f.describe() for f in self.schedule], "notes": self.notes,
        }
        (self.workdir / "harness.json").write_text(json.dumps(doc))

    def check(self, quiet_at: float, check_at: float, observed_until: float,
              catalog: dict[str, int], final_crash: float) -> tuple[list[str], CheckResult]:
        self.save(quiet_at, check_at, observed_until, catalog, final_crash)
        result = CheckResult()
        events, group_of = self._events()
        intervals = ownership_intervals(events, self.deaths, self.frozen)
        result.intervals = len(intervals)
        result.lost_events = sum(e["ev"] == "lost" for es in events.values() for e in es)
        violations: list[str] = list(self.run_violations)
        # What each worker itself may act on: standbys are never acted on, a
        # finished drain leaves nothing owned.
        raw = raw_intervals(events, self.deaths)
        violations += check_standbys(events, raw, commits_of(events), result)
        violations += check_drained(events, raw, result)
        for group, _ in self.config.groups:
            # Each group is its own set of owners: groups never exclude each other.
            violations += [f"group {group}: {v}" for v in
                           check_exclusive(intervals_of(intervals, group_of, group))]
        expected = {g: {(s, i) for s, n in catalog.items() for i in range(n)}
                    for g, _ in self.config.groups}
        # Converged: exactly-once for at least a session timeout. Disturbances
        # later on (nothing is injected then) are counted, not judged here.
        converged, result.disturbances = first_stable_convergence(
            intervals, quiet_at, observed_until, expected, group_of,
            self.config.session_timeout_ms / 1000)
        bound = check_at - quiet_at
        if converged is None:
            violations.append(f"did not converge within {observed_until - quiet_at:.1f}s "
                              f"after the faults ended (bound {bound:.1f}s): "
                              + "; ".join(check_converged(intervals, observed_until - 0.01,
                                                          expected, group_of)[:4]))
        else:
            result.convergence_s = converged - quiet_at
            if converged > check_at:
                violations.append(f"converged {converged - quiet_at:.2f}s after the faults "
                                  f"ended, over the bound of {bound:.2f}s")
        for group, _ in self.config.groups:
            commits = [c for c in commits_of(events) if group_of[c.owner] == group]
            result.commits_ok += sum(c.outcome == "ok" for c in commits)
            result.reordered_commits += reordered_commits(commits)
            violations += [f"group {group}: {v}"
                           for v in check_fencing(intervals_of(intervals, group_of, group),
                                                  commits, result)]
            for crash_at, stored in self.stored:
                if group not in stored:
                    continue  # a crash of a coordinator that did not serve this group
                result.durability_checks += 1
                violations += [f"group {group}: {v}" for v in check_durability(
                    commits, crash_at, stored[group], final=crash_at == final_crash)]
            for stop_at, stored in self.floors:
                result.durability_checks += 1
                violations += [f"group {group}: {v}" for v in check_durability_floor(
                    commits, stop_at, stored.get(group, {}))]
        # A paused coordinator acknowledges nothing sent to it while it was stopped:
        # by the time it runs again its leases have run out.
        for pause in self.pauses:
            for owner, es in events.items():
                for e in es:
                    if (e["ev"] == "call" and e.get("api") == "commit"
                            and e.get("url") == pause.url and e.get("error") is None
                            and pause.stop_at <= e["sent"] <= pause.cont_at):
                        violations.append(
                            f"{owner}: a commit sent at {e['sent']:.3f} to coordinator "
                            f"{pause.index} while it was stopped ({pause.stop_at:.3f} to "
                            f"{pause.cont_at:.3f}) was acknowledged by it")
        result.violations = violations
        return violations, result


def recheck(workdir: Path, config: ChaosConfig | None = None) -> tuple[list[str], CheckResult]:
    """Check a kept work directory again (after a change to the checker)."""
    doc = json.loads((workdir / "harness.json").read_text())
    run = Run(doc["seed"], workdir, config or ChaosConfig())
    run.deaths = {(o[0], o[1]): t for o, t in doc["deaths"]}
    run.frozen = {(o[0], o[1]): [(a, b) for a, b in p] for o, p in doc["frozen"]}
    def stored(entries: list[Any]) -> list[tuple[float, dict[str, dict[Resource, Any]]]]:
        return [(crash, {g: {(r[0], r[1]): r[2] for r in rows} for g, rows in st.items()})
                for crash, st in entries]
    run.stored = stored(doc["stored"])
    run.floors = stored(doc.get("floors", []))
    run.pauses = [Pause(i, url, a, {}, b) for i, url, a, b in doc.get("pauses", [])]
    run.run_violations = list(doc.get("run_violations", []))
    for name, group in doc["slots"].items():
        run.slots[name] = Slot(name, group, "", None,
                               workdir / f"ledger-{name}.jsonl", workdir / f"worker-{name}.log")
    return run.check(doc["quiet_at"], doc["check_at"], doc["observed_until"], doc["catalog"],
                     doc["final_crash"])


def intervals_of(intervals: list[Any], group_of: dict[Owner, str], group: str) -> list[Any]:
    return [iv for iv in intervals if group_of.get(iv.owner) == group]


async def run_seed(seed: int, workdir: Path, config: ChaosConfig | None = None, *,
                   postgres: PostgresServer | None = None, pg_url: str | None = None,
                   schedule: list[Fault] | None = None) -> SeedResult:
    """One seed's run. Several coordinators: on ``postgres`` (a schema of its own;
    restarted by ``restart_postgres``), on ``pg_url`` (PostgreSQL not restarted),
    or on a throw-away PostgreSQL of its own. ``schedule``: these faults instead
    of the seed's, their offsets counted once every group has settled."""
    workdir.mkdir(parents=True, exist_ok=True)
    return await Run(seed, workdir, config or ChaosConfig(), postgres=postgres,
                     pg_url=pg_url, schedule=schedule).run()


def summary_line(result: SeedResult) -> str:
    faults = ", ".join(f"{k}={v}" for k, v in sorted(result.faults.items()))
    c = result.check
    return (f"seed {result.seed}: {len(result.violations)} violation(s); "
            f"{sum(result.faults.values())} faults ({faults}); {c.intervals} ownership "
            f"intervals, {c.commits_ok} commits acknowledged, {c.zombie_commits} zombie "
            f"commits ({c.zombie_commits_refused} refused), {c.durability_checks} durability "
            f"checks, {c.reordered_commits} same-owner commits answered out of order; "
            f"converged {c.convergence_s:.2f}s after the faults"
            f"{f' (disturbed {c.disturbances}x later)' if c.disturbances else ''}; "
            + (f"{c.drains} drains ({c.drains_done} done, {c.drains_timed_out} timed out), "
               f"{c.standbys} standbys ({c.warmups_done} warm); "
               if c.drains or c.standbys else "")
            + (f"generations {result.generations_before} -> {result.generations_after} "
               f"({len(result.rebalances)} rebalances), {c.lost_events} on_lost; "
               if result.generations_before or result.generations_after else "")
            + f"{result.seconds:.1f}s")


if __name__ == "__main__":
    res = asyncio.run(run_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0,
                               Path(os.environ.get("CHAOS_DIR", "/tmp/chaos-run"))))
    print(summary_line(res))
    print("\n".join(res.schedule))
    print("\n".join(res.violations))
    print(json.dumps(res.notes))
