"""Bearer-token authentication and group-prefix authorization (docs/reliability.md, "Security").

Tokens file
-----------
``--auth-tokens PATH`` names a file of token entries. Each entry has:

``name``
    who the token belongs to (shown in logs; never the token itself).
``hash``
    ``"sha256:<64 hex digits>"``: the SHA-256 of the token's UTF-8 bytes. Only
    the hash is stored; ``python -m coordinator.auth hash`` prints an entry.
``groups``
    the group-id prefixes the token grants (``"orders-"`` grants ``orders-eu``
    and ``orders-us``; ``"*"`` or ``""`` grants every group). Empty list: none.
``role``
    what the token may do besides the protocol calls of its groups:
    ``"member"`` (the default: nothing more), ``"viewer"`` (read the admin
    API: ``GET`` of ``/v1/groups...``, ``/v1/coordinators``,
    ``/v1/openapi.json``, the console) or ``"admin"`` (read and
    change: delete groups, remove members, reset checkpoints). Viewers and
    admins see and change only the groups their ``groups`` grant. Reading the
    catalog (``GET /v1/resources``) needs only a valid token: every group
    leader reads it before it assigns. *Changing* the catalog, which every
    group shares, needs an admin whose grant covers every group (``"*"``): a
    team's admin cannot resize another team's resources.
``admin``
    the older spelling: ``true`` is ``role = "admin"``.

Two layouts are read, chosen by the file name:

* ``*.toml`` -- an array of tables::

      [[tokens]]
      name = "orders-app"
      hash = "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
      groups = ["orders-"]
      role = "member"

* anything else -- JSON lines, one object per line; blank lines and lines
  starting with ``#`` are skipped::

      {"name": "ops", "hash": "sha256:...", "groups": ["*"], "role": "admin"}

Why a fast hash
---------------
Tokens are meant to be random strings of at least 128 bits
(``python -m coordinator.auth new`` makes one of 256 bits), not passwords a
human picks. Guessing a preimage of SHA-256 of such a string is out of reach,
so a slow salted hash (scrypt, PBKDF2) would add nothing but ~100 ms to every
request. ``hash`` refuses tokens shorter than :data:`MIN_TOKEN_LENGTH`.

Comparison
----------
The presented token is hashed once and compared with *every* stored hash with
:func:`hmac.compare_digest`, without stopping at the first match, so the time
taken does not depend on which entry (if any) matched nor on how many leading
bytes agree.

Member ids bound to tokens
--------------------------
Member ids already carry 128 random bits, so a member cannot guess another's
id. But the leader of a group *learns* every member id (the join response's
``members``). :func:`new_member_id` appends a tag, an HMAC keyed by the
caller's token hash over the group and the id, and :func:`member_bound`
checks it on every later call: a token can act only for members it created,
even if it learns other ids. The check needs no server state, so it survives
restarts. Callers treat an unbound id as ``UNKNOWN_MEMBER_ID``: it changes
nothing, reveals nothing, and a client that really owns no such member simply
rejoins and gets a fresh, bound id.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import secrets
import sys
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from protocol import codec
from protocol.errors import ErrorCode
from protocol.limits import MAX_NAME_LENGTH
from protocol.messages import APIS
from protocol.validate import control_character_problem

__all__ = [
    "CONSOLE_PREFIX",
    "DEFAULT_OPEN_PATHS",
    "MIN_TOKEN_LENGTH",
    "REQUEST_KEY",
    "ROLES",
    "UNAUTHORIZED_MESSAGE",
    "WWW_AUTHENTICATE",
    "TokenEntry",
    "TokenFileError",
    "TokenStore",
    "auth_middleware",
    "authorize",
    "entry_for_header",
    "forbidden",
    "forbidden_message",
    "hash_token",
    "member_bound",
    "new_member_id",
    "require_group",
    "startup_warning",
    "token_of",
    "unauthorized_msgpack",
]

#: shortest token ``hash``/``new`` accept: 128 bits as hex is 32 characters.
MIN_TOKEN_LENGTH = 32
#: longest ``Authorization`` value read; longer is refused before hashing.
MAX_TOKEN_LENGTH = 4096
#: paths answered without credentials unless the server is told otherwise
#: (scrapers and probes carry no token: /metrics, /healthz and /readyz stay open).
DEFAULT_OPEN_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})

_HASH_PREFIX = "sha256:"
_TAG_SEPARATOR = "."
_TAG_HEX_CHARS = 16  # 64-bit tag: forging one is a 2**-64 guess per request
_MEMBER_PREFIX_MAX = 64
#: the admin API: reading needs the viewer or admin role, changing the admin role.
#: The coordinators list (URLs, partitions) and the OpenAPI document are operators'
#: reading too: members find their coordinator with the find_coordinator call.
_ADMIN_PREFIXES = ("/v1/groups", "/v1/resources", "/v1/coordinators", "/v1/openapi.json")
#: the web console (coordinator.console) checks its own sign-in: a session
#: cookie made from a viewer or admin token (a browser sends no bearer header).
CONSOLE_PREFIX = "/console"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenFileError(ValueError):
    """The tokens file cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class TokenEntry:
    name: str
    #: SHA-256 digest of the token (32 bytes).
    digest: bytes
    #: group-id prefixes granted; ``""`` grants every group.
    group_prefixes: tuple[str, ...]
    #: one of :data:`ROLES`.
    role: str = "member"

    @property
    def admin(self) -> bool:
        """May change through the admin API (its groups; the catalog with a ``*`` grant)."""
        return self.role == "admin"

    @property
    def reads_admin(self) -> bool:
        """May read the admin API (its groups)."""
        return self.role in ("viewer", "admin")

    @property
    def every_group(self) -> bool:
        return "" in self.group_prefixes

    def __repr__(self) -> str:  # never print the digest, even by accident
        return (f"TokenEntry(name={self.name!r}, groups={list(self.group_prefixes)!r}, "
                f"role={self.role!r})")


