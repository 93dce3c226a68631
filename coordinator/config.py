"""Settings of ``groupcoord serve`` (docs/protocol.md, "Running the server").

Every setting comes from, in order of precedence: a command-line flag, a
``GROUPCOORD_*`` environment variable, a key of the TOML file named by
``--config`` (or ``GROUPCOORD_CONFIG``), then the default. A bad value is a
:class:`ConfigError` naming the setting and where the value came from, so an
operator knows which of the three places to fix.

Each setting is declared once, as a field of :class:`ServerConfig` or of the
:class:`CoreConfig` it extends (coordinator/core/config.py, :func:`setting`);
:data:`SETTINGS`, the flags, variables, keys and checks, and
:meth:`ServerConfig.core_config` are derived from those fields.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import get_type_hints

from coordinator.console.live import StreamLimits
from coordinator.core.config import (
    CHECK,
    HELP,
    MAX_COUNT,
    Check,
    CoreConfig,
    between,
    setting,
)
from protocol.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_METADATA_BYTES

ENV_PREFIX = "GROUPCOORD_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(ValueError):
    """A setting has a value the server cannot run with."""


def _non_empty(value: object) -> str | None:
    return None if value else "must not be empty"


def _url_or_empty(value: object) -> str | None:
    if not value:
        return None
    from urllib.parse import urlsplit
    assert isinstance(value, str)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://coord-1:9080"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return "must be scheme://host[:port] only (no path, query or credentials)"
    del port
    return None


_HOST_NAME = re.compile(r"\*|[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")


def _host_names(value: object) -> str | None:
    assert isinstance(value, str)
    for name in (e.strip() for e in value.split(",")):
        if name and not _HOST_NAME.fullmatch(name):
            return (f"{name!r} is not a host name: give names separated by commas, without "
                    f"scheme or port (e.g. coord-admin.internal,ops.example), or *")
    return None


def _log_level(value: object) -> str | None:
    return None if value in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"


@dataclass(frozen=True, slots=True)
class ServerConfig(CoreConfig):
    """Every setting of ``groupcoord serve``: the core's (:class:`CoreConfig`, declared
    there) and then the server's own, each declared once here with :func:`setting`."""

    host: str = setting("127.0.0.1", "address to listen on (the protocol listener; the admin "
                        "listener too unless --admin-host is given)", _non_empty)
    port: int = setting(9080, "TCP port of the protocol listener (the workers' calls); 0 "
                        "picks a free one and prints it", between(0, 65535))
    #: the admin listener (admin JSON, /metrics, /healthz, /readyz); "": the host.
    admin_host: str = setting("", "address of the admin listener (admin API, /metrics, "
                              "/healthz, /readyz); empty: the --host value")
    admin_port: int = setting(9081, "TCP port of the admin listener; 0 picks a free one and "
                              "prints it", between(0, 65535))
    #: without auth, more ``Host`` names the admin listener answers to (comma-separated).
    admin_allowed_hosts: str = setting(
        "", "without --auth-tokens, more names the admin listener answers to in the Host "
        "header, comma-separated (it always answers to localhost, IP addresses, --admin-host "
        "and the --advertised-url host; others get 403, against DNS rebinding); * answers to "
        "any", _host_names)
    db: str = setting("./groupcoord.db", "SQLite database file (created if missing), or a "
                      "postgresql://USER@HOST:PORT/DB URL for several coordinators sharing one "
                      "database (password from PGPASSWORD or ~/.pgpass, never logged)",
                      _non_empty)
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, "largest request body accepted "
                                  "(larger: 413)", between(1024, MAX_COUNT))
    #: bytes of one protocol's metadata in a join, or one member's assignment in a sync.
    max_metadata_bytes: int = setting(
        DEFAULT_MAX_METADATA_BYTES, "largest metadata of one protocol in a join, or "
        "assignment of one member in a sync (larger: 400)", between(1, MAX_COUNT))
    #: joins, syncs and waiting heartbeats parked at once; 0: unlimited.
    max_parked_requests: int = setting(
        100_000, "most joins, syncs and waiting heartbeats parked at once; 0 is unlimited",
        between(0, MAX_COUNT))
    #: joins and syncs parked at once for one token (authentication on); 0: unlimited.
    max_parked_per_token: int = setting(
        10_000, "most joins and syncs parked at once for one token (authentication on), so "
        "one token cannot take the whole of --max-parked-requests; more are answered "
        "COORDINATOR_NOT_AVAILABLE; must be at least the members of the largest group one "
        "token runs; 0 is unlimited", between(0, MAX_COUNT))
    #: groups with their own series on /metrics (the largest first); 0: none.
    group_metrics: int = setting(
        0, "groups that get their own series on /metrics (members, generation, state, "
        "health), the largest by members first; 0: none (the default: per-group series grow "
        "with the number of groups)", between(0, 10_000))
    #: several coordinators (``db`` a postgresql:// URL): what find_coordinator gives
    #: out for this process ("": ``http(s)://HOST:PORT`` as it listens).
    advertised_url: str = setting(
        "", "PostgreSQL only: this coordinator's protocol URL as members reach it, given out "
        "by find_coordinator (empty: http://HOST:PORT as it listens)", _url_or_empty)
    #: partitions of a new PostgreSQL database (0: 64); must match an existing one.
    partitions: int = setting(
        0, "PostgreSQL only: partitions the groups are spread over, fixed when the database "
        "is created (0: the database's, 64 for a new one); another value than the "
        "database's is refused", between(0, 4096))
    #: a partition lease's length (PostgreSQL only).
    lease_ms: int = setting(
        5_000, "PostgreSQL only: how long a partition lease lasts unless renewed (renewed "
        "every lease/5); a failover takes about this long, so keep it well under the "
        "members' session timeout (docs/operations.md)", between(1_000, 600_000))
    #: the web console's live pages (event streams) open at once, and of one client.
    console_max_streams: int = setting(
        32, "web console: live pages (event streams) open at once; one more is refused 503 "
        "and shows without live updates", between(1, 10_000))
    console_max_streams_per_client: int = setting(
        8, "web console: live pages open at once by one client (its token with "
        "--auth-tokens, else its address); one more is refused 429", between(1, 10_000))
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING, ERROR or CRITICAL", _log_level)
    #: tokens file (coordinator.auth); empty: authentication off.
    auth_tokens: str = setting("", "tokens file for bearer authentication (empty: off)")
    #: PEM certificate chain and key (coordinator.tls); empty: plain HTTP.
    tls_cert: str = setting("", "PEM certificate chain for HTTPS (empty: plain HTTP)")
    tls_key: str = setting("", "PEM private key of --tls-cert (if not in that file)")

    @property
    def admin_address(self) -> str:
        """The admin listener's host: ``admin_host``, else ``host``."""
        return self.admin_host or self.host

    @property
    def admin_allowed_host_names(self) -> tuple[str, ...]:
        """``admin_allowed_hosts`` as a list."""
        return tuple(n for n in (e.strip() for e in self.admin_allowed_hosts.split(",")) if n)

    def console_limits(self) -> StreamLimits:
        return StreamLimits(self.console_max_streams, self.console_max_streams_per_client)

    def core_config(self) -> CoreConfig:
        """The settings the core uses: this configuration's fields of :class:`CoreConfig`."""
        return CoreConfig(**{f.name: getattr(self, f.name) for f in fields(CoreConfig)})


