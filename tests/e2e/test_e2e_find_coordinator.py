"""v1.1 ``find_coordinator`` on a one-process server: its own URL, partition 0, for
any group, in msgpack and in JSON (docs/protocol.md, "Several coordinators sharing groups")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import msgpack
from server_harness import StartServer


def test_a_single_server_answers_find_coordinator_with_its_own_url(
        start_server: StartServer) -> None:
    server = start_server()
    for group in ("orders", "ünïcode-group", "x" * 255):
        req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                     data=msgpack.packb({"group_id": group}),
                                     headers={"Content-Type": "application/msgpack"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert msgpack.unpackb(resp.read()) == {"error": None, "url": server.url,
                                                    "partition": 0}
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=json.dumps({"group_id": "orders"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read()) == {"error": None, "url": server.url, "partition": 0}
    # Bad input: 400 naming the field, as for every call.
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=msgpack.packb({"group": "orders"}),
                                 headers={"Content-Type": "application/msgpack"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected 400")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        assert "group_id" in msgpack.unpackb(exc.read())["message"]


def test_the_advertised_url_is_what_a_single_server_gives_out(
        start_server: StartServer) -> None:
    server = start_server(advertised_url="http://coordinator.example:9080")
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=msgpack.packb({"group_id": "orders"}),
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert msgpack.unpackb(resp.read())["url"] == "http://coordinator.example:9080"