#: token roles, least to most (module docstring).
ROLES = ("member", "viewer", "admin")


#: where the middleware leaves the caller's :class:`TokenEntry` on the request.
REQUEST_KEY: web.RequestKey[TokenEntry] = web.RequestKey("groupcoord.auth.token", TokenEntry)


def hash_token(token: str) -> str:
    """The ``hash`` field for ``token``: ``"sha256:<hex>"``."""
    return _HASH_PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()


def authorize(entry: TokenEntry | None, group_id: str) -> bool:
    """May ``entry`` act on ``group_id``? ``None`` (authentication off) may do anything."""
    if entry is None:
        return True
    return any(group_id.startswith(prefix) for prefix in entry.group_prefixes)


class TokenStore:
    """The entries of one tokens file, looked up in constant time per entry."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self.entries: tuple[TokenEntry, ...] = tuple(entries)
        names = [e.name for e in self.entries]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TokenFileError(f"token names must be unique; repeated: {', '.join(dupes)}")

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def load(cls, path: str | Path) -> TokenStore:
        """Read a tokens file (TOML when it ends in ``.toml``, else JSON lines)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenFileError(f"{p}: cannot read tokens file: {exc}") from exc
        if p.suffix.lower() == ".toml":
            return cls(_parse_toml(text, str(p)))
        return cls(_parse_json_lines(text, str(p)))

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry whose hash matches ``token``, or ``None``.

        Every entry is compared, with no early exit, so timing reveals nothing
        about which one matched or how close a wrong token came.
        """
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: TokenEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found


# ---------------------------------------------------------------- file parsing


def _entry(raw: object, where: str) -> TokenEntry:
    if not isinstance(raw, dict):
        raise TokenFileError(f"{where}: expected a table/object with name, hash, groups")
    unknown = set(raw) - {"name", "hash", "groups", "admin", "role"}
    if unknown:
        raise TokenFileError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise TokenFileError(f"{where}: name: expected a non-empty string of at most "
                             f"{MAX_NAME_LENGTH} characters")
    if (problem := control_character_problem(name)) is not None:
        # the name is written into log lines (and binds static members to the token)
        raise TokenFileError(f"{where}: name: {problem}")
    hashed = raw.get("hash")
    if not isinstance(hashed, str) or not hashed.startswith(_HASH_PREFIX):
        raise TokenFileError(f"{where}: hash: expected \"sha256:<64 hex digits>\" "
                             "(see python -m coordinator.auth hash)")
    hex_digest = hashed[len(_HASH_PREFIX):]
    try:
        digest = bytes.fromhex(hex_digest)
    except ValueError as exc:
        raise TokenFileError(f"{where}: hash: not hexadecimal") from exc
    if len(digest) != hashlib.sha256().digest_size:
        raise TokenFileError(f"{where}: hash: expected 64 hex digits, got {len(hex_digest)}")
    groups = raw.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise TokenFileError(f"{where}: groups: expected a list of group-id prefixes")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise TokenFileError(f"{where}: admin: expected true or false")
    role = raw.get("role", "admin" if admin else "member")
    if role not in ROLES:
        raise TokenFileError(f"{where}: role: expected one of {', '.join(ROLES)}, got {role!r}")
    if admin and role != "admin":
        raise TokenFileError(f"{where}: admin = true contradicts role = {role!r}; "
                             f"give only role")
    prefixes = tuple(dict.fromkeys("" if g == "*" else g for g in groups))
    return TokenEntry(name=name, digest=digest, group_prefixes=prefixes, role=role)


def _parse_toml(text: str, source: str) -> list[TokenEntry]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"{source}: not valid TOML: {exc}") from exc
    tables = doc.get("tokens", [])
    if not isinstance(tables, list):
        raise TokenFileError(f"{source}: tokens: expected an array of tables ([[tokens]])")
    return [_entry(t, f"{source}: tokens[{i}]") for i, t in enumerate(tables)]


def _parse_json_lines(text: str, source: str) -> list[TokenEntry]:
    entries = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            raw = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise TokenFileError(f"{source}:{lineno}: not valid JSON: {exc.msg}") from exc
        entries.append(_entry(raw, f"{source}:{lineno}"))
    return entries


# ---------------------------------------------------------------- member ids


def _tag(entry: TokenEntry, group_id: str, body: str) -> str:
    mac = hmac.new(entry.digest, f"{group_id}\0{body}".encode(), hashlib.sha256)
    return mac.hexdigest()[:_TAG_HEX_CHARS]


def new_member_id(client_id: str | None, group_id: str, entry: TokenEntry | None) -> str:
    """A fresh member id: ``<client_id>-<128 random bits as hex>[.<tag>]``.

    Kafka's member ids are ``client_id-UUID``; the prefix helps people reading
    logs and the admin API. It is cut to 64 characters so the id stays within
    the 255-character limit. With authentication on, the id is bound to the
    caller's token (module docstring).
    """
    prefix = (client_id or "member")[:_MEMBER_PREFIX_MAX]
    body = f"{prefix}-{secrets.token_hex(16)}"
    if entry is None:
        return body
    return f"{body}{_TAG_SEPARATOR}{_tag(entry, group_id, body)}"


def member_bound(entry: TokenEntry | None, group_id: str, member_id: str) -> bool:
    """Was ``member_id`` minted for ``entry`` in ``group_id``?

    Authentication off (``entry is None``) or an empty member id (a first
    join, or a static member leaving by instance id) is always allowed.
    """
    if entry is None or not member_id:
        return True
    body, sep, tag = member_id.rpartition(_TAG_SEPARATOR)
    if not sep or len(tag) != _TAG_HEX_CHARS:
        return False
    return hmac.compare_digest(tag.encode("ascii", "replace"),
                               _tag(entry, group_id, body).encode("ascii"))


# ---------------------------------------------------------------- HTTP


def _is_protocol_call(path: str) -> bool:
    # docs/protocol.md, "Transport": every protocol call is POST /v1/<api>.
    return path.startswith("/v1/") and path[len("/v1/"):] in APIS


def _is_admin_call(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _ADMIN_PREFIXES)


def _is_catalog(path: str) -> bool:
    return path == "/v1/resources" or path.startswith("/v1/resources/")


def _catalog_read(method: str, path: str) -> bool:
    # Every leader reads the catalog before it assigns (docs/protocol.md, "Admin (JSON)":
    # "the leader rejoins when the epoch moves"), so reading it needs a valid
    # token but not the admin flag; changing it does.
    return method in ("GET", "HEAD") and path == "/v1/resources"


def _error(path: str, status: int, code: ErrorCode, message: str,
           headers: dict[str, str] | None = None) -> web.Response:
    """An error body in the call's encoding (docs/protocol.md, "Transport")."""
    doc = {"error": code.value, "message": message}
    if _is_protocol_call(path):
        return web.Response(status=status, body=codec.encode(doc),
                            content_type=codec.CONTENT_TYPE, headers=headers)
    return web.json_response(doc, status=status, headers=headers)


