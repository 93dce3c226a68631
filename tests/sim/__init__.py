"""The deterministic simulator of whole groups (docs/reliability.md).

``run_seed(seed)`` runs the real coordinator core and real member machines
in one thread on one simulated clock, with the network, disk, clocks and
faults drawn from the seed, and checks the invariants of :mod:`sim.world`
after every step. ``benchmarks/simulate_groups.py`` runs many seeds.
"""

from sim.run import SeedResult, make_config, replay_command, report, run_seed

__all__ = ["SeedResult", "make_config", "replay_command", "report", "run_seed"]
