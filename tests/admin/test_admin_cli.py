"""``groupcoord groups|checkpoints|rebalances|resources`` against a real server.

Each command runs as a user runs it (the ``groupcoord`` script in a
subprocess), against ``groupcoord serve`` started by the test. Exit status:
0 done, 1 refused (the server's reason on stderr), 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
import pytest
from server_harness import GROUPCOORD, ServerProcess, StartServer

from client import GroupMember
from protocol.resources import ResourceAssignment


def run(server: ServerProcess, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GROUPCOORD, *args, "--url", server.admin_url], capture_output=True,
                          text=True, timeout=60, env=env)


def call(server: ServerProcess, api: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{server.url}/v1/{api}", data=msgpack.packb(body),
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        doc: dict[str, Any] = msgpack.unpackb(answer.read())
    return doc


#: The static members' session: the suite's per-test limit (pytest-timeout, 300 s),
#: so a member that never heartbeats stays for the whole test however slowly its
#: CLI runs go (one test took 47 s with several xdist workers on 2 cores, past
#: the 30 s it had). The server's largest allowed session is 30 min.
SESSION_MS = 300_000


def static_member(server: ServerProcess, group: str, instance: str,
                  assigned: dict[str, list[int]]) -> tuple[str, int]:
    joined = call(server, "join", {
        "group_id": group, "member_id": "", "group_instance_id": instance,
        "protocol_type": "resources", "protocols": [["range", b""]],
        "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": 10_000, "client_id": "cli-test"})
    assert joined["error"] is None, joined
    member_id, generation = joined["member_id"], joined["generation_id"]
    synced = call(server, "sync", {
        "group_id": group, "member_id": member_id, "generation_id": generation,
        "group_instance_id": instance,
        "assignments": [{"member_id": member_id,
                         "assignment": ResourceAssignment(assigned).encode()}]})
    assert synced["error"] is None, synced
    return member_id, generation


def test_groups_describe_remove_member_and_rebalances(start_server: StartServer) -> None:
    server = start_server()
    assert run(server, "resources", "set", "shards", "8").returncode == 0
    member_id, generation = static_member(server, "orders", "worker-1", {"shards": [0, 1, 2, 5]})
    call(server, "commit", {"group_id": "orders", "member_id": member_id,
                            "generation_id": generation, "group_instance_id": "worker-1",
                            "checkpoints": [["shards", 0, 41], ["shards", 1, b"\xff"]]})
    listed = run(server, "groups", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["GROUP", "STATE", "HEALTH", "PROTOCOL", "GENERATION", "MEMBERS"]
    assert lines[1].split()[:3] == ["orders", "Stable", "OK"]
    as_json = json.loads(run(server, "groups", "list", "--state", "Stable", "--json").stdout)
    assert [g["group_id"] for g in as_json["groups"]] == ["orders"]
    assert as_json["groups"][0]["health"] == "OK" and as_json["groups"][0]["health_reasons"] == []
    assert json.loads(run(server, "groups", "list", "--state", "Empty", "--json").stdout) == \
        {"groups": []}

    described = run(server, "groups", "describe", "orders")
    assert described.returncode == 0, described.stderr
    assert "shards:0-2,5" in described.stdout and "worker-1" in described.stdout
    assert f"\ncoordinator: {server.url}, partition 0\n" in described.stdout
    assert "hex:ff" in described.stdout and "41" in described.stdout
    assert "initial" in described.stdout  # the last rebalance and why

    refused = run(server, "checkpoints", "reset", "orders", "--to-value", "0")
    assert refused.returncode == 1
    assert "NON_EMPTY_GROUP" in refused.stderr and "Stable" in refused.stderr

    removed = run(server, "groups", "remove-member", "orders", member_id)
    assert removed.returncode == 0, removed.stderr
    again = run(server, "groups", "remove-member", "orders", member_id)
    assert again.returncode == 1 and "UNKNOWN_MEMBER_ID" in again.stderr
    history = json.loads(run(server, "rebalances", "orders", "--json").stdout)["rebalances"]
    assert history[0]["reason"] == "initial" and history[0]["resources"]["assigned"] == 4

    # The member is gone, so the group is Empty and can be deleted (with its checkpoints).
    deleted = run(server, "groups", "delete", "orders")
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted group orders" in deleted.stdout
    gone = run(server, "groups", "describe", "orders")
    assert gone.returncode == 1 and "UNKNOWN_GROUP" in gone.stderr


def test_checkpoints_reset_dry_run_export_execute_and_undo(start_server: StartServer,
                                                           tmp_path: Path) -> None:
    server = start_server()
    call(server, "commit", {"group_id": "g", "member_id": "tool", "generation_id": -1,
                            "checkpoints": [["s", 0, 100], ["s", 1, 200], ["s", 2, 300]]})
    dry = run(server, "checkpoints", "reset", "g", "--shift-by", "-50", "--resources", "s:0-1")
    assert dry.returncode == 0, dry.stderr
    rows = [line.split() for line in dry.stdout.splitlines()]
    assert rows[0] == ["SET", "INDEX", "BEFORE", "AFTER"]
    assert rows[1:3] == [["s", "0", "100", "50"], ["s", "1", "200", "150"]]
    assert "dry run: nothing changed" in dry.stdout
    shown = json.loads(run(server, "checkpoints", "show", "g", "--json").stdout)
    assert [c["value"] for c in shown["checkpoints"]] == [100, 200, 300]

    export = tmp_path / "before.json"
    done = run(server, "checkpoints", "reset", "g", "--to-value", "0", "--execute",
               "--export", str(export))
    assert done.returncode == 0, done.stderr
    shown = json.loads(run(server, "checkpoints", "show", "g", "--json").stdout)
    assert [c["value"] for c in shown["checkpoints"]] == [0, 0, 0]
    undo = run(server, "checkpoints", "reset", "g", "--from-file", str(export), "--execute")
    assert undo.returncode == 0, undo.stderr
    shown = json.loads(run(server, "checkpoints", "show", "g", "--json").stdout)
    assert [c["value"] for c in shown["checkpoints"]] == [100, 200, 300]


def test_bad_input_is_one_line_and_changes_nothing(start_server: StartServer,
                                                   tmp_path: Path) -> None:
    server = start_server()
    call(server, "commit", {"group_id": "g", "member_id": "tool", "generation_id": -1,
                            "checkpoints": [["s", 0, "text"]]})
    shift = run(server, "checkpoints", "reset", "g", "--shift-by", "1", "--execute")
    assert shift.returncode == 1 and "not integers" in shift.stderr
    assert len(shift.stderr.strip().splitlines()) == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    bad_file = run(server, "checkpoints", "reset", "g", "--from-file", str(broken))
    assert bad_file.returncode == 2 and "not JSON" in bad_file.stderr
    unknown = run(server, "groups", "describe", "nope")
    assert unknown.returncode == 1 and "UNKNOWN_GROUP" in unknown.stderr
    usage = run(server, "checkpoints", "reset", "g")
    assert usage.returncode == 2
    shown = json.loads(run(server, "checkpoints", "show", "g", "--json").stdout)
    assert [{k: c[k] for k in ("set", "index", "value")} for c in shown["checkpoints"]] == [
        {"set": "s", "index": 0, "value": "text"}]
    assert shown["checkpoints"][0]["member_id"] == "tool"


def test_resources_set_list_delete(start_server: StartServer) -> None:
    server = start_server()
    assert run(server, "resources", "set", "shards", "12").returncode == 0
    listed = run(server, "resources", "list")
    assert listed.stdout.splitlines()[1].split()[:2] == ["shards", "12"]
    assert "resources_epoch 1" in listed.stdout
    assert run(server, "resources", "delete", "shards").returncode == 0
    assert json.loads(run(server, "resources", "list", "--json").stdout)["resources"] == {}


def test_an_unreachable_url_names_it(tmp_path: Path) -> None:
    result = subprocess.run([GROUPCOORD, "groups", "list", "--url", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in result.stderr


def test_several_admin_urls_use_the_first_that_accepts_a_connection(
        start_server: StartServer) -> None:
    """v1.1: every coordinator answers admin calls; a refused URL is skipped
    (nothing was sent), and the client keeps to the one that answered."""
    from client.admin import AdminClient, AdminError

    server = start_server()
    dead = "http://127.0.0.1:9"
    result = subprocess.run([GROUPCOORD, "resources", "set", "shards", "4", "--url",
                             f"{dead},{server.admin_url}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    admin = AdminClient([dead, server.admin_url])
    assert admin.request("GET", "/v1/resources")["resources"] == {"shards": 4}
    assert admin.url == server.admin_url
    with pytest.raises(AdminError) as caught:
        AdminClient([dead, "http://127.0.0.1:7"]).list_groups()
    assert caught.value.code == "CONNECTION_FAILED"
    assert "cannot reach http://127.0.0.1:9: " in caught.value.message
    assert "; http://127.0.0.1:7: " in caught.value.message
    with pytest.raises(ValueError, match="ftp://x"):
        AdminClient([server.admin_url, "ftp://x"])
    with pytest.raises(ValueError, match="at least one"):
        AdminClient([])


def columns(table_text: str) -> list[dict[str, str]]:
    """The rows of one of the CLI's tables, each cell under its header: the
    columns start where their header does (cells may hold spaces)."""
    lines = table_text.splitlines()
    header = lines[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def section(text: str, first_header: str) -> str:
    """The table of ``groups describe``'s output whose header starts with ``first_header``."""
    return next(block for block in text.split("\n\n") if block.startswith(first_header))


