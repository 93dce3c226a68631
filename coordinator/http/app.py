"""The admin listener: admin JSON, ``/metrics``, ``/healthz``, ``/readyz`` (aiohttp).

``groupcoord serve`` has two listeners, each with one parser and one set of
limits (:mod:`coordinator.http.listeners`): the protocol calls are
answered by the lean protocol listener (:mod:`coordinator.http.fast`), and
everything an operator uses by this aiohttp app on ``--admin-port``, so the
two can be firewalled apart. ``GET /v1/resources`` (the catalog a leader
reads) is on both; a protocol call sent here gets a JSON 404 saying where the
protocol listener is.

A field that must be given once given twice (``Authorization`` among them)
is refused 400 as on the protocol listener, and without authentication a
``Host`` that does not name this listener is refused 403 (DNS rebinding;
:mod:`coordinator.http.headers`).

Admin calls speak JSON (docs/protocol.md, "Admin (JSON)"). A request with a
``Content-Encoding`` (other than ``identity``) is refused 415 before its body
is read, and the listener never decompresses (aiohttp's ``auto_decompress``
is off). With authentication on (``--auth-tokens``), the middleware of
:mod:`coordinator.auth` checks the token and the admin flag. A request
aiohttp's parser refuses (400, 431) is the client's mistake: it is counted in
``groupcoord_http_refused_total{listener="admin"}`` and said at DEBUG, never
logged as an error (:class:`AdminServerLog`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpProcessingError
from aiohttp.http_exceptions import LineTooLong

from coordinator import admin_views, auth
from coordinator.console import build_console
from coordinator.console.live import DEFAULT_LIMITS, StreamLimits
from coordinator.core.commands import (
    DeleteGroup,
    DeleteResource,
    DrainMember,
    PutResource,
    RemoveMember,
)
from coordinator.core.effects import AdminResult
from coordinator.core.states import GroupState
from coordinator.http import openapi
from coordinator.http.calls import SERVER_FAILED, catalog_answer
from coordinator.http.headers import (
    SINGLE_VALUE_FIELDS,
    duplicate_message,
    host_allowed,
    host_refused_message,
)
from coordinator.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from coordinator.metrics import Metrics
from coordinator.runtime.runtime import Answer
from coordinator.runtime.service import Service
from protocol.catalog import DEFAULT_PLACEMENT, parse_weights, parse_zones
from protocol.errors import ErrorCode
from protocol.limits import MAX_PARTITIONS
from protocol.messages import ADMIN_LISTENER, APIS, LISTENER_FIELD, NotCoordinatorAnswer
from protocol.validate import Fields, ValidationError, check_string

log = logging.getLogger("groupcoord.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

RUNTIME_KEY: web.AppKey[Service] = web.AppKey("groupcoord.runtime")
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("groupcoord.metrics", Metrics)
MAX_BODY_KEY: web.AppKey[int] = web.AppKey("groupcoord.max_body_bytes", int)


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
    except web.RequestPayloadError as exc:
        # A body cut short or badly chunked: the client's mistake, answered 400.
        raise Refused(400, f"the body could not be read: {exc}") from None


# ---------------------------------------------------------------- protocol calls


def protocol_elsewhere(api: str) -> Handler:
    """``POST /v1/<api>`` on the admin listener: a JSON 404 saying where it is served."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"error": ErrorCode.INVALID_REQUEST.value,
             "message": f"protocol call /v1/{api} is served on the protocol listener "
                        f"(--port), not on the admin listener",
             LISTENER_FIELD: ADMIN_LISTENER}, status=404)
    return handle


# ---------------------------------------------------------------- admin (JSON)


def _not_ready(runtime: Service) -> web.Response | None:
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
                          else not_found, result.message or None)
    assert result.error is not None
    status = {ErrorCode.NON_EMPTY_GROUP: 409, ErrorCode.CHECKPOINT_LIMIT_REACHED: 409,
              ErrorCode.INCONSISTENT_GROUP_PROTOCOL: 409,
              ErrorCode.INVALID_REQUEST: 400,
              ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: 503,
              ErrorCode.COORDINATOR_NOT_AVAILABLE: 503,
              ErrorCode.NOT_COORDINATOR: 503}.get(result.error, 500)
    return json_error(status, result.error.value, result.message or None)


