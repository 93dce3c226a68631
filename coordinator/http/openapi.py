"""An OpenAPI 3.1 description of every route (``GET /v1/openapi.json``).

Both listeners are described: the protocol calls on the protocol listener
(``--port``, msgpack or JSON bodies, docs/protocol.md, "Calls" and "JSON on the
protocol calls"), everything else on the admin listener (``--admin-port``).
Limits come from :mod:`protocol.limits` and error codes from
:class:`protocol.errors.ErrorCode`, so the description cannot drift from what
the server checks. ``tests/http/test_openapi.py`` validates it with
``openapi-spec-validator`` and compares its paths with the routes the
listeners really serve.

The schemas describe the JSON form: byte fields are base64 strings, and a
bytes checkpoint value is ``{"base64": "..."}``. The msgpack form is the same
document with those as msgpack ``bin``.
"""

from __future__ import annotations

import functools
from typing import Any

from protocol.catalog import MAX_OVERRIDES, MAX_WEIGHT, MAX_ZONES
from protocol.errors import ErrorCode
from protocol.limits import (
    MAX_FETCH_CHECKPOINTS,
    MAX_GENERATION_ID,
    MAX_HEARTBEAT_WAIT_MS,
    MAX_NAME_LENGTH,
    MAX_PARTITIONS,
    MAX_PROTOCOLS_PER_JOIN,
    MAX_RESOURCE_INDEX,
    MAX_TIMEOUT_MS,
)

#: ``x-groupcoord-listener`` of each path: which listener serves it.
PROTOCOL_LISTENER, ADMIN_LISTENER = "protocol", "admin"

_NAME: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH,
                         "description": "no control or format characters"}
_OPT_NAME: dict[str, Any] = {"type": ["string", "null"], "maxLength": MAX_NAME_LENGTH}
_B64: dict[str, Any] = {"type": "string", "contentEncoding": "base64"}
_GENERATION: dict[str, Any] = {"type": "integer", "minimum": -1, "maximum": MAX_GENERATION_ID}
_TIMEOUT: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_TIMEOUT_MS}
_INDEX: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_RESOURCE_INDEX}
_VALUE: dict[str, Any] = {
    "description": 'a checkpoint value: a scalar, or bytes as {"base64": "..."}',
    "oneOf": [{"type": ["string", "number", "boolean", "null"]},
              {"type": "object", "required": ["base64"], "additionalProperties": False,
               "properties": {"base64": _B64}}]}
_RESOURCE: dict[str, Any] = {"type": "array", "prefixItems": [_NAME, _INDEX],
                             "minItems": 2, "maxItems": 2}
_CHECKPOINT: dict[str, Any] = {"type": "array", "prefixItems": [_NAME, _INDEX, _VALUE],
                               "minItems": 3, "maxItems": 3}
_ZONE_LIST: dict[str, Any] = {
    "description": "home zones; null: anywhere",
    "oneOf": [{"type": "null"},
              {"type": "array", "items": _NAME, "minItems": 1, "maxItems": MAX_ZONES,
               "uniqueItems": True}]}
_OVERRIDE_INDEX: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_PARTITIONS - 1,
                                   "description": "below the set's partitions, each once"}
_WEIGHT: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": MAX_WEIGHT}
#: a set's weights and zones (docs/protocol.md, v1.2 "Resources that differ").


def _sparse(description: str, value: dict[str, Any]) -> dict[str, Any]:
    """A default ``value`` and ``[index, value]`` overrides (protocol.catalog)."""
    return {
        "type": "object", "additionalProperties": False, "description": description,
        "properties": {"default": value, "overrides": {
            "type": "array", "maxItems": MAX_OVERRIDES,
            "items": {"type": "array", "prefixItems": [_OVERRIDE_INDEX, value],
                      "minItems": 2, "maxItems": 2}}}}


_WEIGHTS = _sparse("the load each resource is expected to carry (default 1.0)", _WEIGHT)
_ZONES = _sparse("where each resource is best served (default: anywhere)", _ZONE_LIST)
_ERROR_CODE: dict[str, Any] = {"type": ["string", "null"],
                               "enum": [*(code.value for code in ErrorCode), None]}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _error_body() -> dict[str, Any]:
    return _object(["error"], error={"type": "string"}, message={"type": "string"})


