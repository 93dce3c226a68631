"""The catalog's weights and home zones (docs/protocol.md, v1.2 "Resources that differ")
through the admin app with the real runtime, core and SQLite: ``PUT`` and ``GET
/v1/resources`` round trip, what a ``PUT`` without them keeps, every refusal a
400 naming the field with nothing changed, and the catalog as it was after a
restart. The protocol listener's catalog read serves the same body."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http.app import build_admin_app
from coordinator.http.calls import catalog_answer
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import CorruptDatabaseError, Storage
from protocol.catalog import MAX_OVERRIDES


class Admin:
    def __init__(self, client: TestClient[Any, Any], runtime: Runtime) -> None:
        self.client = client
        self.runtime = runtime

    async def put(self, name: str, body: Any, status: int = 200) -> Any:
        resp = await self.client.put(f"/v1/resources/{name}", json=body)
        assert resp.status == status, await resp.text()
        return await resp.json()

    async def catalog(self) -> Any:
        resp = await self.client.get("/v1/resources")
        assert resp.status == 200
        return await resp.json()


@asynccontextmanager
async def serving(db: Path) -> AsyncIterator[Admin]:
    storage = await Storage.open(db)
    runtime = Runtime(GroupCoordinator(CoreConfig()), storage, WallClock(), Metrics())
    try:
        await runtime.start()
    except BaseException:
        await storage.close()
        raise
    try:
        app = build_admin_app(runtime, Metrics(), max_body_bytes=4 * 1024 * 1024)
        async with TestClient(TestServer(app)) as client:
            yield Admin(client, runtime)
    finally:
        await runtime.stop()
        await storage.close()


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    async with serving(tmp_path / "g.db") as a:
        yield a


SHARDS = {"partitions": 1000,
          "weights": {"default": 1, "overrides": [[7, 12.5], [3, 40]]},
          "zones": {"overrides": [[3, ["eu-1a"]], [4, ["eu-1a", "eu-1b"]]]}}


async def test_put_and_get_round_trip_sparse_with_the_counts(admin: Admin) -> None:
    answer = await admin.put("shards", SHARDS)
    # The set as the catalog holds it: overrides by index, weights as numbers.
    assert answer == {"name": "shards", "partitions": 1000, "resources_epoch": 1,
                      "weights": {"default": 1.0, "overrides": [[3, 40.0], [7, 12.5]]},
                      "zones": {"default": None,
                                "overrides": [[3, ["eu-1a"]], [4, ["eu-1a", "eu-1b"]]]}}
    await admin.put("users", {"partitions": 4})
    assert await admin.catalog() == {
        "resources_epoch": 2, "resources": {"shards": 1000, "users": 4},
        # only the sets that have weights (zones) other than the default
        "weights": {"shards": answer["weights"]}, "zones": {"shards": answer["zones"]}}
    await admin.put("shards", {"partitions": 1000, "weights": {}, "zones": {}})
    # With none left, the answer is v1's.
    assert await admin.catalog() == {"resources_epoch": 3,
                                     "resources": {"shards": 1000, "users": 4}}
    # The protocol listener's catalog read (what a leader reads) is the same body.
    status, body = catalog_answer(admin.runtime)
    assert status == 200 and json.loads(body) == await admin.catalog()


async def test_a_put_without_weights_or_zones_keeps_them_and_an_equal_put_changes_nothing(
        admin: Admin) -> None:
    first = await admin.put("shards", SHARDS)
    again = await admin.put("shards", SHARDS)
    assert again["resources_epoch"] == first["resources_epoch"] == 1
    grown = await admin.put("shards", {"partitions": 2000})
    assert grown["resources_epoch"] == 2
    assert (grown["weights"], grown["zones"]) == (first["weights"], first["zones"])
    # Given, they replace the set's own; {} is the default again.
    cleared = await admin.put("shards", {"partitions": 2000, "weights": {}})
    assert cleared["weights"] == {"default": 1.0, "overrides": []}
    assert cleared["zones"] == first["zones"]
    doc = await admin.catalog()
    assert "weights" not in doc and doc["resources_epoch"] == 3
    # A set deleted and made again starts from the default.
    resp = await admin.client.delete("/v1/resources/shards")
    assert resp.status == 200
    again = await admin.put("shards", {"partitions": 10})
    assert again["zones"] == {"default": None, "overrides": []}


async def test_a_shrink_that_would_leave_an_override_outside_is_refused(admin: Admin) -> None:
    await admin.put("shards", SHARDS)
    before = await admin.catalog()
    refused = await admin.put("shards", {"partitions": 5}, status=400)
    assert refused == {"error": "INVALID_REQUEST", "message":
                       "weights.overrides: the set has an override for index 7, beyond the "
                       "new 5 partitions: send weights without it"}
    refused = await admin.put("shards", {"partitions": 4, "weights": {}}, status=400)
    assert refused["message"].startswith("zones.overrides: the set has an override for index 4")
    assert await admin.catalog() == before
    # Sent without them, it shrinks.
    shrunk = await admin.put("shards", {"partitions": 4, "weights": {}, "zones": {
        "default": ["eu-1b"], "overrides": [[3, ["eu-1a"]]]}})
    assert shrunk["resources_epoch"] == 2


BAD = [
    ({"weights": {"overrides": [[3, 1], [1, 2], [2, 3], [0, -1]]}},
     "weights.overrides[3][1]: must be a finite number >= 0 (at most 1e+15), got -1"),
    ({"weights": {"default": "heavy"}},
     "weights.default: must be a finite number >= 0 (at most 1e+15), got a string"),
    ({"weights": {"default": True}},
     "weights.default: must be a finite number >= 0 (at most 1e+15), got True"),
    ({"weights": {"overrides": [[0, 1e300]]}},
     "weights.overrides[0][1]: must be a finite number >= 0 (at most 1e+15), got 1e+300"),
    ({"weights": {"overrides": [[10, 1]]}},
     "weights.overrides[0][0]: index 10 is beyond the set's 10 partitions (0..9)"),
    ({"weights": {"overrides": [[1, 1], [1, 2]]}},
     "weights.overrides[1][0]: index 1 is given twice"),
    ({"weights": {"overrides": [[-1, 1]]}}, "weights.overrides[0][0]: must be >= 0, got -1"),
    ({"weights": {"overrides": [[1]]}},
     "weights.overrides[0]: expected an [index, value] pair, got a list of 1 items"),
    ({"weights": {"overrides": {"1": 2}}},
     "weights.overrides: expected a list of [index, value] pairs, got an object"),
    ({"weights": [1, 2]}, "weights: expected an object with default and overrides, got a list"),
    ({"weights": {"dflt": 2}}, "weights.dflt: unknown field (expected default and overrides)"),
    ({"zones": {"default": []}},
     "zones.default: expected null (anywhere) or a non-empty list of zone names, got []"),
    ({"zones": {"default": "eu-1a"}},
     "zones.default: expected null (anywhere) or a non-empty list of zone names, got a string"),
    ({"zones": {"overrides": [[2, ["eu-1a", "eu\u202e1b"]]]}},
     "zones.overrides[0][1][1]: must not contain control or format characters "
     "(U+202E at position 2)"),
    ({"zones": {"overrides": [[2, ["eu-1a", "eu-1a"]]]}},
     "zones.overrides[0][1][1]: zone 'eu-1a' is given twice"),
    ({"zones": {"overrides": [[2, ["z" * 256]]]}},
     "zones.overrides[0][1][0]: longer than 255 characters (256)"),
    ({"zones": {"overrides": [[12, ["eu-1a"]]]}},
     "zones.overrides[0][0]: index 12 is beyond the set's 10 partitions (0..9)"),
    ({"zones": {"default": [f"z{i}" for i in range(33)]}},
     "zones.default: at most 32 zones, got 33"),
]


@pytest.mark.parametrize(("extra", "message"), BAD)
async def test_malformed_weights_or_zones_are_a_400_naming_the_field_and_change_nothing(
        admin: Admin, extra: dict[str, Any], message: str) -> None:
    await admin.put("shards", {"partitions": 10, "weights": {"overrides": [[1, 5]]}})
    before = await admin.catalog()
    refused = await admin.put("shards", {"partitions": 10, **extra}, status=400)
    assert refused == {"error": "INVALID_REQUEST", "message": message}
    assert await admin.catalog() == before


async def test_nan_and_infinity_and_too_many_overrides_are_refused(admin: Admin) -> None:
    for text, shown in (("NaN", "nan"), ("Infinity", "inf")):
        resp = await admin.client.put(
            "/v1/resources/s", data=f'{{"partitions": 3, "weights": {{"default": {text}}}}}',
            headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert (await resp.json())["message"] == (
            f"weights.default: must be a finite number >= 0 (at most 1e+15), got {shown}")
    many = {"partitions": 1_000_000,
            "weights": {"overrides": [[i, 2] for i in range(MAX_OVERRIDES + 1)]}}
    refused = await admin.put("s", many, status=400)
    assert refused["message"] == (f"weights.overrides: at most {MAX_OVERRIDES} overrides, "
                                  f"got {MAX_OVERRIDES + 1}")
    assert (await admin.catalog())["resources"] == {}


async def test_weights_and_zones_are_as_they_were_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    async with serving(db) as a:
        put = await a.put("shards", SHARDS)
        await a.put("users", {"partitions": 4, "zones": {"default": ["eu-1b"]}})
        before = await a.catalog()
    async with serving(db) as b:
        assert await b.catalog() == before
        assert before["zones"]["users"] == {"default": ["eu-1b"], "overrides": []}
        assert before["weights"]["shards"] == put["weights"]
        # A PUT after the restart still knows what the set has.
        refused = await b.put("shards", {"partitions": 5}, status=400)
        assert "index 7" in refused["message"]


@pytest.mark.parametrize(("column", "value", "problem"), [
    ("weights", "{not json", "column weights: not JSON"),
    ("weights", '{"overrides": [[12, 1]]}',
     "column weights.overrides[0][0]: index 12 is beyond the set's 10 partitions"),
    ("zones", '{"default": []}', "column zones.default: expected null (anywhere)"),
    ("zones", "7", "column zones: expected an object with default and overrides, got an "
                   "integer"),
])
async def test_a_damaged_catalog_row_names_file_table_row_and_column(
        tmp_path: Path, column: str, value: str, problem: str) -> None:
    db = tmp_path / "g.db"
    async with serving(db) as a:
        await a.put("shards", {"partitions": 10})
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE catalog SET {column} = ?", (value,))
    with pytest.raises(CorruptDatabaseError) as caught:
        async with serving(db):
            pass
    assert str(caught.value).startswith(f"database {db}: table catalog, row name='shards': "
                                        f"{problem}")
