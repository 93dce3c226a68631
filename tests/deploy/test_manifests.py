"""deploy/'s Kubernetes manifests, compose file and Dockerfile say only what the
server understands: every ``GROUPCOORD_*`` variable is a setting of
``coordinator/config.py`` and the values pass its own checks, the ports the
containers, Services, probes and advertised URLs name are the ports the
settings make it listen on, and the probes ask for routes the admin listener
serves. So the manifests cannot drift from the code unnoticed (they are never
applied here: no Kubernetes or Docker on these machines)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from coordinator.cluster.serve import SHUTDOWN_GRACE_S
from coordinator.config import ENV_PREFIX, SETTINGS, ServerConfig, resolve
from coordinator.http import openapi
from coordinator.http.headers import admin_names, host_allowed
from coordinator.storage import pgurl

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
#: what the downward API gives POD_IP in these checks.
POD_IP = "10.1.2.3"
KNOWN_ENV = {s.env for s in SETTINGS} | {ENV_PREFIX + "CONFIG"}
KNOWN_FLAGS = {s.flag for s in SETTINGS} | {"--config"}
#: seconds the coordinator's own shutdown may take beyond the hand-offs (a margin).
HAND_OFF_BUDGET_S = 10


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {p.name: load_all(p) for p in sorted(KUBERNETES.glob("*.yaml"))}


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def secret_values() -> dict[tuple[str, str], str]:
    """(secret name, key) -> value, from the example Secrets shipped beside the manifests."""
    out = {}
    for docs in manifests().values():
        for secret in of_kind(docs, "Secret"):
            for key, value in secret.get("stringData", {}).items():
                out[(secret["metadata"]["name"], key)] = value
    return out


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: the downward API's
    POD_IP, Secrets from the example Secret, ``$(VAR)`` expanded from earlier
    entries (Kubernetes' rule)."""
    env: dict[str, str] = {}
    secrets = secret_values()
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: env.get(m.group(1), m.group(0)), str(entry["value"]))
        else:
            source = entry["valueFrom"]
            if "fieldRef" in source:
                assert source["fieldRef"]["fieldPath"] == "status.podIP", entry
                env[name] = POD_IP
            else:
                ref = source["secretKeyRef"]
                env[name] = secrets[(ref["name"], ref["key"])]
    return env


def workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in manifests().items():
        for doc in docs:
            if doc["kind"] in ("Deployment", "StatefulSet"):
                yield name, doc


def coordinator_container(workload: Mapping[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == "groupcoord"]
    assert len(found) == 1, containers
    container: dict[str, Any] = found[0]
    return container


def settings_of(env: Mapping[str, str], args: list[str] | None = None) -> ServerConfig:
    """What ``groupcoord serve`` would run with (the image's ENV under the given one)."""
    flags: dict[str, object | None] = {}
    for arg in args or []:
        flag, _, value = arg.partition("=")
        assert flag in KNOWN_FLAGS, f"{flag} is not a flag of groupcoord serve"
        flags[flag[2:].replace("-", "_")] = value
    return resolve(flags, {**dockerfile_env(), **env})


def dockerfile_env() -> dict[str, str]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


# ---------------------------------------------------------------- every file


def test_every_yaml_file_of_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert {p.name for p in files} >= {"sqlite.yaml", "postgres.yaml", "compose.yaml",
                                       "postgres-secret.example.yaml"}
    for path in files:
        assert load_all(path), f"{path} holds no document"


def test_the_dockerfile_sets_only_real_settings_and_exposes_their_ports() -> None:
    env = dockerfile_env()
    assert {k for k in env if k.startswith(ENV_PREFIX)} <= KNOWN_ENV
    config = resolve({}, env)
    text = (DEPLOY / "Dockerfile").read_text()
    exposed = {int(p) for line in text.splitlines() if line.startswith("EXPOSE ")
               for p in line.split()[1:]}
    assert exposed == {config.port, config.admin_port}
    # The manifests give no command: they rely on this entry point.
    assert 'ENTRYPOINT ["groupcoord", "serve"]' in text


# ---------------------------------------------------------------- Kubernetes


def test_both_shapes_are_there() -> None:
    shapes = {name: (doc["kind"], doc["spec"]["replicas"]) for name, doc in workloads()}
    assert shapes == {"sqlite.yaml": ("StatefulSet", 1), "postgres.yaml": ("Deployment", 3)}


@pytest.mark.parametrize("name", ["sqlite.yaml", "postgres.yaml"])
def test_a_workload_uses_only_real_settings_with_valid_values(name: str) -> None:
    workload = dict(workloads())[name]
    container = coordinator_container(workload)
    assert "command" not in container  # the image's ENTRYPOINT: groupcoord serve
    env = container_env(container)
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in KNOWN_ENV)
    assert not unknown, f"{name}: not settings of coordinator/config.py: {unknown}"
    settings_of(env, container.get("args"))  # raises ConfigError on a bad value


