"""An operator's drain request on a real server (docs/protocol.md, "Drain"):
``POST /v1/groups/{id}/members/{member}/drain`` and ``groupcoord members
drain``; the member's heartbeat answers carry ``drain: true`` until it rejoins
draining or leaves; what ``GET /v1/groups/{id}``, ``groupcoord groups
describe`` and the metrics show of it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from server_harness import GROUPCOORD, ServerProcess, StartServer, call

from coordinator.auth import hash_token
from protocol.resources import MemberMetadata, ResourceAssignment

GROUP = "placed"


def run(server: ServerProcess, *args: str, token: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    extra = ["--token", token] if token else []
    return subprocess.run([GROUPCOORD, *args, "--url", server.admin_url, *extra],
                          capture_output=True, text=True, timeout=60)



def admin(server: ServerProcess, method: str, path: str, token: str | None = None
          ) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{server.admin_url}{path}", method=method,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def join(server: ServerProcess, instance: str, metadata: MemberMetadata, member_id: str = "",
         group: str = GROUP, protocol_type: str = "resources") -> dict[str, Any]:
    return call(server, "join", {
        "group_id": group, "member_id": member_id, "group_instance_id": instance,
        "protocol_type": protocol_type, "protocols": [["balanced", metadata.encode()]],
        "session_timeout_ms": 300_000, "rebalance_timeout_ms": 10_000, "client_id": instance})


def heartbeat(server: ServerProcess, member: dict[str, Any]) -> dict[str, Any]:
    return call(server, "heartbeat", {
        "group_id": GROUP, "member_id": member["member_id"],
        "generation_id": member["generation_id"],
        "group_instance_id": member["member_id"].split("-")[0]})


def form_group(server: ServerProcess, metas: dict[str, MemberMetadata],
               given: dict[str, ResourceAssignment]) -> dict[str, dict[str, Any]]:
    """The members ``metas`` (by instance id) join together; the leader hands out
    ``given`` (by instance id). Returns each member's join answer."""
    instances = list(metas)
    with ThreadPoolExecutor(len(instances)) as pool:  # joined together: one generation
        joined = list(pool.map(lambda i: join(server, i, metas[i]), instances))
    assert all(j["error"] is None for j in joined), joined
    by_instance = dict(zip(instances, joined, strict=True))
    leader = next(i for i, j in by_instance.items() if j["member_id"] == j["leader"])
    synced = call(server, "sync", {
        "group_id": GROUP, "member_id": by_instance[leader]["member_id"],
        "generation_id": by_instance[leader]["generation_id"], "group_instance_id": leader,
        "assignments": [{"member_id": by_instance[i]["member_id"], "assignment": a.encode()}
                        for i, a in given.items()]})
    assert synced["error"] is None, synced
    return by_instance


def members_shown(server: ServerProcess) -> dict[str, dict[str, Any]]:
    _, group = admin(server, "GET", f"/v1/groups/{GROUP}")
    return {m["group_instance_id"]: m for m in group["members"]}