@dataclass(frozen=True, slots=True)
class Setting:
    """One field of :class:`ServerConfig` as ``serve`` takes it: its flag, its
    environment variable, its TOML key (the name) and its check."""

    name: str
    kind: type[int] | type[str]
    default: int | str
    help: str
    #: returns a problem description, or None when the value is fine.
    check: Check
    #: whether the core uses it (a field of :class:`CoreConfig`), not only the server.
    core: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _settings() -> tuple[Setting, ...]:
    """:class:`ServerConfig`'s fields as settings, the server's own (listeners and
    database first) before the core's; a field without a :func:`setting` or of
    another type than int or str fails at import."""
    hints = get_type_hints(ServerConfig)
    core = {f.name for f in fields(CoreConfig)}
    out = []
    for f in fields(ServerConfig):
        kind: type[int] | type[str] = hints[f.name]
        default = f.default
        if kind not in (int, str) or type(default) is not kind or HELP not in f.metadata:
            raise TypeError(f"ServerConfig.{f.name}: not a setting (an int or str field "
                            f"declared with setting())")
        assert isinstance(default, int | str)
        out.append(Setting(f.name, kind, default, f.metadata[HELP], f.metadata[CHECK],
                           f.name in core))
    return tuple(sorted(out, key=lambda s: s.core))


SETTINGS: tuple[Setting, ...] = _settings()

_BY_NAME = {s.name: s for s in SETTINGS}


def _parse(setting: Setting, raw: object, source: str) -> object:
    """Convert a raw value (flag/env text or a TOML value) and check it."""
    value: object = raw
    if setting.kind is int:
        if isinstance(raw, str):
            try:
                value = int(raw.strip(), 10)
            except ValueError:
                raise ConfigError(f"{setting.name} ({source}): expected an integer, "
                                  f"got {raw!r}") from None
        elif isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"{setting.name} ({source}): expected an integer, got {raw!r}")
    else:
        if not isinstance(raw, str):
            raise ConfigError(f"{setting.name} ({source}): expected a string, got {raw!r}")
        if setting.name == "log_level":
            value = raw.upper()
    problem = setting.check(value)
    if problem is not None:
        raise ConfigError(f"{setting.name} ({source}): {problem}, got {raw!r}")
    return value


def read_config_file(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc
    unknown = sorted(k for k in doc if k.replace("-", "_") not in _BY_NAME)
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(_BY_NAME)}")
    return {k.replace("-", "_"): v for k, v in doc.items()}


def resolve(flags: Mapping[str, object | None], env: Mapping[str, str],
            config_file: str | None = None) -> ServerConfig:
    """Merge flag > environment > file > default into a checked :class:`ServerConfig`.

    ``flags`` maps setting names to the parsed flag value or ``None`` when the
    flag was not given. ``config_file`` falls back to ``GROUPCOORD_CONFIG``.
    """
    path = config_file or env.get(ENV_PREFIX + "CONFIG") or None
    file_values = read_config_file(path) if path else {}
    values: dict[str, object] = {}
    for s in SETTINGS:
        flag_value = flags.get(s.name)
        if flag_value is not None:
            values[s.name] = _parse(s, flag_value, s.flag)
        elif s.env in env:
            values[s.name] = _parse(s, env[s.env], s.env)
        elif s.name in file_values:
            values[s.name] = _parse(s, file_values[s.name], f"key {s.name} in {path}")
    config = ServerConfig(**values)  # type: ignore[arg-type]
    if config.min_session_timeout_ms > config.max_session_timeout_ms:
        raise ConfigError(
            f"min_session_timeout_ms ({config.min_session_timeout_ms}) must not exceed "
            f"max_session_timeout_ms ({config.max_session_timeout_ms})")
    if config.port and config.port == config.admin_port and (
            (config.admin_host or config.host) == config.host):
        raise ConfigError(f"admin_port ({config.admin_port}) must differ from port: the "
                          "protocol and admin listeners are separate")
    if config.tls_key and not config.tls_cert:
        raise ConfigError("tls_key is set but tls_cert is not: give the certificate too")
    return config
