"""One protocol call, without an HTTP framework (docs/protocol.md, "Transport", "Calls").

The protocol listener (:mod:`coordinator.http.fast`) answers every call with
this, and nothing else answers them. Given the call's name, its raw body, its
``Content-Type`` header, the caller's address and token entry,
:meth:`Calls.call` returns the HTTP status and the body to send, or a future of
them when the answer waits. It builds the call's command itself and hands it
to the runtime serving the group (:meth:`Runtime.request`), which returns the
answer or a future of it; nothing here is called back from below.

What a call goes through, in order (a refused request never reaches the
core, so it changes no state):

1. from the head, before :meth:`Calls.call` (the listener asks
   :meth:`Calls.early_refusal`): 415 for another content type than msgpack or
   JSON (v1.1: a JSON call is answered in JSON, bytes as base64:
   :mod:`protocol.json_wire`), 413 for a body over ``--max-body-bytes``
   (``{error: INVALID_REQUEST, message}``);
2. decode and validate into the request's dataclass (a body of at least
   ``offload.LARGE_BODY_BYTES`` on :mod:`coordinator.offload`'s worker thread,
   so the event loop goes on answering meanwhile); 400 ``INVALID_REQUEST``
   naming the field, also for a join's protocol metadata or a sync's
   per-member assignment over ``--max-metadata-bytes``;
3. with authentication on: 403 ``GROUP_AUTHORIZATION_FAILED`` for a group the
   token is not granted, ``UNKNOWN_MEMBER_ID`` for a member id not minted for
   the token (:func:`coordinator.auth.member_bound`);
4. the command (a fresh member id for a join) to :meth:`Runtime.request`,
   and the answer encoded; an answer the core gave
   ``INVALID_REQUEST`` (a commit or fetch refused on what it says)
   is sent as that 400 with its message.

Every call is counted in ``groupcoord_requests`` by outcome; a bug is logged
and answered 500 ``UNKNOWN_SERVER_ERROR``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from coordinator import auth, offload
from coordinator.auth import TokenEntry, TokenStore
from coordinator.core.commands import CallCommand, Commit, Fetch, Heartbeat, Join, Leave, Sync
from coordinator.core.effects import AdminResult
from coordinator.metrics import Metrics
from coordinator.runtime.runtime import Answer, error_answer
from coordinator.runtime.service import Service
from protocol import codec, json_wire
from protocol.catalog import catalog_json
from protocol.errors import ErrorCode
from protocol.limits import DEFAULT_MAX_METADATA_BYTES
from protocol.messages import (
    Api,
    CommitRequest,
    FetchRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    NotCoordinatorAnswer,
    SyncRequest,
)
from protocol.validate import ValidationError

log = logging.getLogger("groupcoord.http")

MSGPACK_TYPES = frozenset({codec.CONTENT_TYPE, "application/x-msgpack"})
#: docs/protocol.md, "JSON on the protocol calls": a call in JSON is answered in
#: JSON (protocol/json_wire.py).
JSON_TYPES = frozenset({json_wire.CONTENT_TYPE})
ACCEPTED_TYPES = MSGPACK_TYPES | JSON_TYPES
SERVER_FAILED = "the server failed on this request; see its log"

#: (HTTP status, msgpack body).
Result = tuple[int, bytes]
#: make the command of a validated request: (request, request id, remote address, token).
MakeCommand = Callable[[Any, int, str, TokenEntry | None], CallCommand]


def _cancel(future: asyncio.Future[Answer], _done: object) -> None:
    future.cancel()


def _principal(token: TokenEntry | None) -> str | None:
    """Who the core sees as the caller: the token's name (``None``: authentication off)."""
    return None if token is None else token.name


def _join(msg: JoinRequest, rid: int, remote: str, token: TokenEntry | None) -> CallCommand:
    return Join(rid, msg, remote, auth.new_member_id(msg.client_id, msg.group_id, token),
                _principal(token))


#: api -> (parse the wire map, make the command).
PROTOCOL_APIS: dict[Api, tuple[Callable[[object], Any], MakeCommand]] = {
    Api.JOIN: (JoinRequest.from_wire, _join),
    Api.SYNC: (SyncRequest.from_wire, lambda m, i, _r, t: Sync(i, m, _principal(t))),
    Api.HEARTBEAT: (HeartbeatRequest.from_wire, lambda m, i, _r, _t: Heartbeat(i, m)),
    Api.LEAVE: (LeaveRequest.from_wire, lambda m, i, _r, t: Leave(i, m, _principal(t))),
    Api.COMMIT: (CommitRequest.from_wire, lambda m, i, _r, t: Commit(i, m, _principal(t))),
    Api.FETCH: (FetchRequest.from_wire, lambda m, i, _r, _t: Fetch(i, m)),
}


