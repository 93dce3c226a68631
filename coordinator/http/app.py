"""The HTTP surface (PROTOCOL.md, "Transport", "Calls", "Admin").

Protocol calls: ``POST /v1/{join,sync,heartbeat,leave,commit,fetch}``, msgpack
both ways. Each handler reads the body (415 for another content type, 413 over
``--max-body-bytes``) and hands it to :class:`coordinator.http.calls.Calls`,
which decodes and validates it (400 ``INVALID_REQUEST`` naming the field),
submits one command to the runtime and encodes the answer; ``groupcoord
serve`` answers most of these calls on its lean path
(:mod:`coordinator.http.fast`) with the same :class:`Calls`. A refused request
never reaches the core, so it changes no state. Error bodies use the call's
encoding: msgpack here, JSON for the admin API.

With authentication on (``--auth-tokens``), the middleware of
:mod:`coordinator.auth` checks the token; the handlers check, after decoding,
that the token is granted the body's group (403) and that the member ids it
names were minted for it (else ``UNKNOWN_MEMBER_ID``, as for any unknown id).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web

from coordinator import admin_views, auth
from coordinator.console import build_console
from coordinator.core.commands import (
    DeleteGroup,
    DeleteResource,
    PutResource,
    RemoveMember,
)
from coordinator.core.effects import AdminResult
from coordinator.core.states import GroupState
from coordinator.http import calls as calls_module
from coordinator.http.calls import SERVER_FAILED, Calls
from coordinator.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from coordinator.metrics import Metrics
from coordinator.runtime.runtime import Answer, Runtime
from protocol import codec
from protocol.errors import ErrorCode
from protocol.limits import DEFAULT_MAX_METADATA_BYTES, MAX_PARTITIONS
from protocol.validate import (
    Fields,
    ValidationError,
    check_string,
)

log = logging.getLogger("groupcoord.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

RUNTIME_KEY: web.AppKey[Runtime] = web.AppKey("groupcoord.runtime", Runtime)
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("groupcoord.metrics", Metrics)
MAX_BODY_KEY: web.AppKey[int] = web.AppKey("groupcoord.max_body_bytes", int)
CALLS_KEY: web.AppKey[Calls] = web.AppKey("groupcoord.calls", Calls)


class Refused(Exception):
    """A request refused before it reached the core: its HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_error(status: int, code: str, message: str | None = None) -> web.Response:
    doc: dict[str, str] = {"error": code}
    if message is not None:
        doc["message"] = message
    return web.json_response(doc, status=status)


async def read_body(request: web.Request, content_types: frozenset[str],
                    limit: int | None = None) -> bytes:
    """The body, or :class:`Refused` (415 wrong type, 413 too large)."""
    # The raw header usually is exactly the media type: skip parsing it then.
    if (request.headers.get(hdrs.CONTENT_TYPE) not in content_types
            and request.content_type not in content_types):
        raise Refused(415, f"Content-Type must be {' or '.join(sorted(content_types))}, "
                           f"got {request.content_type!r}")
    if limit is None:
        limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise Refused(413, f"body of {request.content_length} bytes is over the "
                           f"limit of {limit} bytes")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Refused(413, f"body is over the limit of {limit} bytes") from None


# ---------------------------------------------------------------- protocol calls


_MSGPACK_HEADERS = {hdrs.CONTENT_TYPE: codec.CONTENT_TYPE}


def protocol_handler(api: str, calls: Calls) -> Handler:
    """The handler of ``POST /v1/<api>``: read the body, answer with :class:`Calls`.

    The lean path (:mod:`coordinator.http.fast`) serves these calls on most
    connections; this one serves them on a connection that went to aiohttp
    for an admin request, and in tests that mount the app alone. It answers
    its own failures (no error middleware in front of it).
    """
    perf_counter = time.perf_counter

    async def handle(request: web.Request) -> web.StreamResponse:
        started = perf_counter()
        try:
            content_type = request.headers.get(hdrs.CONTENT_TYPE)
            result = calls.early_refusal(api, content_type, request.content_length, started)
            if result is None:
                try:
                    body = await request.read()
                except web.HTTPRequestEntityTooLarge:
                    result = calls.refuse(api, 413, f"body is over the limit of "
                                          f"{calls.max_body_bytes} bytes", started)
                else:
                    result = await calls.call(api, body, content_type, request.remote or "",
                                              auth.token_of(request), started)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            result = calls.server_error(api)
        status, payload = result
        return web.Response(status=status, body=payload, headers=_MSGPACK_HEADERS)
    return handle


#: api -> (parse the wire map, make the command); read when an app is built.
PROTOCOL_APIS = calls_module.PROTOCOL_APIS


# ---------------------------------------------------------------- admin (JSON)


