"""The member's one-method transport (docs/architecture.md practice 7, the httpx model).

Everything the member says to the coordinator goes through
``await transport.call(api, request) -> response``: ``api`` is a protocol
call of docs/protocol.md, "Calls" ("join", "sync", "heartbeat", "leave", "commit",
"fetch") with its request/response dataclasses from ``protocol.messages``,
or ``"resources"`` (the admin catalog, ``GET /v1/resources``) with
:class:`CatalogRequest` / :class:`CatalogResponse`.

A protocol outcome (``REBALANCE_IN_PROGRESS``, ...) is a *response* with its
``error`` set. Failures to get a response are exceptions, translated here
and nowhere else:

- network errors, timeouts, HTTP 5xx, an undecodable answer:
  :class:`~client.errors.CoordinatorUnavailableError` (retriable);
- HTTP 400/413/415: :class:`~client.errors.InvalidRequestError` (a bug);
- HTTP 401/403: :class:`~client.errors.GroupAuthorizationFailedError`;
- a coordinator certificate that does not verify:
  :class:`~client.errors.TLSVerificationError` (fatal: a setting to fix);
- a 404 from the coordinator's admin listener (the URL names ``--admin-port``,
  not ``--port``): :class:`~client.errors.WrongListenerError` (fatal: a
  setting to fix);
- v1.1, an answer ``NOT_COORDINATOR`` or ``COORDINATOR_LOAD_IN_PROGRESS``
  (a coordinator that does not serve the group, or not yet): recognised
  before the call's own response is parsed (such an answer carries only
  ``error`` and ``url``) and raised as
  :class:`~client.errors.NotCoordinatorError` (retriable; nothing changed).

:class:`CoordinatorRouter` is the transport of a member given several
coordinators (docs/protocol.md, "Several coordinators sharing groups"): it
finds the group's coordinator with ``find_coordinator``, sends every call
there through per-URL :class:`AiohttpTransport` views of one HTTP session,
follows ``NOT_COORDINATOR``, and looks for the coordinator again when the
current one fails (docs/client.md, "Several coordinators"): the asyncio
driver of :class:`client.routing.Routing`, which decides all of that.

Tests swap in an in-memory transport: any object with this ``call`` method.
A transport may also have ``timed_out(api)``: the member calls it when a call
got no answer within the member's own timeout (it cancels the call), so a
router stops sending to a coordinator that accepts connections and answers
nothing (a paused process).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from client.errors import (
    CoordinatorUnavailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    NotCoordinatorError,
    TLSVerificationError,
    WrongListenerError,
)
from client.routing import (
    MAX_REDIRECTS,
    Answer,
    AskFind,
    CoordinatorChanged,
    CoordinatorChoice,
    Fail,
    RoutedCall,
    Routing,
    RoutingEffect,
    SendCall,
    check_coordinator_url,
    redact_url,
)
from client.tls import client_ssl_context
from protocol.catalog import Placement, parse_catalog_placement
from protocol.codec import CONTENT_TYPE, DecodeError, decode, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    ADMIN_LISTENER,
    APIS,
    LISTENER_FIELD,
    Api,
    FindCoordinatorRequest,
    Request,
    Response,
)
from protocol.validate import ValidationError

__all__ = [
    "AiohttpTransport",
    "CallRequest",
    "CallResponse",
    "CatalogRequest",
    "CatalogResponse",
    "CoordinatorChoice",
    "CoordinatorRouter",
    "Transport",
    "check_coordinator_url",
    "redact_url",
]

log = logging.getLogger("groupcoord.client")

#: the answers a coordinator gives instead of a call's own response (v1.1).
_NOT_SERVED = frozenset({ErrorCode.NOT_COORDINATOR.value,
                         ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.value})


@dataclass(frozen=True, slots=True)
class CatalogRequest:
    """``GET /v1/resources``: the leader reads the catalog before it assigns."""

    API = Api.RESOURCES


@dataclass(frozen=True, slots=True)
class CatalogResponse:
    """``{"resources_epoch": E, "resources": {name: partitions}, "weights"?: ...,
    "zones"?: ...}``. ``placement`` holds the weights and zones of the sets that
    have them (docs/protocol.md, v1.2 "Resources that differ"); the leader keeps
    the whole answer for its assignment (``Syncing.catalog``), and a set with a
    placement is given to the assignor as a ``ResourceSet``
    (:func:`client.leader.catalog_resources`)."""

    resources_epoch: int
    resources: Mapping[str, int] = field(default_factory=dict)
    placement: Mapping[str, Placement] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: object) -> CatalogResponse:
        if not isinstance(obj, dict):
            raise ValidationError("body", "expected a JSON object")
        epoch = obj.get("resources_epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValidationError("resources_epoch", "expected a non-negative integer")
        raw = obj.get("resources")
        if not isinstance(raw, dict):
            raise ValidationError("resources", "expected an object of name -> partitions")
        resources: dict[str, int] = {}
        for name, n in raw.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValidationError(f"resources.{name}", "expected a non-negative integer")
            resources[str(name)] = n
        return cls(epoch, resources, parse_catalog_placement(obj, resources))


CallRequest = Request | CatalogRequest
CallResponse = Response | CatalogResponse


class Transport(Protocol):
    """What the member needs from the network: one method."""

    async def call(self, api: str, request: Any) -> Any:
        """Send ``request`` to ``api``; return the decoded response or raise one
        of the errors listed in this module's docstring."""
        ...


