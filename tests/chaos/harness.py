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
   worker's proxy, catalog changes, extra workers joining, clean leaves;
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
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
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
    check_durability,
    check_exclusive,
    check_fencing,
    commits_of,
    first_stable_convergence,
    ownership_intervals,
    read_ledger,
    reordered_commits,
)
from proxy import FaultProxy

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
    #: relative weights of the fault kinds.
    weights: tuple[tuple[str, float], ...] = (
        ("kill_worker", 2), ("zombie", 2), ("kill_coordinator", 1.5), ("latency", 1.5),
        ("partition", 2), ("catalog", 1), ("join", 1), ("leave", 1),
    )

    @property
    def convergence_s(self) -> float:
        return (2 * self.session_timeout_ms + self.rebalance_timeout_ms
                + self.initial_rebalance_delay_ms) / 1000


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
        elif kind == "kill_coordinator" and coord_up_at <= t:
            down = rng.uniform(0.2, 1.5)
            fault = Fault(t, kind, "", down)
            coord_up_at = t + down
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
        elif kind == "catalog" and coord_up_at <= t:
            name, _ = rng.choice(config.catalog)
            fault = Fault(t, kind, "", 0.0, (("set", name), ("partitions", rng.randint(1, 12))))
        elif kind == "join" and extra[group] < config.max_extra_workers_per_group:
            extra[group] += 1
            slot = f"{group}-x{extra[group]}"
            slots[slot] = group
            busy_until[slot] = 0.0
            fault = Fault(t, kind, slot)
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
    def __init__(self, workdir: Path, config: ChaosConfig) -> None:
        self.db = workdir / "groupcoord.db"
        self.log = workdir / "coordinator.log"
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.port = 0
        #: the admin listener (catalog changes, /metrics).
        self.admin_url = ""

    async def start(self) -> None:
        c = self.config
        # An instance whose start was cancelled half-way (end_faults cancels a pending
        # restart) may still run: it would hold the database, and a second server on
        # the same file is refused (issue 11, item 14). Never leave one behind.
        await self.kill()
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
                "--db", str(self.db), "--min-session-timeout-ms", "100",
                "--initial-rebalance-delay-ms", str(c.initial_rebalance_delay_ms),
                "--log-level", "WARNING",
                stdout=asyncio.subprocess.PIPE, stderr=log, preexec_fn=_die_with_parent)
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
                elif text.startswith("listening on "):
                    self.url = text[len("listening on "):]
                    self.port = int(self.url.rsplit(":", 1)[1])
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


class Slot:
    """One worker slot: its proxy, and its current process (an incarnation)."""

    def __init__(self, name: str, group: str, assignor: str, proxy: FaultProxy,
                 ledger: Path, log: Path) -> None:
        self.name = name
        self.group = group
        self.assignor = assignor
        self.proxy = proxy
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
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, str(WORKER), "--url", self.proxy.url, "--group", self.group,
                "--assignor", self.assignor, "--sets", sets, "--ledger", str(self.ledger),
                "--worker", self.name, "--incarnation", str(self.incarnation),
                "--session-timeout-ms", str(config.session_timeout_ms),
                "--rebalance-timeout-ms", str(config.rebalance_timeout_ms),
                "--heartbeat-interval-ms", str(config.heartbeat_interval_ms),
                "--request-timeout-ms", str(config.request_timeout_ms),
                "--commit-interval-ms", str(config.commit_interval_ms),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=log, preexec_fn=_die_with_parent)
        self.stopped = False

    def signal(self, sig: signal.Signals) -> bool:
        if not self.running:
            return False
        assert self.proc is not None
        self.proc.send_signal(sig)
        return True


# ---------------------------------------------------------------- the run


