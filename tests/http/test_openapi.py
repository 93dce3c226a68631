"""``GET /v1/openapi.json``: a valid OpenAPI 3.1 document (checked by
openapi-spec-validator) that names exactly the routes the two listeners serve."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from listeners_kit import InProcess, serve_in_process
from openapi_spec_validator import validate

from coordinator.core import GroupCoordinator
from coordinator.core.config import CoreConfig
from coordinator.http.app import protocol_elsewhere
from coordinator.http.openapi import ADMIN_LISTENER, PROTOCOL_LISTENER
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage

_METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcess]:
    storage = await Storage.open(tmp_path / "o.db")
    runtime = Runtime(GroupCoordinator(CoreConfig()), storage, WallClock(), Metrics())
    await runtime.start()
    async with serve_in_process(runtime, Metrics(), max_body_bytes=65536) as tc:
        yield tc
    await runtime.stop()
    await storage.close()


def described(doc: dict[str, Any], listener: str) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items()
            if item["x-groupcoord-listener"] in (listener, "both")
            for method in _METHODS if method in item}


def template(canonical: str) -> str:
    """aiohttp's ``{group_id:.+}`` and ``{group_id}`` are the same template."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", canonical)


async def test_the_description_is_valid_and_matches_the_routes(server: InProcess) -> None:
    resp = await server.get("/v1/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    validate(doc)                                  # raises on an invalid document
    app = server.listeners.admin_app
    admin = set()
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        if route.handler.__qualname__ == protocol_elsewhere("join").__qualname__:
            continue                               # a 404 that points to the other listener
        admin.add((route.method, template(route.resource.canonical)))
    assert described(doc, ADMIN_LISTENER) == admin
    calls = server.listeners.calls
    protocol = {("POST", f"/v1/{api}") for api in calls.apis} | {("GET", "/v1/resources")}
    assert described(doc, PROTOCOL_LISTENER) == protocol
    # The protocol listener answers what the description says it does.
    for method, path in sorted(protocol):
        resp = await server.session.request(method, server.url + path, data=b"\x80",
                                            headers={"Content-Type": "application/msgpack"})
        assert resp.status != 404, path


def test_every_error_code_is_in_the_schema() -> None:
    from coordinator.http.openapi import description
    from protocol.errors import ErrorCode
    join = description()["paths"]["/v1/join"]["post"]["responses"]["200"]
    codes = join["content"]["application/json"]["schema"]["properties"]["error"]["enum"]
    assert set(codes) == {c.value for c in ErrorCode} | {None}


async def test_the_catalog_with_weights_and_zones_is_as_described(server: InProcess) -> None:
    """What ``PUT`` and ``GET /v1/resources`` send and answer fits the described schemas;
    a body the server refuses does not."""
    from jsonschema import Draft202012Validator

    from coordinator.http.openapi import description
    paths = description()["paths"]
    put = paths["/v1/resources/{name}"]["put"]
    request_schema = put["requestBody"]["content"]["application/json"]["schema"]
    answer_schema = put["responses"]["200"]["content"]["application/json"]["schema"]
    list_schema = (paths["/v1/resources"]["get"]["responses"]["200"]["content"]
                   ["application/json"]["schema"])
    body = {"partitions": 1000, "weights": {"default": 0.5, "overrides": [[3, 40], [7, 12.5]]},
            "zones": {"default": None, "overrides": [[3, ["eu-1a"]], [4, None]]}}
    Draft202012Validator(request_schema).validate(body)
    resp = await server.put("/v1/resources/shards", json=body)
    assert resp.status == 200
    Draft202012Validator(answer_schema).validate(await resp.json())
    resp = await server.get("/v1/resources")
    listed = await resp.json()
    assert set(listed) == {"resources_epoch", "resources", "weights", "zones"}
    Draft202012Validator(list_schema).validate(listed)
    for refused in ({"partitions": 4, "weights": {"default": -1}},
                    {"partitions": 4, "zones": {"default": []}},
                    {"partitions": 4, "weights": {"heavy": 2}}):
        assert not Draft202012Validator(request_schema).is_valid(refused)
        resp = await server.put("/v1/resources/other", json=refused)
        assert resp.status == 400
