"""JOINING: the join request, and its answer.

:class:`JoinStep` builds the join (each protocol's metadata: the
subscription, the claims, the reported load, the warm standbys, the assignor's
echoed ``user_data``; eager members revoke everything first) and reads its
answer: the member id a dynamic member's first join gets
(MEMBER_ID_REQUIRED), or the generation, which makes the member SYNCING.
"""

from __future__ import annotations

from client.assignors import RebalanceProtocol
from client.member_state.actions import Action, Call
from client.member_state.core import MemberCore, to_index_map
from client.member_state.recovery import Recovery
from client.member_state.states import Joining, Syncing
from protocol.errors import ErrorCode
from protocol.messages import Api, JoinRequest, JoinResponse
from protocol.resources import PROTOCOL_TYPE, MemberMetadata

__all__ = ["JoinStep"]


class JoinStep:
    """The JOINING state's step and the join's answer; holds the join sequence."""

    def __init__(self, core: MemberCore, recovery: Recovery) -> None:
        self._m = core
        self._recovery = recovery
        #: the ``sequence`` of the last join built (JoinRequest.sequence).
        self._sequence = -1

    def step(self, now_ms: int, phase: Joining) -> Action:
        m = self._m
        if (wait := m._not_due_yet(now_ms)) is not None:
            return wait
        if m.protocol is RebalanceProtocol.EAGER and m._owned:
            # KIP-429, eager: on_revoked on the full set before the join.
            return m._revoke_owned()
        m._rejoin = None
        if m._rebalance.started_ms is None:
            m._rebalance.start(now_ms, phase.reason)
        static = m.config.group_instance_id is not None
        request = JoinRequest(
            group_id=m.config.group_id, member_id=m.member_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=self.protocols(),
            session_timeout_ms=m.config.session_timeout_ms,
            rebalance_timeout_ms=m.config.rebalance_timeout_ms,
            group_instance_id=m.config.group_instance_id,
            client_id=m.config.client_id, reason=phase.reason,
            incarnation=m.incarnation if static else None,
            incarnation_ms=m.incarnation_ms if static else None,
            sequence=self.next_sequence(),
        )
        m._handover.join_built()
        if phase.first_sent_ms is None:
            phase.first_sent_ms = now_ms
        return m._send(now_ms, Call(Api.JOIN, request, m._rebalance_call_timeout()))

    def protocols(self) -> tuple[tuple[str, bytes], ...]:
        """Each protocol's metadata: the same subscription and claims; the
        protocol of the last assignment carries that assignment's
        ``user_data`` back, the others ``config.user_data``."""
        m = self._m

        def metadata(user_data: bytes | None) -> bytes:
            return MemberMetadata(
                sets=m.sets,
                owned=to_index_map(m._owned),
                generation=m._owned_generation if m._owned else -1,
                rack=m.config.rack,
                user_data=user_data,
                capacity=m.config.capacity,
                load=self.reported_load(),
                warm=to_index_map(m._handover.warm),
                draining=m._handover.draining,
            ).encode()

        plain = metadata(m.config.user_data)
        if m._echo is None:
            return tuple((name, plain) for name in m.config.assignors)
        echoed, user_data = m._echo
        return tuple(
            (name, metadata(user_data) if name == echoed else plain)
            for name in m.config.assignors)

    def reported_load(self) -> dict[str, dict[int, float]]:
        """The measured loads of what the member owns, by set, for its metadata."""
        m = self._m
        out: dict[str, dict[int, float]] = {}
        for (name, index), load in m._loads.items():
            if (name, index) in m._owned:
                out.setdefault(name, {})[index] = load
        return out

    def next_sequence(self) -> int:
        """Increasing over the member's whole life, one per join sent (a join
        sent again included): a join the member gave up on that reaches the
        coordinator after a later one is not applied (docs/client.md, "A call
        the coordinator is done with"; docs/coordinator-semantics.md, "The join
        sequence")."""
        self._sequence += 1
        return self._sequence

    def on_join(self, now_ms: int, sent_ms: int, resp: JoinResponse) -> None:
        m = self._m
        if resp.error is ErrorCode.MEMBER_ID_REQUIRED:
            # docs/protocol.md, "POST /v1/join": a dynamic member's first join gets its id this way;
            # owned is empty at this point, join again at once.
            if resp.member_id:
                m.member_id = resp.member_id
            m._schedule.due_ms = now_ms
            return
        if resp.error is not None:
            self._recovery.apply(now_ms, Api.JOIN, resp.error, detail=resp.message)
            return
        # The coordinator restarts our session timer when the join phase
        # completes, which is no earlier than when we sent the join.
        m._lease.known(sent_ms)
        # The generation formed after the join that put us in it reached the
        # coordinator; that may be an earlier join of ours than this one (a
        # join whose answer we never read, answered now "current generation"
        # at once), so the sync deadline is no earlier than the first join's
        # send time + the rebalance timeout.
        phase = m._phase
        first = phase.first_sent_ms if isinstance(phase, Joining) else None
        m.member_id = resp.member_id or m.member_id
        m.generation_id = resp.generation_id
        if m._owned:
            # Kafka's rule: claims carry the join's generation. This join claimed
            # all we own, so that generation gave none of it away (what is
            # claimed is withheld): still ours if our sync is cut short. At the
            # older generation it went stale and moved cold (docs/benchmarks.md).
            m._owned_generation = resp.generation_id
        m.protocol_name = resp.protocol_name
        m.leader_id = resp.leader
        m._phase = Syncing(base_ms=sent_ms if first is None else min(first, sent_ms),
                           members=resp.members, skip_assignment=resp.skip_assignment)
        m._schedule.due_ms = now_ms