def media_type(content_type: str | None) -> str:
    """The media type of a ``Content-Type`` value: lower case, parameters dropped."""
    if not content_type:
        return ""
    return content_type.partition(";")[0].strip().lower()


def is_json(content_type: str | None) -> bool:
    """Whether a call's ``Content-Type`` asks for JSON (else msgpack, the default)."""
    return (content_type is not None and content_type not in MSGPACK_TYPES
            and media_type(content_type) in JSON_TYPES)


def error_body(code: ErrorCode, message: str, json_body: bool = False) -> bytes:
    doc = {"error": code.value, "message": message}
    return json_wire.encode_error(doc) if json_body else codec.encode(doc)


def _member_ids(msg: Any) -> list[str]:
    if isinstance(msg, LeaveRequest):
        return [m.member_id for m in msg.members]
    member_id = getattr(msg, "member_id", "")
    return [member_id] if member_id else []


def check_metadata(msg: object, limit: int) -> None:
    """Refuse (:class:`ValidationError`) a join's protocol metadata or a sync's
    per-member assignment longer than ``limit`` (``--max-metadata-bytes``).

    The body limit alone would let one member park a megabyte of metadata in
    the group, which every join answer to the leader and every stored
    generation then repeats.
    """
    if isinstance(msg, JoinRequest):
        for i, (_name, metadata) in enumerate(msg.protocols):
            if len(metadata) > limit:
                raise ValidationError(f"protocols[{i}].metadata", f"{len(metadata)} bytes is "
                                      f"over --max-metadata-bytes ({limit})")
    elif isinstance(msg, SyncRequest):
        for i, a in enumerate(msg.assignments):
            if len(a.assignment) > limit:
                raise ValidationError(f"assignments[{i}].assignment", f"{len(a.assignment)} "
                                      f"bytes is over --max-metadata-bytes ({limit})")