class Run:
    def __init__(self, seed: int, workdir: Path, config: ChaosConfig) -> None:
        self.seed = seed
        self.workdir = workdir
        self.config = config
        self.coordinator = Coordinator(workdir, config)
        self.slots: dict[str, Slot] = {}
        self.deaths: dict[Owner, float] = {}
        #: (SIGSTOP, SIGCONT) times of each incarnation
        self.frozen: dict[Owner, list[tuple[float, float]]] = {}
        self.faults: Counter[str] = Counter()
        self.notes: list[str] = []
        #: (crash time, {group: {resource: value}}) read after each restart
        self.stored: list[tuple[float, dict[str, dict[Resource, Any]]]] = []
        self.catalog: dict[str, int] = dict(config.catalog)
        self.pending: set[asyncio.Task[None]] = set()
        self.coordinator_lock = asyncio.Lock()
        self.session: aiohttp.ClientSession | None = None
        self.schedule: list[Fault] = []
        self.max_loop_lag: tuple[float, float] = (0.0, 0.0)
        self.lag_watch: asyncio.Task[None] | None = None
        self.last_crash = 0.0

    # ------------------------------------------------------------ helpers

    def later(self, delay: float, coro_fn: Any, *args: Any) -> None:
        async def go() -> None:
            await asyncio.sleep(delay)
            await coro_fn(*args)
        task = asyncio.create_task(go())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def put_catalog(self, name: str, partitions: int) -> bool:
        assert self.session is not None
        try:
            async with self.session.put(f"{self.coordinator.admin_url}/v1/resources/{name}",
                                        json={"partitions": partitions}) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def fetch_all(self) -> dict[str, dict[Resource, Any]]:
        assert self.session is not None
        out: dict[str, dict[Resource, Any]] = {}
        for group, _ in self.config.groups:
            async with self.session.post(
                    f"{self.coordinator.url}/v1/fetch",
                    data=codec.encode({"group_id": group}),
                    headers={"Content-Type": codec.CONTENT_TYPE}) as resp:
                doc = codec.decode(await resp.read())
            if resp.status != 200 or doc.get("error") is not None:
                raise RuntimeError(f"fetch {group}: HTTP {resp.status} {doc}")
            out[group] = {(s, i): v for s, i, v in doc["checkpoints"]}
        return out

    def add_slot(self, name: str, group: str) -> Slot:
        assignor = dict(self.config.groups)[group]
        slot = Slot(name, group, assignor,
                    FaultProxy("127.0.0.1", self.coordinator.port, seed=self.seed),
                    self.workdir / f"ledger-{name}.jsonl", self.workdir / f"worker-{name}.log")
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
                slot.proxy.set_upstream("127.0.0.1", self.coordinator.port)

    async def crash_coordinator(self, down: float) -> None:
        async with self.coordinator_lock:
            await self.coordinator.kill()
            crash_at = self.last_crash = time.monotonic()
            self.coordinator.url = ""
        self.later(down, self.restart_coordinator, crash_at)

    # ------------------------------------------------------------ faults

    async def apply(self, fault: Fault) -> None:
        slot = self.slots.get(fault.slot)
        params = dict(fault.params)
        applied = True
        if fault.kind == "kill_worker" and slot is not None and slot.running:
            await self.kill_slot(slot)
            self.later(fault.duration, self.respawn, slot)
        elif fault.kind == "zombie" and slot is not None and slot.running and not slot.stopped:
            slot.signal(signal.SIGSTOP)
            slot.stopped = True
            self.frozen.setdefault(slot.owner, []).append((time.monotonic(), INFINITY))
            self.later(fault.duration, self.cont, slot)
        elif fault.kind == "kill_coordinator" and self.coordinator.up:
            await self.crash_coordinator(fault.duration)
        elif fault.kind == "latency" and slot is not None:
            slot.proxy.set_latency(params["ms"])
            self.later(fault.duration, self._no_latency, slot)
        elif fault.kind == "partition" and slot is not None:
            slot.proxy.partition(fault.duration, cut=params["cut"])
        elif fault.kind == "catalog" and self.coordinator.up:
            applied = await self.put_catalog(params["set"], params["partitions"])
            if applied:
                self.catalog[params["set"]] = params["partitions"]
        elif fault.kind == "join":
            group = fault.slot.rsplit("-", 1)[0]
            new = self.add_slot(fault.slot, group)
            await new.proxy.start()
            await new.spawn(self.config)
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

    async def _no_latency(self, slot: Slot) -> None:
        slot.proxy.set_latency(0)

    async def _rejoin(self, slot: Slot) -> None:
        if slot.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.proc.wait(), 10)
        if slot.running:  # did not leave in time: it counts as a crash
            await self.kill_slot(slot)
        await slot.spawn(self.config)

    async def end_faults(self) -> None:
        """Cancel pending restorations and restore everything now."""
        for task in list(self.pending):
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        if not self.coordinator.up:
            await self.restart_coordinator(self.last_crash)
        for slot in self.slots.values():
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
        self.schedule = make_schedule(self.seed, self.config)
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
            if self.coordinator.proc is not None and self.coordinator.proc.returncode is None:
                self.coordinator.proc.kill()
            for slot in self.slots.values():
                if slot.proc is not None:
                    await slot.proc.wait()
                await slot.proxy.stop()
            await self.coordinator.kill()
            await self.session.close()

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
        """Storage transactions over 0.5 s, from the coordinator's own histogram."""
        assert self.session is not None
        try:
            async with self.session.get(f"{self.coordinator.admin_url}/metrics") as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return "?"
        below_half = below_one = total = 0.0
        for line in text.splitlines():
            if line.startswith("groupcoord_storage_commit_duration_seconds_bucket"):
                value = float(line.rsplit(" ", 1)[1])
                if 'le="0.5"' in line:
                    below_half = value
                elif 'le="1.0"' in line:
                    below_one = value
                elif 'le="+Inf"' in line:
                    total = value
        return (f"{int(total - below_half)} of {int(total)} (over 1 s: "
                f"{int(total - below_one)})")

    async def _run(self, started: float) -> SeedResult:
        c = self.config
        self.lag_watch = asyncio.create_task(self._watch_loop_lag())
        await self.coordinator.start()
        for name, partitions in c.catalog:
            if not await self.put_catalog(name, partitions):
                raise RuntimeError("could not create the catalog")
        for group, _ in c.groups:
            for i in range(c.workers_per_group):
                slot = self.add_slot(f"{group}-{i}", group)
                await slot.proxy.start()
                await slot.spawn(c)
        t0 = time.monotonic()
        for fault in self.schedule:
            wait = t0 + fault.at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.apply(fault)
        await asyncio.sleep(max(0.0, t0 + c.fault_seconds - time.monotonic()))
        await self.end_faults()
        quiet_at = time.monotonic()
        check_at = quiet_at + c.convergence_s
        # Watch for as long again, to tell "converged late" from "never".
        observed_until = check_at + c.convergence_s
        await asyncio.sleep(observed_until - time.monotonic())
        catalog_at_check = dict(self.catalog)
        self.notes.append(f"storage commits over 0.5 s since the last restart: "
                          f"{await self._slow_commits()}")
        lag, lag_at = self.max_loop_lag
        self.notes.append(f"harness loop lag max {lag * 1000:.0f} ms at "
                          f"t{lag_at - quiet_at:+.1f}s "
                          "(relative to the end of the faults)")
        # Stop the workers cleanly, then one last crash of the coordinator.
        for slot in self.slots.values():
            slot.signal(signal.SIGTERM)
        for slot in self.slots.values():
            if slot.proc is not None:
                try:
                    await asyncio.wait_for(slot.proc.wait(), 15)
                except TimeoutError:
                    self.notes.append(f"{slot.name} did not exit on SIGTERM; killed")
                    await self.kill_slot(slot)
        await self.crash_coordinator(0)
        for task in list(self.pending):
            await task
        final_crash = self.stored[-1][0]
        # In a thread: reading ledgers and checking takes a while, and this
        # loop also runs the proxies of any other seed running alongside.
        violations, check = await asyncio.to_thread(
            self.check, quiet_at, check_at, observed_until, catalog_at_check, final_crash)
        await self.coordinator.terminate()
        return SeedResult(self.seed, [f.describe() for f in self.schedule], self.faults,
                          violations, check, time.monotonic() - started, self.workdir,
                          self.notes)

    def save(self, quiet_at: float, check_at: float, observed_until: float,
             catalog: dict[str, int], final_crash: float) -> None:
        """What the harness knows that the ledgers do not, for ``recheck``."""
        doc = {
            "seed": self.seed, "quiet_at": quiet_at, "check_at": check_at,
            "observed_until": observed_until, "catalog": catalog, "final_crash": final_crash,
            "deaths": [[list(o), t] for o, t in self.deaths.items()],
            "frozen": [[list(o), [[a, min(b, 1e300)] for a, b in p]]
                       for o, p in self.frozen.items()],
            "stored": [[crash, {g: [[r[0], r[1], v] for r, v in m.items()]
                                for g, m in stored.items()}] for crash, stored in self.stored],
            "slots": {n: s.group for n, s in self.slots.items()},
            "schedule": [f.describe() for f in self.schedule], "notes": self.notes,
        }
        (self.workdir / "harness.json").write_text(json.dumps(doc))

    def check(self, quiet_at: float, check_at: float, observed_until: float,
              catalog: dict[str, int], final_crash: float) -> tuple[list[str], CheckResult]:
        self.save(quiet_at, check_at, observed_until, catalog, final_crash)
        result = CheckResult()
        events: dict[Owner, list[dict[str, Any]]] = {}
        group_of: dict[Owner, str] = {}
        for slot in self.slots.values():
            if not slot.ledger.exists():
                continue
            for e in read_ledger(slot.ledger):
                owner = (e["w"], e["inc"])
                events.setdefault(owner, []).append(e)
                group_of[owner] = slot.group
        intervals = ownership_intervals(events, self.deaths, self.frozen)
        result.intervals = len(intervals)
        violations: list[str] = []
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
                result.durability_checks += 1
                violations += [f"group {group}: {v}" for v in check_durability(
                    commits, crash_at, stored.get(group, {}), final=crash_at == final_crash)]
        result.violations = violations
        return violations, result


