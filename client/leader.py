"""The leader's side of a rebalance: decode, assign, validate, encode.

A pure function (no I/O, no clock): the member state machine calls it with the
join response's member list, the catalog it read from ``GET /v1/resources``
and the time (``now_ms``, handed to assignors that take it: KIP-415's
deferred imbalance resolution keeps deadlines), and sends the result in its
sync request.

Steps (KIP-429, "For the leader", adapted):

1. Decode every member's ``MemberMetadata`` into a ``Subscription`` (with its
   owned resources, their generation and its ``group_instance_id``). A member
   whose metadata cannot be decoded gets an assignment carrying ``error`` and
   nothing else; the rest of the group is assigned as usual.
2. Run the selected assignor.
3. If the assignor supports the COOPERATIVE protocol it promises never to hand
   a resource to a new owner while another member still owns it: its output
   is validated as is, and a broken rule fails the rebalance loudly
   (:class:`AssignmentFailed`) rather than risking double ownership.
   An assignor that does not place by ``draining`` (every one but
   ``balanced``, which declares ``reads_draining``) is shown a draining
   member as subscribed only to the sets no other member subscribes to
   (:func:`hide_draining`): it gives such a member nothing new, and a
   cooperative one revokes what it owns (a claim on a set not subscribed is
   withheld from everybody this round, KIP-429), so drain works with it.
4. An EAGER-only assignor ignores ``owned``. Members of an eager group revoke
   everything before they join, so ``owned`` is empty and nothing changes;
   should a member still claim something, KIP-429 step 2.4 applies: a
   resource that would change owner is held back this round (its owner sees
   it missing, revokes it, and rejoins; the follow-up rebalance moves it).
   The filtered output is then validated the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, cast

from client.assignors import (
    Assignment,
    AssignmentError,
    Assignor,
    RebalanceProtocol,
    Resources,
    ResourceSet,
    Subscription,
    validate_assignment,
)
from protocol.catalog import Placement
from protocol.messages import JoinMember
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError

__all__ = [
    "AssignmentFailed",
    "LeaderResult",
    "TimedAssignor",
    "accepts_now",
    "hide_draining",
    "hold_back_moving",
    "perform_assignment",
    "reads_draining",
]


class TimedAssignor(Protocol):
    """An assignor whose ``assign`` takes the time explicitly (e.g.
    ``incremental-cooperative``; without it that assignor reads the wall clock)."""

    def assign(self, resources: Resources, subscriptions: Mapping[str, Subscription],
               now_ms: int | None = None) -> dict[str, Assignment]: ...


@functools.cache
def _assign_takes_now(assignor_type: type[Assignor]) -> bool:
    try:
        params = inspect.signature(assignor_type.assign).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    param = params.get("now_ms")
    return param is not None and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                inspect.Parameter.KEYWORD_ONLY)


def accepts_now(assignor: Assignor) -> bool:
    """Does ``assignor.assign`` declare a ``now_ms`` keyword? (Inspected once
    per assignor class.)"""
    return _assign_takes_now(type(assignor))


class AssignmentFailed(Exception):
    """The assignor broke a rule of the "resources" protocol (docs/protocol.md, "The
    embedded "resources" protocol") or raised; the rebalance fails."""


@dataclass(frozen=True, slots=True)
class LeaderResult:
    assignments: dict[str, ResourceAssignment]
    #: members whose metadata could not be decoded, with the reason.
    undecodable: dict[str, str]
    #: members subscribed to sets the catalog does not have: those sets, sorted.
    unknown_sets: dict[str, tuple[str, ...]]


def hold_back_moving(subscriptions: Mapping[str, Subscription],
                     result: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """KIP-429 step 2.4: drop from each member's assignment the resources that
    another member claims to own (they will move in the follow-up rebalance,
    after their owner revoked them)."""
    claimed: dict[tuple[str, int], str] = {}
    for member, sub in subscriptions.items():
        for name, indexes in sub.owned.items():
            for i in indexes:
                # Two claimants can only come from a stale member; either one
                # blocks a move, which is the safe reading.
                claimed.setdefault((name, i), member)
    out: dict[str, Assignment] = {}
    for member, assignment in result.items():
        kept: dict[str, list[int]] = {}
        for name, indexes in assignment.assigned.items():
            keep = [i for i in indexes if claimed.get((name, i), member) == member]
            if keep:
                kept[name] = keep
        out[member] = replace(assignment, assigned=kept)
    return out


def reads_draining(assignor: Assignor) -> bool:
    """Does the assignor place by ``Subscription.draining`` itself (declares
    ``reads_draining = True``)?"""
    return getattr(assignor, "reads_draining", False) is True


def hide_draining(subscriptions: Mapping[str, Subscription]) -> dict[str, Subscription]:
    """The subscriptions an assignor that ignores ``draining`` is given: a
    draining member subscribes only to the sets no member that stays
    subscribes to (those it keeps serving: nobody else could), its claims
    and everything else as sent."""
    staying = {name for sub in subscriptions.values() if not sub.draining
               for name in sub.sets}
    return {member: replace(sub, sets=[n for n in sub.sets if n not in staying])
            if sub.draining else sub for member, sub in subscriptions.items()}


def catalog_resources(catalog: Mapping[str, int],
                      placement: Mapping[str, Placement]) -> dict[str, int | ResourceSet]:
    """What the assignor is given: each set's partition count, or, for a set whose
    weights or home zones the catalog gives (``GET /v1/resources``), a
    :class:`ResourceSet` carrying them (a default zone list is every index's)."""
    out: dict[str, int | ResourceSet] = {}
    for name, partitions in catalog.items():
        place = placement.get(name)
        if place is None or place.is_default:
            out[name] = partitions
            continue
        zones: dict[int, tuple[str, ...]] = {}
        if place.zones.default is not None:
            zones = dict.fromkeys(range(partitions), tuple(place.zones.default))
        for index, home in place.zones.overrides:
            if home is None:
                zones.pop(index, None)
            else:
                zones[index] = tuple(home)
        out[name] = ResourceSet(partitions, weights=dict(place.weights.overrides),
                                zones=zones, default_weight=place.weights.default)
    return out


def perform_assignment(assignor: Assignor, catalog: Mapping[str, int],
                       members: Sequence[JoinMember], *,
                       now_ms: int | None = None,
                       placement: Mapping[str, Placement] | None = None) -> LeaderResult:
    """Assign ``catalog`` over ``members``; raise :class:`AssignmentFailed`.

    ``placement``: the catalog's weights and home zones by set (absent: every
    resource weighs 1.0, anywhere); the assignor gets them as
    a :class:`ResourceSet` each (:func:`catalog_resources`). ``now_ms`` is passed to
    assignors whose ``assign`` declares it (see :func:`accepts_now`); the others
    are called without it."""
    resources: Resources = catalog_resources(catalog, placement) if placement else catalog
    subscriptions: dict[str, Subscription] = {}
    undecodable: dict[str, str] = {}
    for m in members:
        try:
            meta = MemberMetadata.decode(m.metadata)
        except ValidationError as exc:
            undecodable[m.member_id] = f"metadata of member {m.member_id!r} is malformed: {exc}"
            continue
        subscriptions[m.member_id] = Subscription(
            sets=list(meta.sets),
            owned={k: list(v) for k, v in meta.owned.items()},
            generation=meta.generation,
            rack=meta.rack,
            user_data=meta.user_data,
            group_instance_id=m.group_instance_id,
            capacity=1.0 if meta.capacity is None else meta.capacity,
            load=meta.load,
            warm=meta.warm,
            draining=meta.draining,
        )
    given = (subscriptions if reads_draining(assignor)
             or not any(s.draining for s in subscriptions.values())
             else hide_draining(subscriptions))
    try:
        if now_ms is not None and accepts_now(assignor):
            result = cast(TimedAssignor, assignor).assign(resources, given, now_ms=now_ms)
        else:
            result = assignor.assign(resources, given)
    except Exception as exc:  # an assignor bug must fail the rebalance, not the member
        raise AssignmentFailed(f"assignor {assignor.name!r} raised {exc!r}") from exc
    cooperative = RebalanceProtocol.COOPERATIVE in assignor.protocols
    any_owned = any(v for s in subscriptions.values() for v in s.owned.values())
    if not cooperative and any_owned:
        result = hold_back_moving(subscriptions, result)
    try:
        validate_assignment(catalog, subscriptions, result, cooperative or any_owned)
    except AssignmentError as exc:
        raise AssignmentFailed(f"assignor {assignor.name!r} broke a rule: {exc}") from exc
    out = {
        member: ResourceAssignment(assigned=a.assigned, user_data=a.user_data,
                                   delay_ms=max(0, a.delay_ms), standby=a.standby,
                                   why=a.why, band=a.band, load=a.load)
        for member, a in result.items()
    }
    for member, reason in undecodable.items():
        out[member] = ResourceAssignment(error=reason)
    unknown = {member: tuple(sorted(set(sub.sets) - catalog.keys()))
               for member, sub in subscriptions.items()}
    return LeaderResult(out, undecodable, {m: sets for m, sets in unknown.items() if sets})
