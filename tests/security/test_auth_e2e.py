"""Authentication and TLS against the real ``groupcoord serve`` process.

The tokens file and the certificate are made during the test; the client
library's GroupMember takes the token and never logs it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from server_harness import StartServer
from tls_certs import make_tls_files

from client.errors import GroupAuthorizationFailedError, InvalidRequestError
from client.member import GroupMember
from client.tls import client_ssl_context
from coordinator.auth import hash_token
from protocol import codec
from protocol.messages import HeartbeatRequest, LeaveMember, LeaveRequest

APP_A = secrets.token_urlsafe(32)
APP_B = secrets.token_urlsafe(32)
OPS = secrets.token_urlsafe(32)
MSGPACK = {"Content-Type": codec.CONTENT_TYPE}


def _tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.jsonl"
    lines = [
        {"name": "app-a", "hash": hash_token(APP_A), "groups": ["orders-"]},
        {"name": "app-b", "hash": hash_token(APP_B), "groups": ["orders-"]},
        {"name": "ops", "hash": hash_token(OPS), "groups": ["*"], "admin": True},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {**MSGPACK, **(_auth(token) if token else {})}
    async with session.post(url, data=codec.encode(body), headers=headers) as resp:
        return resp.status, codec.decode(await resp.read())


def _member(url: str, group: str, token: str) -> GroupMember:
    return GroupMember(url, group, ["orders"], token=token, session_timeout_ms=1_000,
                       heartbeat_interval_ms=200, rebalance_timeout_ms=2_000,
                       request_timeout_ms=3_000)


async def test_tokens_grants_and_member_binding_end_to_end(
        start_server: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = start_server(auth_tokens=_tokens_file(tmp_path))
    async with aiohttp.ClientSession() as session:
        # Health and metrics stay open; everything else needs a token.
        for path in ("/healthz", "/readyz", "/metrics"):
            async with session.get(server.admin_url + path) as resp:
                assert resp.status == 200, path
        async with session.put(f"{server.admin_url}/v1/resources/orders",
                               json={"partitions": 4}) as resp:
            assert resp.status == 401
        async with session.put(f"{server.admin_url}/v1/resources/orders",
                               json={"partitions": 4}, headers=_auth(APP_A)) as resp:
            assert resp.status == 403  # not an admin token
        async with session.put(f"{server.admin_url}/v1/resources/orders",
                               json={"partitions": 4}, headers=_auth(OPS)) as resp:
            assert resp.status == 200

        member = _member(server.url, "orders-eu", APP_A)
        async with member:
            assert len(member.assignment) == 4
            mid, gen = member.member_id, member.generation_id
            # The member id carries 128 random bits (32 hex digits) and a tag.
            assert len(mid.rsplit(".", 1)[0].rsplit("-", 1)[1]) == 32
            hb = HeartbeatRequest("orders-eu", mid, gen).to_wire()
            status, _ = await _post(session, f"{server.url}/v1/heartbeat", hb, None)
            assert status == 401
            status, body = await _post(session, f"{server.url}/v1/heartbeat", hb,
                                       "x" * 43)
            assert status == 401 and body["error"] == "GROUP_AUTHORIZATION_FAILED"
            # Another token granted the same group learned A's member id: it
            # still cannot act for A (heartbeat, leave) -- the id is not its own.
            status, body = await _post(session, f"{server.url}/v1/heartbeat", hb, APP_B)
            assert (status, body["error"]) == (200, "UNKNOWN_MEMBER_ID")
            leave = LeaveRequest("orders-eu", (LeaveMember(mid),)).to_wire()
            status, body = await _post(session, f"{server.url}/v1/leave", leave, APP_B)
            assert status == 200 and body["error"] in ("UNKNOWN_MEMBER_ID", None)
            if body["error"] is None:
                assert [m["error"] for m in body["members"]] == ["UNKNOWN_MEMBER_ID"]
            async with session.get(f"{server.admin_url}/v1/groups/orders-eu",
                                   headers=_auth(OPS)) as resp:
                view = await resp.json()
            assert [m["member_id"] for m in view["members"]] == [mid]
            assert view["generation_id"] == gen
            # The owner itself is still fine.
            status, body = await _post(session, f"{server.url}/v1/heartbeat", hb, APP_A)
            assert (status, body["error"]) == (200, None)

        # A group outside the token's grant: 403, which the member reports as fatal.
        outsider = _member(server.url, "users", APP_A)
        with pytest.raises(GroupAuthorizationFailedError):
            async with outsider:
                pass

    logged = "\n".join(r.getMessage() for r in caplog.records) + server.stderr
    for token in (APP_A, APP_B, OPS):
        assert token not in logged
        assert token not in repr(member) and token not in repr(outsider)
    assert server.terminate() == 0


async def test_tls_end_to_end(start_server: StartServer, tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    server = start_server(tls_cert=files.server_cert, tls_key=files.server_key)
    assert server.url.startswith("https://127.0.0.1:")
    hb = HeartbeatRequest("g", "m", 1).to_wire()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/v1/heartbeat", data=codec.encode(hb),
                                headers=MSGPACK,
                                ssl=client_ssl_context(files.ca_cert)) as resp:
            assert resp.status == 200
            assert codec.decode(await resp.read())["error"] == "UNKNOWN_MEMBER_ID"
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(f"{server.url}/v1/heartbeat", data=codec.encode(hb),
                               headers=MSGPACK, ssl=client_ssl_context())
        with pytest.raises(aiohttp.ClientError):
            async with session.post(server.url.replace("https", "http") + "/v1/heartbeat",
                                    data=codec.encode(hb), headers=MSGPACK) as resp:
                assert resp.status == 400  # aiohttp's answer to plaintext on a TLS port
                raise aiohttp.ClientError("plaintext refused")
    assert server.terminate() == 0


def test_server_refuses_a_bad_tokens_file_or_certificate(start_server: StartServer,
                                                         tmp_path: Path) -> None:
    bad = tmp_path / "tokens.jsonl"
    bad.write_text('{"name": "x", "hash": "sha256:00", "groups": []}\n')
    with pytest.raises(RuntimeError, match="64 hex digits"):
        start_server(auth_tokens=bad)
    with pytest.raises(RuntimeError, match="does not exist"):
        start_server(tls_cert=tmp_path / "missing.pem")


async def test_a_static_instance_belongs_to_the_token_that_created_it(
        start_server: StartServer, tmp_path: Path) -> None:
    """App-b shares app-a's grant but cannot take over or remove
    app-a's static instance, before or after a restart; app-a still can."""
    db = tmp_path / "static.db"
    tokens = _tokens_file(tmp_path)
    server = start_server(db, auth_tokens=tokens)
    join = {"group_id": "orders-static", "member_id": "", "group_instance_id": "worker-1",
            "protocol_type": "resources", "protocols": [["range", b""]],
            "session_timeout_ms": 60_000, "rebalance_timeout_ms": 1_000}
    async with aiohttp.ClientSession() as session:
        status, owner = await _post(session, f"{server.url}/v1/join", join, APP_A)
        assert status == 200 and owner["error"] is None, owner
        member_id = owner["member_id"]
        sync = {"group_id": "orders-static", "member_id": member_id,
                "generation_id": owner["generation_id"], "group_instance_id": "worker-1",
                "assignments": [{"member_id": member_id, "assignment": b"mine"}]}
        status, body = await _post(session, f"{server.url}/v1/sync", sync, APP_A)
        assert status == 200 and body["error"] is None and body["assignment"] == b"mine"

        async def attempts() -> None:
            status, body = await _post(session, f"{server.url}/v1/join", join, APP_B)
            assert (status, body["error"]) == (200, "FENCED_INSTANCE_ID"), body
            leave = LeaveRequest("orders-static", (LeaveMember("", "worker-1"),)).to_wire()
            status, body = await _post(session, f"{server.url}/v1/leave", leave, APP_B)
            assert status == 200 and body["members"][0]["error"] == "FENCED_INSTANCE_ID"
            # The owner's member is untouched: same id, same generation.
            beat = HeartbeatRequest("orders-static", member_id, owner["generation_id"],
                                    "worker-1").to_wire()
            status, body = await _post(session, f"{server.url}/v1/heartbeat", beat, APP_A)
            assert (status, body["error"]) == (200, None), body

        await attempts()
        assert server.terminate() == 0
        server = start_server(db, auth_tokens=tokens)
        await attempts()
        # The owning token restarts its instance as KIP-345 allows: same assignment.
        status, body = await _post(session, f"{server.url}/v1/join", join, APP_A)
        assert status == 200 and body["error"] is None and body["member_id"] != member_id
    assert server.terminate() == 0


