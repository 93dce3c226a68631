"""STABLE: the heartbeat long-poll, the commits, the load reports.

:class:`StableStep` sends the main channel's heartbeat (held up to an
interval, by the timing rule of ``client/lease.py``) and reads its answer;
builds commit requests and feeds their outcomes through the error table;
takes the application's load reports and rejoins when their sum leaves the
leader's band.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from client.errors import (
    CommitFailedError,
    MemberClosedError,
    NotOwnedError,
    RebalanceInProgressError,
)
from client.member_state.actions import (
    COMMIT_CONTENT_ERRORS,
    ERROR_ACTIONS,
    Action,
    Call,
    ErrorAction,
    MemberState,
    Resource,
    Wait,
)
from client.member_state.core import MemberCore
from client.member_state.recovery import Recovery
from client.member_state.states import Syncing
from client.member_state.syncing import SyncStep
from protocol.errors import ErrorCode
from protocol.messages import Api, CommitRequest, HeartbeatRequest, HeartbeatResponse, Scalar

__all__ = ["StableStep"]


class StableStep:
    """The STABLE state's step, the commits and the load reports; holds the
    commit sequence."""

    def __init__(self, core: MemberCore, recovery: Recovery, syncing: SyncStep) -> None:
        self._m = core
        self._recovery = recovery
        self._syncing = syncing
        #: the ``sequence`` of the last commit built (CommitRequest.sequence).
        self._commit_sequence = -1
        #: the ``sequence`` of the last commit built while joining or syncing.
        self._rebalancing_sequence = -1

    def step(self, now_ms: int) -> Action:
        m = self._m
        due = m._schedule.due_ms
        wake = [due]
        if m._rejoin is not None:
            wake.append(m._rejoin[0])
        deadline = m.safety_deadline_ms()
        if deadline is not None:
            wake.append(deadline)
        if now_ms < due:
            return Wait(min(wake))
        # The timing rule (client/lease.py): held at most an interval, and
        # never so long that the answer, and one retry after it, could come
        # after the lease's end; awaited reply_ms past the hold.
        end = m._lease_end_now()
        wait_ms = m._timing.hold_ms(now_ms, end)
        if m._rejoin is not None:
            wait_ms = max(0, min(wait_ms, m._rejoin[0] - now_ms))
        timeout = m._timing.heartbeat_timeout_ms(now_ms, wait_ms, end)
        request = HeartbeatRequest(m.config.group_id, m.member_id, m.generation_id,
                                   m.config.group_instance_id, wait_ms)
        # Should this heartbeat start a rebalance, the side channel carries on
        # one interval later.
        m._side.next_ms = now_ms + m._timing.heartbeat_interval_ms
        return m._send(now_ms, Call(Api.HEARTBEAT, request, timeout, interruptible=True))

    def on_heartbeat(self, now_ms: int, sent_ms: int, request: HeartbeatRequest,
                     resp: HeartbeatResponse) -> None:
        m = self._m
        if (request.member_id != m.member_id
                or request.generation_id != m.generation_id):
            # A commit's refusal reset the member while this was in flight:
            # the answer is about a generation we no longer have.
            m._schedule.due_ms = now_ms
            return
        if resp.error is not None:
            if resp.error is ErrorCode.REBALANCE_IN_PROGRESS:
                # The coordinator re-armed our session: proven contact.
                m._lease.known(sent_ms)
            self._recovery.apply(now_ms, Api.HEARTBEAT, resp.error)
            return
        m._lease.settled(sent_ms)
        phase = m._phase
        if isinstance(phase, Syncing) and phase.pending is not None:
            # We are still in this generation as of the heartbeat's send time.
            if now_ms >= m._timing.end(sent_ms, sent_ms):
                m._schedule.due_ms = now_ms  # late again: check again
                return
            self._syncing.deliver(now_ms, phase, phase.pending, sent_ms)
            return
        m._schedule.due_ms = max(now_ms, sent_ms + m._timing.heartbeat_interval_ms)
        m.last_resources_epoch = max(m.last_resources_epoch, resp.resources_epoch)
        m._drain_asked(now_ms, resp)
        if (m.is_leader and m._assigned_epoch is not None
                and resp.resources_epoch > m._assigned_epoch):
            # docs/protocol.md, "Admin (JSON)": the coordinator does not rebalance on catalog
            # changes; the leader rejoins so the new catalog is assigned.
            m._request_rejoin(now_ms, "resource catalog changed")

    def build_commit(self, checkpoints: Mapping[Resource, Scalar]) -> CommitRequest:
        """:meth:`MemberStateMachine.build_commit`."""
        m = self._m
        if m.failure is not None:
            raise m.failure
        if m.state is MemberState.CLOSED:
            raise MemberClosedError("the member is closed")
        not_owned = sorted(r for r in checkpoints if r not in m._owned)
        if not_owned:
            raise NotOwnedError(not_owned)
        if m.generation_id < 0 or not m.member_id:
            if m.revoking(checkpoints) and m.last_error is not None:
                # Out of the group while on_revoked ran (a heartbeat's answer):
                # no later generation will take this commit.
                raise NotOwnedError(not_owned or sorted(checkpoints), (
                    f"the member left the group while on_revoked ran ({m.last_error}), "
                    f"so the group may have given them to another member; nothing was sent"))
            raise RebalanceInProgressError(ErrorCode.REBALANCE_IN_PROGRESS,
                                           "commit: the member has not joined a generation yet")
        # Increasing over the member's whole life (rejoins included): a commit the
        # member gave up on that reaches the coordinator after a later one is not
        # applied over it (docs/client.md, "Commits").
        self._commit_sequence += 1
        if m.state is not MemberState.STABLE:
            self._rebalancing_sequence = self._commit_sequence
        return CommitRequest(
            group_id=m.config.group_id, member_id=m.member_id,
            generation_id=m.generation_id, group_instance_id=m.config.group_instance_id,
            checkpoints=tuple((s, i, v) for (s, i), v in sorted(
                checkpoints.items(), key=lambda kv: kv[0])),
            sequence=self._commit_sequence,
        )

    def commit_result(self, now_ms: int, request: CommitRequest,
                      code: ErrorCode | None) -> CommitFailedError | None:
        """:meth:`MemberStateMachine.commit_result`."""
        m = self._m
        if code is None:
            return None
        stale = (request.generation_id != m.generation_id
                 or request.member_id != m.member_id)
        action = ERROR_ACTIONS.get(code, ErrorAction.RETRY)
        if code in COMMIT_CONTENT_ERRORS:
            # Refused for what it carries (a resource the catalog no longer has,
            # a value over a limit): that commit fails, the membership is fine,
            # as Kafka's per-partition OffsetCommit errors leave the consumer be.
            # A catalog shrink can refuse a commit of a resource the member
            # still owns until the rebalance it starts (simulator seed 1554).
            return CommitFailedError(code)
        # Kafka's consumer acts on a generation error only if the generation is
        # unchanged since the commit was sent (generationUnchanged()). Here also
        # only while STABLE: a member that is rebalancing (its join or sync in
        # flight) learns where it stands from that call, and a commit sent
        # after its own join is refused as soon as the join phase completes
        # (simulator seed 121489, docs/client.md "A commit racing a rebalance").
        rebalancing = m.state in (MemberState.JOINING, MemberState.SYNCING)
        # Sent while the member was joining or syncing and answered once it is
        # stable in that same generation: the rebalance it reports is the one
        # the member has since completed, not a new one, so it does not rejoin
        # (Kafka's consumer sends no commit between its join and its sync;
        # simulator seed 5007018).
        sent_rebalancing = request.sequence is not None \
            and request.sequence <= self._rebalancing_sequence
        if not stale and not sent_rebalancing and m.state is MemberState.STABLE \
                and action is not ErrorAction.RETRY:
            self._recovery.apply(now_ms, Api.COMMIT, code, action)
        if m._closing and code in (ErrorCode.REBALANCE_IN_PROGRESS,
                                   ErrorCode.ILLEGAL_GENERATION):
            # No "commit again": a closing member does not rejoin.
            return CommitFailedError(
                code, f"commit refused: {code.value} (generation {request.generation_id}): "
                      f"the group was rebalancing when the member closed, and a closing "
                      f"member does not rejoin, so the checkpoint was not stored")
        if code is ErrorCode.REBALANCE_IN_PROGRESS:
            return RebalanceInProgressError(code)
        if code is ErrorCode.ILLEGAL_GENERATION and (stale or rebalancing):
            # About a generation the member has left or is leaving, not a loss
            # of what it owns: Kafka raises RebalanceInProgressException here
            # ("commit again once the rebalance completes").
            return RebalanceInProgressError(
                code, f"commit refused: {code.value} (generation {request.generation_id}; "
                      f"the member has rebalanced since, or is rebalancing: commit again "
                      f"once the rebalance completes)")
        return CommitFailedError(code)

    def report_load(self, now_ms: int, loads: Mapping[Resource, float]) -> bool:
        """:meth:`MemberStateMachine.report_load`."""
        m = self._m
        m._check_open()
        for resource, load in loads.items():
            if isinstance(load, bool) or not isinstance(load, int | float) \
                    or not math.isfinite(load) or load < 0:
                raise ValueError(f"load of {resource}: expected a finite number >= 0, "
                                 f"got {load!r}")
        for resource, load in loads.items():
            if resource in m._owned:
                m._loads[resource] = float(load)
        band = m._band
        if band is None or m._rejoin is not None or not m._owned \
                or any(r not in m._loads for r in m._owned):
            return False
        total = sum(m._loads[r] for r in m._owned)
        if band[0] <= total <= band[1]:
            return False
        last = m._load_rejoin_ms
        if last is not None and now_ms - last < m.config.load_rejoin_interval_ms:
            return False
        m._load_rejoin_ms = now_ms
        m._request_rejoin(now_ms, f"measured load {total:g} outside the band "
                                  f"[{band[0]:g}, {band[1]:g}]")
        return True