_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "join": ("JoinGroup: join or rejoin; parks until the join phase completes", _object(
        ["group_id", "member_id", "protocol_type", "protocols", "session_timeout_ms",
         "rebalance_timeout_ms"],
        group_id=_NAME, member_id={"type": "string", "maxLength": MAX_NAME_LENGTH},
        group_instance_id=_OPT_NAME, protocol_type=_NAME,
        protocols={"type": "array", "minItems": 1, "maxItems": MAX_PROTOCOLS_PER_JOIN,
                   "items": {"type": "array", "prefixItems": [_NAME, _B64],
                             "minItems": 2, "maxItems": 2}},
        session_timeout_ms=_TIMEOUT, rebalance_timeout_ms=_TIMEOUT, client_id=_OPT_NAME,
        reason={"type": ["string", "null"]}), _object(
        ["error", "generation_id", "member_id"], error=_ERROR_CODE, generation_id=_GENERATION,
        protocol_type=_OPT_NAME, protocol_name=_OPT_NAME, leader={"type": "string"},
        member_id={"type": "string"}, skip_assignment={"type": "boolean"},
        message={"type": "string"},
        members={"type": "array", "items": _object(
            ["member_id", "metadata"], member_id=_NAME, group_instance_id=_OPT_NAME,
            metadata=_B64)})),
    "sync": ("SyncGroup: the leader sends every member's assignment; each gets its own",
             _object(["group_id", "member_id", "generation_id"], group_id=_NAME,
                     member_id=_NAME, generation_id=_GENERATION,
                     group_instance_id=_OPT_NAME, protocol_type=_OPT_NAME,
                     protocol_name=_OPT_NAME,
                     assignments={"type": "array", "items": _object(
                         ["member_id", "assignment"], member_id=_NAME, assignment=_B64)}),
             _object(["error"], error=_ERROR_CODE, protocol_type=_OPT_NAME,
                     protocol_name=_OPT_NAME, assignment=_B64,
                     resources_epoch={"type": "integer", "minimum": 0})),
    "heartbeat": ("Heartbeat: keep the session; REBALANCE_IN_PROGRESS says rejoin",
                  _object(["group_id", "member_id", "generation_id"], group_id=_NAME,
                          member_id=_NAME, generation_id=_GENERATION,
                          group_instance_id=_OPT_NAME,
                          wait_ms={"type": "integer", "minimum": 0,
                                   "maximum": MAX_HEARTBEAT_WAIT_MS}),
                  _object(["error"], error=_ERROR_CODE,
                          resources_epoch={"type": "integer", "minimum": 0})),
    "leave": ("LeaveGroup: members leave; the group rebalances once for the batch",
              _object(["group_id", "members"], group_id=_NAME,
                      members={"type": "array", "minItems": 1, "items": _object(
                          ["member_id"], member_id={"type": "string"},
                          group_instance_id=_OPT_NAME, reason={"type": ["string", "null"]})}),
              _object(["error"], error=_ERROR_CODE, members={"type": "array", "items": _object(
                  ["member_id", "error"], member_id={"type": "string"},
                  group_instance_id=_OPT_NAME, error=_ERROR_CODE)})),
    "commit": ("Commit checkpoints, fenced by the generation (a simple commit: -1)",
               _object(["group_id", "member_id", "generation_id", "checkpoints"],
                       group_id=_NAME, member_id=_NAME, generation_id=_GENERATION,
                       group_instance_id=_OPT_NAME,
                       checkpoints={"type": "array", "items": _CHECKPOINT},
                       sequence={"type": "integer", "minimum": 0,
                                 "description": "v1.1 extension: the member's commit count; "
                                                "a commit older than one applied is not applied"}),
               _object(["error"], error=_ERROR_CODE, message={"type": "string"})),
    "fetch": ("Fetch checkpoints: named resources, or all of them in pages (after/next)",
              _object(["group_id"], group_id=_NAME,
                      resources={"type": ["array", "null"], "items": _RESOURCE,
                                 "maxItems": MAX_FETCH_CHECKPOINTS},
                      after={"description": "[] for the first page, then the answer's next",
                             "type": ["array", "null"], "maxItems": 2}),
              _object(["error", "checkpoints"], error=_ERROR_CODE,
                      checkpoints={"type": "array", "items": _CHECKPOINT,
                                   "maxItems": MAX_FETCH_CHECKPOINTS},
                      next={"type": ["array", "null"]}, message={"type": "string"})),
    "find_coordinator": (
        "FindCoordinator (v1.1): the URL of the coordinator owning the group's partition",
        _object(["group_id"], group_id=_NAME),
        _object(["error"], error=_ERROR_CODE, url={"type": "string"},
                partition={"type": "integer", "minimum": 0})),
}