def catalog_answer(runtime: Service) -> Result:
    """``GET /v1/resources`` (docs/protocol.md, "Admin (JSON)"), JSON: what a leader reads before it
    assigns. Both listeners serve it (a worker may reach only the protocol one)."""
    if not runtime.ready:
        code = (ErrorCode.COORDINATOR_NOT_AVAILABLE if runtime.failed.is_set()
                else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return 503, json.dumps({"error": code.value}).encode("utf-8")
    core = runtime.core
    epoch = core.resources_epoch
    cached = _CATALOG_ANSWERS.get(runtime)
    if cached is not None and cached[0] == epoch:
        return 200, cached[1]
    # Encoded once per epoch: with many weight overrides the body is large, and
    # every leader of every group reads it after a change.
    body = json.dumps(catalog_json(core.catalog(), core.catalog_placement(), epoch),
                      separators=(",", ":")).encode("utf-8")
    _CATALOG_ANSWERS[runtime] = (epoch, body)
    return 200, body


#: each server's latest ``GET /v1/resources`` body, by the epoch it was made at.
_CATALOG_ANSWERS: weakref.WeakKeyDictionary[Service, tuple[int, bytes]] = (
    weakref.WeakKeyDictionary())


class Calls:
    """The protocol calls of one server: its runtime, metrics, limits and tokens."""

    __slots__ = ("_apis", "_observe", "max_body_bytes", "max_metadata_bytes", "metrics",
                 "runtime", "tokens")

    def __init__(self, runtime: Service, metrics: Metrics, *, max_body_bytes: int,
                 max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
                 tokens: TokenStore | None = None,
                 apis: Mapping[Api, tuple[Callable[[object], Any], MakeCommand]] | None = None
                 ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_metadata_bytes = max_metadata_bytes
        #: ``None``: authentication off (every caller may do anything).
        self.tokens = tokens
        self._apis = dict(PROTOCOL_APIS if apis is None else apis)
        self._observe = metrics.observe_request

    @property
    def apis(self) -> frozenset[Api]:
        """The paths ``POST /v1/<api>`` served: the calls, and ``find_coordinator``."""
        return frozenset(self._apis) | {FindCoordinatorRequest.API}

    def authenticate(self, authorization: str | None) -> TokenEntry | None:
        """The caller's entry for an ``Authorization`` value (``None``: refuse with 401).

        Only meaningful with authentication on (``tokens`` set).
        """
        assert self.tokens is not None
        return auth.entry_for_header(self.tokens, authorization)

    def refuse(self, api: Api, status: int, message: str, started: float,
               json_body: bool = False) -> Result:
        """A counted ``INVALID_REQUEST`` refusal (4xx) of a call that never reached the core."""
        self._observe(api, ErrorCode.INVALID_REQUEST, time.perf_counter() - started)
        return status, error_body(ErrorCode.INVALID_REQUEST, message, json_body)

    def early_refusal(self, api: Api, content_type: str | None, content_length: int | None,
                      started: float) -> Result | None:
        """415 or 413 from the headers alone (before the body is read), else ``None``."""
        # The raw header usually is exactly the media type: skip parsing it then.
        if content_type not in MSGPACK_TYPES and media_type(content_type) not in ACCEPTED_TYPES:
            return self.refuse(api, 415, f"Content-Type must be "
                               f"{' or '.join(sorted(ACCEPTED_TYPES))}, got "
                               f"{media_type(content_type)!r}", started)
        if content_length is not None and content_length > self.max_body_bytes:
            return self.refuse(api, 413, f"body of {content_length} bytes is over the limit "
                               f"of {self.max_body_bytes} bytes", started,
                               is_json(content_type))
        return None

    def catalog(self) -> Result:
        """The JSON answer of ``GET /v1/resources`` (:func:`catalog_answer`)."""
        return catalog_answer(self.runtime)

    def server_error(self, api: Api, json_body: bool = False) -> Result:
        self._observe(api, ErrorCode.UNKNOWN_SERVER_ERROR, 0.0)
        return 500, error_body(ErrorCode.UNKNOWN_SERVER_ERROR, SERVER_FAILED, json_body)

    def call(self, api: Api, body: bytes, as_json: bool, remote: str,
             token: TokenEntry | None, started: float) -> Result | asyncio.Future[Result]:
        """Answer one call whose head the listener has admitted (its content type
        and length by :meth:`early_refusal`, its token); ``as_json``: the call came
        in JSON; ``started`` is the ``time.perf_counter()`` of its arrival.

        ``token`` is the caller's entry when authentication is on. The answer, or
        a future of it when the runtime's answer waits (a parked call) or the body
        is decoded off the loop; cancelling that future (the client went away)
        tells the core (``Cancelled``).
        """
        try:
            if api == FindCoordinatorRequest.API:
                return self._find_coordinator(body, as_json, token, started)
            if len(body) >= offload.LARGE_BODY_BYTES:
                # A large body (a commit of thousands of checkpoints) is decoded and
                # validated off the event loop, which answers other groups meanwhile.
                return asyncio.ensure_future(
                    self._call_offloaded(api, body, remote, token, started, as_json))
            try:
                msg = self._decode(api, body, as_json)
            except (codec.DecodeError, ValidationError) as exc:
                return self.refuse(api, 400, str(exc), started, as_json)
            return self._submit(api, msg, remote, token, started, as_json)
        except Exception:
            log.exception("unhandled error on POST /v1/%s", api)
            return self.server_error(api, as_json)

    def _decode(self, api: Api, body: bytes, as_json: bool) -> Any:
        """The request's message, validated (:class:`ValidationError` naming the field)."""
        msg = self._apis[api][0](json_wire.decode_request(api, body) if as_json
                                 else codec.decode(body))
        if api is Api.JOIN or api is Api.SYNC:
            check_metadata(msg, self.max_metadata_bytes)
        return msg

    async def _call_offloaded(self, api: Api, body: bytes, remote: str,
                              token: TokenEntry | None, started: float,
                              as_json: bool) -> Result:
        try:
            try:
                msg = await offload.run(functools.partial(self._decode, api, body, as_json))
            except (codec.DecodeError, ValidationError) as exc:
                return self.refuse(api, 400, str(exc), started, as_json)
            answer = self._submit(api, msg, remote, token, started, as_json)
            return answer if isinstance(answer, tuple) else await answer
        except Exception:
            log.exception("unhandled error on POST /v1/%s", api)
            return self.server_error(api, as_json)

    def _submit(self, api: Api, msg: Any, remote: str, token: TokenEntry | None,
                started: float, as_json: bool) -> Result | asyncio.Future[Result]:
        """Authorise the call, build its command and hand it to the runtime serving
        its group."""
        # Before routing: a caller not granted the group learns nothing of it,
        # not even which coordinator owns it.
        forbidden = self._forbidden(api, token, msg.group_id, started, as_json)
        if forbidden is not None:
            return forbidden
        # v1.1: the runtime serving the group here, or NOT_COORDINATOR /
        # COORDINATOR_LOAD_IN_PROGRESS (a one-process server serves every group).
        target = self.runtime.route(msg.group_id)
        if isinstance(target, NotCoordinatorAnswer):
            self._observe(api, target.error, time.perf_counter() - started)
            return 200, self._encode(api, target.to_wire(), as_json)
        command = self._apis[api][1]
        if self.tokens is not None and not all(auth.member_bound(token, msg.group_id, m)
                                               for m in _member_ids(msg)):
            answer = error_answer(command(msg, 0, remote, token), ErrorCode.UNKNOWN_MEMBER_ID)
        else:
            outcome = target.request(command(msg, target.new_request_id(), remote, token))
            if isinstance(outcome, asyncio.Future):
                waiting = asyncio.ensure_future(self._answer_later(api, outcome, started,
                                                                   as_json))
                # Cancelled before it ever ran, the task never cancelled the runtime's
                # future: do it, so the core hears the caller is gone.
                waiting.add_done_callback(functools.partial(_cancel, outcome))
                return waiting
            answer = outcome
        return self._answered(api, answer, started, as_json)

    async def _answer_later(self, api: Api, answer: asyncio.Future[Answer], started: float,
                            as_json: bool) -> Result:
        done = await answer
        try:
            return self._answered(api, done, started, as_json)
        except Exception:
            log.exception("unhandled error on POST /v1/%s", api)
            return self.server_error(api, as_json)

    def _answered(self, api: Api, answer: Answer, started: float, as_json: bool) -> Result:
        """The runtime's answer to a call, counted and encoded."""
        assert not isinstance(answer, AdminResult)
        self._observe(api, answer.error, time.perf_counter() - started)
        if answer.error is ErrorCode.INVALID_REQUEST:
            # Refused by the core on what the request says (a checkpoint
            # outside the catalog, a value over its limit, a fetch too big
            # for one answer): a 400 like any bad input, naming the field.
            message = getattr(answer, "message", "") or "invalid request"
            return 400, error_body(ErrorCode.INVALID_REQUEST, message, as_json)
        return 200, self._encode(api, answer.to_wire(), as_json)

    def _forbidden(self, api: Api, token: TokenEntry | None, group_id: str, started: float,
                   as_json: bool) -> Result | None:
        """403 ``GROUP_AUTHORIZATION_FAILED`` for a group outside the token's grant
        (authentication on), counted; ``None`` when the call may go on."""
        if self.tokens is None or auth.authorize(token, group_id):
            return None
        self._observe(api, ErrorCode.GROUP_AUTHORIZATION_FAILED, time.perf_counter() - started)
        return 403, error_body(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                               auth.forbidden_message(token, group_id), as_json)

    @staticmethod
    def _encode(api: str, wire: dict[str, Any], as_json: bool) -> bytes:
        return json_wire.encode_response(api, wire) if as_json else codec.encode(wire)

    def _find_coordinator(self, body: bytes, as_json: bool, token: TokenEntry | None,
                          started: float) -> Result:
        """``POST /v1/find_coordinator`` (v1.1): who owns the group; any group may be
        asked by a caller granted it."""
        api = FindCoordinatorRequest.API
        try:
            msg = FindCoordinatorRequest.from_wire(
                json_wire.decode_request(api, body) if as_json else codec.decode(body))
        except (codec.DecodeError, ValidationError) as exc:
            return self.refuse(api, 400, str(exc), started, as_json)
        forbidden = self._forbidden(api, token, msg.group_id, started, as_json)
        if forbidden is not None:
            return forbidden
        answer = self.runtime.find_coordinator(msg.group_id)
        self._observe(api, answer.error, time.perf_counter() - started)
        return 200, self._encode(api, answer.to_wire(), as_json)
