"""The two listeners of one server: protocol (workers) and admin (operators).

Each byte stream is parsed by exactly one parser with one set of limits
(docs/operations.md, "Listeners"): the protocol listener (``--host``/``--port``, default 9080) is
the lean llhttp path of :mod:`coordinator.http.fast` and serves only the
protocol calls (and the catalog read a leader needs); the admin listener
(``--admin-host``/``--admin-port``, default 9081) is aiohttp with the app of
:mod:`coordinator.http.app`: admin JSON, ``/metrics``, ``/healthz``,
``/readyz``. Operators can firewall the admin port apart from the workers'.
TLS and tokens apply to both. docs/operations.md, "Listeners".

The URL given out for this process (``--advertised-url``, else the protocol
listener's) is checked at start (:meth:`Listeners.check_reaches_self`): a
coordinator whose advertised URL leads nowhere, or to another process, would
take partitions and have ``find_coordinator`` send their groups there.
"""

from __future__ import annotations

import hmac
import secrets
import ssl
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from coordinator import auth
from coordinator.console.live import DEFAULT_LIMITS, StreamLimits
from coordinator.http.app import AdminServerLog, build_admin_app
from coordinator.http.calls import Calls
from coordinator.http.fast import (
    BACKLOG,
    KEEPALIVE_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    SELF_CHECK_PREFIX,
    FastServer,
    self_check_proof,
)
from coordinator.metrics import Metrics
from coordinator.runtime.service import Service
from protocol.limits import DEFAULT_MAX_METADATA_BYTES

#: seconds the admin listener gives its open requests at shutdown.
ADMIN_SHUTDOWN_S = 2.0
#: seconds the start-up check of the advertised URL waits for its answer (it is
#: this process answering itself: milliseconds when the URL is right).
SELF_CHECK_TIMEOUT_S = 3.0


class ListenError(OSError):
    """A listener could not bind, or the advertised URL does not reach this process;
    the message names which one and the address."""


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a listener listens (``port`` is the one bound when 0 was asked)."""

    host: str
    port: int
    scheme: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


class Listeners:
    """The protocol and admin listeners of one runtime; :meth:`start`, then :meth:`stop`."""

    def __init__(self, runtime: Service, metrics: Metrics, *, max_body_bytes: int,
                 max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
                 tokens: auth.TokenStore | None = None,
                 admin_names: frozenset[str] = frozenset(),
                 console_limits: StreamLimits = DEFAULT_LIMITS,
                 keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """``admin_names``: without ``tokens``, the ``Host`` names the admin listener
        answers to besides localhost and IP addresses
        (:func:`coordinator.http.headers.admin_names`)."""
        self.calls = Calls(runtime, metrics, max_body_bytes=max_body_bytes,
                           max_metadata_bytes=max_metadata_bytes, tokens=tokens)
        self.protocol = FastServer(self.calls, keepalive_timeout_s=keepalive_timeout_s,
                                   request_timeout_s=request_timeout_s)
        self.admin_app = build_admin_app(runtime, metrics, max_body_bytes=max_body_bytes,
                                         tokens=tokens, admin_names=admin_names,
                                         console_limits=console_limits)
        # auto_decompress off: no body is ever decompressed on this listener
        # (Content-Encoding is refused 415 before the body is read anyway).
        self._runner = web.AppRunner(self.admin_app, access_log=None,
                                     shutdown_timeout=ADMIN_SHUTDOWN_S,
                                     keepalive_timeout=keepalive_timeout_s,
                                     logger=AdminServerLog(metrics), auto_decompress=False)
        self._site: web.TCPSite | None = None
        self._set_up = False

    async def start(self, host: str, port: int, admin_host: str, admin_port: int,
                    ssl_context: ssl.SSLContext | None = None) -> tuple[Bound, Bound]:
        """Listen on both; returns (protocol, admin) as bound. :class:`ListenError`
        if either address cannot be used (nothing is left listening then)."""
        scheme = "https" if ssl_context is not None else "http"
        try:
            bound_host, bound_port = await self.protocol.start(host, port, ssl_context)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port} (protocol listener, --port): "
                              f"{exc.strerror or exc}") from exc
        protocol = Bound(bound_host, bound_port, scheme)
        await self._runner.setup()
        self._set_up = True
        site = web.TCPSite(self._runner, admin_host, admin_port, ssl_context=ssl_context,
                           backlog=BACKLOG, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            self.protocol.close_listener()
            raise ListenError(f"cannot listen on {admin_host}:{admin_port} (admin listener, "
                              f"--admin-port): {exc.strerror or exc}") from exc
        self._site = site
        name = self._runner.addresses[0]
        admin = Bound(str(name[0]), int(name[1]), scheme)
        self.protocol.admin_port = admin.port
        return protocol, admin

    async def check_reaches_self(self, url: str,
                                 timeout_s: float = SELF_CHECK_TIMEOUT_S) -> None:
        """:class:`ListenError` unless ``url`` (the advertised protocol URL) reaches
        this very process's protocol listener.

        It asks ``GET {url}/v1/self-check/{challenge}``; only while this runs does
        the listener answer that, with an HMAC of the challenge under a key that
        never leaves the process, so another process at that address (another
        coordinator, any web server) cannot pass. The certificate is not verified
        (the proof is the HMAC); redirects and proxies are not followed.
        """
        key = secrets.token_bytes(32)
        challenge = secrets.token_hex(16)
        where = f"advertised URL {url} (--advertised-url, else the protocol listener's)"
        self.protocol.self_check_key = key
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as session, \
                    session.get(f"{url.rstrip('/')}{SELF_CHECK_PREFIX.decode()}{challenge}",
                                ssl=False, allow_redirects=False) as resp:
                status = resp.status
                body = await resp.content.read(256)
        except TimeoutError:
            raise ListenError(f"{where} does not reach this coordinator: no answer within "
                              f"{timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise ListenError(f"{where} does not reach this coordinator: {detail}") from None
        finally:
            self.protocol.self_check_key = None
        if status != 200 or not hmac.compare_digest(
                body, self_check_proof(key, challenge.encode("ascii"))):
            raise ListenError(f"{where} does not reach this coordinator: what answers there "
                              f"(HTTP {status}) is another process or listener")

    def close(self) -> None:
        """Accept no new connections on the protocol listener (the first thing at
        shutdown, before the runtime answers what is parked)."""
        self.protocol.close_listener()

    async def stop(self, grace_s: float) -> None:
        """Answer what is in flight (``grace_s`` at most) and close everything."""
        await self.protocol.shutdown(grace_s)
        if self._set_up:
            await self._runner.cleanup()
        await self.protocol.finish()
