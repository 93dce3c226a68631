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
from typing import Literal, TypedDict

__all__ = ["RebalanceMoves", "RebalanceSummary", "checkpoint_bytes_text"]


class RebalanceMoves(TypedDict):
    """What a rebalance changed, resource by resource (the ``resources`` protocol)."""

    #: owned in both generations, by different members.
    moved: int
    #: owned now, by nobody before.
    assigned: int
    #: owned before, by nobody now.
    revoked: int


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