@pytest.mark.parametrize("name", ["sqlite.yaml", "postgres.yaml"])
def test_ports_probes_and_services_agree_with_the_settings(name: str) -> None:
    docs = manifests()[name]
    workload = dict(workloads())[name]
    container = coordinator_container(workload)
    config = settings_of(container_env(container), container.get("args"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"protocol": config.port, "admin": config.admin_port}

    served = set(openapi.description()["paths"])
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["path"] in served
        assert ports.get(get["port"], get["port"]) == config.admin_port, probe
    if "startupProbe" in container:
        get = container["startupProbe"]["httpGet"]
        assert get["path"] in served and ports.get(get["port"]) == config.admin_port

    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    services = of_kind(docs, "Service")
    assert services
    for service in services:
        assert service["spec"]["selector"].items() <= labels.items(), service["metadata"]
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert ports.get(target, target) in (config.port, config.admin_port)
    exposed = {ports.get(p["targetPort"], p["targetPort"])
               for s in services for p in s["spec"]["ports"]}
    assert exposed == {config.port, config.admin_port}
    # Without tokens the admin listener answers only to its own names: the admin
    # Service's name must be one of them (else everything through it is 403).
    names = admin_names(config.admin_address, config.advertised_url,
                        config.admin_allowed_host_names)
    for service in services:
        for port in service["spec"]["ports"]:
            if ports.get(port["targetPort"], port["targetPort"]) == config.admin_port:
                host = f"{service['metadata']['name']}:{port['port']}"
                assert config.auth_tokens or host_allowed(host, names), host

    grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
    sleep_s = int(pre_stop["command"][1]) if pre_stop else 0
    assert grace >= sleep_s + SHUTDOWN_GRACE_S + HAND_OFF_BUDGET_S


def test_the_sqlite_shape_keeps_its_file_on_the_volume() -> None:
    workload = dict(workloads())["sqlite.yaml"]
    container = coordinator_container(workload)
    config = settings_of(container_env(container))
    assert not pgurl.is_postgres_url(config.db)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]}
    assert any(config.db.startswith(path.rstrip("/") + "/") and name in claims
               for name, path in mounts.items()), (config.db, mounts, claims)


def test_the_postgres_shape_advertises_and_forwards_to_reachable_addresses() -> None:
    docs = manifests()["postgres.yaml"]
    workload = dict(workloads())["postgres.yaml"]
    container = coordinator_container(workload)
    env = container_env(container)
    config = settings_of(env)
    assert pgurl.is_postgres_url(config.db)
    # The password comes from a Secret through PGPASSWORD, never in the URL.
    assert pgurl.passwords(config.db) == ()
    password = next(e for e in container["env"] if e["name"] == "PGPASSWORD")
    assert "secretKeyRef" in password["valueFrom"]
    # Members reach the pod's protocol port; the others reach its admin listener
    # at the address it binds (admin forwarding uses that address).
    advertised = urlsplit(config.advertised_url)
    assert (advertised.hostname, advertised.port) == (POD_IP, config.port)
    assert config.admin_address == POD_IP
    budget = of_kind(docs, "PodDisruptionBudget")
    assert len(budget) == 1 and budget[0]["spec"]["maxUnavailable"] == 1
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert budget[0]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # A lease well under the default session timeout of the client (10 s).
    assert config.lease_ms <= 5_000


# ---------------------------------------------------------------- compose


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def coordinators_of_compose() -> dict[str, dict[str, Any]]:
    services = compose()["services"]
    return {name: s for name, s in services.items()
            if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"}


def test_compose_runs_three_coordinators_on_postgres_15_or_later() -> None:
    services = compose()["services"]
    coordinators = coordinators_of_compose()
    assert len(coordinators) == 3
    image = services["postgres"]["image"]
    assert image.startswith("postgres:") and int(image.split(":")[1].split(".")[0]) >= 15
    for service in coordinators.values():
        # The build context is relative to deploy/: the repository root.
        context = (DEPLOY / service["build"]["context"]).resolve()
        assert context == DEPLOY.parent and (context / service["build"]["dockerfile"]).is_file()
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_coordinators_use_real_settings_and_their_published_ports() -> None:
    advertised = set()
    for name, service in coordinators_of_compose().items():
        env = {k: str(v) for k, v in service["environment"].items()}
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in KNOWN_ENV)
        assert not unknown, f"{name}: not settings of coordinator/config.py: {unknown}"
        config = settings_of(env)
        db = urlsplit(config.db)
        assert pgurl.is_postgres_url(config.db) and db.hostname == "postgres"
        assert pgurl.passwords(config.db) == () and env.get("PGPASSWORD")
        published = {}
        for mapping in service["ports"]:
            host_ip, host_port, container_port = mapping.split(":")
            published[int(container_port)] = (host_ip, int(host_port))
        assert set(published) == {config.port, config.admin_port}
        # Members on the host reach the coordinator at its advertised URL, and so
        # does the coordinator itself in its container (its start-up check): the
        # same port inside as published.
        url = urlsplit(config.advertised_url)
        assert (url.hostname, url.port) == published[config.port]
        assert url.hostname != "127.0.0.1" or url.port == config.port, name
        advertised.add(config.advertised_url)
        # Admin forwarding: the admin listener is bound to a name the others resolve.
        assert config.admin_address == service["hostname"] == name
        assert f"http://{name}:{config.admin_port}/readyz" in " ".join(
            service["healthcheck"]["test"])
    assert len(advertised) == 3