def _json(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {"content": {"application/json": {"schema": schema}}}
    doc["description"] = description or "JSON"
    return doc


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {400: "bad input, naming the field; nothing changed",
               401: "no valid bearer token", 403: "outside the token's grant or role",
               404: "unknown group, member or resource", 409: "refused in the group's state",
               413: "body over --max-body-bytes", 415: "unsupported Content-Type or a "
               "Content-Encoding", 503: "loading, or stopped after a storage failure"}
    return {str(s): _json(_error_body(), meaning[s]) for s in statuses}


def _protocol_call(api: str) -> dict[str, Any]:
    summary, request, response = _CALLS[api]
    both = {"application/msgpack": {"schema": request}, "application/json": {"schema": request}}
    answer = {"application/msgpack": {"schema": response}, "application/json": {"schema": response}}
    return {"post": {
        "operationId": api, "summary": summary, "tags": ["protocol"],
        "requestBody": {"required": True, "content": both},
        "responses": {"200": {"description": "a protocol outcome: error null or a code",
                              "content": answer}, **_errors(400, 401, 403, 413, 415)}}}


_GROUP_ID = {"name": "group_id", "in": "path", "required": True,
             "schema": _NAME, "description": "one path segment: '/' as %2F"}
_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}
_HTML = {"content": {"text/html": {"schema": {"type": "string"}}}}


def _get(op: str, summary: str, ok: dict[str, Any], *errors: int,
         parameters: list[dict[str, Any]] | None = None, tag: str = "admin") -> dict[str, Any]:
    doc: dict[str, Any] = {"operationId": op, "summary": summary, "tags": [tag],
                           "responses": {"200": {"description": "OK", **ok}, **_errors(*errors)}}
    if parameters:
        doc["parameters"] = parameters
    return doc