async def list_groups(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    states = _states_query(request)
    # Several coordinators: the groups owned elsewhere, as last written (v1.1).
    await runtime.refresh_groups()
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


async def resource_history(request: web.Request) -> web.StreamResponse:
    """``GET /v1/groups/{group_id}/resources/{set}/{index}/history?limit=N``: one
    resource's owner in each of the newest journal rows, and why it changed."""
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    group_id = _path_name(request, "group_id")
    resource_set = _path_name(request, "set")
    try:
        index = admin_views.check_resource_index(request.match_info["index"])
        limit = admin_views.check_history_limit(request.query.get("limit", "20"))
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None
    doc = await admin_views.resource_history(runtime, group_id, resource_set, index, limit)
    if doc is None:
        return json_error(404, ErrorCode.UNKNOWN_GROUP.value)
    return web.json_response(doc)


async def describe_group(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if (busy := _not_ready(runtime)) is not None:
        return busy
    view = runtime.core.describe_group(_path_name(request, "group_id"))
    if view is None:
        return json_error(404, ErrorCode.UNKNOWN_GROUP.value)
    doc = admin_views.group_doc(view)
    doc["coordinator"] = admin_views.coordinator_doc(runtime, view.group_id)
    return web.json_response(doc)


async def delete_group(request: web.Request) -> web.StreamResponse:
    group_id = _path_name(request, "group_id")
    runtime = request.app[RUNTIME_KEY]
    result = await runtime.call(DeleteGroup(runtime.new_request_id(), group_id))
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
    runtime = request.app[RUNTIME_KEY]
    result = await runtime.call(RemoveMember(runtime.new_request_id(), group_id, member_id))
    return _admin_answer(result, lambda _: web.json_response(
        {"group_id": group_id, "removed": member_id}), "UNKNOWN_MEMBER_ID")


async def drain_member(request: web.Request) -> web.StreamResponse:
    """``POST /v1/groups/{group_id}/members/{member_id}/drain`` (v1.2, docs/protocol.md,
    "Drain"): the member (by member id, else a static member's instance id) is asked
    to drain through its heartbeat answers. No body."""
    group_id = _path_name(request, "group_id")
    member = _path_name(request, "member_id")
    runtime = request.app[RUNTIME_KEY]
    result = await runtime.call(DrainMember(runtime.new_request_id(), group_id, member))
    return _admin_answer(result, lambda r: web.json_response(
        admin_views.drain_doc(group_id, r)), ErrorCode.UNKNOWN_MEMBER_ID.value)


async def list_resources(request: web.Request) -> web.StreamResponse:
    status, body = catalog_answer(request.app[RUNTIME_KEY])
    return web.Response(status=status, body=body, content_type="application/json")


async def put_resource(request: web.Request) -> web.StreamResponse:
    """``PUT /v1/resources/{name}``: ``partitions``, and optionally ``weights`` and
    ``zones`` (absent: the set keeps its own; docs/protocol.md, v1.2 "Resources
    that differ"). Answers the set as the catalog then holds it."""
    name = _path_name(request, "name")
    doc = await _json_object(request, '{"partitions": N, "weights"?: ..., "zones"?: ...}')
    try:
        partitions = Fields(doc).integer("partitions", lo=1, hi=MAX_PARTITIONS)
        weights = None if "weights" not in doc else parse_weights(doc["weights"], "weights",
                                                                   partitions)
        zones = None if "zones" not in doc else parse_zones(doc["zones"], "zones", partitions)
    except ValidationError as exc:
        raise Refused(400, str(exc)) from None
    runtime = request.app[RUNTIME_KEY]
    result = await runtime.call(PutResource(runtime.new_request_id(), name, partitions, weights,
                                            zones))

    def answer(r: AdminResult) -> web.StreamResponse:
        placement = runtime.core.catalog_placement().get(name, DEFAULT_PLACEMENT)
        return web.json_response({"name": name, "partitions": partitions,
                                  "resources_epoch": r.resources_epoch,
                                  "weights": placement.weights.to_json(),
                                  "zones": placement.zones.to_json()})

    return _admin_answer(result, answer, "UNKNOWN_RESOURCE")


async def delete_resource(request: web.Request) -> web.StreamResponse:
    name = _path_name(request, "name")
    runtime = request.app[RUNTIME_KEY]
    result = await runtime.call(DeleteResource(runtime.new_request_id(), name))
    return _admin_answer(result, lambda r: web.json_response(
        {"name": name, "resources_epoch": r.resources_epoch}), "UNKNOWN_RESOURCE")


# ---------------------------------------------------------------- health, metrics


async def list_coordinators(request: web.Request) -> web.StreamResponse:
    """``GET /v1/coordinators`` (v1.1): the live coordinators, their URLs and the
    partitions each owns, with since when."""
    return web.json_response({"coordinators": request.app[RUNTIME_KEY].coordinators()})


#: set on an admin call one coordinator forwards to another: never forwarded again.
FORWARDED_HEADER = "X-Groupcoord-Forwarded"
#: seconds a forwarded admin call may take.
FORWARD_TIMEOUT_S = 10.0
_FORWARD_SESSION: web.AppKey[list[Any]] = web.AppKey("groupcoord.forward_session")


@web.middleware
async def route_group_calls(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Several coordinators (v1.1): an admin call about one group is answered where
    the group is served; here if this coordinator owns its partition, else it is
    forwarded once to the owner's admin listener (same method, path, body and
    credentials). A one-process server serves every group: nothing to do."""
    group_id = request.match_info.get("group_id")
    service = request.app[RUNTIME_KEY]
    if group_id is None or not service.ready:
        return await handler(request)
    target = service.route(group_id)
    if not isinstance(target, NotCoordinatorAnswer):
        return await handler(request)
    url = service.owner_admin_url(group_id)
    if url is None or request.headers.get(FORWARDED_HEADER):
        return json_error(503, target.error.value,
                          f"group {group_id!r} is not served here and its owner is not "
                          f"known yet (partition moving); retry shortly")
    if request.path.startswith("/console/"):
        # A browser page: sent to the owner's console (its session is its own).
        if request.method != "GET":
            return json_error(503, target.error.value,
                              f"group {group_id!r} is served by {url}: use its console")
        raise web.HTTPTemporaryRedirect(url.rstrip("/") + request.raw_path)
    return await _forward(request, url)


async def _forward(request: web.Request, base_url: str) -> web.StreamResponse:
    import aiohttp

    holder = request.app[_FORWARD_SESSION]
    if not holder:
        holder.append(aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S), auto_decompress=False))
    session: aiohttp.ClientSession = holder[0]
    headers = {FORWARDED_HEADER: "1"}
    for name in (hdrs.AUTHORIZATION, hdrs.CONTENT_TYPE, hdrs.ACCEPT):
        if name in request.headers:
            headers[name] = request.headers[name]
    body = await request.read() if request.can_read_body else None
    try:
        async with session.request(request.method, base_url.rstrip("/") + request.raw_path,
                                   data=body, headers=headers) as answer:
            payload = await answer.read()
            return web.Response(status=answer.status, body=payload, headers={
                hdrs.CONTENT_TYPE: answer.headers.get(hdrs.CONTENT_TYPE, "application/json")})
    except (aiohttp.ClientError, TimeoutError) as exc:
        return json_error(503, ErrorCode.COORDINATOR_NOT_AVAILABLE.value,
                          f"the coordinator owning this group ({base_url}) did not answer: "
                          f"{type(exc).__name__}")


async def _close_forward_session(app: web.Application) -> None:
    for session in app[_FORWARD_SESSION]:
        await session.close()


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME_KEY]
    if runtime.ready:
        return web.json_response({"status": "ready"})
    state = "failed" if runtime.failed.is_set() else "not ready"
    return web.json_response({"status": state}, status=503)


async def openapi_description(request: web.Request) -> web.StreamResponse:
    """``GET /v1/openapi.json``: every route of both listeners (coordinator/http/openapi.py)."""
    return web.json_response(openapi.description())


async def metrics_page(request: web.Request) -> web.StreamResponse:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


# ---------------------------------------------------------------- errors, app


def guarded(handler: Handler) -> Handler:
    """An admin/health handler whose refusals answer JSON and whose bugs answer 500."""
    async def guard(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Refused as refused:
            return json_error(refused.status, ErrorCode.INVALID_REQUEST.value, refused.message)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("unhandled error on %s %r", request.method, request.path)
            return json_error(500, ErrorCode.UNKNOWN_SERVER_ERROR.value, SERVER_FAILED)
    return guard


def check_header_fields(metrics: Metrics, admin_names: frozenset[str] | None) -> Any:
    """A middleware, first of all: 400 for a field of
    :data:`~coordinator.http.headers.SINGLE_VALUE_FIELDS` given twice (aiohttp's
    parser refuses some of them itself, not ``Authorization``), connection closed;
    with ``admin_names`` (authentication off), 403 for a ``Host`` that is not a name
    of this listener (:func:`~coordinator.http.headers.host_allowed`)."""
    refused = metrics.http_refused

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        fields = request.headers
        for name in SINGLE_VALUE_FIELDS:
            if len(fields.getall(name, ())) > 1:
                refused.labels("admin", "duplicate_header").inc()
                response = web.Response(status=400, text=duplicate_message(name) + "\n")
                response.force_close()
                return response
        if admin_names is not None:
            host = fields.get(hdrs.HOST)
            if not host_allowed(host, admin_names):
                assert host is not None
                refused.labels("admin", "host_not_allowed").inc()
                return json_error(403, ErrorCode.INVALID_REQUEST.value,
                                  host_refused_message(host))
        return await handler(request)

    return middleware


def refuse_content_encoding(metrics: Metrics) -> Any:
    """A middleware: 415 for a request with a ``Content-Encoding`` other than
    ``identity``, before anything reads its body (no body here is decompressed)."""
    refused = metrics.http_refused

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        encoding = request.headers.get(hdrs.CONTENT_ENCODING)
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            refused.labels("admin", "content_encoding").inc()
            return json_error(415, ErrorCode.INVALID_REQUEST.value,
                              f"Content-Encoding {encoding.strip()[:40]!r} is not accepted: "
                              f"send the body unencoded")
        return await handler(request)

    return middleware


class AdminServerLog(logging.LoggerAdapter[logging.Logger]):
    """The logger of the admin listener's aiohttp request handlers.

    aiohttp logs a request its parser refuses (a bad request line, a field
    over 8 KiB, ...) at ERROR with a traceback, once per request: any client
    could fill the log with them. Here such a refusal is counted
    (``groupcoord_http_refused_total{listener="admin"}``) and said at DEBUG;
    everything else (a bug) is logged as aiohttp logs it.
    """

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(logging.getLogger("groupcoord.http.admin"), {})
        self._refused = metrics.http_refused

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        error = (exc_info if isinstance(exc_info, BaseException)
                 else exc_info[1] if isinstance(exc_info, tuple) else None)
        if isinstance(error, HttpProcessingError):
            code = error.code
            reason = ("head_too_large" if code == 431 or isinstance(error, LineTooLong)
                      else "body_too_large" if code == 413 else "malformed")
            self._refused.labels("admin", reason).inc()
            kwargs.pop("exc_info")
            level = logging.DEBUG
            msg = f"admin listener: refused a request ({reason}): {error}"
            args = ()
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs


def build_admin_app(runtime: Service, metrics: Metrics, *, max_body_bytes: int,
                    tokens: auth.TokenStore | None = None,
                    admin_names: frozenset[str] = frozenset(),
                    console_limits: StreamLimits = DEFAULT_LIMITS) -> web.Application:
    """The aiohttp app of the admin listener (module docs). ``admin_names``: the
    ``Host`` names it answers to without ``tokens``, besides localhost and IP
    addresses (:func:`coordinator.http.headers.admin_names`)."""
    middlewares: list[Any] = [
        # With tokens, a page that rebinds a name to us has no token to send.
        check_header_fields(metrics, admin_names if tokens is None else None),
        refuse_content_encoding(metrics)]
    if tokens is not None:
        # A caller without a valid token learns nothing else.
        middlewares.append(auth.auth_middleware(tokens))
    middlewares.append(route_group_calls)
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[RUNTIME_KEY] = runtime
    app[_FORWARD_SESSION] = []
    app.on_cleanup.append(_close_forward_session)
    app[METRICS_KEY] = metrics
    app[MAX_BODY_KEY] = max_body_bytes
    for api in APIS:
        app.router.add_post(f"/v1/{api}", protocol_elsewhere(api))
    app.router.add_get("/v1/groups", guarded(list_groups))
    # A group id is one path segment ("/" in it as %2F); aiohttp matches the
    # encoded path, so the sub-resources below are never mistaken for a group.
    app.router.add_get("/v1/groups/{group_id}/rebalances", guarded(group_rebalances))
    app.router.add_get("/v1/groups/{group_id}/resources/{set}/{index}/history",
                       guarded(resource_history))
    app.router.add_get("/v1/groups/{group_id}/checkpoints", guarded(group_checkpoints))
    app.router.add_post("/v1/groups/{group_id}/checkpoints/reset", guarded(reset_checkpoints))
    app.router.add_delete("/v1/groups/{group_id}/members/{member_id}", guarded(remove_member))
    app.router.add_post("/v1/groups/{group_id}/members/{member_id}/drain",
                        guarded(drain_member))
    app.router.add_get("/v1/groups/{group_id:.+}", guarded(describe_group))
    app.router.add_delete("/v1/groups/{group_id:.+}", guarded(delete_group))
    app.router.add_get("/v1/resources", guarded(list_resources))
    app.router.add_put("/v1/resources/{name:.+}", guarded(put_resource))
    app.router.add_delete("/v1/resources/{name:.+}", guarded(delete_resource))
    app.router.add_get("/v1/coordinators", guarded(list_coordinators))
    app.router.add_get("/v1/openapi.json", guarded(openapi_description))
    app.router.add_get("/metrics", guarded(metrics_page))
    app.router.add_get("/healthz", guarded(healthz))
    app.router.add_get("/readyz", guarded(readyz))
    app.add_subapp("/console/", build_console(runtime, tokens=tokens, limits=console_limits))
    return app