async def test_one_token_cannot_take_every_parked_slot(start_server: StartServer,
                                                       tmp_path: Path) -> None:
    """The security re-attack: app-a minted member ids (each an empty-member-id
    join answered MEMBER_ID_REQUIRED) and parked a join for each until
    --max-parked-requests was full; app-b's joins were then refused. With a share
    per token, app-a's extra joins are refused and app-b's is still admitted."""
    server = start_server(auth_tokens=_tokens_file(tmp_path), max_parked_requests=4,
                          max_parked_per_token=2, initial_rebalance_delay_ms=30_000)

    def join(group: str, member_id: str) -> dict[str, Any]:
        # A new group waits the initial rebalance delay for more members: every
        # join in it parks until then.
        return {"group_id": group, "member_id": member_id, "protocol_type": "resources",
                "protocols": [["range", b""]], "session_timeout_ms": 60_000,
                "rebalance_timeout_ms": 60_000}

    async with aiohttp.ClientSession() as session:
        async def mint(group: str, token: str) -> str:
            status, body = await _post(session, f"{server.url}/v1/join", join(group, ""), token)
            assert (status, body["error"]) == (200, "MEMBER_ID_REQUIRED"), body
            member_id: str = body["member_id"]
            return member_id

        async def members(group: str) -> list[str]:
            async with session.get(f"{server.admin_url}/v1/groups/{group}",
                                   headers=_auth(OPS)) as resp:
                view = await resp.json()
            return sorted(m["member_id"] for m in view["members"])

        minted = [await mint("orders-a", APP_A) for _ in range(4)]
        a_joins = []
        for member_id in minted:
            a_joins.append(asyncio.ensure_future(
                _post(session, f"{server.url}/v1/join", join("orders-a", member_id), APP_A)))
            await asyncio.sleep(0.2)
        try:
            # Two park; the others are answered at once, retriable, and never joined.
            assert [j.done() for j in a_joins] == [False, False, True, True]
            for j in a_joins[2:]:
                status, body = j.result()
                assert (status, body["error"]) == (200, "COORDINATOR_NOT_AVAILABLE")
            assert await members("orders-a") == sorted(minted[:2])
            # app-b's member is admitted: it joins its group and parks like any other.
            b_member = await mint("orders-b", APP_B)
            b_join = asyncio.ensure_future(
                _post(session, f"{server.url}/v1/join", join("orders-b", b_member), APP_B))
            await asyncio.sleep(0.3)
            assert not b_join.done()
            assert await members("orders-b") == [b_member]
            async with session.get(server.admin_url + "/metrics") as resp:
                text = await resp.text()
            assert 'groupcoord_requests_refused_total{reason="max_parked_per_token"} 2.0' \
                in text
            assert 'groupcoord_requests_refused_total{reason="max_parked_requests"}' \
                not in text
            b_join.cancel()
        finally:
            for j in a_joins:
                j.cancel()
    assert server.terminate() == 0


