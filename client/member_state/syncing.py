"""SYNCING: the leader's catalog read and assignment, every member's sync.

:class:`SyncStep` reads the catalog and runs the assignor (the leader,
through ``client/leader.py``, unless the group kept an earlier assignment,
KIP-814), sends the sync, and delivers the assignment it answers: the
revocations and the ``on_assigned`` it queues, the rejoins it asks for (a
hand-over, a delayed rebalance, a follow-up, a catalog changed meanwhile),
and the member becomes STABLE. A sync answer read too late to trust is kept
until a heartbeat of its generation confirms it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from client.leader import AssignmentFailed, perform_assignment
from client.member_state.actions import (
    Action,
    Call,
    CallbackKind,
    InvokeListener,
    UnknownSets,
)
from client.member_state.core import MemberCore, from_index_map
from client.member_state.recovery import Recovery
from client.member_state.states import Stable, Syncing
from client.transport import CatalogRequest, CatalogResponse
from protocol.messages import (
    Api,
    HeartbeatRequest,
    JoinMember,
    SyncAssignment,
    SyncRequest,
    SyncResponse,
)
from protocol.resources import PROTOCOL_TYPE, MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError

__all__ = ["SyncStep"]


class SyncStep:
    """The SYNCING state's step and the sync's answer; holds what the leader
    remembers between its plans (set names reported unknown, a follow-up owed)."""

    def __init__(self, core: MemberCore, recovery: Recovery) -> None:
        self._m = core
        self._recovery = recovery
        #: set names already reported missing from the catalog (UnknownSets).
        self._unknown_sets_reported: set[str] = set()
        #: the leader's last plan left subscribed resources to nobody (they are
        #: being revoked by their owners), and no assignment was delivered since:
        #: it rejoins once that generation is Stable.
        self._followup_needed = False

    def step(self, now_ms: int, phase: Syncing) -> Action:
        m = self._m
        if (wait := m._not_due_yet(now_ms)) is not None:
            return wait
        if phase.pending is not None:
            request = HeartbeatRequest(m.config.group_id, m.member_id, m.generation_id,
                                       m.config.group_instance_id, 0)
            # Not held, so awaited the reply allowance as every heartbeat is
            # (the timing rule), then retried: an answer read a lease after its
            # send could not be trusted anyway, and one lost on a hung
            # connection must not keep the member out of the group for
            # request_timeout_ms (simulator seed 217816: 30 s, with the
            # group converged without it meanwhile).
            timeout = m._timing.heartbeat_timeout_ms(now_ms, 0, None)
            return m._send(now_ms, Call(Api.HEARTBEAT, request, timeout))
        needs_assignment = m.is_leader and not phase.skip_assignment
        if needs_assignment and phase.request is None:
            if phase.catalog is None:
                return m._send(now_ms, Call(Api.RESOURCES, CatalogRequest(),
                                            m.config.request_timeout_ms))
            phase.request = self.leader_request(now_ms, phase, phase.catalog)
        if phase.request is None:
            phase.request = SyncRequest(
                m.config.group_id, m.member_id, m.generation_id, (),
                m.config.group_instance_id, PROTOCOL_TYPE, m.protocol_name)
        return m._send(now_ms, Call(Api.SYNC, phase.request, m._rebalance_call_timeout()))

    def leader_request(self, now_ms: int, phase: Syncing,
                       catalog: CatalogResponse) -> SyncRequest:
        m = self._m
        name = m.protocol_name or ""
        assignor = m._assignors.get(name)
        members = phase.members
        if assignor is None:
            failure = f"the group chose protocol {name!r}, which this member does not have"
            assignments: dict[str, ResourceAssignment] = {
                m.member_id: ResourceAssignment(error=failure) for m in members}
        else:
            try:
                clock = m._assignor_clock
                result = perform_assignment(assignor, catalog.resources, members,
                                            now_ms=now_ms if clock is None else clock(),
                                            placement=catalog.placement)
            except AssignmentFailed as exc:
                failure = str(exc)
                assignments = {m.member_id: ResourceAssignment(error=failure)
                               for m in members}
            else:
                # Each member's assignment says which catalog epoch it covers:
                # a later leader process that syncs without assigning (KIP-814)
                # rejoins when the catalog moved since.
                assignments = {m: replace(a, resources_epoch=catalog.resources_epoch)
                               for m, a in result.assignments.items()}
                failure = "; ".join(result.undecodable.values())
                self.report_unknown_sets(now_ms, result.unknown_sets, catalog)
                self._followup_needed = _leaves_resources_unassigned(
                    catalog.resources, members, assignments)
                if self._followup_needed:
                    # So does the plan: a later process of this static leader,
                    # which syncs without assigning (KIP-814), starts the
                    # follow-up that this process (maybe the revoker) may not
                    # live to start (simulator seeds 75664, 76088, 91962).
                    assignments = {m: replace(a, followup=True)
                                   for m, a in assignments.items()}
        if failure:
            m.last_error = failure
        m._assigned_epoch = catalog.resources_epoch
        return SyncRequest(
            m.config.group_id, m.member_id, m.generation_id,
            tuple(SyncAssignment(m, a.encode()) for m, a in sorted(assignments.items())),
            m.config.group_instance_id, PROTOCOL_TYPE, m.protocol_name)

    def report_unknown_sets(self, now_ms: int, unknown: Mapping[str, tuple[str, ...]],
                            catalog: CatalogResponse) -> None:
        """An :class:`UnknownSets` event for the set names not reported yet."""
        m = self._m
        new = {m: tuple(n for n in sets if n not in self._unknown_sets_reported)
               for m, sets in sorted(unknown.items())}
        members = tuple((m, sets) for m, sets in new.items() if sets)
        if not members:
            return
        self._unknown_sets_reported.update(n for _, sets in members for n in sets)
        m._rebalance.unknown_sets(
            UnknownSets(now_ms, members, tuple(sorted(catalog.resources))))

    def on_catalog(self, now_ms: int, resp: CatalogResponse) -> None:
        m = self._m
        if isinstance(m._phase, Syncing):
            m._phase.catalog = resp
        m._schedule.due_ms = now_ms

    def on_sync(self, now_ms: int, sent_ms: int, resp: SyncResponse) -> None:
        m = self._m
        if resp.error is not None:
            self._recovery.apply(now_ms, Api.SYNC, resp.error)
            return
        m.last_resources_epoch = max(m.last_resources_epoch, resp.resources_epoch)
        phase = m._phase
        assert isinstance(phase, Syncing)  # a sync in flight outside SYNCING is stale
        if now_ms >= m._lease.end_if_settled(sent_ms):
            # The lease this answer would start is over already: the answer
            # was read a session timeout after our last proven contact (the
            # process was paused, or the answer sat in its socket), or a
            # rebalance timeout after the sync went out. The coordinator may
            # have removed us meanwhile and given these resources to someone
            # else (chaos seed 0). Nothing is delivered until a heartbeat of
            # this generation, sent now, succeeds; the safety rule treats
            # what we own as lost first. (Background heartbeats during a
            # slow sync keep the anchor fresh, so a slow leader alone does
            # not trigger this.)
            phase.pending = resp
            m._schedule.due_ms = now_ms
            return
        self.deliver(now_ms, phase, resp, sent_ms)

    def deliver(self, now_ms: int, phase: Syncing, resp: SyncResponse, proof_ms: int) -> None:
        m = self._m
        # The coordinator answered a sync (or a heartbeat after it) sent at
        # proof_ms: we were a member then, and the join phase was over.
        m._lease.settled(proof_ms)
        stable = Stable()
        m._phase = stable
        m._schedule.due_ms = now_ms  # start the heartbeat long-poll at once
        try:
            assignment = ResourceAssignment.decode(resp.assignment)
        except ValidationError as exc:
            assignment = ResourceAssignment(error=f"assignment undecodable: {exc}")
        if assignment.error is not None:
            # The leader could not assign (a broken assignor, our metadata
            # unreadable): keep what we own (it was validly ours and is still
            # claimed in our metadata), count a failed rebalance, retry.
            m.last_error = f"rebalance failed: {assignment.error}"
            self._recovery.fail_rebalance(now_ms, m.last_error)
            m._request_rejoin(now_ms, "previous rebalance failed",
                              m._schedule.backoff_ms())
            return
        if assignment.user_data is not None:
            # The assignor owns its protocol's user_data from now on
            # (docs/client.md): echoed at the next join.
            m._echo = (m.protocol_name, assignment.user_data)
        new = from_index_map(assignment.assigned)
        m._band = assignment.band
        m._loads = {r: v for r, v in m._loads.items() if r in new}
        revoked = frozenset(m._owned - new)
        added = frozenset(new - m._owned)
        if m._closing:
            # The sync was finished for the generation the close's final commits
            # need (_finishing_sync), nothing more: nothing new is taken on (no
            # on_assigned while closing, as Kafka's consumer does not poll then),
            # and the close revokes everything owned, in this generation. What
            # moves away is nobody else's in it (a cooperative assignor withholds
            # a resource its owner still claims), and moves once the member left;
            # a static member leaves for that too (CloseStep.step).
            stable.handover_pending = bool(revoked)
            m._owned_generation = m.generation_id
            m._rebalance.forget_assignment()
            return
        if revoked:
            # Eager members own nothing here; a cooperative member gives up
            # what moves and rejoins at once so the follow-up rebalance can
            # hand it to its new owner (KIP-429 step 3.3).
            m._callbacks.append(InvokeListener(CallbackKind.REVOKED, revoked))
            m._request_rejoin(now_ms, "revoked resources move to their new owner")
            stable.handover_pending = True
        m._owned_generation = m.generation_id
        m._callbacks.append(InvokeListener(CallbackKind.ASSIGNED, added))
        m._rebalance.assignment_delivered()
        # Never standby while owned, now or until on_revoked returns.
        dropped = m._handover.assigned(new | m._owned, from_index_map(assignment.standby))
        if dropped is not None:
            m._callbacks.append(dropped)
        if assignment.delay_ms > 0:
            # Deferred imbalance resolution (KIP-415 / incremental cooperative).
            m._request_rejoin(now_ms, "assignor asked for a delayed rebalance",
                              assignment.delay_ms)
        if m.is_leader and phase.skip_assignment and assignment.followup:
            # Assigned by an earlier leader process (KIP-814) whose plan left
            # resources to nobody: it may have been the revoker itself, and died
            # before its follow-up join (a new process owns nothing, so it
            # revokes nothing and would never rejoin).
            self._followup_needed = True
        if m.is_leader and self._followup_needed and not revoked \
                and assignment.delay_ms <= 0:
            # KIP-429's follow-up rebalance is started by the members that revoke;
            # a revoker that stops before it rejoins (closed, crashed, a static
            # member restarted: it gets its stored assignment back without a
            # rebalance) would leave what it revoked to nobody. The leader, which
            # planned the hand-over, starts the follow-up itself (simulator seeds
            # 700838430, 700838624).
            m._request_rejoin(now_ms, "resources revoked in this rebalance move to "
                                      "their new owner")
        self._followup_needed = False
        if m.is_leader:
            if phase.skip_assignment or m._assigned_epoch is None:
                # Assigned by an earlier leader process (KIP-814): from the
                # epoch its assignment carries (older leaders' carry none:
                # then the sync's epoch, and a catalog change made meanwhile
                # waits for the next rebalance).
                m._assigned_epoch = (assignment.resources_epoch
                                     if assignment.resources_epoch is not None
                                     else resp.resources_epoch)
            if resp.resources_epoch > m._assigned_epoch:
                m._request_rejoin(now_ms, "resource catalog changed during the rebalance")


def _leaves_resources_unassigned(catalog: Mapping[str, int], members: Sequence[JoinMember],
                                 assignments: Mapping[str, ResourceAssignment]) -> bool:
    """Whether a plan gives some resource of a set that a member subscribes to to
    nobody (cooperative: it is being revoked by its owner, and moves in the
    follow-up rebalance)."""
    subscribed: set[str] = set()
    for m in members:
        try:
            subscribed.update(MemberMetadata.decode(m.metadata).sets)
        except ValidationError:
            continue
    assigned = {(name, i) for a in assignments.values() for name, idx in a.assigned.items()
                for i in idx}
    return any((name, i) not in assigned for name in subscribed if name in catalog
               for i in range(catalog[name]))
