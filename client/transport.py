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
current one fails (docs/client.md, "Several coordinators").

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
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from client.errors import (
    CoordinatorUnavailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    NotCoordinatorError,
    TLSVerificationError,
    WrongListenerError,
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
    FindCoordinatorResponse,
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


def redact_url(url: str) -> str:
    """``url`` without the user name and password it may carry (for logs and
    error messages)."""
    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
    except ValueError:  # a port that is not a number: show no part of the netloc
        return "<unparsable URL>"
    return urlunsplit(parts._replace(netloc=netloc))


def check_coordinator_url(url: object, *, tls_settings: bool = False) -> str:
    """``url`` if it can name a coordinator (``http://`` or ``https://`` and a
    host); else ``ValueError`` naming it. ``tls_settings``: the caller gave a
    CA or an SSL context, which only an ``https://`` URL can use."""
    if not isinstance(url, str):
        raise ValueError(f"coordinator URL must be a string, got {url!r}")
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"coordinator URL must start with http:// or https://: {shown!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"coordinator URL {shown!r} cannot be parsed: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"coordinator URL has no host: {shown!r}")
    if tls_settings and url.startswith("http://"):
        raise ValueError(f"ca_file/ssl_context need an https:// coordinator URL: {shown!r}")
    return url


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


class CoordinatorChoice:
    """Which coordinator a member's calls go to: the decisions of
    :class:`CoordinatorRouter`, without I/O (the deterministic simulator,
    tests/sim/cluster.py, drives the same object).

    ``current``: the group's coordinator as last learned (``None``: unknown;
    with one bootstrap URL, that URL from the start). ``find_order()``: whom to
    ask ``find_coordinator``, from the last that answered, the coordinator just
    given up last.
    """

    __slots__ = ("bootstrap", "current", "failed", "first", "https_only")

    def __init__(self, bootstrap: Sequence[str]) -> None:
        urls = tuple(dict.fromkeys(u.rstrip("/") for u in bootstrap))
        if not urls:
            raise ValueError("give at least one coordinator URL")
        self.bootstrap = urls
        #: given https:// URLs, the member follows no server to http:// (its
        #: token would then travel in clear).
        self.https_only = any(u.startswith("https://") for u in urls)
        self.current: str | None = urls[0] if len(urls) == 1 else None
        #: where the next find_coordinator round starts (the last that answered).
        self.first = 0
        #: the coordinator last given up (asked last in the next round).
        self.failed: str | None = None

    def find_order(self) -> list[str]:
        """The bootstrap URLs in the order a ``find_coordinator`` round asks them:
        from the last that answered; the coordinator just given up last (killed
        or paused, it would cost a timeout each round)."""
        urls = self.bootstrap
        order = [(self.first + k) % len(urls) for k in range(len(urls))]
        order.sort(key=lambda j: urls[j] == self.failed)
        return [urls[j] for j in order]

    def answered(self, url: str) -> None:
        """``url`` (a bootstrap URL) answered ``find_coordinator``."""
        self.first = self.bootstrap.index(url)

    def none_answered(self) -> None:
        """A ``find_coordinator`` round got no answer: the next starts one further."""
        self.first = (self.first + 1) % len(self.bootstrap)

    def check_named(self, url: str) -> None:
        """A coordinator URL a server named; ``ValueError`` if this member must not use it."""
        if self.https_only and not url.startswith("https://"):
            raise ValueError(f"{redact_url(url)!r} is not an https:// URL, and this member "
                             f"was given https:// URLs")

    def forget(self, url: str) -> None:
        """``url`` failed (no answer, a reset, ``COORDINATOR_NOT_AVAILABLE``): the
        coordinator is unknown again, if it was ``url``."""
        if self.current == url:
            self.current = None
            self.failed = url

    def redirect_target(self, url: str, owner: str) -> str | None:
        """``url`` answered ``NOT_COORDINATOR`` naming ``owner`` (or nobody): the
        URL to follow (to be checked with :meth:`check_named`), or ``None`` (the
        caller forgets ``url``: look again). Only while ``url`` is current:
        another call may have moved on already (then ``""``: nothing to do)."""
        if self.current != url:
            return ""
        owner = owner.rstrip("/")
        if not owner or owner == url:
            return None
        return owner

    def found_target(self, asked: str, response: FindCoordinatorResponse) -> str:
        """``asked`` answered ``find_coordinator``: the group's coordinator (to be
        checked with :meth:`check_named` unless it is ``asked``), or
        :class:`CoordinatorUnavailableError` when none serves the group now."""
        if response.error is not None:
            raise CoordinatorUnavailableError(
                f"no coordinator serves the group now (find_coordinator at "
                f"{redact_url(asked)}: {response.error.value})")
        if not response.url:
            # No error and no other URL: the server asked serves the group (a
            # one-process server that does not know its advertised URL); should
            # it not, its NOT_COORDINATOR corrects it.
            return asked
        return response.url.rstrip("/")