def _admin_paths() -> dict[str, Any]:
    group_row = _object(["group_id", "state", "generation_id", "member_count", "health"],
                        group_id=_NAME, state={"type": "string"},
                        protocol_type=_OPT_NAME, protocol_name=_OPT_NAME,
                        generation_id={"type": "integer"}, member_count={"type": "integer"},
                        health={"type": "string", "enum": ["OK", "STORM", "REWIND", "STALLED"]},
                        health_reasons={"type": "array", "items": {"type": "string"}})
    checkpoint = _object(["set", "index", "value"], set=_NAME, index=_INDEX, value={},
                         encoding={"const": "base64"},
                         committed_at={"type": ["integer", "null"]},
                         member_id=_OPT_NAME, generation_id={"type": ["integer", "null"]})
    member_id = {"name": "member_id", "in": "path", "required": True, "schema": _NAME}
    name = {"name": "name", "in": "path", "required": True, "schema": _NAME}
    return {
        "/v1/groups": {"get": _get(
            "listGroups", "every group the token may see, with state and health",
            _json(_object(["groups"], groups={"type": "array", "items": group_row})), 400,
            401, 403, 503, parameters=[{"name": "state", "in": "query", "required": False,
                                         "schema": {"type": "string"},
                                         "description": "comma-separated states"}])},
        "/v1/groups/{group_id}": {
            "parameters": [_GROUP_ID],
            "get": _get("describeGroup", "a group, its members and decoded assignments",
                        _json({"type": "object"}), 401, 403, 404, 503),
            "delete": {"operationId": "deleteGroup", "summary": "delete an Empty group",
                       "tags": ["admin"], "responses": {
                           "204": {"description": "deleted"}, **_errors(401, 403, 404, 409)}}},
        "/v1/groups/{group_id}/checkpoints": {
            "parameters": [_GROUP_ID],
            "get": _get("groupCheckpoints", "checkpoints, and who wrote each and when",
                        _json(_object(["checkpoints"], checkpoints={
                            "type": "array", "items": checkpoint})), 401, 403, 404, 503)},
        "/v1/groups/{group_id}/checkpoints/reset": {
            "parameters": [_GROUP_ID],
            "post": {"operationId": "resetCheckpoints", "tags": ["admin"],
                     "summary": "reset checkpoints of an Empty group; a dry run unless "
                                "dry_run is false",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": _object([], dry_run={"type": "boolean", "default": True},
                                           resources={"type": "array", "items": _RESOURCE},
                                           to_value={}, shift_by={"type": "integer"},
                                           delete={"const": True},
                                           values={"type": "array"})}}},
                     "responses": {"200": _json(_object(
                         ["dry_run", "before", "after"], dry_run={"type": "boolean"},
                         before={"type": "array", "items": checkpoint},
                         after={"type": "array", "items": checkpoint}), "before and after"),
                         **_errors(400, 401, 403, 404, 409, 415)}}},
        "/v1/groups/{group_id}/rebalances": {
            "parameters": [_GROUP_ID],
            "get": _get("groupRebalances", "the journal: why, how long, who, what moved",
                        _json({"type": "object"}), 400, 401, 403, 404, 503,
                        parameters=[{"name": "limit", "in": "query", "required": False,
                                     "schema": {"type": "integer", "minimum": 1,
                                                "maximum": 1000, "default": 20}}])},
        "/v1/groups/{group_id}/resources/{set}/{index}/history": {
            "parameters": [_GROUP_ID,
                           {"name": "set", "in": "path", "required": True, "schema": _NAME,
                            "description": "one path segment: '/' as %2F"},
                           {"name": "index", "in": "path", "required": True,
                            "schema": _INDEX}],
            "get": _get("resourceHistory", "one resource's owners over the journal's "
                        "generations, and why each change", _json(_object(
                            ["group_id", "set", "index", "generations"], group_id=_NAME,
                            set=_NAME, index=_INDEX, generations={
                                "type": "array", "items": _object(
                                    ["generation_id", "ended_ms", "reason", "owner",
                                     "member_id", "change", "cause", "standby"],
                                    generation_id={"type": "integer"},
                                    ended_ms={"type": "integer"},
                                    reason={"type": "string"}, owner=_OPT_NAME,
                                    member_id=_OPT_NAME,
                                    change={"type": "string", "enum": [
                                        "kept", "moved", "assigned", "revoked", "unowned"]},
                                    cause={"type": ["string", "null"]},
                                    standby={"type": "array",
                                             "items": {"type": "string"}})})),
                        400, 401, 403, 404, 503,
                        parameters=[{"name": "limit", "in": "query", "required": False,
                                     "schema": {"type": "integer", "minimum": 1,
                                                "maximum": 1000, "default": 20}}])},
        "/v1/groups/{group_id}/members/{member_id}": {
            "parameters": [_GROUP_ID, member_id],
            "delete": {"operationId": "removeMember", "tags": ["admin"],
                       "summary": "remove one member; the group rebalances",
                       "responses": {"200": _json({"type": "object"}, "removed"),
                                     **_errors(401, 403, 404)}}},
        "/v1/groups/{group_id}/members/{member_id}/drain": {
            "parameters": [_GROUP_ID, {**member_id, "description":
                                       "a member id, else a static member's instance id"}],
            "post": {"operationId": "drainMember", "tags": ["admin"],
                     "summary": "ask a member of a resources group to drain (v1.2): its "
                                "heartbeat answers say drain: true until it rejoins draining "
                                "or leaves",
                     "description": "No body. A member draining already is answered "
                                    "draining: true and nothing is asked; asking twice "
                                    "changes nothing. 409: the group is not of the resources "
                                    "protocol.",
                     "responses": {"200": _json(_object(
                         ["group_id", "member_id", "group_instance_id", "drain_requested",
                          "draining"], group_id=_NAME, member_id=_NAME,
                         group_instance_id=_OPT_NAME, drain_requested={"type": "boolean"},
                         draining={"type": "boolean"}), "asked, or draining already"),
                         **_errors(401, 403, 404, 409, 503)}}},
        "/v1/resources/{name}": {
            "parameters": [name],
            "put": {"operationId": "putResource", "tags": ["admin"],
                    "summary": "create or resize a resource set, set its weights and zones "
                               "(admin of every group)",
                    "description": "weights or zones absent: the set keeps its own; given: "
                                   "they replace them ({} is the default again). A size that "
                                   "would leave a kept override outside is refused (400).",
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": _object(["partitions"], partitions={
                            "type": "integer", "minimum": 1, "maximum": MAX_PARTITIONS},
                            weights=_WEIGHTS, zones=_ZONES)}}},
                    "responses": {"200": _json(_object(
                        ["name", "partitions", "resources_epoch", "weights", "zones"],
                        name=_NAME, partitions={"type": "integer"},
                        resources_epoch={"type": "integer"}, weights=_WEIGHTS, zones=_ZONES),
                        "the set as the catalog then holds it, and the epoch"),
                                  **_errors(400, 401, 403, 415)}},
            "delete": {"operationId": "deleteResource", "tags": ["admin"],
                       "summary": "delete a resource set (admin of every group)",
                       "responses": {"200": _json({"type": "object"}, "the new epoch"),
                                     **_errors(401, 403, 404)}}},
        "/v1/coordinators": {"get": _get(
            "listCoordinators", "the live coordinators, their URLs and the partitions each "
            "owns (one entry for a one-process server; viewer or admin role)",
            _json(_object(["coordinators"], coordinators={"type": "array", "items": _object(
                ["id", "url", "partitions"], id={"type": "string"}, url={"type": "string"},
                admin_url={"type": "string"}, started_at={"type": ["string", "null"]},
                partitions={"type": "array", "items": _object(
                    ["partition", "epoch"], partition={"type": "integer"},
                    epoch={"type": "integer"}, since={"type": ["string", "null"]})})})),
            401, 403, tag="operations")},
        "/metrics": {"get": _get("metrics", "Prometheus text", _TEXT, tag="operations")},
        "/healthz": {"get": _get("healthz", "alive", _json({"type": "object"}),
                                 tag="operations")},
        "/readyz": {"get": _get("readyz", "state loaded, serving", _json({"type": "object"}),
                                503, tag="operations")},
        "/v1/openapi.json": {"get": _get("openapi", "this description (viewer or admin role)",
                                         _json({"type": "object"}), 401, 403,
                                         tag="operations")},
        "/console": {"get": {"operationId": "consoleRedirect", "tags": ["console"],
                             "summary": "redirects to /console/",
                             "responses": {"308": {"description": "to /console/"}}}},
        "/console/": {"get": _get("console", "the web console: groups", _HTML,
                                  tag="console")},
        "/console/groups/{group_id}": {
            "parameters": [_GROUP_ID],
            "get": _get("consoleGroup", "the web console: one group", _HTML, 404,
                        tag="console")},
        "/console/groups/{group_id}/reset": {
            "parameters": [_GROUP_ID],
            "post": {"operationId": "consoleReset", "tags": ["console"],
                     "summary": "the console's reset form (dry run, then execute)",
                     "responses": {"200": {"description": "before and after", **_HTML}}}},
        "/console/groups/{group_id}/members/{member_id}/drain": {
            "parameters": [_GROUP_ID, {"name": "member_id", "in": "path", "required": True,
                                       "schema": _NAME}],
            "post": {"operationId": "consoleDrain", "tags": ["console"],
                     "summary": "a member's Drain button (admin role): the drain request, "
                                "then back to the group page",
                     "responses": {"303": {"description": "to the group page"},
                                   "403": {"description": "not an admin", **_HTML},
                                   "404": {"description": "no such group or member", **_HTML},
                                   "409": {"description": "not a resources group", **_HTML}}}},
        "/console/events": {"get": _get("consoleEvents", "live page fragments",
                                        {"content": {"text/event-stream": {
                                            "schema": {"type": "string"}}}}, tag="console")},
        "/console/login": {
            "get": _get("consoleLoginForm", "the sign-in form", _HTML, tag="console"),
            "post": {"operationId": "consoleLogin", "tags": ["console"],
                     "summary": "sign in with a token (a session cookie)",
                     "responses": {"303": {"description": "signed in"}}}},
        "/console/logout": {"post": {"operationId": "consoleLogout", "tags": ["console"],
                                     "summary": "sign out",
                                     "responses": {"303": {"description": "signed out"}}}},
        "/console/static/{name}": {
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "get": _get("consoleStatic", "the console's CSS, script and icon",
                        {"content": {"*/*": {"schema": {"type": "string"}}}}, 404,
                        tag="console")},
    }


