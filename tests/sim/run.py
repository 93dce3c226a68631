"""Run one seed; describe a failure so it can be replayed."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from sim.scenario import SimConfig, draw_config, draw_faults
from sim.world import World

__all__ = ["SeedResult", "make_config", "replay_command", "report", "run_seed"]

#: the production runtime's logger: its lines are a real server's, the trace has
#: what a seed's reader needs.
_SERVER_LOG = logging.getLogger("groupcoord")

REPLAY = "PYTHONPATH=$PWD .venv/bin/python benchmarks/simulate_groups.py --seed {seed} --trace"


@dataclass
class SeedResult:
    seed: int
    config: SimConfig
    violations: list[str]
    trace_hash: str
    events: int
    cpu_s: float
    faults: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    converged_after_ms: int | None = None
    settled_at_ms: int | None = None
    core_errors: list[str] = field(default_factory=list)
    reordered: int = 0
    #: several coordinators: how many, the group's partition acquired after its
    #: first owner (failovers and hand-offs), writes the database fenced or
    #: ended (a zombie's), and partitions dropped by their owner.
    coordinators: int = 1
    takeovers: int = 0
    refused_writes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def make_config(seed: int, profile: str = "space") -> SimConfig:
    config = draw_config(seed, profile)
    return dataclasses.replace(config, faults=draw_faults(config))


def run_seed(seed: int, *, keep_trace: bool = False, profile: str = "space") -> SeedResult:
    started = time.process_time()
    config = make_config(seed, profile)
    world = World(config, keep_trace=keep_trace)
    level = _SERVER_LOG.level
    _SERVER_LOG.setLevel(logging.CRITICAL + 1)
    try:
        world.run()
    finally:
        _SERVER_LOG.setLevel(level)
    violations = list(world.violations)
    violations += [f"core: {e}" for e in world.core_errors[:3]]
    converged = (max(0, world.converged_since - world.quiet_at)
                 if world.converged_since is not None and config.faulty else None)
    result = SeedResult(seed, config, violations, world.sim.trace_hash(), world.sim.events,
                        time.process_time() - started, dict(world.applied), world.sim.trace,
                        converged, world.settled_at, list(world.core_errors),
                        world.reordered)
    cluster = world.cluster
    if cluster is not None:
        db = cluster.db
        result.coordinators = config.coordinators
        result.takeovers = max(0, len(db.acquired.get(cluster.group_partition, [])) - 1)
        result.refused_writes = db.fenced + db.ended
    return result


def replay_command(seed: int, profile: str = "space") -> str:
    extra = "" if profile == "space" else f" --profile {profile}"
    return REPLAY.format(seed=seed) + extra


def shorten(trace: list[str], limit: int = 60) -> list[str]:
    """The lines that matter: faults, crashes, pauses, losses, state changes
    of the group, violations; the last ``limit`` of them."""
    keys = ("FAULT", "CRASH", "PAUSE", "RESUME", "CLOSE", "VIOLATION", "coord group",
            "coord up", "on_lost", "stopped", "SETTLED", "CONVERGENCE", "start ", "acquired p",
            "serving p", "hand-off p", "drop p", "STOP")
    picked = [line for line in trace if any(k in line for k in keys)]
    return picked[-limit:]


def report(result: SeedResult) -> str:
    """What a failed seed prints: the seed, its configuration, the faults that
    matter, the violations and the command that replays it."""
    traced = (run_seed(result.seed, keep_trace=True, profile=result.config.profile)
              if not result.trace else result)
    lines = [f"seed {result.seed}: {len(result.violations)} violation(s)",
             f"  config: {result.config.describe()}",
             "  faults: " + ("; ".join(f.describe() for f in result.config.faults) or "none"),
             "  violations:"]
    lines += [f"    {v}" for v in result.violations]
    lines.append("  trace (shortened):")
    lines += [f"    {line}" for line in shorten(traced.trace)]
    lines.append(f"  replay: {replay_command(result.seed, result.config.profile)}")
    return "\n".join(lines)
