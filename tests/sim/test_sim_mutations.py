"""The simulator catches mutations of the runtime it drives (docs/reliability.md).

Each test breaks one rule of the runtime -- its machine
(``coordinator/runtime/machine.py``) or its asyncio shell
(``coordinator/runtime/runtime.py``) --, of the member's asyncio shell
(``client/member.py``) or of the partition host's
(``coordinator/cluster/host.py``) in this process (the simulator runs that
very code) and runs seeds
from 0 until one reports a violation, at most ``MAX_SEEDS``: the checker must
find it, and name the rule broken. The runtime's own faults the simulator
draws (a core failure over one group, a record the store refuses, a failed
write, the parked-request limits) are exercised by the seeds below and have
teeth of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client.member import GroupMember
from client.member_state import CallbackKind, Resource
from client.member_state.states import Syncing
from client.member_state.syncing import SyncStep
from coordinator.cluster.host import PartitionHost
from coordinator.core import coordinator as core_module
from coordinator.core.commands import Command
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.effects import Effect
from coordinator.core.records import Record
from coordinator.runtime.commits import Batch, Commits
from coordinator.runtime.machine import RuntimeMachine
from coordinator.runtime.runtime import Runtime
from protocol.messages import SyncResponse
from sim import report, run_seed

#: how many seeds a mutation may take to be found.
MAX_SEEDS = 3_000


def expect_found(names_the_rule: Callable[[str], bool], profile: str = "space") -> None:
    """Seeds from 0 until one reports a violation: one does within
    ``MAX_SEEDS``, and one of its violations names the rule broken."""
    for seed in range(MAX_SEEDS):
        found = run_seed(seed, profile=profile)
        if not found.ok:
            assert any(names_the_rule(v) for v in found.violations), report(found)
            return
    raise AssertionError(f"no violation in {MAX_SEEDS} seeds")


def test_a_reply_sent_before_its_write_commits_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: every reply goes at once, its write still in the open or the
    in-flight batch (nothing to wait for)."""
    def nothing_to_wait_for(self: Commits, command: Command, wrote: bool) -> Batch | None:
        return None

    monkeypatch.setattr(Commits, "wait_for", nothing_to_wait_for)
    expect_found(lambda v: "reply after commit:" in v)


def test_a_parked_slot_not_freed_when_its_caller_goes_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a caller that went away is forgotten, but its call stays parked in
    the core (no ``Cancelled``), holding its slot of the parked-request limits."""
    def forget_the_caller_only(self: RuntimeMachine, now_ms: int, request_id: int) -> None:
        self._waiters.pop(request_id, None)

    monkeypatch.setattr(RuntimeMachine, "caller_gone", forget_the_caller_only)
    expect_found(lambda v: "parked:" in v and "its caller gone" in v)


def test_the_shell_reporting_a_write_done_before_the_store_returns_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the asyncio shell: a write is reported committed to the
    machine as soon as it starts, so the replies waiting for it go out before
    the store has it."""
    async def done_at_once(self: Runtime, records: list[Record]) -> None:
        self._writer = None
        self.machine.write_done(self.clock.now_ms(), 0.0)
        self._perform()
        await self.storage.write(records)

    monkeypatch.setattr(Runtime, "_write", done_at_once)
    expect_found(lambda v: "reply after commit:" in v)


def test_the_shell_not_telling_the_machine_a_caller_went_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the asyncio shell: a cancelled future (the caller's connection
    closed) is forgotten, the machine never told: the call stays parked."""
    def forget_the_future(self: Runtime, request_id: int, future: object) -> None:
        self._futures.pop(request_id, None)

    monkeypatch.setattr(Runtime, "_caller_gone", forget_the_future)
    expect_found(lambda v: "parked:" in v and "its caller gone" in v)


def test_a_member_reporting_what_it_owned_past_its_safety_deadline_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the member's shell: ``assignment`` reports what the member
    last owned, not cut at its safety deadline (a paused process acts on
    resources the group may have given away)."""
    monkeypatch.setattr(GroupMember, "assignment", property(lambda self: self._machine.owned))
    # Found as two owners at once, or as acting past the deadline: whichever
    # check sees the paused member first.
    expect_found(lambda v: v.split(": ")[0].endswith(("exclusive", "deadline")))


