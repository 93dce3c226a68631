"""libpq-style PostgreSQL URLs: telling one from a file path, and showing one safely.

The password of ``--db postgresql://user:secret@host:5432/db`` must never reach
a log line, an error message, a ``repr`` or ``/metrics``. Every
message that names the database goes through :func:`redact`, and any text that
comes back from the driver goes through :func:`scrub` as well, in case it
quotes what it was given.

This module does not import the driver: ``groupcoord serve`` on SQLite uses it
to recognise a PostgreSQL URL without asyncpg installed.
"""

from __future__ import annotations

import re
import urllib.parse

SCHEMES = ("postgresql://", "postgres://")
MASK = "***"

# ``password=...`` in the query string (libpq accepts it there) or in a
# key=value conninfo string: the value runs to the next ``&`` or blank.
_PASSWORD_PARAM = re.compile(r"(?i)(\bpassword\s*=\s*)([^&\s]*)")


def is_postgres_url(text: str) -> bool:
    """Whether ``--db`` names a PostgreSQL database rather than an SQLite file."""
    return text.lower().startswith(SCHEMES)


def _split(url: str) -> tuple[str, str | None, str, str]:
    """``(scheme://, userinfo or None, hosts/db, ?query or "")`` of a URL.

    Where the userinfo ends is decided conservatively: asyncpg and libpq stop
    it at the first ``@`` of the authority, but a password typed with a raw
    ``/``, ``?`` or ``@`` in it would then spill into what is shown as the
    host. Taking the *last* ``@`` (of the part before the query, or of the
    whole URL if only the query has one) hides all of a password in every
    case, at worst together with a part of the URL that was not one.
    """
    scheme_end = url.find("://")
    scheme, rest = (url[:scheme_end + 3], url[scheme_end + 3:]) if scheme_end >= 0 else ("", url)
    head, mark, query = rest.partition("?")
    if "@" in head:
        userinfo, hosts = head.rsplit("@", 1)
        return scheme, userinfo, hosts, mark + query
    if "@" in query:
        userinfo, hosts = rest.rsplit("@", 1)
        return scheme, userinfo, hosts, ""
    return scheme, None, head, mark + query


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``; hosts, ports, user and db kept.

    >>> redact("postgresql://app:s3cret@db1:5432,db2:5432/coord?sslmode=require")
    'postgresql://app:***@db1:5432,db2:5432/coord?sslmode=require'
    """
    scheme, userinfo, hosts, query = _split(url)
    if userinfo is None:
        shown = scheme + hosts
    else:
        user, colon, _password = userinfo.partition(":")
        shown = f"{scheme}{user}{':' + MASK if colon else ''}@{hosts}"
    return shown + _PASSWORD_PARAM.sub(lambda m: m.group(1) + MASK, query)


def passwords(url: str) -> tuple[str, ...]:
    """Every spelling of a password the URL carries (as typed and percent-decoded)."""
    found: list[str] = []
    _scheme, userinfo, _hosts, query = _split(url)
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found.extend(m.group(2) for m in _PASSWORD_PARAM.finditer(query))
    spellings = {s for p in found for s in (p, urllib.parse.unquote(p)) if s}
    # Longest first, so that replacing one spelling cannot leave part of another.
    return tuple(sorted(spellings, key=len, reverse=True))


def scrub(text: str, url: str) -> str:
    """``text`` (say, a driver's error message) with the URL's password masked out.

    The URL itself is replaced by its redacted form first; then any stray
    copy of the password (raw or percent-decoded) is masked.
    """
    text = text.replace(url, redact(url))
    for secret in passwords(url):
        text = text.replace(secret, MASK)
    return text
