"""The admin API's documents that the server builds and the operators' tools read.

One definition for both sides: :mod:`coordinator.history` builds
:class:`RebalanceSummary` rows, ``groupcoord rebalances`` (:mod:`client.admin_cli`)
reads them through :class:`client.admin.AdminClient`, and ``mypy --strict``
checks every key either side names against these types, so the two cannot
drift apart. :func:`checkpoint_bytes_text` is how every tool shows a
checkpoint value that is bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

__all__ = ["PLACEMENT_FIELDS", "UNKNOWN_CAUSE", "Change", "MemberPlacement",
           "RebalanceMoves", "RebalanceSummary", "ResourceChange", "ResourceHistory",
           "checkpoint_bytes_text", "shows_placement"]

#: the cause of a resource that changed owner while no member's ``why`` said why
#: (a leader whose assignor does not explain its moves).
UNKNOWN_CAUSE = "unknown"


class RebalanceMoves(TypedDict):
    """What a rebalance changed, resource by resource (the ``resources`` protocol)."""

    #: owned in both generations, by different members.
    moved: int
    #: owned now, by nobody before.
    assigned: int
    #: owned before, by nobody now.
    revoked: int
    #: the resources counted above, each once, by the ``cause`` the members'
    #: ``why`` entries give it (its new owner's entry first, else its old
    #: owner's); :data:`UNKNOWN_CAUSE` for those no entry explains. The
    #: counts add up to ``moved + assigned + revoked``.
    causes: dict[str, int]


class RebalanceSummary(TypedDict):
    """One row of ``GET /v1/groups/{group_id}/rebalances``."""

    generation_id: int
    reason: str
    #: when the rebalance started and ended: Unix epoch milliseconds.
    started_ms: int
    ended_ms: int
    duration_ms: int
    protocol_name: str | None
    leader: str | None
    member_count: int
    joined: list[str]
    left: list[str]
    #: ``None`` when the group's assignments are not of the ``resources`` protocol.
    resources: RebalanceMoves | None


#: how a resource's owner changed from one generation to the next.
Change = Literal["kept", "moved", "assigned", "revoked", "unowned"]


class ResourceChange(TypedDict):
    """One generation of a resource's history
    (``GET /v1/groups/{group_id}/resources/{set}/{index}/history``)."""

    generation_id: int
    #: when the generation's assignment arrived: Unix epoch milliseconds.
    ended_ms: int
    #: why the rebalance started (the journal's reason).
    reason: str
    #: who owned the resource in this generation: the member's instance id when
    #: it is static, else its member id; ``None``: nobody.
    owner: str | None
    #: its member id (``None``: nobody).
    member_id: str | None
    #: ``"kept"`` (same owner as the generation before), ``"moved"`` (another
    #: member), ``"assigned"`` (nobody before), ``"revoked"`` (nobody now) or
    #: ``"unowned"`` (nobody, as before).
    change: Change
    #: why it changed (as :attr:`RebalanceMoves.causes`); ``None`` when it did not.
    cause: str | None
    #: members asked to warm it up in this generation (v1.2 ``standby``), as owners are named.
    standby: list[str]


class ResourceHistory(TypedDict):
    """``GET /v1/groups/{group_id}/resources/{set}/{index}/history``."""

    group_id: str
    set: str
    index: int
    #: newest first, one per journal row read; empty for a group whose
    #: assignments are not of the ``resources`` protocol.
    generations: list[ResourceChange]


class MemberPlacement(TypedDict):
    """What each member of a "resources" group shows besides its record in
    ``GET /v1/groups/{group_id}`` (v1.2, docs/protocol.md, "What a member reports")."""

    #: as the member sent them; ``None``: not sent.
    rack: str | None
    capacity: float | None
    #: the sum of the loads it reported; ``None``: it reported none.
    load: float | None
    draining: bool
    #: an operator asked it to drain (``POST .../drain``) and it has not
    #: rejoined draining yet: its heartbeat answers say ``drain: true``.
    drain_requested: bool
    #: what its assignment asks it to warm up: ``{set: [indexes]}``.
    standby: dict[str, list[int]]
    #: the standby resources it reported warm in its metadata: ``{set: [indexes]}``.
    warm: dict[str, list[int]]


#: the keys of :class:`MemberPlacement`.
PLACEMENT_FIELDS: tuple[str, ...] = tuple(MemberPlacement.__annotations__)


def shows_placement(member: Mapping[str, Any]) -> bool:
    """Did a member of ``GET /v1/groups/{group_id}`` report, or get, any of v1.2's
    placement fields (tools add their columns only then)?"""
    return any(member.get(name) not in (None, False, {}) for name in PLACEMENT_FIELDS)


def checkpoint_bytes_text(data: bytes, binary: Literal["hex", "base64"]) -> str:
    """A checkpoint value that is bytes, labelled: ``utf-8:"order-17"`` when the
    bytes are printable UTF-8 text, else ``hex:ff00`` or ``base64:/wA=``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return "utf-8:" + json.dumps(text, ensure_ascii=False)
    if binary == "hex":
        return "hex:" + data.hex()
    return "base64:" + base64.b64encode(data).decode("ascii")
