"""Settings of ``groupcoord serve`` (docs/protocol.md, "Running the server").

Every setting comes from, in order of precedence: a command-line flag, a
``GROUPCOORD_*`` environment variable, a key of the TOML file named by
``--config`` (or ``GROUPCOORD_CONFIG``), then the default. A bad value is a
:class:`ConfigError` naming the setting and where the value came from, so an
operator knows which of the three places to fix.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from coordinator.console.live import StreamLimits
from coordinator.core.config import CoreConfig
from coordinator.core.storm import STORM_RULE
from protocol.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP,
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN,
    DEFAULT_MAX_CHECKPOINT_VALUE_BYTES,
    DEFAULT_MAX_CHECKPOINTS_PER_GROUP,
    DEFAULT_MAX_METADATA_BYTES,
    MAX_TIMEOUT_MS,
)

ENV_PREFIX = "GROUPCOORD_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: 100 years: beyond any useful retention, far from int64 overflow in deadline arithmetic.
MAX_RETENTION_MS = 100 * 365 * 86_400_000


class ConfigError(ValueError):
    """A setting has a value the server cannot run with."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 9080
    #: the admin listener (admin JSON, /metrics, /healthz, /readyz); "": the host.
    admin_host: str = ""
    admin_port: int = 9081
    #: without auth, more ``Host`` names the admin listener answers to (comma-separated).
    admin_allowed_hosts: str = ""
    db: str = "./groupcoord.db"
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    #: largest rebalance timeout a join may ask for (larger: 400); it bounds how long
    #: a parked join or sync is held.
    max_rebalance_timeout_ms: int = 300_000
    initial_rebalance_delay_ms: int = 3_000
    #: 0: unlimited.
    group_max_size: int = 0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: groups the coordinator holds at once (docs/operations.md, "Limits"); 0: unlimited.
    max_groups: int = 100_000
    #: groups held at once that one token created; 0: unlimited.
    max_groups_per_token: int = 10_000
    #: bytes of one protocol's metadata in a join, or one member's assignment in a sync.
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES
    #: joins, syncs and waiting heartbeats parked at once; 0: unlimited.
    max_parked_requests: int = 100_000
    #: joins and syncs parked at once for one token (authentication on); 0: unlimited.
    max_parked_per_token: int = 10_000
    #: KIP-211: an Empty group and its checkpoints go this long after it emptied; 0: never.
    group_retention_ms: int = 604_800_000
    #: checkpoint caps (docs/operations.md, "Limits"); 0: unlimited.
    max_checkpoints_per_group: int = DEFAULT_MAX_CHECKPOINTS_PER_GROUP
    max_checkpoint_bytes_per_group: int = DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP
    #: with --auth-tokens: checkpoint bytes in all the groups one token created.
    max_checkpoint_bytes_per_token: int = DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN
    max_checkpoint_value_bytes: int = DEFAULT_MAX_CHECKPOINT_VALUE_BYTES
    #: group health rules (docs/operations.md, "Group health"); the STORM rule's
    #: defaults are coordinator/core/storm.py's, which ``groupcoord analyze`` uses too.
    health_window_ms: int = STORM_RULE.window_ms
    health_storm_rebalances: int = STORM_RULE.rebalances
    health_stall_ms: int = 600_000
    #: groups with their own series on /metrics (the largest first); 0: none.
    group_metrics: int = 0
    #: the web console's live pages (event streams) open at once, and of one client.
    console_max_streams: int = 32
    console_max_streams_per_client: int = 8
    log_level: str = "INFO"
    #: several coordinators (``db`` a postgresql:// URL): what find_coordinator gives
    #: out for this process ("": ``http(s)://HOST:PORT`` as it listens).
    advertised_url: str = ""
    #: partitions of a new PostgreSQL database (0: 64); must match an existing one.
    partitions: int = 0
    #: a partition lease's length (PostgreSQL only).
    lease_ms: int = 5_000
    #: tokens file (coordinator.auth); empty: authentication off.
    auth_tokens: str = ""
    #: PEM certificate chain and key (coordinator.tls); empty: plain HTTP.
    tls_cert: str = ""
    tls_key: str = ""

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
        return CoreConfig(
            min_session_timeout_ms=self.min_session_timeout_ms,
            max_session_timeout_ms=self.max_session_timeout_ms,
            max_rebalance_timeout_ms=self.max_rebalance_timeout_ms,
            initial_rebalance_delay_ms=self.initial_rebalance_delay_ms,
            group_max_size=self.group_max_size,
            max_groups=self.max_groups,
            max_groups_per_token=self.max_groups_per_token,
            group_retention_ms=self.group_retention_ms,
            max_checkpoints_per_group=self.max_checkpoints_per_group,
            max_checkpoint_bytes_per_group=self.max_checkpoint_bytes_per_group,
            max_checkpoint_bytes_per_token=self.max_checkpoint_bytes_per_token,
            max_checkpoint_value_bytes=self.max_checkpoint_value_bytes,
            health_window_ms=self.health_window_ms,
            health_storm_rebalances=self.health_storm_rebalances,
            health_stall_ms=self.health_stall_ms,
        )


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    kind: type[int] | type[str]
    help: str
    #: returns a problem description, or None when the value is fine.
    check: Callable[[object], str | None]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _int_range(lo: int, hi: int) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        assert isinstance(value, int)
        if not lo <= value <= hi:
            return f"must be between {lo} and {hi}"
        return None
    return check


