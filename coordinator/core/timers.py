"""Timer firings and cancelled requests.

Every firing is checked against the core's own state before it acts (docs/architecture.md,
practice 3: stale firings are dropped): the key must still be registered, the group and
member must still exist, and the recorded deadline must have passed. A firing
that arrives before the recorded deadline (the runtime's clock and ``now_ms``
disagreeing by a hair, or a re-arm racing the firing) re-arms the timer for the
recorded deadline rather than being lost.

Timer kinds are :class:`~coordinator.core.group.TimerKind` (keys:
``session:{group}:{member}``, ``pending:{group}:{member}``, ``join:{group}``,
``sync:{group}``, ``heartbeat:{request_id}``, ``retention:{group}``); each has
its handler per group state in the state table (:mod:`coordinator.core.dispatch`).
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.core.admin import delete_group
from coordinator.core.commands import Cancelled, TimerFired
from coordinator.core.effects import MemberExpired
from coordinator.core.group import Group
from coordinator.core.kernel import Kernel, TimerTarget
from coordinator.core.rebalance import (
    after_removal,
    complete_join,
    maybe_complete_join,
    prepare_rebalance,
    remove_member,
    set_join_deadline,
)
from protocol.errors import ErrorCode

#: what a firing does in one group state (a cell of the state table's timer columns).
OnTimer = Callable[[Kernel, Group, str, TimerTarget], None]


def fired_target(k: Kernel, cmd: TimerFired) -> tuple[Group, TimerTarget] | None:
    """The group and target of a firing; ``None``: stale (the key was disarmed,
    or its group is gone). A fired timer is gone on the runtime's side;
    handlers re-arm if they need it."""
    target = k.timers.pop(cmd.key, None)
    if target is None:
        return None
    group = k.groups.get(target.group_id)
    return None if group is None else (group, target)


def stale(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    """A deadline of a phase the group is no longer in: nothing to do."""


def session_expired(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    member = g.members.get(target.member_id)
    if member is None or member.session_key != key:
        return
    if k.now < member.session_deadline_ms:
        k.arm(key, member.session_deadline_ms, target)
        return
    if member.join_request is not None or member.sync_request is not None:
        # A member whose join or sync is parked is alive (Kafka: awaiting join/sync
        # satisfies the heartbeat); its session restarts when it is answered.
        k.arm_session(g, member)
        return
    k.emit(MemberExpired(g.group_id, member.member_id))
    remove_member(k, g, member, ErrorCode.UNKNOWN_MEMBER_ID)
    after_removal(k, g, "session_expiry")


def heartbeat_held(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    parked = k.heartbeats.get(target.request_id)
    if parked is None:
        return
    member = g.members[parked.member_id]
    k.answer_heartbeat(member, target.request_id, None)
    # The member was connected all along: its session counts from the answer.
    k.arm_session(g, member)


def join_deadline(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    """PreparingRebalance only (the state table)."""
    deadline = g.join_deadline_ms
    if deadline is None:
        return
    if k.now < deadline:
        k.arm(key, deadline, target)
        return
    remaining = g.initial_delay_remaining_ms
    if remaining is not None and remaining > 0:
        if g.new_member_added:
            # Kafka's InitialDelayedJoin: newcomers arrived during the delay, so
            # wait once more, never beyond the rebalance timeout in total.
            delay = k.config.initial_rebalance_delay_ms
            g.initial_delay_remaining_ms = max(remaining - delay, 0)
            g.new_member_added = False
            set_join_deadline(k, g, k.now + min(delay, remaining))
            return
        if not g.all_joined():
            # A newcomer holds its member id but has not rejoined yet (KIP-394
            # pending), or a join was cancelled: fall back to the normal barrier
            # for what is left of the rebalance timeout instead of forming a
            # generation without it (Kafka would complete here).
            g.initial_delay_remaining_ms = None
            set_join_deadline(k, g, k.now + remaining)
            return
    complete_join(k, g)


def sync_deadline(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    """CompletingRebalance and Stable only (the state table)."""
    deadline = g.sync_deadline_ms
    if deadline is None:
        return
    if k.now < deadline:
        k.arm(key, deadline, target)
        return
    g.sync_deadline_ms = None
    late = [m for mid, m in g.members.items() if mid in g.pending_sync]
    if not late:
        return
    for member in late:
        remove_member(k, g, member, ErrorCode.UNKNOWN_MEMBER_ID)
    prepare_rebalance(k, g, "sync_timeout")
    maybe_complete_join(k, g)


def pending_expired(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    deadline = g.pending.get(target.member_id)
    if deadline is None:
        return
    if k.now < deadline:
        k.arm(key, deadline, target)
        return
    k.drop_pending(g, target.member_id)  # its timer fired: nothing to cancel
    maybe_complete_join(k, g)
    k.forget_if_vacant(g)


def retention_expired(k: Kernel, g: Group, key: str, target: TimerTarget) -> None:
    """KIP-211: an Empty group's checkpoints expire, and the group with them (Empty -> Dead).

    Kafka expires the offsets of a group ``offsets.retention.minutes`` after it
    became Empty, then removes the group once it holds none. Here the two go
    together, durably (a ``GroupDeleted`` record, as the admin delete writes).
    """
    deadline = k.retention.get(g.group_id)
    if deadline is None:
        return
    if k.now < deadline:
        # Renewed by a commit since the timer was armed (Kernel.renew_retention).
        k.arm(key, deadline, target)
        return
    latest_pending = max(g.pending.values(), default=0)
    if latest_pending > k.now:
        # A KIP-394 pending member is between MEMBER_ID_REQUIRED and its real join:
        # let it join (that stops the retention) or expire first.
        k.extend_retention(g.group_id, latest_pending)
        return
    delete_group(k, g, "retention_expired")


def handle_cancelled(k: Kernel, cmd: Cancelled) -> None:
    """The caller went away: forget its parked request; the member stays (Kafka)."""
    cancelled = k.cancel_parked(cmd.request_id)
    if cancelled is None:
        return
    group, member, kind = cancelled
    if kind != "heartbeat":
        # No longer parked join or sync, so no longer kept alive: its session runs from now.
        k.arm_session(group, member)

