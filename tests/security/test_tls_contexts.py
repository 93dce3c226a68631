"""TLS: the server and client contexts, with a certificate generated during the test."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web
from tls_certs import TLSFiles, make_tls_files

from client.tls import client_ssl_context
from coordinator.tls import TLSConfigError, server_ssl_context
from protocol import codec


async def _ping(request: web.Request) -> web.Response:
    return web.Response(body=codec.encode({"error": None}), content_type=codec.CONTENT_TYPE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def tls_server(tls_files: TLSFiles) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/heartbeat", _ping)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port,
                       ssl_context=server_ssl_context(tls_files.server_cert,
                                                      tls_files.server_key))
    await site.start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_client_trusting_the_ca_talks_to_the_tls_server(tls_server: str,
                                                              tls_files: TLSFiles) -> None:
    ctx = client_ssl_context(tls_files.ca_cert)
    async with aiohttp.ClientSession() as session, session.post(
            f"{tls_server}/v1/heartbeat", data=codec.encode({}), ssl=ctx) as resp:
        assert resp.status == 200
        assert codec.decode(await resp.read()) == {"error": None}


async def test_client_without_the_ca_refuses_the_server(tls_server: str) -> None:
    # The system trust store does not know the test CA: verification must fail.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(f"{tls_server}/v1/heartbeat", data=b"",
                               ssl=client_ssl_context())


async def test_client_trusting_another_ca_refuses_the_server(tls_server: str,
                                                             tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = make_tls_files(tmp_path / "other")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(f"{tls_server}/v1/heartbeat", data=b"",
                               ssl=client_ssl_context(other.ca_cert))


async def test_host_name_is_checked(tls_files: TLSFiles, tmp_path: Path) -> None:
    # A certificate for another host, signed by the trusted CA, is still refused.
    ca = trustme.CA()
    wrong = ca.issue_cert("example.invalid")
    ca.cert_pem.write_to_path(str(tmp_path / "ca2.pem"))
    wrong.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "wrong.pem"))
    app = web.Application()
    app.router.add_post("/v1/heartbeat", _ping)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port,
                       ssl_context=server_ssl_context(tmp_path / "wrong.pem"))
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.post(f"https://127.0.0.1:{port}/v1/heartbeat", data=b"",
                                   ssl=client_ssl_context(tmp_path / "ca2.pem"))
    finally:
        await runner.cleanup()


async def test_plain_http_to_the_tls_port_gets_no_answer(tls_server: str) -> None:
    url = tls_server.replace("https://", "http://")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.post(f"{url}/v1/heartbeat", data=b"") as resp:
                # aiohttp may answer 400 to a plaintext request on a TLS port;
                # it must never be served as a protocol call.
                assert resp.status == 400
                raise aiohttp.ClientError("plaintext refused")


def test_server_context_refuses_old_protocols(tls_files: TLSFiles) -> None:
    ctx = server_ssl_context(tls_files.server_cert, tls_files.server_key)
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert client_ssl_context(tls_files.ca_cert).verify_mode == ssl.CERT_REQUIRED
    assert client_ssl_context(tls_files.ca_cert).check_hostname


def test_bad_server_files_are_named(tls_files: TLSFiles, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match=r"missing\.pem"):
        server_ssl_context(tmp_path / "missing.pem", tls_files.server_key)
    with pytest.raises(TLSConfigError, match=r"nokey\.key"):
        server_ssl_context(tls_files.server_cert, tmp_path / "nokey.key")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TLSConfigError, match=r"garbage\.pem"):
        server_ssl_context(garbage, tls_files.server_key)
    # A key that does not belong to the certificate.
    (tmp_path / "other").mkdir()
    other = make_tls_files(tmp_path / "other")
    with pytest.raises(TLSConfigError, match="cannot load"):
        server_ssl_context(tls_files.server_cert, other.server_key)


def test_bad_ca_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing-ca\.pem"):
        client_ssl_context(tmp_path / "missing-ca.pem")
    garbage = tmp_path / "garbage-ca.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    with pytest.raises(ValueError, match=r"garbage-ca\.pem"):
        client_ssl_context(garbage)