def metric(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"{name} not in /metrics"
    return float(found[1])


async def test_drain_route_heartbeat_answers_and_what_the_tools_show(
        start_server: StartServer) -> None:
    server = start_server(initial_rebalance_delay_ms=1_000)
    assert (await asyncio.to_thread(run, server, "resources", "set", "s", "4")).returncode == 0
    metas = {"a": MemberMetadata(sets=("s",), warm={"s": [3]}),
             "b": MemberMetadata(sets=("s",))}
    given = {"a": ResourceAssignment(assigned={"s": [0, 1]}, standby={"s": [3]}),
             "b": ResourceAssignment(assigned={"s": [2, 3]})}
    joined = await asyncio.to_thread(form_group, server, metas, given)
    a, b = joined["a"], joined["b"]
    assert "drain" not in heartbeat(server, b)  # sent only when true
    assert await asyncio.to_thread(metric, server, "groupcoord_drain_requests_total") == 0

    status, doc = await asyncio.to_thread(
        admin, server, "POST", f"/v1/groups/{GROUP}/members/{b['member_id']}/drain")
    assert (status, doc) == (200, {"group_id": GROUP, "member_id": b["member_id"],
                                   "group_instance_id": "b", "drain_requested": True,
                                   "draining": False})
    # Every heartbeat answer to b says so, until it rejoins draining; a's do not.
    assert heartbeat(server, b) == {"error": None, "resources_epoch": 1, "drain": True}
    assert heartbeat(server, b)["drain"] is True
    assert "drain" not in heartbeat(server, a)

    shown = await asyncio.to_thread(members_shown, server)
    assert {i: (m["drain_requested"], m["draining"], m["standby"], m["warm"])
            for i, m in shown.items()} == {"a": (False, False, {"s": [3]}, {"s": [3]}),
                                           "b": (True, False, {}, {})}
    described = await asyncio.to_thread(run, server, "groups", "describe", GROUP)
    assert described.returncode == 0, described.stderr
    rows = {line.split()[1]: line.split() for line in described.stdout.splitlines()
            if line.split()[:1] in ([a["member_id"]], [b["member_id"]])}
    assert rows["a"][-3:] == ["s:3", "s:3", "-"] and rows["b"][-1] == "requested", \
        described.stdout

    # The CLI names the static member by its instance id; asked again, nothing new.
    again = await asyncio.to_thread(run, server, "members", "drain", GROUP, "b")
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"asked member {b['member_id']} (instance b) of group {GROUP} to "
                            f"drain: its next heartbeat answer says so; it hands its "
                            f"resources over, then leaves\n")
    assert await asyncio.to_thread(metric, server, "groupcoord_drain_requests_total") == 1
    assert await asyncio.to_thread(metric, server, "groupcoord_drain_requested_members") == 1
    assert await asyncio.to_thread(metric, server, "groupcoord_draining_members") == 0

    # b rejoins draining: the request is fulfilled; a rejoins too and the group forms.
    draining = MemberMetadata(sets=("s",), owned={"s": [2, 3]}, generation=1, draining=True)
    rejoined = await asyncio.gather(
        asyncio.to_thread(join, server, "b", draining, b["member_id"]),
        asyncio.to_thread(join, server, "a", metas["a"], a["member_id"]))
    assert all(j["error"] is None for j in rejoined), rejoined
    b = rejoined[0]
    shown = await asyncio.to_thread(members_shown, server)
    assert (shown["b"]["drain_requested"], shown["b"]["draining"]) == (False, True)
    assert await asyncio.to_thread(metric, server, "groupcoord_draining_members") == 1
    assert await asyncio.to_thread(metric, server, "groupcoord_drain_requested_members") == 0
    answer = await asyncio.to_thread(run, server, "members", "drain", GROUP, "b", "--json")
    assert json.loads(answer.stdout)["draining"] is True
    described = await asyncio.to_thread(run, server, "groups", "describe", GROUP)
    assert any(line.split()[1:2] == ["b"] and line.split()[-1] == "yes"
               for line in described.stdout.splitlines()), described.stdout
    # Draining and owning nothing (no assignment in the new generation yet): --wait is done.
    waited = await asyncio.to_thread(run, server, "members", "drain", GROUP, "b", "--wait")
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.splitlines() == [
        f"member {b['member_id']} (instance b) of group {GROUP} is draining already",
        f"member {b['member_id']} (instance b) drains and owns nothing now"]


async def test_refusals_name_the_group_or_member(start_server: StartServer) -> None:
    server = start_server(initial_rebalance_delay_ms=0)
    await asyncio.to_thread(form_group, server, {"a": MemberMetadata(sets=("s",))},
                            {"a": ResourceAssignment()})
    status, doc = await asyncio.to_thread(admin, server, "POST",
                                          "/v1/groups/nope/members/a/drain")
    assert (status, doc) == (404, {"error": "UNKNOWN_GROUP", "message": "no group 'nope'"})
    status, doc = await asyncio.to_thread(admin, server, "POST",
                                          f"/v1/groups/{GROUP}/members/ghost/drain")
    assert status == 404 and doc["error"] == "UNKNOWN_MEMBER_ID"
    assert "'ghost'" in doc["message"] and f"'{GROUP}'" in doc["message"]
    cli = await asyncio.to_thread(run, server, "members", "drain", GROUP, "ghost")
    assert cli.returncode == 1 and "'ghost'" in cli.stderr, cli.stderr
    # A member that owns nothing but never drains (it does not speak v1.2): --wait gives up.
    waited = await asyncio.to_thread(run, server, "members", "drain", GROUP, "a", "--wait",
                                     "--timeout", "1")
    assert waited.returncode == 1
    assert re.fullmatch(r"groupcoord: member a-\w+ \(instance a\) has neither left nor "
                        rf"drained down to nothing after 1 s; see groupcoord groups describe "
                        rf"{GROUP}\n", waited.stderr), waited.stderr
    # A group of another protocol has no way to drain: 409.
    other = await asyncio.to_thread(join, server, "x", MemberMetadata(sets=("s",)), "",
                                    "consumers", "consumer")
    status, doc = await asyncio.to_thread(
        admin, server, "POST", f"/v1/groups/consumers/members/{other['member_id']}/drain")
    assert status == 409 and doc["error"] == "INCONSISTENT_GROUP_PROTOCOL"
    assert "'consumer'" in doc["message"]


