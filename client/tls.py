"""TLS for the client: verify the coordinator's certificate against a CA file.

The member never turns verification off: with ``ca_file`` it trusts that CA
(a private CA or a self-signed server certificate) and only that CA;
without it, the system's trust store. Host names are checked, so the URL must name a host (or IP
address) the certificate lists.
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["client_ssl_context"]


def client_ssl_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """A verifying client context; pass it as ``ssl=`` to aiohttp's requests or connector.

    Raises :class:`ValueError` naming the file when ``ca_file`` is missing or
    holds no usable certificate.
    """
    if ca_file is not None and not Path(ca_file).is_file():
        raise ValueError(f"CA file {str(ca_file)!r} does not exist")
    try:
        # With a CA file, only that CA is trusted (not the system store as well):
        # a private coordinator's certificate is never signed by a public CA.
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=None if ca_file is None else str(ca_file))
    except ssl.SSLError as exc:
        raise ValueError(f"CA file {str(ca_file)!r} holds no usable certificate: "
                         f"{exc.reason or exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