def _non_empty(value: object) -> str | None:
    return None if value else "must not be empty"


def _any(value: object) -> str | None:
    return None


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


SETTINGS: tuple[Setting, ...] = (
    Setting("host", str, "address to listen on (the protocol listener; the admin "
            "listener too unless --admin-host is given)", _non_empty),
    Setting("port", int, "TCP port of the protocol listener (the workers' calls); 0 picks "
            "a free one and prints it", _int_range(0, 65535)),
    Setting("admin_host", str, "address of the admin listener (admin API, /metrics, "
            "/healthz, /readyz); empty: the --host value", _any),
    Setting("admin_port", int, "TCP port of the admin listener; 0 picks a free one and "
            "prints it", _int_range(0, 65535)),
    Setting("admin_allowed_hosts", str, "without --auth-tokens, more names the admin listener "
            "answers to in the Host header, comma-separated (it always answers to localhost, "
            "IP addresses, --admin-host and the --advertised-url host; others get 403, against "
            "DNS rebinding); * answers to any", _host_names),
    Setting("db", str, "SQLite database file (created if missing), or a postgresql://USER@HOST:"
            "PORT/DB URL for several coordinators sharing one database (password from "
            "PGPASSWORD or ~/.pgpass, never logged)", _non_empty),
    Setting("min_session_timeout_ms", int, "smallest session timeout a member may ask for",
            _int_range(0, MAX_TIMEOUT_MS)),
    Setting("max_session_timeout_ms", int, "largest session timeout a member may ask for",
            _int_range(0, MAX_TIMEOUT_MS)),
    Setting("max_rebalance_timeout_ms", int, "largest rebalance timeout a member may ask "
            "for (a join asking more is answered 400 INVALID_REQUEST naming this limit); it "
            "bounds how long a parked join or sync is held", _int_range(0, MAX_TIMEOUT_MS)),
    Setting("initial_rebalance_delay_ms", int,
            "how long an empty group waits for more joiners before its first generation",
            _int_range(0, MAX_TIMEOUT_MS)),
    Setting("group_max_size", int, "most members a group may have; 0 is unlimited",
            _int_range(0, 2**31 - 1)),
    Setting("max_body_bytes", int, "largest request body accepted (larger: 413)",
            _int_range(1024, 2**31 - 1)),
    Setting("max_groups", int, "most groups held at once; a join that would create one more "
            "is answered COORDINATOR_NOT_AVAILABLE; 0 is unlimited", _int_range(0, 2**31 - 1)),
    Setting("max_groups_per_token", int, "most groups held at once that were created by one "
            "token (authentication on); a join or simple commit that would create one more is "
            "answered COORDINATOR_NOT_AVAILABLE; 0 is unlimited", _int_range(0, 2**31 - 1)),
    Setting("max_metadata_bytes", int, "largest metadata of one protocol in a join, or "
            "assignment of one member in a sync (larger: 400)", _int_range(1, 2**31 - 1)),
    Setting("max_parked_requests", int, "most joins, syncs and waiting heartbeats parked at "
            "once; 0 is unlimited", _int_range(0, 2**31 - 1)),
    Setting("max_parked_per_token", int, "most joins and syncs parked at once for one token "
            "(authentication on), so one token cannot take the whole of "
            "--max-parked-requests; more are answered COORDINATOR_NOT_AVAILABLE; must be at "
            "least the members of the largest group one token runs; 0 is unlimited",
            _int_range(0, 2**31 - 1)),
    Setting("group_retention_ms", int, "how long an Empty group and its checkpoints are kept "
            "after it became Empty (after the last commit, for a group that never had "
            "members); 0 keeps them forever (Kafka's offsets.retention.minutes)",
            _int_range(0, MAX_RETENTION_MS)),
    Setting("max_checkpoints_per_group", int, "most checkpoints one group may hold; a commit "
            "that would hold more is refused whole (CHECKPOINT_LIMIT_REACHED); 0 is unlimited",
            _int_range(0, 2**31 - 1)),
    Setting("max_checkpoint_bytes_per_group", int, "most bytes of checkpoints (set names, 8 "
            "per index, values) one group may hold; a commit that would hold more is refused "
            "whole (CHECKPOINT_LIMIT_REACHED); 0 is unlimited", _int_range(0, 2**62)),
    Setting("max_checkpoint_bytes_per_token", int, "with --auth-tokens: most bytes of "
            "checkpoints (counted as for --max-checkpoint-bytes-per-group) held in all the "
            "groups one token created; a commit or reset that would hold more is refused whole "
            "(CHECKPOINT_LIMIT_REACHED); 0 is unlimited", _int_range(0, 2**62)),
    Setting("max_checkpoint_value_bytes", int, "largest checkpoint value (bytes of a string's "
            "UTF-8 or of a byte string; larger: 400); Kafka's offset.metadata.max.bytes; "
            "0 is unlimited", _int_range(0, 2**31 - 1)),
    Setting("health_window_ms", int, "window of the STORM and REWIND health rules",
            _int_range(1_000, MAX_RETENTION_MS)),
    Setting("health_storm_rebalances", int, "a group is STORM with this many rebalances "
            "started within --health-window-ms (the rule `groupcoord analyze` uses too; the "
            "default lets a rolling restart of about 15 members pass); 0: never",
            _int_range(0, 1_000_000)),
    Setting("health_stall_ms", int, "a group with members and checkpoints is STALLED after "
            "this long without a commit; 0: never", _int_range(0, MAX_RETENTION_MS)),
    Setting("group_metrics", int, "groups that get their own series on /metrics (members, "
            "generation, state, health), the largest by members first; 0: none (the "
            "default: per-group series grow with the number of groups)",
            _int_range(0, 10_000)),
    Setting("advertised_url", str, "PostgreSQL only: this coordinator's protocol URL as "
            "members reach it, given out by find_coordinator (empty: http://HOST:PORT as it "
            "listens)", _url_or_empty),
    Setting("partitions", int, "PostgreSQL only: partitions the groups are spread over, fixed "
            "when the database is created (0: the database's, 64 for a new one); another "
            "value than the database's is refused", _int_range(0, 4096)),
    Setting("lease_ms", int, "PostgreSQL only: how long a partition lease lasts unless renewed "
            "(renewed every lease/5); a failover takes about this long, so keep it well "
            "under the members' session timeout (docs/operations.md)",
            _int_range(1_000, 600_000)),
    Setting("console_max_streams", int, "web console: live pages (event streams) open at "
            "once; one more is refused 503 and shows without live updates",
            _int_range(1, 10_000)),
    Setting("console_max_streams_per_client", int, "web console: live pages open at once by "
            "one client (its token with --auth-tokens, else its address); one more is "
            "refused 429", _int_range(1, 10_000)),
    Setting("log_level", str, "DEBUG, INFO, WARNING, ERROR or CRITICAL", _log_level),
    Setting("auth_tokens", str, "tokens file for bearer authentication (empty: off)", _any),
    Setting("tls_cert", str, "PEM certificate chain for HTTPS (empty: plain HTTP)", _any),
    Setting("tls_key", str, "PEM private key of --tls-cert (if not in that file)", _any),
)

_BY_NAME = {s.name: s for s in SETTINGS}
assert set(_BY_NAME) == {f.name for f in fields(ServerConfig)}


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
    for setting in SETTINGS:
        flag_value = flags.get(setting.name)
        if flag_value is not None:
            values[setting.name] = _parse(setting, flag_value, setting.flag)
        elif setting.env in env:
            values[setting.name] = _parse(setting, env[setting.env], setting.env)
        elif setting.name in file_values:
            values[setting.name] = _parse(setting, file_values[setting.name],
                                          f"key {setting.name} in {path}")
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