async def test_rebalances_show_when_each_ended_and_what_moved(start_server: StartServer) -> None:
    """The rebalance tables (``rebalances`` and ``groups describe``) read the
    server's own answers: a group of real members, a second one joining, so
    resources move from the first to it."""
    server = start_server()
    began_s = int(time.time())
    assert (await asyncio.to_thread(run, server, "resources", "set", "shards", "4")
            ).returncode == 0

    def member(name: str) -> GroupMember:
        return GroupMember(server.url, "orders", ["shards"], assignors=["range"],
                           client_id=name, session_timeout_ms=10_000)

    async with member("first") as first:
        await first.commit({("shards", 0): b"offset-42", ("shards", 1): b"\xff\x00",
                            ("shards", 2): "text"})
        async with member("second") as second:
            while len(first.assignment) + len(second.assignment) != 4 or \
                    first.generation_id != second.generation_id:
                await asyncio.sleep(0.05)
            generation = first.generation_id
            history = await asyncio.to_thread(run, server, "rebalances", "orders")
            described = await asyncio.to_thread(run, server, "groups", "describe", "orders")
    ended_s = time.time()
    assert history.returncode == 0, history.stderr
    assert described.returncode == 0, described.stderr
    for text in (history.stdout, section(described.stdout, "GENERATION")):
        rows = columns(text)
        assert [int(r["GENERATION"]) for r in rows] == [generation, generation - 1], text
        newest, initial = rows
        # The second member took two of the four from the first: moved, not new.
        assert (newest["MOVED"], newest["ASSIGNED"], newest["REVOKED"]) == ("2", "0", "0"), text
        assert (initial["MOVED"], initial["ASSIGNED"], initial["REVOKED"]) == ("0", "4", "0")
        for row in rows:
            ended = datetime.strptime(row["ENDED"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            assert began_s <= ended.timestamp() <= ended_s, row
    # Checkpoints: bytes that are text show as text, other bytes in hex; both labelled.
    values = {r["INDEX"]: r["VALUE"] for r in columns(section(described.stdout, "SET"))}
    assert values == {"0": 'utf-8:"offset-42"', "1": "hex:ff00", "2": '"text"'}


def test_output_into_a_closed_pipe_ends_quietly(start_server: StartServer) -> None:
    """``groupcoord groups describe g | head``: the reader leaves early; the
    command stops without a traceback."""
    server = start_server()
    static_member(server, "orders", "worker-1", {"shards": [0]})
    proc = subprocess.Popen([GROUPCOORD, "groups", "describe", "orders", "--url",
                             server.admin_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # before the command writes anything: every write fails
    _, err = proc.communicate(timeout=60)
    assert err.decode() == ""
    assert proc.returncode == 1


def test_the_protocol_port_given_as_the_admin_url_says_so(start_server: StartServer) -> None:
    server = start_server()
    admin_port = server.admin_url.rsplit(":", 1)[1]
    result = subprocess.run([GROUPCOORD, "groups", "list", "--url", server.url],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{server.url} is the coordinator's protocol listener" in result.stderr
    assert f"admin listener (--admin-port, port {admin_port} here)" in result.stderr