async def test_a_member_asking_a_longer_rebalance_timeout_is_told_the_limit(
        start_server: StartServer, tmp_path: Path) -> None:
    """--max-rebalance-timeout-ms bounds how long a join can stay parked; a member
    asking more fails at its first join with the limit in the error."""
    server = start_server(auth_tokens=_tokens_file(tmp_path), max_rebalance_timeout_ms=2_000)
    member = GroupMember(server.url, "orders-slow", ["orders"], token=APP_A,
                         session_timeout_ms=1_000, heartbeat_interval_ms=200,
                         rebalance_timeout_ms=2_001, request_timeout_ms=3_000)
    with pytest.raises(InvalidRequestError, match=r"rebalance_timeout_ms: 2001 is over the "
                       r"server's --max-rebalance-timeout-ms \(2000\); allowed: 0 to 2000"):
        async with member:
            pass
    async with _member(server.url, "orders-slow", APP_A):  # rebalance_timeout_ms=2_000
        pass


async def _member_of_new_group(session: aiohttp.ClientSession, url: str, group: str,
                               token: str) -> tuple[str, int]:
    """Join (and sync) a new group as its only member: (member id, generation)."""
    join = {"group_id": group, "member_id": "", "protocol_type": "app",
            "protocols": [["plain", b""]], "session_timeout_ms": 60_000,
            "rebalance_timeout_ms": 1_000}
    status, body = await _post(session, f"{url}/v1/join", join, token)
    assert body["error"] == "MEMBER_ID_REQUIRED", body
    join["member_id"] = body["member_id"]
    status, body = await _post(session, f"{url}/v1/join", join, token)
    assert status == 200 and body["error"] is None, body
    member_id, generation = body["member_id"], body["generation_id"]
    sync = {"group_id": group, "member_id": member_id, "generation_id": generation,
            "assignments": [{"member_id": member_id, "assignment": b""}]}
    status, body = await _post(session, f"{url}/v1/sync", sync, token)
    assert status == 200 and body["error"] is None, body
    return member_id, generation


