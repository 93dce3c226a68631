"""Two ``groupcoord serve --db postgresql://`` processes: routing, the admin API and
/metrics at every coordinator, bad start-up input (docs/protocol.md, "Several
coordinators sharing groups")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import pytest
from server_harness import ServerProcess, free_port, wait_until

from coordinator.auth import hash_token
from coordinator.storage.postgres import partition_of

P = 8
GROUPS = [f"group-{i}" for i in range(6)]
GROUPCOORD = str(Path(sys.executable).with_name("groupcoord"))


def call(url: str, api: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/v1/{api}", data=msgpack.packb(body),
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer: dict[str, Any] = msgpack.unpackb(resp.read())
    return answer


def admin(url: str, path: str, method: str = "GET", doc: Any = None) -> tuple[int, Any]:
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def owners(admin_url: str) -> dict[int, str]:
    _, doc = admin(admin_url, "/v1/coordinators")
    return {p["partition"]: c["url"] for c in doc["coordinators"] for p in c["partitions"]}


def stable_static_member(url: str, group: str) -> tuple[str, int]:
    joined = call(url, "join", {
        "group_id": group, "member_id": "", "group_instance_id": "worker-1",
        "protocol_type": "resources", "protocols": [["range", b""]],
        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000})
    assert joined["error"] is None, joined
    synced = call(url, "sync", {
        "group_id": group, "member_id": joined["member_id"],
        "generation_id": joined["generation_id"], "group_instance_id": "worker-1",
        "assignments": [{"member_id": joined["member_id"], "assignment": b"\x80"}]})
    assert synced["error"] is None, synced
    return joined["member_id"], joined["generation_id"]


@pytest.fixture
def two(pg_url: str) -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    try:
        with ThreadPoolExecutor(2) as pool:           # both start at once
            servers += pool.map(lambda _: ServerProcess(pg_url, {  # type: ignore[arg-type]
                "partitions": P, "lease_ms": 2000, "initial_rebalance_delay_ms": 0}), range(2))
        wait_until(lambda: sorted(owners(servers[0].admin_url).values()).count(
            servers[0].url) == P // 2 and len(owners(servers[0].admin_url)) == P, 15)
        yield servers
    finally:
        for server in servers:
            server.kill()


def test_a_coordinator_logs_its_partitions_in_a_few_lines(two: list[ServerProcess]) -> None:
    """Not one INFO line per partition (three each at start, of 8 or 64): the
    start is one "ready" line naming what it owns, a round that moves partitions
    one line (the per-partition lines are DEBUG)."""
    for server in two:
        info = [line for line in server.stderr_lines if " INFO " in line]
        assert [line for line in info if "ready: coordinator" in line], info
        assert not [line for line in info if re.search(r"partition \d+: ", line)], info
        assert len(info) <= 4, info
    for server in two:
        # (the second may have taken over some of the first's partitions by its stop)
        server.terminate()

        def said_at_stop() -> list[str]:
            return [line for line in server.stderr_lines  # noqa: B023 - called in the loop
                    if re.search(r"handed off \d+ partition\(s\) \([\d,-]+\)$", line)]
        assert wait_until(lambda: bool(said_at_stop()), 5), server.stderr_lines[-5:]
        assert len(said_at_stop()) == 1


def test_every_coordinator_routes_and_answers_for_every_group(two: list[ServerProcess]
                                                               ) -> None:
    a, b = two
    urls = {a.url, b.url}
    where = owners(a.admin_url)
    members = {}
    for group in GROUPS:
        owner = where[partition_of(group, P)]
        for server in two:
            found = call(server.url, "find_coordinator", {"group_id": group})
            assert found == {"error": None, "url": owner, "partition": partition_of(group, P)}
        (other,) = urls - {owner}
        # The wrong coordinator changes nothing and names the owner.
        wrong = call(other, "heartbeat", {"group_id": group, "member_id": "m",
                                          "generation_id": 1})
        assert wrong == {"error": "NOT_COORDINATOR", "url": owner}
        members[group] = stable_static_member(owner, group)
    for server in two:
        status, doc = admin(server.admin_url, "/v1/groups")
        assert status == 200
        assert sorted(g["group_id"] for g in doc["groups"]) == GROUPS
        assert {g["state"] for g in doc["groups"]} == {"Stable"}
        # The console's overview too: the groups served here and those of the other.
        with urllib.request.urlopen(server.admin_url + "/console/", timeout=10) as resp:
            page = resp.read().decode()
        assert all(f">{group}</a>" in page for group in GROUPS)
        assert page.count(">Stable</span>") == len(GROUPS)
        for group in GROUPS:                       # answered here or by the owner
            status, view = admin(server.admin_url, f"/v1/groups/{group}")
            assert status == 200, view
            assert [m["member_id"] for m in view["members"]] == [members[group][0]]
            # ...and says which coordinator serves it.
            owner = where[partition_of(group, P)]
            owner_admin = next(s.admin_url for s in two if s.url == owner)
            assert {k: view["coordinator"][k] for k in ("serving", "url", "admin_url",
                                                        "partition")} == {
                "serving": True, "url": owner, "admin_url": owner_admin,
                "partition": partition_of(group, P)}, view["coordinator"]
        status, coordinators = admin(server.admin_url, "/v1/coordinators")
        assert {c["url"] for c in coordinators["coordinators"]} == urls
        with urllib.request.urlopen(server.admin_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "groupcoord_ready 1.0" in text
    # The catalog changed through one coordinator reaches the other within a round.
    status, put = admin(a.admin_url, "/v1/resources/orders", "PUT", {"partitions": 4})
    assert status == 200 and put["resources_epoch"] == 1

    def catalog_of(url: str) -> Any:
        with urllib.request.urlopen(url + "/v1/resources", timeout=10) as resp:
            return json.loads(resp.read())
    wait_until(lambda: catalog_of(b.url) == {"resources_epoch": 1,
                                             "resources": {"orders": 4}}, 5)
    # So do its weights and zones; a resize through the other keeps them.
    weights = {"default": 1.0, "overrides": [[3, 40.0]]}
    zones = {"default": ["eu-1a"], "overrides": [[2, None]]}
    status, put = admin(a.admin_url, "/v1/resources/orders", "PUT",
                        {"partitions": 4, "weights": weights, "zones": zones})
    assert status == 200 and put["resources_epoch"] == 2
    status, put = admin(b.admin_url, "/v1/resources/orders", "PUT", {"partitions": 6})
    assert status == 200 and (put["weights"], put["zones"]) == (weights, zones)
    wait_until(lambda: catalog_of(a.url) == {"resources_epoch": 3, "resources": {"orders": 6},
                                             "weights": {"orders": weights},
                                             "zones": {"orders": zones}}, 5)
    # A one-group admin call at the coordinator that does not own the group is
    # forwarded: removing the member rebalances the group at its owner.
    group = GROUPS[0]
    owner = where[partition_of(group, P)]
    not_owner = b if owner == a.url else a
    status, _ = admin(not_owner.admin_url, f"/v1/groups/{group}/members/{members[group][0]}",
                      "DELETE")
    assert status == 200
    status, view = admin(not_owner.admin_url, f"/v1/groups/{group}")
    assert status == 200 and view["members"] == [] and view["state"] == "Empty"
    # The operators' commands: which coordinator serves a group, asked of the other one...
    described = subprocess.run([GROUPCOORD, "groups", "describe", group, "--url",
                                not_owner.admin_url], capture_output=True, text=True, timeout=30)
    assert described.returncode == 0, described.stderr
    owner_admin = next(s.admin_url for s in two if s.url == owner)
    assert f" {owner} (admin {owner_admin}), partition {partition_of(group, P)}\n" in \
        described.stdout, described.stdout
    # ...and who coordinates what.
    shown = subprocess.run([GROUPCOORD, "coordinators", "--url", b.admin_url],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["ID", "URL", "ADMIN", "URL", "PARTITIONS", "OWNED"]
    rows = [line.split() for line in lines[1:]]
    assert {row[2] if row[1] == "*" else row[1] for row in rows} == urls
    assert sum(int(row[-2]) for row in rows) == P


def test_a_coordinator_stopped_with_sigterm_hands_its_groups_over(
        two: list[ServerProcess]) -> None:
    a, b = two
    where = owners(a.admin_url)
    moved = [g for g in GROUPS if where[partition_of(g, P)] == a.url]
    assert moved
    members = {g: stable_static_member(a.url, g) for g in moved}
    assert a.terminate() == 0
    for group in moved:
        wait_until(lambda g=group: call(b.url, "find_coordinator",
                                        {"group_id": g})["url"] == b.url, 5)
        member_id, generation = members[group]
        request = {"group_id": group, "member_id": member_id, "generation_id": generation,
                   "group_instance_id": "worker-1"}
        # COORDINATOR_LOAD_IN_PROGRESS while b loads the partition (as Kafka answers),
        # then the same generation, no error: the group did not rebalance.
        wait_until(lambda r=request: call(b.url, "heartbeat", r)["error"]  # type: ignore[misc]
                   != "COORDINATOR_LOAD_IN_PROGRESS", 5)
        answer = call(b.url, "heartbeat", request)
        assert answer["error"] is None, (group, answer)


def test_a_drain_request_outlives_the_hand_over_of_its_partition(
        two: list[ServerProcess]) -> None:
    """An operator asks a member to drain through the other coordinator (the call
    is forwarded to the group's owner); the owner stops with SIGTERM, and the
    coordinator that takes the group over keeps asking: the request is in the
    member's durable record, not in the first owner's memory."""
    a, b = two
    where = owners(a.admin_url)
    group = next(g for g in GROUPS if where[partition_of(g, P)] == a.url)
    member_id, generation = stable_static_member(a.url, group)
    request = {"group_id": group, "member_id": member_id, "generation_id": generation,
               "group_instance_id": "worker-1"}
    assert "drain" not in call(a.url, "heartbeat", request)
    status, doc = admin(b.admin_url, f"/v1/groups/{group}/members/worker-1/drain", "POST")
    assert (status, doc["member_id"], doc["drain_requested"]) == (200, member_id, True)
    assert call(a.url, "heartbeat", request)["drain"] is True
    assert a.terminate() == 0
    assert wait_until(lambda: call(b.url, "find_coordinator", {"group_id": group})["url"]
                      == b.url, 5)
    assert wait_until(lambda: call(b.url, "heartbeat", request)["error"]
                      != "COORDINATOR_LOAD_IN_PROGRESS", 5)
    answer = call(b.url, "heartbeat", request)
    assert (answer["error"], answer.get("drain")) == (None, True), answer
    _, shown = admin(b.admin_url, f"/v1/groups/{group}")
    assert [m["drain_requested"] for m in shown["members"]] == [True]


def test_bad_start_up_input_is_one_line_that_names_it(pg_url: str, postgres_server: Any
                                                      ) -> None:
    def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GROUPCOORD, "serve", "--port", "0", "--admin-port", "0", *args],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})
    password = "s3cret-Pw-5721"
    # A URL that does not connect: the host is named, the password never.
    port = postgres_server.port
    dead = pg_url.replace(f":{port}/", ":1/")
    result = serve("--db", dead)
    assert result.returncode == 2
    assert "127.0.0.1" in result.stderr and password not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # A database made with other partitions.
    first = ServerProcess(pg_url, {"partitions": 8})  # type: ignore[arg-type]
    first.kill()
    result = serve("--db", pg_url, "--partitions", "16")
    assert result.returncode == 2 and "8" in result.stderr and "16" in result.stderr
    assert password not in result.stderr
    # An advertised URL that is not a URL.
    result = serve("--db", pg_url, "--advertised-url", "coord-1:9080")
    assert result.returncode == 2 and "advertised_url" in result.stderr


def test_an_advertised_url_that_does_not_lead_here_is_refused_before_registering(
        pg_url: str) -> None:
    """A coordinator whose advertised URL leads nowhere, or to another coordinator,
    would take partitions and have find_coordinator send their groups there: it
    exits 2 with one line naming the URL and what failed, and never registers."""
    a = ServerProcess(pg_url, {"partitions": P, "lease_ms": 2000})  # type: ignore[arg-type]
    try:
        wait_until(lambda: len(owners(a.admin_url)) == P, 15)
        for url, problem in ((f"http://127.0.0.1:{free_port()}", "Cannot connect"),
                             (a.url, "another process")):
            result = subprocess.run(
                [GROUPCOORD, "serve", "--port", "0", "--admin-port", "0", "--db", pg_url,
                 "--partitions", str(P), "--lease-ms", "2000", "--advertised-url", url],
                capture_output=True, text=True, timeout=60)
            assert result.returncode == 2, result.stderr
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert url in lines[0] and "does not reach this coordinator" in lines[0]
            assert problem in lines[0], lines[0]
        # Never registered: a is still the only coordinator and owns every partition.
        _, doc = admin(a.admin_url, "/v1/coordinators")
        assert [c["url"] for c in doc["coordinators"]] == [a.url]
        assert set(owners(a.admin_url).values()) == {a.url}
    finally:
        a.kill()


def test_a_caller_not_granted_a_group_does_not_learn_its_owner(pg_url: str,
                                                                tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(json.dumps({"name": "app", "hash": hash_token("app-secret"),
                                  "groups": ["orders-"]}) + "\n"
                      + json.dumps({"name": "ops", "hash": hash_token("ops-secret"),
                                    "groups": ["*"], "role": "viewer"}) + "\n")
    with ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda _: ServerProcess(pg_url, {  # type: ignore[arg-type]
            "partitions": P, "lease_ms": 2000, "auth_tokens": tokens}), range(2)))
    try:
        def owned_by_both() -> bool:
            # (the coordinators list is for operators: a viewer's token)
            req = urllib.request.Request(servers[0].admin_url + "/v1/coordinators",
                                         headers={"Authorization": "Bearer ops-secret"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                doc = json.loads(resp.read())
            return all(c["partitions"] for c in doc["coordinators"]) and len(
                doc["coordinators"]) == 2
        wait_until(owned_by_both, 15)
        for server in servers:
            req = urllib.request.Request(
                f"{server.url}/v1/heartbeat", headers={
                    "Content-Type": "application/msgpack", "Authorization": "Bearer app-secret"},
                data=msgpack.packb({"group_id": "users-1", "member_id": "m",
                                    "generation_id": 1}))
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 403
            body = msgpack.unpackb(refused.value.read())
            assert body["error"] == "GROUP_AUTHORIZATION_FAILED" and "url" not in body
    finally:
        for server in servers:
            server.kill()
