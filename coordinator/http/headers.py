"""Rules about a request's header fields that both listeners apply.

Fields given once
-----------------
:data:`SINGLE_VALUE_FIELDS` may appear at most once in a request (RFC 9110
5.3: they are not lists). A second one is refused 400 and the connection
closed, on the protocol listener (:mod:`coordinator.http.fast`, while it
parses the head) and on the admin listener (:mod:`coordinator.http.app`):
two parsers, or a proxy in front, could each pick another one, and the
first of two ``Authorization`` fields must not be the one that counts for
us while a proxy in front checked the second.

The admin listener's names
--------------------------
Without authentication, the admin listener answers only requests whose
``Host`` names it (:func:`host_allowed`): a web page cannot use DNS
rebinding (a name of its own that it re-points to 127.0.0.1) to make the
browser of someone on the coordinator's machine read or change groups
through it. Allowed are: ``localhost``, any IP address (a page whose origin
is an IP address is served by that address, so rebinding needs a name), the
address the listener is bound to as given (``--admin-host``), the host of
``--advertised-url``, and the names of ``--admin-allowed-hosts`` (``*``:
any). The port is not compared: ``kubectl port-forward``, SSH tunnels and
published container ports reach the listener under another port, and the
name alone is what rebinding controls. A request without ``Host`` (HTTP/1.0)
passes: a browser always sends one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = [
    "ADMIN_ALLOWED_HOSTS_SETTING",
    "ANY_HOST",
    "LOCAL_NAMES",
    "SINGLE_VALUE_FIELDS",
    "admin_names",
    "duplicate_message",
    "host_allowed",
    "host_name",
    "host_refused_message",
]

#: fields a request may give once; a second one is 400 on both listeners.
SINGLE_VALUE_FIELDS: tuple[str, ...] = (
    "Content-Type", "Content-Length", "Authorization", "Host", "Expect",
    "Content-Encoding", "Transfer-Encoding")

#: names the admin listener always answers to (besides IP addresses).
LOCAL_NAMES = frozenset({"localhost"})
#: in ``--admin-allowed-hosts``: every name (no ``Host`` check).
ANY_HOST = "*"
#: the setting that adds names (its flag; also GROUPCOORD_ADMIN_ALLOWED_HOSTS).
ADMIN_ALLOWED_HOSTS_SETTING = "--admin-allowed-hosts"


def duplicate_message(field: str) -> str:
    """The body of the 400 answer to a request that gives ``field`` twice."""
    return f"{field} is given more than once"


def host_name(host: str) -> str:
    """The name part of a ``Host`` value or a host setting, lower case, without its
    port, IPv6 brackets or trailing dot: ``"[::1]:9081"`` -> ``"::1"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:  # name:port (an unbracketed IPv6 address has several)
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.partition("%")[0])  # a zone id: fe80::1%eth0
    except ValueError:
        return False
    return True


def admin_names(admin_address: str, advertised_url: str,
                extra: Iterable[str]) -> frozenset[str]:
    """The names the admin listener answers to, besides :data:`LOCAL_NAMES` and IP
    addresses: its address as given, the advertised URL's host, ``extra``."""
    names = {host_name(admin_address), *(host_name(e) for e in extra)}
    if advertised_url:
        names.add(host_name(urlsplit(advertised_url).hostname or ""))
    names.discard("")
    return frozenset(names)


def host_allowed(host: str | None, names: frozenset[str]) -> bool:
    """May a request with this ``Host`` value be answered (module docs)?"""
    if host is None or ANY_HOST in names:
        return True
    name = host_name(host)
    return name in LOCAL_NAMES or name in names or _is_ip(name)


def host_refused_message(host: str) -> str:
    """The message of the 403 answer to a ``Host`` the admin listener does not answer to."""
    shown = ascii(host[:100])
    return (f"Host {shown} is not a name of this admin listener: without --auth-tokens it "
            f"answers only to localhost, IP addresses, its --admin-host and the "
            f"--advertised-url host (DNS-rebinding protection); add the name with "
            f"{ADMIN_ALLOWED_HOSTS_SETTING} (GROUPCOORD_ADMIN_ALLOWED_HOSTS)")
