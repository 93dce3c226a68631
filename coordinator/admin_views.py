"""What the admin API shows of groups, spelled once for the JSON routes and the console.

:mod:`coordinator.http.app` answers these as JSON (docs/protocol.md, "Admin (JSON)" and
"Admin additions"); :mod:`coordinator.console` renders the same documents as
HTML. Each function reads the runtime (or the journal) and returns plain
JSON-ready values; neither knows about requests. Bad input raises
:class:`protocol.validate.ValidationError` naming the field.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from coordinator import auth, history, offload, placement
from coordinator.core.commands import ResetCheckpoints
from coordinator.core.effects import AdminResult
from coordinator.core.records import SHOWN_MEMBER_FIELDS, MemberRecord
from coordinator.core.views import GroupSummary, GroupView
from coordinator.runtime.runtime import Answer, CoreView
from coordinator.runtime.service import Service
from protocol.admin_docs import RebalanceSummary, ResourceHistory
from protocol.limits import MAX_PARTITIONS, MAX_RESOURCE_INDEX
from protocol.resources import PROTOCOL_TYPE as RESOURCES
from protocol.resources import ResourceAssignment
from protocol.validate import Scalar, ValidationError, check_int, check_string, check_value

#: most rebalances one history call answers.
MAX_HISTORY = 1000

_T = TypeVar("_T")


# ---------------------------------------------------------------- groups


def group_rows(runtime: Service, entry: auth.TokenEntry | None,
               states: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """``GET /v1/groups``: every group ``entry`` is granted, in a state of ``states``
    (``None``: any), sorted by group id."""
    now = runtime.clock.now_ms()
    return [group_row(runtime.core, g, now) for g in runtime.core.list_groups()
            if (states is None or g.state in states) and auth.authorize(entry, g.group_id)]


def group_row(core: CoreView, g: GroupSummary, now_ms: int) -> dict[str, Any]:
    """One group of ``GET /v1/groups``, its health at ``now_ms``."""
    health = core.health(g.group_id, now_ms)
    return {"group_id": g.group_id, "state": g.state,
            "protocol_type": g.protocol_type, "protocol_name": g.protocol_name,
            "generation_id": g.generation_id, "member_count": g.member_count,
            "health": health.status, "health_reasons": list(health.reasons)}


def assignment_json(protocol_type: str | None, data: bytes) -> Any:
    """``{set: [indexes]}`` for the "resources" protocol, else base64
    (docs/protocol.md, "Admin (JSON)")."""
    if protocol_type == RESOURCES:
        try:
            return {k: list(v) for k, v in ResourceAssignment.decode(data).assigned.items()}
        except ValidationError:
            pass  # a leader sent bytes that are not a resources map: show them raw
    return base64.b64encode(data).decode("ascii")


_shown_member_fields = attrgetter(*SHOWN_MEMBER_FIELDS)


def member_json(protocol_type: str | None, m: MemberRecord,
                protocol_name: str | None = None) -> dict[str, Any]:
    """A member as the admin API shows it: the record's ``SHOWN_MEMBER_FIELDS`` in
    order, the assignment decoded (none yet: ``b""``); for the "resources"
    protocol also what :func:`coordinator.placement.member_placement` reads of
    its metadata (for the group's ``protocol_name``) and assignment."""
    doc: dict[str, Any] = dict(zip(SHOWN_MEMBER_FIELDS, _shown_member_fields(m), strict=True))
    doc["assignment"] = assignment_json(protocol_type, m.assignment or b"")
    if protocol_type == RESOURCES:
        doc.update(placement.member_placement(m, protocol_name))
    return doc


def group_doc(view: GroupView) -> dict[str, Any]:
    """``GET /v1/groups/{group_id}``: the group, its members and their assignments."""
    return {"group_id": view.group_id, "state": view.state,
            "protocol_type": view.protocol_type, "protocol_name": view.protocol_name,
            "generation_id": view.generation_id, "leader": view.leader,
            "members": [member_json(view.protocol_type, m, view.protocol_name)
                        for m in view.members]}


def coordinator_doc(runtime: Service, group_id: str) -> dict[str, Any]:
    """The ``coordinator`` of ``GET /v1/groups/{group_id}``: which coordinator serves
    the group (an admin call about it is answered there): its ``id``, protocol
    ``url``, ``admin_url`` (``None`` where not known: a one-process server) and
    the group's ``partition``; ``serving`` false while no coordinator serves it (its
    partition is moving)."""
    found = runtime.find_coordinator(group_id)
    entry = next((c for c in runtime.coordinators() if found.url and c["url"] == found.url),
                 None)
    return {"serving": found.error is None,
            "id": None if entry is None else entry["id"], "url": found.url or None,
            "admin_url": (entry or {}).get("admin_url") or None,
            "partition": found.partition}


async def journal(runtime: Service, group_id: str, limit: int
                  ) -> list[dict[str, Any]] | None:
    """The group's ``limit + 1`` newest journal rows (the extra one counts what the
    oldest reported rebalance moved), newest first; ``None`` for an unknown group."""
    rows = await runtime.storage.rebalances(group_id, limit + 1)
    if not rows and runtime.core.describe_group(group_id) is None:
        return None
    return rows


def check_history_limit(text: str) -> int:
    """``?limit=`` of the history route: 1 to :data:`MAX_HISTORY`."""
    try:
        limit = int(text)
    except ValueError:
        raise ValidationError("limit", f"expected an integer, got {text!r}") from None
    if not 1 <= limit <= MAX_HISTORY:
        raise ValidationError("limit", f"must be between 1 and {MAX_HISTORY}, got {limit}")
    return limit


async def _read_rows(rows: Sequence[Mapping[str, Any]], reading: Callable[[], _T]) -> _T:
    """``reading()`` of journal ``rows``: on the offload worker when their
    assignments are large (decoding them would hold the event loop, which
    answers every group's calls), else here."""
    size = sum(len(blob) for row in rows for blob in (row.get("assignments") or {}).values())
    return await offload.run(reading) if size >= offload.LARGE_BODY_BYTES else reading()


async def rebalance_history(runtime: Service, group_id: str, limit: int
                            ) -> list[RebalanceSummary] | None:
    """``GET /v1/groups/{group_id}/rebalances``: newest first; ``None`` for an unknown group."""
    rows = await journal(runtime, group_id, limit)
    if rows is None:
        return None
    return await _read_rows(rows, lambda: history.summarize(rows, limit))


def check_resource_index(text: str) -> int:
    """The ``{index}`` of a resource's path: 0 to ``MAX_RESOURCE_INDEX``."""
    try:
        index = int(text)
    except ValueError:
        raise ValidationError("index", f"expected an integer, got {text!r}") from None
    return check_int(index, "index", lo=0, hi=MAX_RESOURCE_INDEX)


async def resource_history(runtime: Service, group_id: str, resource_set: str, index: int,
                           limit: int) -> ResourceHistory | None:
    """``GET /v1/groups/{group_id}/resources/{set}/{index}/history``: the resource's
    owner in each of the newest ``limit`` journal rows and why it changed, newest
    first; ``None`` for an unknown group."""
    rows = await journal(runtime, group_id, limit)
    if rows is None:
        return None
    generations = await _read_rows(
        rows, lambda: history.resource_history(rows, limit, (resource_set, index)))
    return ResourceHistory(group_id=group_id, set=resource_set, index=index,
                           generations=generations)


def drain_doc(group_id: str, result: AdminResult) -> dict[str, Any]:
    """The answer of ``POST .../members/{member}/drain``: the member it named, and
    whether it is ``draining`` already (else the request waits for it:
    ``drain_requested``)."""
    return {"group_id": group_id, "member_id": result.member_id,
            "group_instance_id": result.group_instance_id,
            "drain_requested": not result.draining, "draining": result.draining}


# ---------------------------------------------------------------- checkpoints


def checkpoint_json(resource_set: str, index: int, value: Scalar) -> dict[str, Any]:
    """One checkpoint as the admin API shows it: bytes as base64 with ``encoding``."""
    if isinstance(value, bytes):
        return {"set": resource_set, "index": index,
                "value": base64.b64encode(value).decode("ascii"), "encoding": "base64"}
    return {"set": resource_set, "index": index, "value": value}


def checkpoints_doc(runtime: Service, group_id: str) -> list[dict[str, Any]]:
    """``GET /v1/groups/{group_id}/checkpoints``: the group's checkpoints, by resource,
    with who wrote each and when (``committed_at``: Unix ms; ``member_id`` ``None``
    for an operator's reset; all ``None`` for rows stored before that was kept)."""
    core = runtime.core
    meta = core.checkpoint_meta(group_id)
    out = []
    for (s, i), v in sorted(core.checkpoints(group_id).items()):
        doc = checkpoint_json(s, i, v)
        written = meta.get((s, i))
        doc["committed_at"] = None if written is None else written.committed_ms
        doc["member_id"] = None if written is None else written.member_id
        doc["generation_id"] = None if written is None else written.generation_id
        out.append(doc)
    return out


def _resource(item: object, field: str) -> tuple[str, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValidationError(field, "expected [set, index]")
    name = check_string(item[0], f"{field}[0]")
    assert name is not None
    return name, check_int(item[1], f"{field}[1]", lo=0, hi=MAX_PARTITIONS - 1)


def _json_scalar(value: object, field: str, encoding: object = None) -> Scalar:
    if encoding is not None:
        if encoding != "base64":
            raise ValidationError(field, f"unknown encoding {encoding!r} (only \"base64\")")
        if not isinstance(value, str):
            raise ValidationError(field, "a base64 value must be a string")
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise ValidationError(field, "not valid base64") from None
    if isinstance(value, dict | list):
        raise ValidationError(field, "expected a scalar (number, string, true/false, null)")
    return check_value(value, field)


def parse_reset(group_id: str, doc: dict[str, Any], request_id: int) -> ResetCheckpoints:
    """The body of ``POST .../checkpoints/reset`` (docs/protocol.md, "Admin additions")."""
    dry_run = doc.get("dry_run", True)
    if not isinstance(dry_run, bool):
        raise ValidationError("dry_run", "expected true or false")
    resources = None
    if doc.get("resources") is not None:
        items = doc["resources"]
        if not isinstance(items, list):
            raise ValidationError("resources", "expected a list of [set, index]")
        resources = tuple(_resource(item, f"resources[{n}]") for n, item in enumerate(items))
    ways = [w for w in ("to_value", "shift_by", "delete", "values") if w in doc]
    if len(ways) != 1:
        raise ValidationError("body", "give exactly one of to_value, shift_by, delete, values"
                              + (f" (got {', '.join(ways)})" if ways else ""))
    way = ways[0]
    if way == "to_value":
        return ResetCheckpoints(request_id, group_id, dry_run, resources, has_value=True,
                                to_value=_json_scalar(doc["to_value"], "to_value",
                                                      doc.get("encoding")))
    if way == "shift_by":
        shift = check_int(doc["shift_by"], "shift_by", lo=-(2**63), hi=2**63 - 1)
        return ResetCheckpoints(request_id, group_id, dry_run, resources, shift_by=shift)
    if way == "delete":
        if doc["delete"] is not True:
            raise ValidationError("delete", "expected true")
        return ResetCheckpoints(request_id, group_id, dry_run, resources, delete=True)
    items = doc["values"]
    if not isinstance(items, list):
        raise ValidationError("values", "expected a list of [set, index, value]")
    values = []
    for n, item in enumerate(items):
        field = f"values[{n}]"
        if not isinstance(item, list) or len(item) not in (3, 4):
            raise ValidationError(field, 'expected [set, index, value] or '
                                         '[set, index, value, "base64"]')
        name, index = _resource(item[:2], field)
        value = _json_scalar(item[2], f"{field}[2]", item[3] if len(item) == 4 else None)
        if value is None:
            raise ValidationError(f"{field}[2]", "null: use delete to remove checkpoints")
        values.append((name, index, value))
    return ResetCheckpoints(request_id, group_id, dry_run, resources, values=tuple(values))


async def reset_checkpoints(runtime: Service, group_id: str, doc: dict[str, Any]) -> Answer:
    """Submit a reset (``doc`` as docs/protocol.md's body); the core's :class:`AdminResult`.

    Bad input raises :class:`ValidationError` before anything is submitted.
    """
    return await runtime.call(parse_reset(group_id, doc, runtime.new_request_id()))


def reset_doc(group_id: str, doc: dict[str, Any], result: AdminResult) -> dict[str, Any]:
    """The answer of a successful reset: the checkpoints it concerns, before and after."""
    return {"group_id": group_id, "dry_run": doc.get("dry_run", True),
            "before": _checkpoints_json(result.before),
            "after": _checkpoints_json(result.after)}


def _checkpoints_json(items: Iterable[tuple[str, int, Scalar]]) -> list[dict[str, Any]]:
    return [checkpoint_json(*c) for c in items]