def _not_ready(runtime: Runtime) -> web.Response | None:
    if runtime.ready:
        return None
    code = (ErrorCode.COORDINATOR_NOT_AVAILABLE if runtime.failed.is_set()
            else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    return json_error(503, code.value)


def _path_name(request: web.Request, key: str) -> str:
    try:
        return check_string(request.match_info[key], key) or ""
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None


def _admin_answer(result: Answer, ok: Callable[[AdminResult], web.StreamResponse],
                  not_found: str) -> web.StreamResponse:
    assert isinstance(result, AdminResult)
    if result.error is None and result.found:
        return ok(result)
    if not result.found or result.error is ErrorCode.UNKNOWN_GROUP:
        return json_error(404, "UNKNOWN_GROUP" if result.error is ErrorCode.UNKNOWN_GROUP
                          else not_found)
    assert result.error is not None
    status = {ErrorCode.NON_EMPTY_GROUP: 409, ErrorCode.CHECKPOINT_LIMIT_REACHED: 409,
              ErrorCode.INVALID_REQUEST: 400,
              ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: 503,
              ErrorCode.COORDINATOR_NOT_AVAILABLE: 503}.get(result.error, 500)
    return json_error(status, result.error.value, result.message or None)


async def list_groups(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    states = _states_query(request)
    return web.json_response(
        {"groups": admin_views.group_rows(runtime, auth.token_of(request), states)})


_STATE_NAMES = {state.value.lower(): state.value for state in GroupState}


def _states_query(request: web.Request) -> frozenset[str] | None:
    """``?state=Stable,Empty`` (any case; repeated or comma-separated), else ``None``."""
    given = [s.strip() for value in request.query.getall("state", []) for s in value.split(",")]
    given = [s for s in given if s]
    if not given:
        return None
    unknown = [s for s in given if s.lower() not in _STATE_NAMES]
    if unknown:
        raise Refused(400, f"state: unknown state {unknown[0]!r}; expected one of "
                           f"{', '.join(sorted(_STATE_NAMES.values()))}")
    return frozenset(_STATE_NAMES[s.lower()] for s in given)


async def group_rebalances(request: web.Request) -> web.StreamResponse:
    """``GET /v1/groups/{group_id}/rebalances?limit=N``: newest first, from the journal."""
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    group_id = _path_name(request, "group_id")
    try:
        limit = admin_views.check_history_limit(request.query.get("limit", "20"))
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None
    rebalances = await admin_views.rebalance_history(runtime, group_id, limit)
    if rebalances is None:
        return json_error(404, ErrorCode.UNKNOWN_GROUP.value)
    return web.json_response({"group_id": group_id, "rebalances": rebalances})


async def describe_group(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    view = runtime.core.describe_group(_path_name(request, "group_id"))
    if view is None:
        return json_error(404, ErrorCode.UNKNOWN_GROUP.value)
    return web.json_response(admin_views.group_doc(view))


async def delete_group(request: web.Request) -> web.StreamResponse:
    group_id = _path_name(request, "group_id")
    result = await request.app[RUNTIME_KEY].call(lambda rid: DeleteGroup(rid, group_id))
    return _admin_answer(result, lambda _: web.Response(status=204), "UNKNOWN_GROUP")


async def group_checkpoints(request: web.Request) -> web.StreamResponse:
    """``GET /v1/groups/{group_id}/checkpoints``, sorted by resource."""
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    group_id = _path_name(request, "group_id")
    if runtime.core.describe_group(group_id) is None:
        return json_error(404, ErrorCode.UNKNOWN_GROUP.value)
    return web.json_response({"group_id": group_id,
                              "checkpoints": admin_views.checkpoints_doc(runtime, group_id)})


async def _json_object(request: web.Request, what: str) -> dict[str, Any]:
    body = await read_body(request, frozenset({"application/json"}))
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        # json.loads recurses once per nesting level: a deep body is bad input, not a bug.
        raise Refused(400, "body nests too deeply") from None
    if not isinstance(doc, dict):
        raise Refused(400, f"body: expected an object {what}")
    return doc


async def reset_checkpoints(request: web.Request) -> web.StreamResponse:
    """``POST /v1/groups/{group_id}/checkpoints/reset``: a dry run unless ``dry_run: false``."""
    group_id = _path_name(request, "group_id")
    doc = await _json_object(request, '{"dry_run": ..., "to_value" | "shift_by" | "delete" | '
                                      '"values": ...}')
    try:
        # bad input is refused before anything is submitted
        result = await admin_views.reset_checkpoints(request.app[RUNTIME_KEY], group_id, doc)
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None
    return _admin_answer(result, lambda r: web.json_response(
        admin_views.reset_doc(group_id, doc, r)), "UNKNOWN_GROUP")


async def remove_member(request: web.Request) -> web.StreamResponse:
    """``DELETE /v1/groups/{group_id}/members/{member_id}`` (Kafka's ``--remove-members``)."""
    group_id = _path_name(request, "group_id")
    member_id = _path_name(request, "member_id")
    result = await request.app[RUNTIME_KEY].call(
        lambda rid: RemoveMember(rid, group_id, member_id))
    return _admin_answer(result, lambda _: web.json_response(
        {"group_id": group_id, "removed": member_id}), "UNKNOWN_MEMBER_ID")


async def list_resources(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    return web.json_response({"resources_epoch": runtime.core.resources_epoch,
                              "resources": dict(runtime.core.catalog())})


async def put_resource(request: web.Request) -> web.StreamResponse:
    name = _path_name(request, "name")
    body = await read_body(request, frozenset({"application/json"}))
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        # json.loads recurses once per nesting level: a deep body is bad input, not a bug.
        raise Refused(400, "body nests too deeply") from None
    if not isinstance(doc, dict):
        raise Refused(400, 'body: expected an object {"partitions": N}')
    try:
        partitions = Fields(doc).integer("partitions", lo=1, hi=MAX_PARTITIONS)
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None
    result = await request.app[RUNTIME_KEY].call(lambda rid: PutResource(rid, name, partitions))
    return _admin_answer(result, lambda r: web.json_response(
        {"name": name, "partitions": partitions, "resources_epoch": r.resources_epoch}),
        "UNKNOWN_RESOURCE")


async def delete_resource(request: web.Request) -> web.StreamResponse:
    name = _path_name(request, "name")
    result = await request.app[RUNTIME_KEY].call(lambda rid: DeleteResource(rid, name))
    return _admin_answer(result, lambda r: web.json_response(
        {"name": name, "resources_epoch": r.resources_epoch}), "UNKNOWN_RESOURCE")


# ---------------------------------------------------------------- health, metrics


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if runtime.ready:
        return web.json_response({"status": "ready"})
    state = "failed" if runtime.failed.is_set() else "not ready"
    return web.json_response({"status": state}, status=503)


async def metrics_page(request: web.Request) -> web.StreamResponse:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


# ---------------------------------------------------------------- errors, app


def guarded(handler: Handler) -> Handler:
    """An admin/health handler whose refusals answer JSON and whose bugs answer 500.

    A wrapper per route rather than an app middleware: the protocol handlers,
    on the hot path, answer their own failures and skip this layer.
    """
    async def guard(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Refused as refused:
            return json_error(refused.status, ErrorCode.INVALID_REQUEST.value, refused.message)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return json_error(500, ErrorCode.UNKNOWN_SERVER_ERROR.value, SERVER_FAILED)
    return guard


def build_app(runtime: Runtime, metrics: Metrics, *, max_body_bytes: int,
              max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
              tokens: auth.TokenStore | None = None) -> web.Application:
    """The aiohttp app of every route; its :class:`Calls` is ``app[CALLS_KEY]``
    (the lean path of :mod:`coordinator.http.fast` answers with the same one)."""
    middlewares: list[Any] = []
    if tokens is not None:
        # A caller without a valid token learns nothing else.
        middlewares.append(auth.auth_middleware(tokens))
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[RUNTIME_KEY] = runtime
    app[METRICS_KEY] = metrics
    app[MAX_BODY_KEY] = max_body_bytes
    calls = Calls(runtime, metrics, max_body_bytes=max_body_bytes,
                  max_metadata_bytes=max_metadata_bytes, tokens=tokens, apis=PROTOCOL_APIS)
    app[CALLS_KEY] = calls
    for api in PROTOCOL_APIS:
        app.router.add_post(f"/v1/{api}", protocol_handler(api, calls))
    app.router.add_get("/v1/groups", guarded(list_groups))
    # A group id is one path segment ("/" in it as %2F); aiohttp matches the
    # encoded path, so the sub-resources below are never mistaken for a group.
    app.router.add_get("/v1/groups/{group_id}/rebalances", guarded(group_rebalances))
    app.router.add_get("/v1/groups/{group_id}/checkpoints", guarded(group_checkpoints))
    app.router.add_post("/v1/groups/{group_id}/checkpoints/reset", guarded(reset_checkpoints))
    app.router.add_delete("/v1/groups/{group_id}/members/{member_id}", guarded(remove_member))
    app.router.add_get("/v1/groups/{group_id:.+}", guarded(describe_group))
    app.router.add_delete("/v1/groups/{group_id:.+}", guarded(delete_group))
    app.router.add_get("/v1/resources", guarded(list_resources))
    app.router.add_put("/v1/resources/{name:.+}", guarded(put_resource))
    app.router.add_delete("/v1/resources/{name:.+}", guarded(delete_resource))
    app.router.add_get("/metrics", guarded(metrics_page))
    app.router.add_get("/healthz", guarded(healthz))
    app.router.add_get("/readyz", guarded(readyz))
    app.add_subapp("/console/", build_console(runtime, tokens=tokens))
    return app