async def test_a_tokens_checkpoint_budget_holds_across_a_restart(
        start_server: StartServer, tmp_path: Path) -> None:
    """--max-checkpoint-bytes-per-token: app-a's commits stop at its budget with a
    message naming it, before and after a restart; app-b has its own."""
    db = tmp_path / "budget.db"
    tokens = _tokens_file(tmp_path)
    # 100 checkpoints of ("orders", i, an int) count 100 * (6 + 8 + 8) bytes.
    budget = 100 * 22
    server = start_server(db, auth_tokens=tokens, max_checkpoint_bytes_per_token=budget)

    async def commit(token: str, group: str, member: tuple[str, int], count: int
                     ) -> dict[str, Any]:
        body = {"group_id": group, "member_id": member[0], "generation_id": member[1],
                "checkpoints": [["orders", i, i] for i in range(count)]}
        status, answer = await _post(session, f"{server.url}/v1/commit", body, token)
        assert status == 200, answer
        return answer

    async with aiohttp.ClientSession() as session:
        a1 = await _member_of_new_group(session, server.url, "orders-a1", APP_A)
        a2 = await _member_of_new_group(session, server.url, "orders-a2", APP_A)
        assert (await commit(APP_A, "orders-a1", a1, 45))["error"] is None
        assert (await commit(APP_A, "orders-a2", a2, 45))["error"] is None

        async def refused() -> None:
            answer = await commit(APP_A, "orders-a2", a2, 56)
            assert answer["error"] == "CHECKPOINT_LIMIT_REACHED", answer
            assert answer["message"] == (
                f"token 'app-a' holds {90 * 22} bytes of checkpoints in the groups it "
                f"created; this write to group 'orders-a2' would add {11 * 22}, over "
                f"--max-checkpoint-bytes-per-token ({budget}); nothing was written")

        await refused()
        assert server.terminate() == 0
        server = start_server(db, auth_tokens=tokens, max_checkpoint_bytes_per_token=budget)
        await refused()
        # What fits still goes; app-b has a budget of its own.
        assert (await commit(APP_A, "orders-a2", a2, 55))["error"] is None
        b1 = await _member_of_new_group(session, server.url, "orders-b1", APP_B)
        assert (await commit(APP_B, "orders-b1", b1, 100))["error"] is None
    assert server.terminate() == 0