def forbidden_message(entry: TokenEntry | None, group_id: str) -> str:
    """The message of the 403 ``GROUP_AUTHORIZATION_FAILED`` answer for ``group_id``."""
    who = entry.name if entry is not None else "caller"
    return f"token {who!r} is not granted group {group_id!r}"


def forbidden(request: web.Request, group_id: str) -> web.Response:
    """The 403 ``GROUP_AUTHORIZATION_FAILED`` answer for ``group_id``."""
    return _error(request.path, 403, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                  forbidden_message(token_of(request), group_id))


# Framework-free pieces for the lean HTTP path of the protocol calls
# (coordinator.http.fast), which has no aiohttp request to hand over.

#: the message of the 401 answer (the middleware's and the lean path's).
UNAUTHORIZED_MESSAGE = "missing or invalid bearer token (Authorization: Bearer <token>)"
#: RFC 6750 section 3: a 401 names the scheme; the reason is in the body.
WWW_AUTHENTICATE = 'Bearer realm="groupcoord"'


def entry_for_header(tokens: TokenStore, authorization: str | None) -> TokenEntry | None:
    """The entry of the bearer token in an ``Authorization`` header value, or ``None``."""
    token = _bearer(authorization)
    return tokens.lookup(token) if token is not None else None


def unauthorized_msgpack() -> bytes:
    """The msgpack body of the 401 answer to a protocol call."""
    return codec.encode({"error": ErrorCode.GROUP_AUTHORIZATION_FAILED.value,
                         "message": UNAUTHORIZED_MESSAGE})