@functools.cache
def description() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document (built once; it does not change at run time)."""
    paths: dict[str, Any] = {}
    for api in _CALLS:
        paths[f"/v1/{api}"] = {**_protocol_call(api),
                               "x-groupcoord-listener": PROTOCOL_LISTENER}
    catalog = _object(["resources_epoch", "resources"], resources_epoch={"type": "integer"},
                      resources={"type": "object", "additionalProperties": {"type": "integer"}},
                      weights={"type": "object", "additionalProperties": _WEIGHTS,
                               "description": "v1.2: the sets whose weights are not the "
                                              "default; absent when none"},
                      zones={"type": "object", "additionalProperties": _ZONES,
                             "description": "v1.2: the sets whose zones are not the "
                                            "default; absent when none"})
    paths["/v1/resources"] = {
        "get": _get("listResources", "the catalog (any valid token; both listeners)",
                    _json(catalog), 401, 503),
        "x-groupcoord-listener": "both"}
    for path, item in _admin_paths().items():
        paths[path] = {**item, "x-groupcoord-listener": ADMIN_LISTENER}
    return {
        "openapi": "3.1.0",
        "info": {"title": "groupcoord", "version": "1.1",
                 "description": "Kafka's group membership protocol made generic, over HTTP. "
                                "Protocol calls on the protocol listener (--port), the rest "
                                "on the admin listener (--admin-port)."},
        "servers": [{"url": "http://127.0.0.1:9080", "description": "protocol listener"},
                    {"url": "http://127.0.0.1:9081", "description": "admin listener"}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
        "paths": paths,
    }
