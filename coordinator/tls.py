"""TLS for the server: ``--tls-cert`` / ``--tls-key`` to an :class:`ssl.SSLContext`.

docs/protocol.md, "Transport": HTTP/1.1 over TCP, TLS optional. The context is
handed to aiohttp's ``web.TCPSite(runner, host, port, ssl_context=...)``.
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["TLSConfigError", "server_ssl_context"]


class TLSConfigError(ValueError):
    """The certificate or key cannot be used; the message names the file."""


def server_ssl_context(cert: str | Path, key: str | Path | None = None,
                       password: str | None = None) -> ssl.SSLContext:
    """A server context from a PEM certificate chain and its private key.

    ``key`` may be omitted when the key is in the ``cert`` file. TLS 1.2 is the
    oldest version accepted (older ones have known breaks, RFC 8996); cipher
    choice is left to OpenSSL's defaults, which Python keeps current.
    """
    cert_path = Path(cert)
    key_path = Path(key) if key is not None else None
    for label, path in (("certificate", cert_path), ("key", key_path)):
        if path is not None and not path.is_file():
            raise TLSConfigError(f"TLS {label} file {str(path)!r} does not exist")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_path, key_path, password=password)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"cannot load TLS certificate {str(cert_path)!r}"
            f"{'' if key_path is None else f' with key {str(key_path)!r}'}: {exc.reason or exc}"
        ) from exc
    except OSError as exc:
        raise TLSConfigError(f"cannot read TLS files: {exc}") from exc
    return ctx