class CoordinatorRouter:
    """The transport of one group's member when coordinators may change
    (docs/protocol.md, "Several coordinators sharing groups"; Kafka's
    consumer: coordinator unknown -> FindCoordinator -> retry there).

    ``bootstrap``: the URLs the member was given; ``connect(url)``: the
    transport that talks to one coordinator (for HTTP,
    :meth:`AiohttpTransport.at`, so every coordinator shares one session).
    A call goes to the group's current coordinator:

    - none known: with several bootstrap URLs, ``find_coordinator`` is asked
      of each in turn, starting with the last that answered, the coordinator
      just given up last (each attempt bounded by ``find_timeout_ms``); the
      first answer decides. A server that does not have the call (HTTP 404:
      a v1 server), or answers no error and no URL, is the coordinator
      itself. With one URL, that URL is presumed to be the coordinator
      (a one-process server serves every group; anything else redirects).
    - ``NOT_COORDINATOR`` (nothing changed there): the call goes at once to
      the owner it names, or, when it names none, to the one
      ``find_coordinator`` names; at most ``MAX_REDIRECTS`` times per call,
      then it fails retriably.
    - a failure to get an answer (network, 5xx, an unreadable answer, the
      member's timeout reported through :meth:`timed_out`), or
      ``COORDINATOR_NOT_AVAILABLE``: the coordinator is unknown again; the
      error goes to the member, which retries with its backoff (bounded by
      its safety lease) and the next call looks for the coordinator. When it
      finds another one, the calls still waiting on the old one fail (they
      are retried), so none stays parked at a coordinator given up.
    - ``COORDINATOR_LOAD_IN_PROGRESS``: the owner, still loading; the member
      retries there after its backoff.

    A coordinator URL a server names must be one ``connect`` accepts, and
    ``https://`` when the member was given ``https://`` URLs; else the answer
    counts as a failure. One INFO line is logged whenever the coordinator
    changes (URLs without credentials).
    """

    #: NOT_COORDINATOR answers followed within one call.
    MAX_REDIRECTS = 3

    def __init__(self, bootstrap: Sequence[str], group_id: str,
                 connect: Callable[[str], Transport], *, find_timeout_ms: int = 5_000,
                 name: str | None = None) -> None:
        if find_timeout_ms <= 0:
            raise ValueError(f"find_timeout_ms must be positive, got {find_timeout_ms!r}")
        self._choice = CoordinatorChoice(bootstrap)
        urls = self._choice.bootstrap
        self._group_id = group_id
        self._connect = connect
        self._find_timeout_ms = find_timeout_ms
        self._name = name or f"of group {group_id!r}"
        self._transports: dict[str, Transport] = {}
        for url in urls:
            self._transport_for(url)  # a URL the transport refuses: ValueError now
        #: the coordinator last announced in the log.
        self._announced: str | None = self._choice.current
        self._finding = asyncio.Lock()
        #: per api, the coordinator the last call cancelled while waiting was sent to.
        self._cancelled: dict[str, str] = {}
        #: per coordinator, resolved when another one is found: the calls
        #: still waiting on it fail then (a join parked at a paused process).
        self._gone: dict[str, asyncio.Future[None]] = {}

    @property
    def bootstrap_urls(self) -> tuple[str, ...]:
        return self._choice.bootstrap

    @property
    def current_url(self) -> str | None:
        """The group's coordinator as last learned, ``None`` while unknown."""
        return self._choice.current

    @property
    def failed_url(self) -> str | None:
        """The coordinator last given up (no answer, ``COORDINATOR_NOT_AVAILABLE``)."""
        return self._choice.failed

    async def call(self, api: str, request: Any) -> Any:
        self._cancelled.pop(api, None)
        redirects = 0
        while True:
            current = self._choice.current
            url = current if current is not None else await self._find(api)
            try:
                response = await self._send(url, api, request)
            except NotCoordinatorError as exc:
                if exc.code is not ErrorCode.NOT_COORDINATOR:
                    raise  # loading: the owner; retried there after the member's backoff
                self._redirect(url, exc.owner_url)
                redirects += 1
                if redirects > self.MAX_REDIRECTS:
                    raise
                continue
            except CoordinatorUnavailableError:
                self._forget(url)
                raise
            if getattr(response, "error", None) is ErrorCode.COORDINATOR_NOT_AVAILABLE:
                self._forget(url)  # Kafka's consumer marks the coordinator unknown too
            return response

    async def _send(self, url: str, api: str, request: Any) -> Any:
        """``request`` to the coordinator at ``url``; fails when another
        coordinator is found while the call waits on this one (Kafka's client
        fails the requests in flight to a coordinator it marks dead)."""
        gone = self._gone.get(url)
        if gone is None:
            gone = self._gone[url] = asyncio.get_running_loop().create_future()
        call = asyncio.ensure_future(self._transports[url].call(api, request))
        try:
            await asyncio.wait((call, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._cancelled[api] = url
            await _cancel(call)
            raise
        if not call.done():
            await _cancel(call)
            raise CoordinatorUnavailableError(
                f"{api}: gave up waiting on {redact_url(url)}: the group's coordinator "
                "changed or stopped answering", url=redact_url(url))
        return call.result()

    def timed_out(self, api: str) -> None:
        """The member's last ``api`` call got no answer within its timeout (a
        paused process, a black hole): look for the coordinator again. Even if it
        answered other calls since that one was sent: those may have been answered
        just before it stopped (a busy member commits between heartbeats), and a
        coordinator still serving
        is found again at the cost of one ``find_coordinator``."""
        url = self._cancelled.pop(api, None)
        if url is not None:
            self._forget(url)

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

    def _named(self, url: str) -> None:
        """Check a coordinator URL a server named; ``ValueError`` if unusable."""
        self._choice.check_named(url)
        self._transport_for(url)

    def _forget(self, url: str) -> None:
        self._choice.forget(url)

    def _use(self, url: str, how: str) -> None:
        self._choice.current = url
        # The calls still waiting on another coordinator fail now (found
        # again, the same coordinator keeps its calls: with one URL nothing
        # changes).
        for other in [u for u in self._gone if u != url]:
            gone = self._gone.pop(other)
            if not gone.done():
                gone.set_result(None)
        if url != self._announced:
            was = self._announced
            self._announced = url
            log.info("member %s: the coordinator of group %r is now %s (%s%s)", self._name,
                     self._group_id, redact_url(url), how,
                     f"; was {redact_url(was)}" if was is not None else "")

    def _redirect(self, url: str, owner: str) -> None:
        """``url`` answered NOT_COORDINATOR naming ``owner`` (or nobody)."""
        target = self._choice.redirect_target(url, owner)
        if target == "":
            return  # another call moved on already
        if target is None:
            self._forget(url)
            return
        owner = target
        try:
            self._named(owner)
        except ValueError as exc:
            log.warning("member %s: %s named an unusable coordinator URL: %s", self._name,
                        redact_url(url), exc)
            self._forget(url)
            return
        self._use(owner, f"NOT_COORDINATOR from {redact_url(url)}")

    async def _find(self, api: str) -> str:
        async with self._finding:
            choice = self._choice
            if choice.current is not None:
                return choice.current  # found by another call meanwhile
            urls = choice.bootstrap
            if len(urls) == 1:
                self._use(urls[0], "the only URL given")
                return urls[0]
            failures: list[str] = []
            for url in choice.find_order():
                try:
                    response = await asyncio.wait_for(
                        self._transports[url].call(Api.FIND_COORDINATOR,
                                                   FindCoordinatorRequest(self._group_id)),
                        self._find_timeout_ms / 1000)
                except TimeoutError:
                    failures.append(f"{redact_url(url)}: no answer within "
                                    f"{self._find_timeout_ms} ms")
                    continue
                except CoordinatorUnavailableError as exc:
                    if exc.http_status == 404:
                        # A server without find_coordinator (v1): one process
                        # that serves every group.
                        choice.answered(url)
                        self._use(url, "a server without find_coordinator")
                        return url
                    failures.append(f"{redact_url(url)}: {exc}")
                    continue
                choice.answered(url)
                return self._found(api, url, response)
            choice.none_answered()
            raise CoordinatorUnavailableError(
                f"{api}: find_coordinator for group {self._group_id!r} got no answer: "
                + "; ".join(failures))

    def _found(self, api: str, asked: str, response: FindCoordinatorResponse) -> str:
        try:
            owner = self._choice.found_target(asked, response)
        except CoordinatorUnavailableError:
            assert response.error is not None
            raise CoordinatorUnavailableError(
                f"{api}: no coordinator serves group {self._group_id!r} now "
                f"(find_coordinator at {redact_url(asked)}: {response.error.value})") from None
        if not response.url:
            self._use(asked, f"find_coordinator at {redact_url(asked)} named itself")
            return asked
        try:
            self._named(owner)
        except ValueError as exc:
            raise CoordinatorUnavailableError(
                f"{api}: find_coordinator at {redact_url(asked)} named an unusable "
                f"coordinator URL: {exc}") from None
        self._use(owner, f"find_coordinator at {redact_url(asked)}")
        return owner


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
