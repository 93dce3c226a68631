"""Settings of ``groupcoord serve``: flag > env > file > default, clear errors."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from coordinator.config import SETTINGS, ConfigError, ServerConfig, resolve
from coordinator.core.config import CoreConfig


def no_flags() -> dict[str, object | None]:
    return {s.name: None for s in SETTINGS}


def test_defaults_are_protocol_md() -> None:
    config = resolve(no_flags(), {})
    assert config == ServerConfig()
    assert (config.host, config.port, config.db) == ("127.0.0.1", 9080, "./groupcoord.db")
    assert config.min_session_timeout_ms == 6000
    assert config.max_session_timeout_ms == 1_800_000
    assert config.initial_rebalance_delay_ms == 3000
    assert config.group_max_size == 0
    assert config.max_body_bytes == 1_048_576
    assert config.max_rebalance_timeout_ms == 300_000
    assert config.max_parked_per_token == 10_000


def test_the_parked_request_limits_reach_the_core() -> None:
    config = resolve(no_flags() | {"max_rebalance_timeout_ms": 60_000},
                     {"GROUPCOORD_MAX_PARKED_PER_TOKEN": "5"})
    assert config.core_config().max_rebalance_timeout_ms == 60_000
    assert config.max_parked_per_token == 5
    with pytest.raises(ConfigError, match=r"max_rebalance_timeout_ms \(--max-rebalance-"
                                          r"timeout-ms\): must be between 0 and 2147483647"):
        resolve(no_flags() | {"max_rebalance_timeout_ms": -1}, {})


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gc.toml"
    cfg.write_text('port = 7000\nhost = "0.0.0.0"\ndb = "/tmp/file.db"\n'
                   "group-max-size = 9\n")
    env = {"GROUPCOORD_PORT": "7100", "GROUPCOORD_HOST": "10.0.0.1"}
    flags = no_flags() | {"port": 7200}
    config = resolve(flags, env, str(cfg))
    assert config.port == 7200          # flag
    assert config.host == "10.0.0.1"    # env
    assert config.db == "/tmp/file.db"  # file
    assert config.group_max_size == 9   # file, dashed key accepted
    assert config.log_level == "INFO"   # default


def test_the_admin_listener_settings(tmp_path: Path) -> None:
    """--admin-port (9081) and --admin-host (the --host value by default),
    from a flag, GROUPCOORD_* or the file, like every setting."""
    config = resolve(no_flags(), {})
    assert (config.admin_host, config.admin_port) == ("", 9081)
    assert config.admin_address == "127.0.0.1"
    assert resolve(no_flags() | {"host": "0.0.0.0"}, {}).admin_address == "0.0.0.0"
    cfg = tmp_path / "gc.toml"
    cfg.write_text('admin-port = 7001\nadmin_host = "10.0.0.2"\n')
    config = resolve(no_flags(), {}, str(cfg))
    assert (config.admin_address, config.admin_port) == ("10.0.0.2", 7001)
    config = resolve(no_flags() | {"admin_port": 0}, {"GROUPCOORD_ADMIN_PORT": "7002",
                                                      "GROUPCOORD_ADMIN_HOST": "::1"})
    assert (config.admin_address, config.admin_port) == ("::1", 0)
    with pytest.raises(ConfigError, match=r"admin_port \(GROUPCOORD_ADMIN_PORT\): must be "
                                          r"between 0 and 65535"):
        resolve(no_flags(), {"GROUPCOORD_ADMIN_PORT": "70000"})
    with pytest.raises(ConfigError, match=r"admin_port \(9080\) must differ from port"):
        resolve(no_flags() | {"admin_port": 9080}, {})
    # Another host, or port 0 (two free ports): no conflict.
    assert resolve(no_flags() | {"admin_port": 9080, "admin_host": "10.0.0.3"}, {})
    assert resolve(no_flags() | {"admin_port": 0, "port": 0}, {})


def test_config_file_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "gc.toml"
    cfg.write_text("initial_rebalance_delay_ms = 0\n")
    config = resolve(no_flags(), {"GROUPCOORD_CONFIG": str(cfg)})
    assert config.initial_rebalance_delay_ms == 0


@pytest.mark.parametrize(("flags", "env", "needle"), [
    ({"port": 70000}, {}, "port (--port): must be between 0 and 65535"),
    ({}, {"GROUPCOORD_PORT": "eighty"}, "port (GROUPCOORD_PORT): expected an integer"),
    ({}, {"GROUPCOORD_LOG_LEVEL": "chatty"}, "log_level (GROUPCOORD_LOG_LEVEL): must be one of"),
    ({"min_session_timeout_ms": 10, "max_session_timeout_ms": 5}, {},
     "min_session_timeout_ms (10) must not exceed max_session_timeout_ms (5)"),
    ({}, {"GROUPCOORD_MAX_BODY_BYTES": "10"}, "max_body_bytes (GROUPCOORD_MAX_BODY_BYTES)"),
    ({}, {"GROUPCOORD_GROUP_MAX_SIZE": "-1"}, "group_max_size (GROUPCOORD_GROUP_MAX_SIZE)"),
])
def test_bad_values_name_the_setting_and_source(
        flags: dict[str, object], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(no_flags() | flags, env)
    assert needle in str(info.value)


def test_bad_config_files(tmp_path: Path) -> None:
    unknown = tmp_path / "u.toml"
    unknown.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        resolve(no_flags(), {}, str(unknown))
    wrong_type = tmp_path / "w.toml"
    wrong_type.write_text('port = "x"\n')
    with pytest.raises(ConfigError, match=r"port \(key port in .*w.toml\): expected an integer"):
        resolve(no_flags(), {}, str(wrong_type))
    broken = tmp_path / "b.toml"
    broken.write_text("port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve(no_flags(), {}, str(broken))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(no_flags(), {}, str(tmp_path / "missing.toml"))


def test_every_core_setting_reaches_the_core_from_its_variable() -> None:
    core = [s for s in SETTINGS if s.core]
    assert {s.name for s in core} == {f.name for f in fields(CoreConfig)}
    # A value of its own for each (valid: the minimum sits below the maximum).
    env = {s.env: str(i + 1_000) for i, s in enumerate(core)}
    config = resolve(no_flags(), env).core_config()
    assert type(config) is CoreConfig
    assert {s.name: getattr(config, s.name) for s in core} == {
        s.name: i + 1_000 for i, s in enumerate(core)}


def test_the_core_and_the_server_default_alike() -> None:
    # One declaration: a core built without the server runs with the server's defaults.
    assert ServerConfig().core_config() == CoreConfig()
    assert all(s.default == getattr(ServerConfig(), s.name) for s in SETTINGS)
