"""The client library over TLS: ``ca_file`` / ``ssl_context`` on the member and transport.

Against the real ``groupcoord serve --tls-cert ... --tls-key ...`` with a CA
and certificate made during the test (trustme): a member given the CA joins
and gets its assignment over https; without it, it stops with a clear,
non-retried error instead of retrying forever.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from server_harness import ServerProcess, StartServer
from tls_certs import TLSFiles, make_tls_files

from client.blocking import BlockingGroupMember
from client.errors import TLSVerificationError
from client.member import GroupMember
from client.tls import client_ssl_context
from client.transport import AiohttpTransport
from protocol.messages import HeartbeatRequest, HeartbeatResponse

pytestmark = pytest.mark.timeout(60)

FAST = dict(session_timeout_ms=1_000, heartbeat_interval_ms=200, rebalance_timeout_ms=2_000,
            request_timeout_ms=3_000, retry_backoff_ms=20, retry_backoff_max_ms=100)


async def _tls_server(start_server: StartServer, files: TLSFiles, partitions: int
                      ) -> ServerProcess:
    server = start_server(tls_cert=files.server_cert, tls_key=files.server_key)
    assert server.url.startswith("https://127.0.0.1:")
    assert server.admin_url.startswith("https://127.0.0.1:")
    async with aiohttp.ClientSession() as session, session.put(
            f"{server.admin_url}/v1/resources/orders", json={"partitions": partitions},
            ssl=client_ssl_context(files.ca_cert)) as resp:
        assert resp.status == 200
    return server


async def test_a_member_with_the_ca_joins_over_https_and_one_without_stops_clearly(
        start_server: StartServer, tls_files: TLSFiles) -> None:
    server = await _tls_server(start_server, tls_files, 4)
    async with GroupMember(server.url, "g", ["orders"], ca_file=tls_files.ca_cert,
                           **FAST) as member:
        assert member.assignment == {("orders", i) for i in range(4)}
        await member.commit({("orders", 1): 42})
        assert await member.fetch() == {("orders", 1): 42}
        # Without the CA (system trust store): the certificate does not verify.
        stranger = GroupMember(server.url, "g", ["orders"], **FAST)
        with pytest.raises(TLSVerificationError, match="could not be verified") as failed:
            await asyncio.wait_for(stranger.__aenter__(), 10)
        assert "ca_file" in str(failed.value) and server.url in str(failed.value)
        assert stranger.failure is failed.value
        # It never joined: the group still has the one member, untouched.
        assert member.assignment == {("orders", i) for i in range(4)}
    assert server.terminate() == 0


async def test_another_ca_or_a_context_made_by_the_caller(start_server: StartServer,
                                                          tls_files: TLSFiles,
                                                          tmp_path: Path) -> None:
    server = await _tls_server(start_server, tls_files, 2)
    (tmp_path / "other").mkdir()
    other = make_tls_files(tmp_path / "other")
    request = HeartbeatRequest("g", "nobody", 1)
    wrong = AiohttpTransport(server.url, ca_file=other.ca_cert)
    try:
        with pytest.raises(TLSVerificationError):
            await wrong.call("heartbeat", request)
    finally:
        await wrong.aclose()
    right = AiohttpTransport(server.url, ssl_context=client_ssl_context(tls_files.ca_cert))
    try:
        answer = await right.call("heartbeat", request)
        assert isinstance(answer, HeartbeatResponse)
        assert answer.error is not None and answer.error.value == "UNKNOWN_MEMBER_ID"
    finally:
        await right.aclose()
    assert server.terminate() == 0


def test_the_blocking_member_takes_ca_file(start_server: StartServer,
                                           tls_files: TLSFiles) -> None:
    server = asyncio.run(_tls_server(start_server, tls_files, 3))
    with BlockingGroupMember(server.url, "g", ["orders"], ca_file=str(tls_files.ca_cert),
                             **FAST) as member:
        assert member.assignment == {("orders", i) for i in range(3)}
        member.commit({("orders", 2): "x"})
        assert member.fetch() == {("orders", 2): "x"}
    assert server.terminate() == 0


def test_bad_tls_settings_are_refused_at_construction(tmp_path: Path,
                                                      tls_files: TLSFiles) -> None:
    with pytest.raises(ValueError, match=r"missing\.pem"):
        GroupMember("https://127.0.0.1:1", "g", ["s"], ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="https://"):
        AiohttpTransport("http://127.0.0.1:1", ca_file=tls_files.ca_cert)
    with pytest.raises(ValueError, match="not both"):
        AiohttpTransport("https://127.0.0.1:1", ca_file=tls_files.ca_cert,
                         ssl_context=client_ssl_context(tls_files.ca_cert))
    transport = AiohttpTransport("https://127.0.0.1:1")
    with pytest.raises(ValueError, match="transport"):
        GroupMember(transport, "g", ["s"], ca_file=tls_files.ca_cert)