def token_of(request: web.Request) -> TokenEntry | None:
    """The caller's token entry; ``None`` when authentication is off."""
    return request.get(REQUEST_KEY)


def require_group(request: web.Request, group_id: str) -> web.Response | None:
    """For handlers, after decoding: the 403 to send, or ``None`` if allowed.

    ``if (denied := require_group(request, msg.group_id)) is not None: return denied``
    """
    if authorize(token_of(request), group_id):
        return None
    return forbidden(request, group_id)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    if not value or len(value) > MAX_TOKEN_LENGTH:
        return None
    return value


def _admin_group(request: web.Request) -> str | None:
    """The group id an admin route names (``/v1/groups/{group_id}...``), else ``None``.

    Taken from the route's match (aiohttp matches the encoded path and decodes
    the segment), so a group id with a "/" in it (sent as %2F) is checked whole.
    """
    group_id = request.match_info.get("group_id")
    return group_id or None


def auth_middleware(tokens: TokenStore,
                    open_paths: Iterable[str] = DEFAULT_OPEN_PATHS) -> Any:
    """An aiohttp middleware: 401 without a known token, 403 outside its grant.

    The caller's :class:`TokenEntry` is left on the request (:func:`token_of`).
    Paths under :data:`CONSOLE_PREFIX` pass: the console signs its users in
    with the same tokens and checks its session cookie itself.
    It checks what it can see without reading the body: the admin flag for
    admin calls and the group in ``/v1/groups/{group_id}``. Protocol calls
    carry the group id in their msgpack body, so their handlers call
    :func:`require_group` (and :func:`member_bound`) after decoding.
    """
    open_set = frozenset(open_paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in open_set or path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/"):
            return await handler(request)
        entry = entry_for_header(tokens, request.headers.get("Authorization"))
        if entry is None:
            return _error(path, 401, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                          UNAUTHORIZED_MESSAGE, headers={"WWW-Authenticate": WWW_AUTHENTICATE})
        request[REQUEST_KEY] = entry
        if _is_admin_call(path) and not _catalog_read(request.method, path):
            reading = request.method in ("GET", "HEAD")
            if not (entry.reads_admin if reading else entry.admin):
                need = "the viewer or admin role" if reading else "the admin role"
                return _error(path, 403, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                              f"token {entry.name!r} (role {entry.role}) may not "
                              f"{'read' if reading else 'change'} through the admin API: "
                              f"needs {need}")
            if _is_catalog(path) and not entry.every_group:
                # The catalog is shared by every group: a team's admin may not change it.
                return _error(path, 403, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                              f"token {entry.name!r} may not change the resource catalog: "
                              f"it is shared by every group, so it needs an admin grant "
                              f"on every group (groups = [\"*\"])")
            group_id = _admin_group(request)
            if group_id is not None and not authorize(entry, group_id):
                return forbidden(request, group_id)
        return await handler(request)

    return middleware


def startup_warning(host: str, auth_enabled: bool) -> str | None:
    """The warning ``serve`` logs when it listens beyond loopback without auth."""
    if auth_enabled or host in ("127.0.0.1", "::1", "localhost"):
        return None
    return (f"listening on {host} without authentication: anyone who can reach this "
            "address can join, leave or delete any group; pass --auth-tokens FILE")


# ---------------------------------------------------------------- command line


def _entry_line(token: str, name: str, groups: Sequence[str], role: str) -> str:
    return json.dumps({"name": name, "hash": hash_token(token), "groups": list(groups),
                       "role": role})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coordinator.auth",
        description="Make entries for a groupcoord tokens file (JSON lines).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd, help_text in (("hash", "read a token from stdin, print its entry"),
                           ("new", "make a random token: prints the token, then its entry")):
        p = sub.add_parser(cmd, help=help_text)
        p.add_argument("--name", required=True, help="who the token belongs to")
        p.add_argument("--group", dest="groups", action="append", default=[],
                       metavar="PREFIX", help="group-id prefix granted (repeat; '*' = all)")
        p.add_argument("--role", choices=ROLES, default="member",
                       help="member (default), viewer (reads the admin API) or admin")
        p.add_argument("--admin", action="store_true", help="the same as --role admin")
    args = parser.parse_args(argv)
    if args.cmd == "new":
        token = secrets.token_urlsafe(32)
        print(token)
    else:
        token = sys.stdin.readline().strip()
        if len(token) < MIN_TOKEN_LENGTH:
            print(f"error: tokens must be at least {MIN_TOKEN_LENGTH} characters of random "
                  "text (python -m coordinator.auth new makes one)", file=sys.stderr)
            return 2
    print(_entry_line(token, args.name, args.groups, "admin" if args.admin else args.role))
    return 0


if __name__ == "__main__":
    sys.exit(main())