async def test_only_the_admin_role_may_ask(start_server: StartServer, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.jsonl"
    lines = [{"name": "ops", "hash": hash_token("ops-token"), "groups": ["*"], "role": "admin"},
             {"name": "eyes", "hash": hash_token("eyes-token"), "groups": ["*"],
              "role": "viewer"},
             {"name": "app", "hash": hash_token("app-token"), "groups": ["*"]}]
    tokens.write_text("".join(json.dumps(line) + "\n" for line in lines))
    server = start_server(initial_rebalance_delay_ms=0, auth_tokens=tokens)
    path = f"/v1/groups/{GROUP}/members/a/drain"
    for token, expected in ((None, 401), ("app-token", 403), ("eyes-token", 403)):
        status, _ = await asyncio.to_thread(admin, server, "POST", path, token)
        assert status == expected, token
    # The admin is let through (and told the group does not exist).
    status, doc = await asyncio.to_thread(admin, server, "POST", path, "ops-token")
    assert (status, doc["error"]) == (404, "UNKNOWN_GROUP")


async def test_a_leave_ends_the_request_and_the_cli_waits_for_it(
        start_server: StartServer) -> None:
    server = start_server(initial_rebalance_delay_ms=1_000)
    joined = await asyncio.to_thread(
        form_group, server, {"a": MemberMetadata(sets=("s",)), "b": MemberMetadata(sets=("s",))},
        {"a": ResourceAssignment(assigned={"s": [0]}), "b": ResourceAssignment()})
    waiting = asyncio.create_task(asyncio.to_thread(
        run, server, "members", "drain", GROUP, "a", "--wait", "--timeout", "30"))
    for _ in range(200):
        if heartbeat(server, joined["a"]).get("drain"):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the drain request never reached a's heartbeat answers")
    left = await asyncio.to_thread(call, server, "leave", {
        "group_id": GROUP, "members": [{"member_id": joined["a"]["member_id"],
                                        "group_instance_id": "a"}]})
    assert left["error"] is None, left
    done = await waiting
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"member {joined['a']['member_id']} (instance a) has left the group")
    assert set(await asyncio.to_thread(members_shown, server)) == {"b"}
    assert await asyncio.to_thread(metric, server, "groupcoord_drain_requested_members") == 0


MEMBER_PROC = str(Path(__file__).parent.parent / "client" / "member_proc.py")


def test_the_drain_command_waits_until_a_real_member_has_handed_over_and_left(
        start_server: StartServer, tmp_path: Path) -> None:
    """Two member processes (GroupMember, the balanced assignor) share a set;
    ``groupcoord members drain --wait`` names one: it returns 0 once that
    member has heard the request, handed its resources over and left; its
    process ends on its own, the other owns everything, and the rebalance
    history counts the moves under ``drain``."""
    server = start_server()
    req = urllib.request.Request(f"{server.admin_url}/v1/resources/orders", method="PUT",
                                 data=json.dumps({"partitions": 6}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()
    procs = {name: subprocess.Popen(
        [sys.executable, MEMBER_PROC, server.url, name, str(tmp_path / f"{name}.jsonl"),
         "--group", GROUP, "--sets", "orders", "--assignor", "balanced",
         "--session-ms", "3000", "--heartbeat-ms", "300"], stderr=subprocess.DEVNULL)
        for name in ("worker-1", "worker-2")}
    try:
        def owners() -> dict[str, list[int]]:
            status, group = admin(server, "GET", f"/v1/groups/{GROUP}")
            if status != 200 or group["state"] != "Stable":
                return {}
            return {m["client_id"]: (m["assignment"] or {}).get("orders", [])
                    for m in group["members"]}

        deadline = time.monotonic() + 30
        while sorted(len(v) for v in owners().values()) != [3, 3]:
            assert time.monotonic() < deadline, owners()
            time.sleep(0.2)
        _, group = admin(server, "GET", f"/v1/groups/{GROUP}")
        member_id = next(m["member_id"] for m in group["members"]
                         if m["client_id"] == "worker-2")

        done = run(server, "members", "drain", GROUP, member_id, "--wait", "--timeout", "45")
        assert done.returncode == 0, done.stdout + done.stderr
        assert procs["worker-2"].wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while owners() != {"worker-1": [0, 1, 2, 3, 4, 5]}:
            assert time.monotonic() < deadline, owners()
            time.sleep(0.2)
        _, history = admin(server, "GET", f"/v1/groups/{GROUP}/rebalances")
        causes: dict[str, int] = {}
        for rebalance in history["rebalances"]:
            for cause, count in rebalance["resources"].get("causes", {}).items():
                causes[cause] = causes.get(cause, 0) + count
        assert causes.get("drain", 0) >= 3, history
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
