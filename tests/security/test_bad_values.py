"""A value the store cannot hold is refused at the edge, by every route that stores one.

Against a real ``groupcoord serve``, with the calls an attacker holding any member
token (or a team-scoped admin) could make: a commit in JSON whose checkpoint value
is a string with a lone surrogate, an integer past 64 bits, NaN or an infinity; the
admin reset to such a value, or shifting a stored integer out of range. Each is a
400 ``INVALID_REQUEST`` naming the field, changes nothing, and the server goes on
serving every group (before, the storage write failed and the server stopped).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import msgpack
import pytest
from server_harness import ServerProcess, StartServer

JSON = "application/json"
MSGPACK = "application/msgpack"


def post(url: str, body: bytes, content_type: str = JSON) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, raw, kind = resp.status, resp.read(), resp.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get_content_type()
    return status, (msgpack.unpackb(raw) if kind == MSGPACK else json.loads(raw))


def commit_json(server: ServerProcess, group: str, value_json: str) -> tuple[int, Any]:
    """A simple commit (generation -1) whose value is the given JSON text, verbatim."""
    body = (f'{{"group_id": "{group}", "member_id": "tool", "generation_id": -1, '
            f'"checkpoints": [["shards", 0, {value_json}]]}}')
    return post(f"{server.url}/v1/commit", body.encode("ascii"))


def fetch(server: ServerProcess, group: str) -> list[Any]:
    status, doc = post(f"{server.url}/v1/fetch", msgpack.packb({"group_id": group}), MSGPACK)
    assert status == 200 and doc["error"] is None, doc
    checkpoints: list[Any] = doc["checkpoints"]
    return checkpoints


def still_serving(server: ServerProcess) -> None:
    """The server is up and another group's commit is stored and read back."""
    assert server.running(), server.stderr[-2000:]
    with urllib.request.urlopen(f"{server.admin_url}/readyz", timeout=10) as resp:
        assert resp.status == 200
    status, doc = commit_json(server, "bystander", "7")
    assert status == 200 and doc["error"] is None, doc
    assert fetch(server, "bystander") == [["shards", 0, 7]]


@pytest.mark.parametrize("value_json, problem", [
    ('"v\\ud800"', "lone surrogate U+D800"),
    (str(2**64), "outside the storable range"),
    (str(-(2**63) - 1), "outside the storable range"),
    ("NaN", "not a finite number"),
    ("Infinity", "not a finite number"),
    ("-Infinity", "not a finite number"),
])
def test_a_json_commit_of_a_value_the_store_cannot_hold_is_refused(
        start_server: StartServer, value_json: str, problem: str) -> None:
    server = start_server()
    status, doc = commit_json(server, "victim", value_json)
    assert status == 400, doc
    assert doc["error"] == "INVALID_REQUEST"
    assert doc["message"].startswith("checkpoints[0][2]: ") and problem in doc["message"]
    still_serving(server)
    # Nothing was stored for the group that sent it.
    assert fetch(server, "victim") == []


def test_the_msgpack_path_follows_the_same_definition(start_server: StartServer) -> None:
    """The extremes msgpack can carry are stored and read back; NaN is refused there
    too (one definition for both encodings)."""
    server = start_server()
    for value in (2**64 - 1, -(2**63)):
        body = msgpack.packb({"group_id": "edges", "member_id": "tool", "generation_id": -1,
                              "checkpoints": [["shards", 0, value]]})
        status, doc = post(f"{server.url}/v1/commit", body, MSGPACK)
        assert status == 200 and doc["error"] is None, doc
        assert fetch(server, "edges") == [["shards", 0, value]]
    body = msgpack.packb({"group_id": "edges", "member_id": "tool", "generation_id": -1,
                          "checkpoints": [["shards", 1, float("nan")]]})
    status, doc = post(f"{server.url}/v1/commit", body, MSGPACK)
    assert status == 400 and "not a finite number" in doc["message"], doc
    still_serving(server)


@pytest.mark.parametrize("way, problem", [
    ('"to_value": "\\ud800"', "lone surrogate"),
    (f'"to_value": {2**64}', "outside the storable range"),
    ('"to_value": NaN', "not a finite number"),
    ('"shift_by": 1', "outside the storable range"),
])
def test_an_admin_reset_to_a_value_the_store_cannot_hold_is_refused(
        start_server: StartServer, way: str, problem: str) -> None:
    server = start_server()
    # 2^64 - 1 is legal (msgpack's largest integer); shifting it by 1 is not.
    body = msgpack.packb({"group_id": "team", "member_id": "tool", "generation_id": -1,
                          "checkpoints": [["shards", 0, 2**64 - 1]]})
    status, doc = post(f"{server.url}/v1/commit", body, MSGPACK)
    assert status == 200 and doc["error"] is None, doc
    raw = f'{{"dry_run": false, {way}}}'.encode("ascii")
    status, answer = post(f"{server.admin_url}/v1/groups/team/checkpoints/reset", raw)
    assert status == 400, answer
    assert problem in answer["message"], answer
    assert answer["message"].split(":")[0] in ("to_value", "shift_by"), answer
    still_serving(server)
    assert fetch(server, "team") == [["shards", 0, 2**64 - 1]]


def test_a_reason_the_journal_cannot_hold_is_refused(start_server: StartServer) -> None:
    """A join's free-text reason is kept with the rebalance: text only."""
    server = start_server()
    body = ('{"group_id": "g", "member_id": "", "protocol_type": "resources", '
            '"protocols": [["range", ""]], "session_timeout_ms": 10000, '
            '"rebalance_timeout_ms": 10000, "reason": "r\\ud800"}')
    status, doc = post(f"{server.url}/v1/join", body.encode("ascii"))
    assert status == 400 and doc["message"].startswith("reason: "), doc
    still_serving(server)
