"""The member's one-method transport (DESIGN.md practice 7, the httpx model).

Everything the member says to the coordinator goes through
``await transport.call(api, request) -> response``: ``api`` is a protocol
call of PROTOCOL.md ("join", "sync", "heartbeat", "leave", "commit",
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
  :class:`~client.errors.TLSVerificationError` (fatal: a setting to fix).

Tests swap in an in-memory transport: any object with this ``call`` method.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from client.errors import (
    CoordinatorUnavailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    TLSVerificationError,
)
from client.tls import client_ssl_context
from protocol.codec import CONTENT_TYPE, DecodeError, decode, encode
from protocol.errors import ErrorCode
from protocol.messages import APIS, Request, Response
from protocol.validate import ValidationError

__all__ = [
    "CATALOG_API",
    "AiohttpTransport",
    "CallRequest",
    "CallResponse",
    "CatalogRequest",
    "CatalogResponse",
    "Transport",
]

#: the pseudo-api name of ``GET /v1/resources``.
CATALOG_API = "resources"


@dataclass(frozen=True, slots=True)
class CatalogRequest:
    """``GET /v1/resources``: the leader reads the catalog before it assigns."""

    API = CATALOG_API


@dataclass(frozen=True, slots=True)
class CatalogResponse:
    """``{"resources_epoch": E, "resources": {name: partitions}}``."""

    resources_epoch: int
    resources: Mapping[str, int] = field(default_factory=dict)

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
        return cls(epoch, resources)


CallRequest = Request | CatalogRequest
CallResponse = Response | CatalogResponse


class Transport(Protocol):
    """What the member needs from the network: one method."""

    async def call(self, api: str, request: Any) -> Any:
        """Send ``request`` to ``api``; return the decoded response or raise one
        of the errors listed in this module's docstring."""
        ...


class AiohttpTransport:
    """The transport over HTTP/1.1 with aiohttp (PROTOCOL.md, "Transport").

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
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator URL must start with http:// or https://: {base_url!r}")
        if ca_file is not None and ssl_context is not None:
            raise ValueError("give ca_file or ssl_context, not both")
        if (ca_file is not None or ssl_context is not None) and base_url.startswith("http://"):
            raise ValueError(f"ca_file/ssl_context need an https:// coordinator URL: "
                             f"{base_url!r}")
        self._base = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._connect_timeout_s = connect_timeout_s
        self._ssl: ssl.SSLContext | None = (
            client_ssl_context(ca_file) if ca_file is not None else ssl_context)
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return self._base

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No total timeout: the member bounds every call itself (a parked
            # join may legitimately last a whole rebalance timeout).
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s)
            # ssl=True: aiohttp's default, verifying against the system store.
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True)
            self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers,
                                                  connector=connector)
        return self._session

    async def call(self, api: str, request: Any) -> Any:
        session = self._get_session()
        try:
            if api == CATALOG_API:
                async with session.get(f"{self._base}/v1/resources") as resp:
                    body = await resp.read()
                    self._check_status(api, resp.status, body, json_body=True)
                    return CatalogResponse.from_json(json.loads(body))
            if api not in APIS:
                raise ValueError(f"unknown api {api!r}")
            response_type = APIS[api][1]
            async with session.post(f"{self._base}/v1/{api}", data=encode(request.to_wire()),
                                    headers={"Content-Type": CONTENT_TYPE}) as resp:
                body = await resp.read()
                self._check_status(api, resp.status, body, json_body=False)
                result: Response = response_type.from_wire(decode(body))
                return result
        except (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError) as exc:
            detail = getattr(exc, "certificate_error", exc)
            raise TLSVerificationError(
                f"{api}: the certificate of {self._base} could not be verified ({detail}); "
                "pass ca_file= (the CA that signed the coordinator's certificate) or "
                "ssl_context=") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise CoordinatorUnavailableError(f"{api}: {type(exc).__name__}: {exc}") from exc
        except (DecodeError, ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CoordinatorUnavailableError(f"{api}: unreadable response: {exc}") from exc

    @staticmethod
    def _check_status(api: str, status: int, body: bytes, *, json_body: bool) -> None:
        if status == 200:
            return
        message = _error_message(body, json_body)
        if status in (400, 413, 415):
            raise InvalidRequestError(f"{api}: HTTP {status}: {message}")
        if status in (401, 403):
            raise GroupAuthorizationFailedError(f"{api}: HTTP {status}: {message}",
                                                ErrorCode.GROUP_AUTHORIZATION_FAILED)
        raise CoordinatorUnavailableError(f"{api}: HTTP {status}: {message}")

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _error_message(body: bytes, json_body: bool) -> str:
    try:
        obj = json.loads(body) if json_body else decode(body)
    except (DecodeError, ValueError):
        return body[:200].decode("utf-8", "replace")
    if isinstance(obj, dict):
        return str(obj.get("message") or obj.get("error") or obj)
    return str(obj)[:200]
