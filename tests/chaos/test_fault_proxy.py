"""The chaos harness's TCP fault proxy, against a real echo server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from proxy import FaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with FaultProxy("127.0.0.1", port, seed=1) as p:
        yield p
    server.close()
    await server.wait_closed()


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     payload: bytes, timeout: float = 2.0) -> bytes:
    writer.write(payload)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)


async def test_forwards_both_ways_and_counts_bytes(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"hello") == b"hello"
    big = bytes(range(256)) * 2000  # several chunks, order must be kept
    assert await _roundtrip(reader, writer, big) == big
    writer.close()
    assert proxy.stats.accepted == 1
    assert proxy.stats.bytes_up == proxy.stats.bytes_down == 5 + len(big)


async def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    await _roundtrip(reader, writer, b"warm")
    proxy.set_latency(150)
    start = time.monotonic()
    assert await _roundtrip(reader, writer, b"slow") == b"slow"
    assert time.monotonic() - start >= 0.29  # 150 ms up + 150 ms down
    proxy.set_latency(0)
    start = time.monotonic()
    await _roundtrip(reader, writer, b"fast")
    assert time.monotonic() - start < 0.25
    writer.close()
    with pytest.raises(ValueError):
        proxy.set_latency(-1)


async def test_refused_connections_are_reset_at_once(proxy: FaultProxy) -> None:
    proxy.refuse_new(True)
    reader, writer = await _connect(proxy)
    writer.write(b"x")
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(reader, writer, b"x", timeout=1.0)
    assert proxy.stats.refused == 1 and proxy.stats.accepted == 0
    proxy.refuse_new(False)
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"ok") == b"ok"
    writer.close()


async def test_cut_all_resets_open_connections(proxy: FaultProxy) -> None:
    conns = [await _connect(proxy) for _ in range(3)]
    for reader, writer in conns:
        await _roundtrip(reader, writer, b"up")
    assert proxy.cut_all() == 3
    for reader, writer in conns:
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(reader, writer, b"gone", timeout=1.0)
    assert proxy.stats.cut == 3
    # New connections still work.
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"new") == b"new"
    writer.close()


async def test_partition_stalls_then_delivers_late(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    await _roundtrip(reader, writer, b"before")
    proxy.partition(0.4)
    assert proxy.partitioned
    start = time.monotonic()
    # Both an open connection and a new one stall until the partition heals.
    new_conn = asyncio.create_task(_connect(proxy))
    assert await _roundtrip(reader, writer, b"during") == b"during"
    assert time.monotonic() - start >= 0.35
    assert not proxy.partitioned
    r2, w2 = await new_conn
    assert await _roundtrip(r2, w2, b"late") == b"late"
    writer.close()
    w2.close()


async def test_partition_with_cut_resets_connections_when_it_heals(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    await _roundtrip(reader, writer, b"before")
    proxy.partition(0.2, cut=True)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(reader, writer, b"during", timeout=2.0)
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"after") == b"after"
    writer.close()


async def test_upstream_down_resets_the_client_and_counts_it() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with FaultProxy("127.0.0.1", port) as p:
        reader, writer = await _connect(p)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(reader, writer, b"x", timeout=1.0)
        assert p.stats.upstream_failures == 1


async def test_http_through_the_proxy_and_a_timeout_in_a_partition() -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with FaultProxy("127.0.0.1", port) as p, aiohttp.ClientSession() as s:
            async with s.get(p.url) as resp:
                assert await resp.text() == "hi"
            p.partition(5)
            with pytest.raises(asyncio.TimeoutError):
                async with s.get(p.url, timeout=aiohttp.ClientTimeout(total=0.3)):
                    pass
            p.heal()
            async with s.get(p.url) as resp:
                assert await resp.text() == "hi"
    finally:
        await runner.cleanup()