class AiohttpTransport:
    """The transport over HTTP/1.1 with aiohttp (docs/protocol.md, "Transport").

    The session is created on first use, in the running loop; ``aclose()``
    releases it. Cancelling a call closes its connection, which the
    coordinator sees as the caller going away (a parked heartbeat is
    forgotten).

    TLS (an ``https://`` URL): ``ca_file`` trusts that CA and only that CA
    (:func:`client.tls.client_ssl_context`; a private CA or a self-signed
    coordinator certificate), ``ssl_context`` takes a context made by the
    caller (client certificates, other trust settings); with neither, the
    system trust store. Verification and host-name checks are never turned
    off. A bad ``ca_file`` raises :class:`ValueError` naming it, here.
    """

    def __init__(self, base_url: str, *, headers: Mapping[str, str] | None = None,
                 connect_timeout_s: float = 5.0, ca_file: str | Path | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if ca_file is not None and ssl_context is not None:
            raise ValueError("give ca_file or ssl_context, not both")
        check_coordinator_url(base_url,
                              tls_settings=ca_file is not None or ssl_context is not None)
        self._base = base_url.rstrip("/")
        self._shared = _Session(
            dict(headers or {}), connect_timeout_s,
            client_ssl_context(ca_file) if ca_file is not None else ssl_context)

    @property
    def base_url(self) -> str:
        return self._base

    def at(self, base_url: str) -> AiohttpTransport:
        """The same transport for another coordinator URL: the same HTTP
        session (connections, headers, TLS settings); ``aclose()`` of either
        closes it. ``ValueError`` for a URL these settings cannot use."""
        check_coordinator_url(base_url, tls_settings=self._shared.ssl is not None)
        view = AiohttpTransport.__new__(AiohttpTransport)
        view._base = base_url.rstrip("/")
        view._shared = self._shared
        return view

    def _get_session(self) -> aiohttp.ClientSession:
        return self._shared.get()

    async def call(self, api: str, request: Any) -> Any:
        session = self._get_session()
        try:
            if api == Api.RESOURCES:
                async with session.get(f"{self._base}/v1/resources") as resp:
                    body = await resp.read()
                    self._check_status(api, resp.status, body, json_body=True)
                    return CatalogResponse.from_json(json.loads(body))
            if api not in APIS:
                raise ValueError(f"unknown api {api!r}")
            response_type = APIS[Api(api)][1]
            async with session.post(f"{self._base}/v1/{api}", data=encode(request.to_wire()),
                                    headers={"Content-Type": CONTENT_TYPE}) as resp:
                body = await resp.read()
                self._check_status(api, resp.status, body, json_body=False)
                obj = decode(body)
                if api != Api.FIND_COORDINATOR:
                    self._check_served(api, obj)
                result: Response = response_type.from_wire(obj)
                return result
        except (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError) as exc:
            detail = getattr(exc, "certificate_error", exc)
            raise TLSVerificationError(
                f"{api}: the certificate of {self._base} could not be verified ({detail}); "
                "pass ca_file= (the CA that signed the coordinator's certificate) or "
                "ssl_context=") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CoordinatorUnavailableError(f"{api}: {type(exc).__name__}: {exc}",
                                              url=redact_url(self._base)) from exc
        except (DecodeError, ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CoordinatorUnavailableError(f"{api}: unreadable response: {exc}",
                                              url=redact_url(self._base)) from exc

    def _check_served(self, api: str, obj: object) -> None:
        """A v1.1 "not served here" answer (``{error, url}`` and nothing else):
        read before the call's own fields, which it does not have."""
        if not isinstance(obj, dict) or obj.get("error") not in _NOT_SERVED:
            return
        code = ErrorCode(obj["error"])
        url = obj.get("url")
        owner = url if isinstance(url, str) else ""
        where = f" (owner: {redact_url(owner)})" if owner else ""
        raise NotCoordinatorError(f"{api}: {code.value} at {redact_url(self._base)}{where}",
                                  code, owner, url=redact_url(self._base))

    def _check_status(self, api: str, status: int, body: bytes, *, json_body: bool) -> None:
        if status == 200:
            return
        if status == 404 and _listener(body) == ADMIN_LISTENER:
            raise WrongListenerError(
                f"{api}: {redact_url(self._base)} is the coordinator's admin listener "
                f"(serve's --admin-port), not its protocol listener (--port, 9080 by "
                f"default): give the member the protocol listener's URL")
        message = _error_message(body, json_body)
        if status in (400, 413, 415):
            raise InvalidRequestError(f"{api}: HTTP {status}: {message}")
        if status in (401, 403):
            raise GroupAuthorizationFailedError(f"{api}: HTTP {status}: {message}",
                                                ErrorCode.GROUP_AUTHORIZATION_FAILED)
        raise CoordinatorUnavailableError(f"{api}: HTTP {status}: {message}", http_status=status,
                                          url=redact_url(self._base))

    async def aclose(self) -> None:
        await self._shared.aclose()


class _Session:
    """One aiohttp session and its settings, shared by the views of one
    transport (:meth:`AiohttpTransport.at`)."""

    def __init__(self, headers: dict[str, str], connect_timeout_s: float,
                 ssl_ctx: ssl.SSLContext | None) -> None:
        self.headers = headers
        self.connect_timeout_s = connect_timeout_s
        self.ssl = ssl_ctx
        self.session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            # No total timeout: the member bounds every call itself (a parked
            # join may legitimately last a whole rebalance timeout).
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
            # ssl=True: aiohttp's default, verifying against the system store.
            connector = aiohttp.TCPConnector(ssl=self.ssl if self.ssl is not None else True)
            self.session = aiohttp.ClientSession(timeout=timeout, headers=self.headers,
                                                 connector=connector)
        return self.session

    async def aclose(self) -> None:
        if self.session is not None and not self.session.closed:
            await self.session.close()
        self.session = None


def _listener(body: bytes) -> object:
    """Which listener a 404 came from, when its JSON body names it (else ``None``)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj.get(LISTENER_FIELD) if isinstance(obj, dict) else None


def _error_message(body: bytes, json_body: bool) -> str:
    try:
        obj = json.loads(body) if json_body else decode(body)
    except (DecodeError, ValueError):
        return body[:200].decode("utf-8", "replace")
    if isinstance(obj, dict):
        return str(obj.get("message") or obj.get("error") or obj)
    return str(obj)[:200]


class CoordinatorRouter:
    """The transport of one group's member when coordinators may change
    (docs/protocol.md, "Several coordinators sharing groups"; Kafka's
    consumer: coordinator unknown -> FindCoordinator -> retry there).

    ``bootstrap``: the URLs the member was given; ``connect(url)``: the
    transport that talks to one coordinator (for HTTP,
    :meth:`AiohttpTransport.at`, so every coordinator shares one session).
    Where each call goes is decided by :class:`client.routing.Routing` (its
    docs say how: ``find_coordinator`` over the bootstrap URLs, each attempt
    bounded by ``find_timeout_ms``, ``NOT_COORDINATOR`` followed at most
    ``MAX_REDIRECTS`` times per call, the coordinator given up on a failure
    or ``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS`` handed
    to the member); this class carries its legs out with asyncio:

    - a failure to get an answer (network, 5xx, an unreadable answer, the
      member's timeout reported through :meth:`timed_out`) goes to the
      member, which retries with its backoff (bounded by its safety lease)
      and the next call looks for the coordinator. When it finds another
      one, the calls still waiting on the old one fail (they are retried),
      so none stays parked at a coordinator given up.
    - a coordinator URL a server names must be one ``connect`` accepts, and
      ``https://`` when the member was given ``https://`` URLs; else the
      answer counts as a failure. One INFO line is logged whenever the
      coordinator changes (URLs without credentials).
    """

    #: NOT_COORDINATOR answers followed within one call.
    MAX_REDIRECTS: int = MAX_REDIRECTS

    def __init__(self, bootstrap: Sequence[str], group_id: str,
                 connect: Callable[[str], Transport], *, find_timeout_ms: int = 5_000,
                 name: str | None = None) -> None:
        self._routing = Routing(bootstrap, group_id, find_timeout_ms=find_timeout_ms)
        self._group_id = group_id
        self._connect = connect
        self._name = name or f"of group {group_id!r}"
        self._transports: dict[str, Transport] = {}
        for url in self._routing.choice.bootstrap:
            self._transport_for(url)  # a URL the transport refuses: ValueError now
        #: the calls under way: the request, the leg in flight, the outcome awaited.
        self._calls: dict[RoutedCall, _Pending] = {}

    @property
    def bootstrap_urls(self) -> tuple[str, ...]:
        return self._routing.choice.bootstrap

    @property
    def current_url(self) -> str | None:
        """The group's coordinator as last learned, ``None`` while unknown."""
        return self._routing.choice.current

    @property
    def failed_url(self) -> str | None:
        """The coordinator last given up (no answer, ``COORDINATOR_NOT_AVAILABLE``)."""
        return self._routing.choice.failed

    async def call(self, api: str, request: Any) -> Any:
        routing = self._routing
        routed = routing.new_call(api)
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        self._calls[routed] = pending
        try:
            self._perform(routing.route(routed))
            return await asyncio.shield(pending.outcome)
        except asyncio.CancelledError:
            if pending.outcome.done():
                pending.outcome.exception()  # over already: its outcome goes unread
            elif not routed.done:
                leg = pending.leg
                self._perform(routing.cancelled(routed))
                if leg is not None:
                    await _cancel(leg)
            raise
        finally:
            del self._calls[routed]

    def timed_out(self, api: str) -> None:
        """The member's last ``api`` call got no answer within its timeout (a
        paused process, a black hole): look for the coordinator again
        (:meth:`client.routing.Routing.timed_out`)."""
        self._routing.timed_out(api)

    async def aclose(self) -> None:
        for transport in self._transports.values():
            aclose = getattr(transport, "aclose", None)
            if aclose is not None:
                await aclose()

    # ------------------------------------------------------------ internals

    def _transport_for(self, url: str) -> Transport:
        transport = self._transports.get(url)
        if transport is None:
            transport = self._connect(url)
            self._transports[url] = transport
        return transport

    def _perform(self, effects: list[RoutingEffect]) -> None:
        for effect in effects:
            if isinstance(effect, (SendCall, AskFind)):
                pending = self._calls[effect.call]
                pending.leg = asyncio.ensure_future(self._leg(effect))
            elif isinstance(effect, (Answer, Fail)):
                pending = self._calls[effect.call]
                leg, pending.leg = pending.leg, None
                if leg is not None:
                    # Waiting on a coordinator given up (Kafka's client fails the
                    # requests in flight to a coordinator it marks dead).
                    leg.cancel()
                if isinstance(effect, Answer):
                    pending.outcome.set_result(effect.response)
                else:
                    pending.outcome.set_exception(effect.error)
            elif isinstance(effect, CoordinatorChanged):
                log.info("member %s: the coordinator of group %r is now %s (%s%s)", self._name,
                         self._group_id, redact_url(effect.url), effect.how,
                         f"; was {redact_url(effect.was)}" if effect.was is not None else "")
            else:
                log.warning("member %s: %s named an unusable coordinator URL: %s", self._name,
                            redact_url(effect.url), effect.reason)

    async def _leg(self, step: SendCall | AskFind) -> None:
        """One leg of a call: the call itself or a ``find_coordinator``, at
        ``step.url``; what came back goes to the routing."""
        routed = step.call
        routing = self._routing
        effects: list[RoutingEffect]
        try:
            try:
                transport = self._transport_for(step.url)
            except ValueError as exc:
                raise CoordinatorUnavailableError(
                    f"{routed.api}: cannot use the coordinator URL {redact_url(step.url)}: {exc}",
                    url=redact_url(step.url)) from None
            if isinstance(step, AskFind):
                response = await asyncio.wait_for(
                    transport.call(Api.FIND_COORDINATOR, FindCoordinatorRequest(self._group_id)),
                    routing.find_timeout_ms / 1000)
            else:
                response = await transport.call(routed.api, self._calls[routed].request)
        except Exception as exc:  # every failure is the routing's to judge
            if isinstance(step, AskFind) and isinstance(exc, TimeoutError):
                effects = routing.find_timed_out(routed)
            else:
                effects = routing.failed(routed, exc)
        else:
            effects = routing.answered(routed, response)
        pending = self._calls.get(routed)
        if pending is not None and pending.leg is asyncio.current_task():
            pending.leg = None
        self._perform(effects)


@dataclass(slots=True)
class _Pending:
    """A call of :class:`CoordinatorRouter` under way."""

    request: Any
    outcome: asyncio.Future[Any]
    leg: asyncio.Future[None] | None = None


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
