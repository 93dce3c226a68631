"""The simulator's seeds in CI (docs/reliability.md, "Deterministic simulation of whole groups").

* a fixed block of 2,000 seeds (the same every run) and one of 300 seeds with
  several coordinators (profile ``cluster``), as four quarters that
  pytest-xdist can give to different workers, each on two worker processes
  (``SIM_JOBS``), with no invariant violated;
* 200 fresh seeds and 40 fresh ones of the ``cluster`` profile, their numbers
  printed (``-s``) so a failure is replayed with
  ``benchmarks/simulate_groups.py --seed S --trace [--profile cluster]``;
* determinism: a seed run twice gives a byte-identical trace;
* several coordinators (sim.cluster): a zombie owner's write never commits
  after another took its partition over, and the checker sees one that would;
* every seed that found a bug, as a regression.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from client.assignors import Assignment
from client.assignors.balanced import BalancedAssignor
from client.member_state import MemberConfig
from coordinator.core.commands import Command, Commit
from coordinator.core.coordinator import CoreFailure, GroupCoordinator
from coordinator.core.effects import Effect
from coordinator.core.records import Record
from sim import SeedResult, report, run_seed
from sim.cluster import SimDatabase, Statement
from sim.run import make_config
from sim.world import Slot, World

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from simulate_groups import Totals, run_many, run_totals, summary

FIXED_FIRST = 0
FIXED_COUNT = 2_000
FIXED_PARTS = 4
FRESH_COUNT = 200
#: several coordinators (sim.cluster): a block of its own, so that every seed of
#: the main block is what it was before they existed.
CLUSTER_FIRST = 0
CLUSTER_COUNT = 300
CLUSTER_FRESH = 40
JOBS = int(os.environ.get("SIM_JOBS", "2"))


def _fail_with(results: list[SeedResult]) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        pytest.fail("\n\n".join(report(r) for r in bad[:5]), pytrace=False)


#: the block's seeds as FIXED_PARTS consecutive ranges, together exactly the block.
_BOUNDS = [FIXED_FIRST + FIXED_COUNT * i // FIXED_PARTS for i in range(FIXED_PARTS + 1)]


_CLUSTER_BOUNDS = [CLUSTER_FIRST + CLUSTER_COUNT * i // FIXED_PARTS
                   for i in range(FIXED_PARTS + 1)]


@pytest.mark.parametrize("part", range(FIXED_PARTS))
def test_fixed_block_of_seeds_violates_nothing(part: int) -> None:
    first, end = _BOUNDS[part], _BOUNDS[part + 1]
    results, wall = run_many(first, end - first, jobs=JOBS)
    print(f"\n{summary(results, wall)}")
    assert [r.seed for r in results] == list(range(first, end))
    first, end = _CLUSTER_BOUNDS[part], _CLUSTER_BOUNDS[part + 1]
    cluster, wall = run_many(first, end - first, "cluster", jobs=JOBS)
    print(f"several coordinators:\n{summary(cluster, wall)}")
    assert [r.seed for r in cluster] == list(range(first, end))
    assert all(r.coordinators > 1 for r in cluster)
    _fail_with(results + cluster)


def test_fresh_seeds_violate_nothing() -> None:
    first = random.SystemRandom().randrange(10**6, 10**9)
    print(f"\nfresh seeds {first}..{first + FRESH_COUNT - 1}")
    results, wall = run_many(first, FRESH_COUNT, jobs=JOBS)
    print(summary(results, wall))
    print(f"fresh seeds {first}..{first + CLUSTER_FRESH - 1}, profile cluster")
    cluster, wall = run_many(first, CLUSTER_FRESH, "cluster", jobs=JOBS)
    print(summary(cluster, wall))
    _fail_with(results + cluster)


@pytest.mark.parametrize(("seed", "profile"), [(3, "space"), (5, "space"), (152, "space"),
                                               (14, "cluster"), (43, "cluster")])
def test_a_seed_gives_a_byte_identical_trace(seed: int, profile: str) -> None:
    first = run_seed(seed, keep_trace=True, profile=profile)
    second = run_seed(seed, keep_trace=True, profile=profile)
    assert len(first.trace) > 100
    assert first.trace == second.trace
    assert first.trace_hash == second.trace_hash
    # The untraced run (the one CI and the runner do) takes the same path.
    plain = run_seed(seed, profile=profile)
    assert (plain.events, plain.violations) == (first.events, first.violations)


def test_the_long_run_adds_up_chunks_to_what_one_block_gives() -> None:
    """``run_totals`` (the runner's path, chunk by chunk over processes) keeps
    no result but the failed ones and adds up to the same totals."""
    results, _ = run_many(40, 30)
    totals, _ = run_totals(40, 30, jobs=2)
    whole = Totals.of(results)
    assert (totals.seeds, totals.first, totals.last) == (30, 40, 69)
    assert (totals.events, totals.faults, totals.converged, totals.converged_max_ms) == (
        whole.events, whole.faults, whole.converged, whole.converged_max_ms)
    assert totals.failed == [] and totals.violations == 0
    failing = results[0]
    failing.violations = ["t=1ms an example violation"]
    assert Totals.of([failing]).failed == [failing]
    assert "violations found: 1 (seeds [40])" in summary([failing], 1.0)


def test_a_failure_report_names_the_seed_the_config_the_faults_and_the_replay() -> None:
    result = run_seed(3)
    result.violations = ["t=1ms an example violation"]
    text = report(result)
    assert "seed 3:" in text and "config: seed=3 " in text and "faults:" in text
    assert "an example violation" in text
    assert "benchmarks/simulate_groups.py --seed 3 --trace" in text
    assert "trace (shortened):" in text and "FAULT" in text


#: A seed with three coordinators whose group's owner is paused between a
#: write's fence and its COMMIT, past its lease (the zombie coordinator).
ZOMBIE_SEED = 14


def test_a_zombie_coordinators_write_is_ended_and_its_partition_taken_over() -> None:
    result = run_seed(ZOMBIE_SEED, keep_trace=True, profile="cluster")
    assert result.coordinators == 3
    assert result.ok, report(result)
    assert result.refused_writes >= 1  # the zombie's COMMIT found its transaction ended
    assert result.takeovers >= 1
    assert any("coord_pause" in line and "mid_write=True" in line for line in result.trace)


def test_a_write_committed_after_a_takeover_is_a_violation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's teeth: a database that lets the zombie's COMMIT through
    (its transaction ended, its partition acquired by another meanwhile)."""
    def commit_anyway(self: SimDatabase, arg: tuple[Statement, list[Record]]) -> None:
        st, records = arg
        for partition, epoch in sorted((st.fence or {}).items()):
            if self.locks.get(partition) is st:
                del self.locks[partition]
            self._check_write(st.node, partition, epoch)
            self.records[partition].extend(records)
        st.node.at(self.sim.now + 1, self._reply, (st, None))

    monkeypatch.setattr(SimDatabase, "_write_commit", commit_anyway)
    result = run_seed(ZOMBIE_SEED, profile="cluster")
    assert any("fenced-db" in v for v in result.violations), result.violations


#: No fault; its second worker starts after the first has formed a generation
#: alone (a late worker's first join is not a rebalance of a settled group).
LATE_WORKER_SEED = 94895


def test_a_rebalance_after_every_worker_settled_is_still_a_violation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's teeth: "settled" waits for every worker of the run (a
    late worker's first join is not a violation), and a rebalance once they
    all settled still is one -- here a member asked to rejoin for no reason."""
    result = run_seed(LATE_WORKER_SEED, keep_trace=True, profile="plain")
    assert result.ok, report(result)
    settled = [int(line.split()[0]) for line in result.trace if line.endswith(" SETTLED")]
    starts = [int(line.split()[0]) for line in result.trace if " start (" in line]
    assert len(settled) == 1 and len(starts) == 2 and settled[0] > max(starts)

    original = World.run

    def run_with_a_spurious_rejoin(self: World) -> None:
        def rejoin(_: object) -> None:
            member = self.slots["w1"].member
            assert member is not None

            def ask() -> None:
                member.machine.request_rejoin(member.local(), "for no reason")
                member.member._wakeup.set()  # what GroupMember's own calls do after one

            member.run(ask)
        self.sim.at(settled[0] + 300, rejoin)
        original(self)

    monkeypatch.setattr(World, "run", run_with_a_spurious_rejoin)
    result = run_seed(LATE_WORKER_SEED, profile="plain")
    assert any("after the group settled" in v for v in result.violations), result.violations


#: No fault; balanced with max_moves=1 over 16 resources, two workers, load changes.
PLACEMENT_SEED = 40


def test_a_placement_seed_runs_balanced_with_its_drawn_weights_zones_and_loads() -> None:
    """A quarter of the seeds or so place by load: drawn weights, zones,
    capacities, racks, max_moves and load changes the application reports."""
    config = make_config(PLACEMENT_SEED)
    assert config.placed and config.max_moves == 1 and config.loads and config.placement
    result = run_seed(PLACEMENT_SEED, keep_trace=True)
    assert result.ok, report(result)
    assert sum(" LOAD " in line for line in result.trace) == len(config.loads)


def test_a_round_that_moves_more_than_max_moves_is_a_violation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's teeth: the members' assignor runs without the seed's
    ``max_moves`` (1), so its first round after the second worker joins
    revokes several resources at once."""
    original = World._member_config

    def without_max_moves(self: World, slot: Slot) -> MemberConfig:
        config = original(self, slot)
        return replace(config, assignor_settings={})

    monkeypatch.setattr(World, "_member_config", without_max_moves)
    result = run_seed(PLACEMENT_SEED)
    assert any("over max_moves=1" in v for v in result.violations), result.violations


def test_a_balanced_group_that_never_rests_is_a_violation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's teeth: a leader whose every round asks for another one
    (``delay_ms``) never reaches its plan."""
    original = BalancedAssignor.assign

    def restless(self: BalancedAssignor, *args: Any, **kwargs: Any) -> dict[str, Assignment]:
        return {m: replace(a, delay_ms=a.delay_ms or 500)
                for m, a in original(self, *args, **kwargs).items()}

    monkeypatch.setattr(BalancedAssignor, "assign", restless)
    result = run_seed(PLACEMENT_SEED)
    assert any("rounds after the last change" in v for v in result.violations), \
        result.violations
    assert any("is not balanced at the end" in v for v in result.violations), result.violations


def test_a_core_failure_over_the_group_evicts_and_reloads_it_as_the_server_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated coordinator is the runtime's own machine: the core raising over
    one group (once, on its first commit) is still a finding, and the group is
    evicted and reloaded from what was committed while the coordinator keeps
    serving, as ``Runtime`` does -- not just recorded."""
    original = GroupCoordinator.handle
    raised: list[Command] = []

    def fail_once(self: GroupCoordinator, now_ms: int, command: Command) -> list[Effect]:
        if isinstance(command, Commit) and not raised:
            raised.append(command)
            raise CoreFailure(command.request.group_id, command, RuntimeError("injected"))
        return original(self, now_ms, command)

    monkeypatch.setattr(GroupCoordinator, "handle", fail_once)
    result = run_seed(LATE_WORKER_SEED, keep_trace=True, profile="plain")
    assert raised, "the seed commits"
    assert [e for e in result.core_errors if "injected" in e], result.core_errors
    evicted = [i for i, line in enumerate(result.trace) if "coord evicted g:" in line]
    reloaded = [i for i, line in enumerate(result.trace) if "coord reloaded g:" in line]
    assert len(evicted) == 1 and len(reloaded) == 1 and evicted[0] < reloaded[0]
    assert not any("coord exits" in line for line in result.trace)
    assert result.settled_at_ms is not None, "the group formed again after the reload"


#: Seeds that found a bug, each failing on the code before its fix
#: (docs/bench-reliability.md, "What the simulator found").
REGRESSION_SEEDS = {
    28: "callbacks queued about resources no longer owned emit nothing (the member crashed)",
    1554: "a returning static leader (KIP-814) rejoins for a catalog change made meanwhile; "
          "a commit refused for a resource the catalog lost fails alone",
    2771: "incremental-cooperative hands out what a returning member's share leaves",
    3159: "incremental-cooperative hands out what a returning member's share leaves",
    2938: "an answer on the side channel ends a join backoff taken for want of a coordinator",
    1170: "a coordinator's answer restarts the backoff from retry_backoff_ms",
    374: "a join lost on a hung connection is sent again once heartbeats show no rebalance",
    1774: "a sync whose answer was lost is sent again once heartbeats show the group Stable",
    113568: "a failed heartbeat is retried within an interval (an empty-handed "
            "member's capped backoff outlasted the coordinator's restart)",
    126479: "the same, with a static member and a coordinator crash",
    121489: "a commit refused ILLEGAL_GENERATION because it raced its member's own "
            "follow-up join is the fence working, not an error",
    428804749: "a commit the member gave up on, delayed past its next one, is not applied "
               "over it (the commit sequence); found by CI's fresh seeds",
    700838430: "a static member that closes in the middle of a hand-over it started leaves, "
               "so the follow-up rebalance gives what it revoked to its new owner",
    700838624: "the same, the revoker closing while another member was a zombie",
    102063: "a static join the same process re-sent after a reset, its first copy late, "
            "is a replay of its incarnation: not fenced",
    108585: "a static join of an older process, late, after the next process joined, is "
            "refused by its older incarnation: the live member not fenced",
    110964: "a static join re-sent after a reset, its first copy late, is a replay of "
            "the same incarnation: not fenced",
    75664: "a static leader that planned a hand-over and crashed before its sync answer: "
           "its next process (KIP-814) starts the follow-up the plan marks",
    76088: "a static leader revoked its share of a hand-over and crashed; its next process "
           "starts the follow-up the plan marks",
    91962: "the same, the leader's revoked half unowned for 16 s before",
    94895: "no fault: the group is settled only once every worker of the run is up "
           "(a late worker's first join is not a rebalance of a settled group)",
    85751: "a join's MEMBER_ID_REQUIRED restarts the backoff, so a join lost to a "
           "partition is sent again soon after it heals",
    61599: "a join the member gave up on, delayed past its next join, is not applied as "
           "its rejoin (the join sequence)",
    217816: "a lost heartbeat verifying a late sync answer is retried soon",
    415932: "a join that timed out is sent again at once: the backoff counts from the "
            "call's start",
    300: "balanced places a hand-over under way before sending kept resources home "
         "(else the receiver's room went to another, and every round undid the last)",
    22: "balanced carries a handed-over resource's measured load until its new owner "
        "measures it (else planned at its catalog weight, a hot resource went on to a "
        "member it overloaded, which rejoined on its load, and so on; found once the "
        "hand-over fix of seed 300 was in)",
    124: "balanced with warm-up: a member planned to carry nothing kept a rounding "
         "residue below zero (a move held for warm-up takes its load back), and its band "
         "went out negative: every sync of that member was undecodable",
    3014575: "balanced clears a finished hand-over from its revoker's echo with empty "
             "user_data (the client keeps the last user_data until another comes): the "
             "stale echo named the old receiver and the load measured then, and each "
             "later hand-over of that resource went back, every round undoing the last",
}


@pytest.mark.parametrize("seed", sorted(REGRESSION_SEEDS))
def test_seed_that_found_a_bug_passes(seed: int) -> None:
    # As found: without the runtime's own draws, which came later (profile "plain").
    result = run_seed(seed, profile="plain")
    assert result.ok, f"{REGRESSION_SEEDS[seed]}\n{report(result)}"


#: Seeds of the default profile (with the runtime's own faults) that found a
#: bug, of the simulator's checks or of the real code.
RUNTIME_REGRESSION_SEEDS = {
    4005704: "a group evicted by a core failure is read back on the slow disk, and the "
             "read ends after the faults; the convergence bound counts from its end, as "
             "from a write's (the bound was too tight, not a bug)",
    5014912: "a commit the member gave up on, delivered after its next one, is answered "
             "without being applied (the commit sequence): neither applied nor held to "
             "be durable (the reply-after-commit check counted it as applied)",
    5038917: "the same, after a core failure",
    8215649: "a commit the member gave up on, delayed past its next one and past a core "
             "failure that reloaded the group: with the commit sequence in memory only it "
             "was applied over the acknowledged value (found by the read-back check); "
             "stored with the checkpoints, the sequence stops it",
    5007018: "a commit sent between a member's join and sync answers, refused "
             "REBALANCE_IN_PROGRESS once the member is stable in that generation, is "
             "about the rebalance it completed: no rejoin (a rebalance of a settled "
             "group without a fault)",
    5017304: "balanced: a member's load rejoin once its interval allows, and the hand-over "
             "it plans, come after the faults (the convergence bound lacked them)",
    6031381: "balanced with warm-up and max_moves: a plan that depended on who warmed what "
             "offered standbys to two members in turn forever (never settled)",
    7024236: "the same, without max_moves",
    7035182: "the same, a member joining and two leaving",
    7038271: "the same, with zones",
    6154540: "balanced with max_moves: revocations of resources the leader's catalog had "
             "lost (cause catalog) are no planned moves, though the catalog grew back "
             "before the round was checked",
    6342355: "a join delayed 18 s, past a coordinator crash, is refused by the join "
             "sequence kept in the member's durable record (applied as the eager "
             "member's rejoin, it gave away what the member still held)",
    9002842: "a commit the member gave up on, applied after its next one whose write the "
             "store refused (answered with an error, the group reloaded from what is "
             "stored): nothing acknowledged was lost, not a violation",
    9009711: "the same",
    8257062: "balanced: the bounds on a plan's rounds and on convergence count the "
             "resources the catalog faults add (one at the start, seven after: the "
             "bound of 16 rounds was for one, the plan took 19 to settle)",
    9168780: "a worker's leave, slowed by latency, still closing when the faults ended: "
             "it was never started again, and the only other worker had left for good "
             "(a fault of the simulator: a worker wanted up now starts again once its "
             "close is done)",
    8024833: "a static instance restarted as a new process kept the old process's join "
             "sequence; its next joins were refused as late until the group expelled it "
             "(a real fault of the coordinator, fixed: the takeover starts the count anew)",
    8019170: "the same, in a group of five",
    10095990: "a worker without a generation was waiting out a 916 ms join backoff (its "
              "coordinator had been down) when the faults ended: the convergence bound "
              "counts from its retry (the simulator's bound; Kafka's consumer backs off "
              "the same way)",
}


@pytest.mark.parametrize("seed", sorted(RUNTIME_REGRESSION_SEEDS))
def test_seed_of_the_default_profile_that_found_a_bug_passes(seed: int) -> None:
    result = run_seed(seed)
    assert result.ok, f"{RUNTIME_REGRESSION_SEEDS[seed]}\n{report(result)}"


#: Seeds of the ``cluster`` profile that found a bug (of the simulator's model
#: of several coordinators, or of the real code: docs/reliability.md).
CLUSTER_REGRESSION_SEEDS = {
    3779: "a hand-off whose partition's lease runs out during its last write ends when "
          "that write returns (Runtime.stop waits for the write in flight), so the "
          "lease loop goes on",
    869: "a statement on its way while the database is cut off goes on when the cut "
         "heals (a load is not lost for its 30 s timeout)",
    2771: "a member's find_coordinator is bounded by its reply allowance, as GroupMember "
          "gives it to its router (not the router's default of 5 s)",
    892: "a request a paused coordinator reads on resuming is dropped if the member moved "
         "its call on meanwhile (the simulator crashed)",
    87: "a group left Empty keeps its checkpoints when another coordinator takes its "
        "partition over: the coordinators' wall clocks are modelled within a minute of "
        "one another (days apart, the new owner counted the group's retention as over)",
    10884: "the same: the group left Empty kept its checkpoints across the takeover",
    10096: "the workers start once the coordinators have shared the partitions out: "
           "start-up hand-offs still going on after the warm-up made a fault-free "
           "member's join meet COORDINATOR_NOT_AVAILABLE, counted as a liveness violation",
    1000027: "the same, with static members",
    3000592: "the same, and the workers wait too until every coordinator can name each "
             "partition's owner (its last read of the leases shows the start-up's last "
             "hand-off)",
}


@pytest.mark.parametrize("seed", sorted(CLUSTER_REGRESSION_SEEDS))
def test_cluster_seed_that_found_a_bug_passes(seed: int) -> None:
    result = run_seed(seed, profile="cluster")
    assert result.ok, f"{CLUSTER_REGRESSION_SEEDS[seed]}\n{report(result)}"
