"""Checks a leader runs on an assignor's output before it sends it
(docs/protocol.md, "The embedded "resources" protocol"), whichever assignor made it.

``validate_assignment`` raises ``AssignmentError`` naming the broken rule,
the member and the resource. It does not require every resource to be
assigned: a cooperative round legitimately holds some back.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._layout import clean_catalog
from .model import Assignment, Resources, Subscription

__all__ = ["AssignmentError", "validate_assignment"]


class AssignmentError(ValueError):
    """An assignment breaks one of the protocol's rules."""

    def __init__(self, rule: str, member: str, detail: str) -> None:
        super().__init__(f"{rule}: member {member!r}: {detail}")
        self.rule = rule
        self.member = member


def validate_assignment(
    resources: Resources,
    subscriptions: Mapping[str, Subscription],
    result: Mapping[str, Assignment],
    cooperative: bool,
) -> None:
    """Rules, in order: every member present; no unknown member; no unknown
    set or index; no resource twice; only to subscribers; and, when
    ``cooperative``, no resource to a new owner while another member still
    claims it in ``owned`` (KIP-429)."""
    catalog = clean_catalog(resources)
    for member in subscriptions:
        if member not in result:
            raise AssignmentError("missing member", member, "no assignment for it")
    for member in result:
        if member not in subscriptions:
            raise AssignmentError("unknown member", member, "not in the subscriptions")

    claims: dict[tuple[str, int], list[str]] = {}
    if cooperative:
        for member, sub in subscriptions.items():
            for name, indexes in sub.owned.items():
                n = catalog.get(name, 0)
                for i in indexes:
                    if 0 <= i < n:
                        claims.setdefault((name, i), []).append(member)

    owner: dict[tuple[str, int], str] = {}
    for member, assignment in result.items():
        subscribed = set(subscriptions[member].sets)
        for name, indexes in assignment.assigned.items():
            if name not in catalog:
                raise AssignmentError("unknown set", member, f"set {name!r} is not in the catalog")
            if name not in subscribed:
                raise AssignmentError(
                    "not subscribed",
                    member,
                    f"{name}[{indexes[0] if indexes else '?'}]: "
                    f"member does not subscribe to set {name!r}",
                )
            n = catalog[name]
            for i in indexes:
                if not 0 <= i < n:
                    raise AssignmentError(
                        "unknown resource", member, f"{name}[{i}]: set has {n} resources"
                    )
                key = (name, i)
                other = owner.get(key)
                if other is not None:
                    raise AssignmentError(
                        "assigned twice", member, f"{name}[{i}] also goes to {other!r}"
                    )
                owner[key] = member
                if cooperative:
                    who = claims.get(key)
                    if who and member not in who:
                        raise AssignmentError(
                            "cooperative transfer",
                            member,
                            f"{name}[{i}] is still owned by {who[0]!r}; it must be "
                            "revoked before it moves",
                        )
