"""End to end: the real ``groupcoord serve`` process, a real SQLite file, ``kill -9``.

docs/protocol.md, "Durability": after a restart a stable group resumes with no
rebalance, every acknowledged checkpoint is still there, and an in-flight
rebalance restarts cleanly; a commit delayed across the restart is not applied
over a newer one. "Running the server": ``--port 0`` prints the
address; SIGTERM exits 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from server_harness import GROUPCOORD, ServerProcess, StartServer

from protocol.resources import ResourceAssignment

SESSION_MS = 10_000
#: initial rebalance delay of servers whose test forms a two-member group.
GROUP_DELAY_MS = 500


class Member:
    """A hand-driven member speaking the wire protocol (no client library)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, group: str = "g",
                 instance: str | None = None) -> None:
        self.http = http
        self.url = url
        self.group = group
        self.instance = instance
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.members: list[dict[str, Any]] = []

    async def call(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(f"{self.url}/v1/{api}",
                                  data=msgpack.packb(body, use_bin_type=True),
                                  headers={"Content-Type": "application/msgpack"}) as resp:
            assert resp.status == 200, await resp.read()
            doc: dict[str, Any] = msgpack.unpackb(await resp.read(), raw=False)
            return doc

    async def join(self) -> dict[str, Any]:
        while True:
            answer = await self.call("join", {
                "group_id": self.group, "member_id": self.member_id,
                "group_instance_id": self.instance, "protocol_type": "resources",
                "protocols": [["range", b"m"]], "session_timeout_ms": SESSION_MS,
                "rebalance_timeout_ms": SESSION_MS, "client_id": "e2e"})
            self.member_id = answer["member_id"] or self.member_id
            if answer["error"] != "MEMBER_ID_REQUIRED":
                break
        if answer["error"] is None:
            self.generation = answer["generation_id"]
            self.leader = answer["leader"]
            self.members = answer["members"]
        return answer

    async def sync(self, assignments: dict[str, bytes] | None = None) -> dict[str, Any]:
        return await self.call("sync", {
            "group_id": self.group, "member_id": self.member_id,
            "generation_id": self.generation, "group_instance_id": self.instance,
            "assignments": [{"member_id": m, "assignment": a}
                            for m, a in (assignments or {}).items()]})

    async def heartbeat(self) -> dict[str, Any]:
        return await self.call("heartbeat", {
            "group_id": self.group, "member_id": self.member_id,
            "generation_id": self.generation, "group_instance_id": self.instance})

    async def commit(self, checkpoints: list[list[Any]],
                     sequence: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "group_id": self.group, "member_id": self.member_id,
            "generation_id": self.generation, "checkpoints": checkpoints}
        if sequence is not None:
            body["sequence"] = sequence
        return await self.call("commit", body)

    async def fetch(self) -> dict[tuple[str, int], Any]:
        answer = await self.call("fetch", {"group_id": self.group})
        assert answer["error"] is None
        return {(s, i): v for s, i, v in answer["checkpoints"]}


def assignment_of(*indexes: int) -> bytes:
    return ResourceAssignment({"orders": list(indexes)}).encode()


async def put_orders(http: aiohttp.ClientSession, url: str) -> None:
    """The catalog entry every checkpoint of these "resources" groups refers to."""
    async with http.put(f"{url}/v1/resources/orders", json={"partitions": 4}) as resp:
        assert resp.status == 200


async def form_stable_group(http: aiohttp.ClientSession, url: str,
                            admin_url: str) -> list[Member]:
    """Two members, one generation, the leader's assignment delivered."""
    await put_orders(http, admin_url)
    members = [Member(http, url), Member(http, url)]
    # Both join at once; the server's initial rebalance delay (GROUP_DELAY_MS)
    # lets the second land in the first generation.
    answers = await asyncio.wait_for(asyncio.gather(*(m.join() for m in members)), 15)
    assert [a["error"] for a in answers] == [None, None], answers
    assert members[0].generation == members[1].generation
    leader = next(m for m in members if m.member_id == m.leader)
    plan = {members[0].member_id: assignment_of(0, 1), members[1].member_id: assignment_of(2, 3)}
    synced = await asyncio.gather(*(m.sync(plan if m is leader else None) for m in members))
    assert [s["error"] for s in synced] == [None, None]
    return members


async def admin_group(http: aiohttp.ClientSession, url: str, group: str) -> dict[str, Any]:
    async with http.get(f"{url}/v1/groups/{group}") as resp:
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
        return doc


async def test_stable_group_survives_kill_9(start_server: StartServer, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    server = start_server(db, initial_rebalance_delay_ms=GROUP_DELAY_MS)
    async with aiohttp.ClientSession() as http:
        members = await form_stable_group(http, server.url, server.admin_url)
        generation = members[0].generation
        for m, idx in zip(members, (0, 2), strict=True):
            assert (await m.commit([["orders", idx, 100 + idx]]))["error"] is None
        server.kill()

        server = start_server(db, initial_rebalance_delay_ms=GROUP_DELAY_MS)
        for m in members:
            m.url = server.url
        # Same generation: no error, no rebalance.
        assert [(await m.heartbeat())["error"] for m in members] == [None, None]
        # A re-sent sync returns the stored assignment.
        again = [await m.sync() for m in members]
        assert [a["error"] for a in again] == [None, None]
        assert again[0]["assignment"] == assignment_of(0, 1)
        assert again[1]["assignment"] == assignment_of(2, 3)
        assert await members[0].fetch() == {("orders", 0): 100, ("orders", 2): 102}
        view = await admin_group(http, server.admin_url, "g")
        assert (view["state"], view["generation_id"]) == ("Stable", generation)
        assert sorted(m["assignment"]["orders"] for m in view["members"]) == [[0, 1], [2, 3]]
    assert server.terminate() == 0


async def test_every_acknowledged_checkpoint_survives_kill_9(
        start_server: StartServer, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    server = start_server(db)
    acked: dict[int, int] = {}
    async with aiohttp.ClientSession() as http:
        await put_orders(http, server.admin_url)
        member = Member(http, server.url)
        await member.join()
        assert (await member.sync({member.member_id: assignment_of(0, 1, 2, 3)}))["error"] is None

        async def committer(idx: int) -> None:
            for value in range(1, 10_000):
                try:
                    answer = await member.commit([["orders", idx, value]])
                except (aiohttp.ClientError, AssertionError):
                    return  # the server died under us
                assert answer["error"] is None
                acked[idx] = value

        tasks = [asyncio.ensure_future(committer(i)) for i in range(4)]
        while sum(acked.values()) < 200:
            await asyncio.sleep(0.01)
        server.kill()  # while commits are in flight
        await asyncio.wait_for(asyncio.gather(*tasks), 10)

        server = start_server(db)
        member.url = server.url
        stored = await member.fetch()
    for idx, value in acked.items():
        # At least what was acknowledged (a commit may land without its ack).
        assert stored[("orders", idx)] >= value, (idx, value, stored)
    assert server.terminate() == 0


async def test_a_commit_delayed_across_a_restart_does_not_undo_a_newer_one(
        start_server: StartServer, tmp_path: Path) -> None:
    """docs/coordinator-semantics.md, "The commit sequence": the member gave up
    on commit 7 and had commit 8 acknowledged; the server restarted before
    commit 7 arrived. It is answered, and the acknowledged value stays."""
    db = tmp_path / "g.db"
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        await put_orders(http, server.admin_url)
        member = Member(http, server.url)
        await member.join()
        assert (await member.sync({member.member_id: assignment_of(0)}))["error"] is None
        assert (await member.commit([["orders", 0, 61]], sequence=8))["error"] is None
        server.kill()

        server = start_server(db)
        member.url = server.url
        assert (await member.commit([["orders", 0, 54]], sequence=7))["error"] is None
        assert await member.fetch() == {("orders", 0): 61}
        assert (await member.commit([["orders", 0, 70]], sequence=9))["error"] is None
        assert await member.fetch() == {("orders", 0): 70}
    assert server.terminate() == 0


async def test_inflight_rebalance_restarts_cleanly(start_server: StartServer,
                                                   tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    server = start_server(db)
    async with aiohttp.ClientSession() as http:
        member = Member(http, server.url)
        answer = await member.join()
        assert answer["error"] is None and answer["generation_id"] == 1
        # The generation formed (and was persisted) but the leader never synced.
        server.kill()

        server = start_server(db)
        member.url = server.url
        beat = await member.heartbeat()
        assert beat["error"] == "REBALANCE_IN_PROGRESS"
        rejoined = await asyncio.wait_for(member.join(), 15)
        assert rejoined["error"] is None
        assert rejoined["generation_id"] > 1
        synced = await member.sync({member.member_id: assignment_of(0)})
        assert synced["error"] is None and synced["assignment"] == assignment_of(0)
        assert (await member.heartbeat())["error"] is None
        view = await admin_group(http, server.admin_url, "g")
        assert view["state"] == "Stable"
    assert server.terminate() == 0


async def test_sigterm_with_a_parked_request_exits_zero(start_server: StartServer) -> None:
    server = start_server(initial_rebalance_delay_ms=60_000)
    async with aiohttp.ClientSession() as http:
        member = Member(http, server.url)
        first = await member.call("join", {
            "group_id": "g", "member_id": "", "protocol_type": "resources",
            "protocols": [["range", b""]], "session_timeout_ms": SESSION_MS,
            "rebalance_timeout_ms": SESSION_MS})
        member.member_id = first["member_id"]
        parked = asyncio.ensure_future(member.join())  # waits out the 60 s delay
        await asyncio.sleep(0.2)
        assert not parked.done()
        status = await asyncio.get_running_loop().run_in_executor(None, server.terminate)
        assert status == 0
        answer = await asyncio.wait_for(parked, 5)
        assert answer["error"] == "COORDINATOR_NOT_AVAILABLE"
    assert "shutting down" in server.stderr


def test_bad_setting_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([GROUPCOORD, "serve", "--port", "70000", "--db",
                           str(tmp_path / "g.db")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "port (--port): must be between 0 and 65535" in done.stderr
    done = subprocess.run([GROUPCOORD, "serve", "--port", "0", "--db", str(tmp_path / "g.db")],
                          capture_output=True, text=True, timeout=30,
                          env={"GROUPCOORD_MIN_SESSION_TIMEOUT_MS": "soon", "PATH": "/usr/bin"})
    assert done.returncode == 2
    assert "GROUPCOORD_MIN_SESSION_TIMEOUT_MS" in done.stderr


def test_port_zero_prints_the_address(start_server: StartServer) -> None:
    server: ServerProcess = start_server()
    assert server.host == "127.0.0.1" and server.port > 0
    # The admin listener's line too (--admin-port 0: a free port of its own).
    assert server.admin_url.startswith("http://127.0.0.1:")
    assert server.admin_url != server.url
    with urllib.request.urlopen(f"{server.admin_url}/readyz", timeout=5) as resp:
        assert json.loads(resp.read()) == {"status": "ready"}
    assert server.terminate() == 0


def test_a_busy_admin_port_is_a_clear_error(start_server: StartServer, tmp_path: Path) -> None:
    server: ServerProcess = start_server()
    admin_port = server.admin_url.rsplit(":", 1)[1]
    done = subprocess.run([GROUPCOORD, "serve", "--host", "127.0.0.1", "--port", "0",
                           "--admin-port", admin_port, "--db", str(tmp_path / "other.db")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{admin_port} (admin listener, --admin-port)" in (
        done.stderr)
    assert "listening on" not in done.stdout
    assert server.terminate() == 0