def test_a_member_owning_an_assignment_before_its_on_assigned_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: the machine owns what a sync delivers at once, not when
    ``on_assigned`` is called with it (a callback queued before it, such as
    ``on_revoked``, still runs meanwhile)."""
    deliver = SyncStep.deliver

    def owned_at_delivery(self: SyncStep, now_ms: int, phase: Syncing, resp: SyncResponse,
                          proof_ms: int) -> None:
        deliver(self, now_ms, phase, resp, proof_ms)
        core = self._m
        for action in core._callbacks:
            if action.kind is CallbackKind.ASSIGNED:
                core._owned = core._owned | action.resources

    monkeypatch.setattr(SyncStep, "deliver", owned_at_delivery)
    expect_found(lambda v: "listener:" in v and "was not given" in v)


def test_a_member_reading_back_no_checkpoints_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the member's shell: ``fetch`` answers nothing, so a new
    owner reads back none of the checkpoints acknowledged before it."""
    async def nothing(self: GroupMember, resources: object = None) -> dict[Resource, object]:
        return {}

    monkeypatch.setattr(GroupMember, "fetch", nothing)
    expect_found(lambda v: "durable:" in v and "fetched" in v)


def test_a_host_whose_lease_loop_stops_after_its_start_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the partition host's shell: the lease loop
    (``PartitionHost.run``) ends at once, so the leases taken at the start are
    never renewed: every partition is dropped a lease later and none is taken
    again (found at seed 0: the coordinators never share the partitions out)."""
    async def no_rounds(self: PartitionHost) -> None:
        return None

    monkeypatch.setattr(PartitionHost, "run", no_rounds)
    expect_found(lambda v: "liveness:" in v, profile="cluster")


#: A seed where a member's commit, given up on, arrives after its next commit
#: was acknowledged and after a core failure made the coordinator reload the group.
LATE_COMMIT_SEED = 8215649


def test_a_load_that_forgets_the_commit_sequences_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation of the core's load: the members of a loaded group come back
    without their commit sequences, so a commit delayed across the load is
    applied over a newer one. Few seeds delay a commit past a reload (none in
    seeds 0-2,999): the seed that found it runs here."""
    monkeypatch.setattr(core_module, "_restore_commit_sequences", lambda group, snapshot: None)
    result = run_seed(LATE_COMMIT_SEED)
    assert any("reordered:" in v for v in result.violations), report(result)


#: A seed whose core fails over group g twice (after a heartbeat changed it).
CORE_FAIL_SEED = 0
#: A seed whose store refuses a record of group g without saying whose (the batch
#: is written again group by group), then refuses g's records alone.
REFUSE_SEED = 21


def test_a_core_failure_over_the_group_is_drawn_and_the_group_reloaded() -> None:
    """The core failing over group g: the group is evicted and reloaded while the
    coordinator serves on (the bystander group b answered throughout), and it
    converges again -- no violation."""
    result = run_seed(CORE_FAIL_SEED, keep_trace=True)
    assert result.ok, report(result)
    evicted = [i for i, line in enumerate(result.trace)
               if "coord evicted g: the core failed" in line]
    reloaded = [i for i, line in enumerate(result.trace) if "coord reloaded g:" in line]
    assert evicted and reloaded and evicted[0] < reloaded[0]
    assert not any("coord exits" in line for line in result.trace)
    assert result.core_errors == []  # injected: expected, not a finding


def test_a_record_the_store_refuses_evicts_only_its_group() -> None:
    result = run_seed(REFUSE_SEED, keep_trace=True)
    assert result.ok, report(result)
    trace = result.trace
    unsaid = [i for i, line in enumerate(trace) if "coord write REFUSED (whose not said)" in line]
    said = [i for i, line in enumerate(trace) if "coord write REFUSED (g)" in line]
    evicted = [i for i, line in enumerate(trace) if "coord evicted g: the store refused" in line]
    reloaded = [i for i, line in enumerate(trace) if "coord reloaded g:" in line]
    assert unsaid and said and evicted and reloaded
    assert unsaid[0] < said[0] < evicted[0] < reloaded[0]
    assert not any("coord evicted b:" in line or "coord exits" in line for line in trace)


def test_a_failure_of_the_group_that_reaches_the_bystander_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bystander's teeth: evicting a group evicts every group (and only the
    failed one is reloaded), so group b's acknowledged checkpoint is gone."""
    original = GroupCoordinator.evict_group

    def evict_all(self: GroupCoordinator, group_id: str, now_ms: int) -> list[Effect]:
        effects = original(self, group_id, now_ms)
        for other in list(self._k.checkpoints):
            if other != group_id:
                effects += original(self, other, now_ms)
        return effects

    monkeypatch.setattr(GroupCoordinator, "evict_group", evict_all)
    result = run_seed(CORE_FAIL_SEED)
    assert any("group b's checkpoint" in v for v in result.violations), result.violations