def recheck(workdir: Path, config: ChaosConfig | None = None) -> tuple[list[str], CheckResult]:
    """Check a kept work directory again (after a change to the checker)."""
    doc = json.loads((workdir / "harness.json").read_text())
    run = Run(doc["seed"], workdir, config or ChaosConfig())
    run.deaths = {(o[0], o[1]): t for o, t in doc["deaths"]}
    run.frozen = {(o[0], o[1]): [(a, b) for a, b in p] for o, p in doc["frozen"]}
    run.stored = [(crash, {g: {(r[0], r[1]): r[2] for r in rows} for g, rows in st.items()})
                  for crash, st in doc["stored"]]
    for name, group in doc["slots"].items():
        run.slots[name] = Slot(name, group, "", FaultProxy("127.0.0.1", 1),
                               workdir / f"ledger-{name}.jsonl", workdir / f"worker-{name}.log")
    return run.check(doc["quiet_at"], doc["check_at"], doc["observed_until"], doc["catalog"],
                     doc["final_crash"])


def intervals_of(intervals: list[Any], group_of: dict[Owner, str], group: str) -> list[Any]:
    return [iv for iv in intervals if group_of.get(iv.owner) == group]


async def run_seed(seed: int, workdir: Path, config: ChaosConfig | None = None) -> SeedResult:
    workdir.mkdir(parents=True, exist_ok=True)
    return await Run(seed, workdir, config or ChaosConfig()).run()


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
            f"{result.seconds:.1f}s")


if __name__ == "__main__":
    res = asyncio.run(run_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0,
                               Path(os.environ.get("CHAOS_DIR", "/tmp/chaos-run"))))
    print(summary_line(res))
    print("\n".join(res.schedule))
    print("\n".join(res.violations))
    print(json.dumps(res.notes))
