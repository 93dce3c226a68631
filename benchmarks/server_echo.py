"""Bare msgpack endpoints: the floors the heartbeat benchmark compares with.

``POST /v1/heartbeat`` decodes the msgpack body and answers a heartbeat-shaped
msgpack map, with nothing else in between: no validation, no state, no
metrics. Same loop (uvloop when installed) as ``groupcoord serve``. Prints
``listening on http://HOST:PORT`` when ready.

``--kind aiohttp`` (default): an aiohttp app, the same server settings as
``groupcoord serve`` used before its lean path. ``--kind httptools``: a bare
``asyncio.Protocol`` on httptools (keep-alive, Content-Length bodies only),
the floor of any Python HTTP server on this loop, so the difference to
groupcoord is what the coordinator itself costs per call.

    python benchmarks/server_echo.py [--port 0] [--kind aiohttp|httptools]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import httptools
import msgpack
from aiohttp import web


async def heartbeat(request: web.Request) -> web.Response:
    body = msgpack.unpackb(await request.read(), raw=False)
    answer = {"error": None, "resources_epoch": 0 if body.get("group_id") else 1}
    return web.Response(body=msgpack.packb(answer, use_bin_type=True),
                        content_type="application/msgpack")


async def main_aiohttp(host: str, port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/heartbeat", heartbeat)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"listening on http://{host}:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


class Echo(asyncio.Protocol):
    """The least an HTTP/1.1 msgpack endpoint can do per request."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        doc = msgpack.unpackb(b"".join(self.body), raw=False)
        answer = msgpack.packb({"error": None,
                                "resources_epoch": 0 if doc.get("group_id") else 1},
                               use_bin_type=True)
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\n"
                             b"Content-Length: %d\r\n\r\n%b" % (len(answer), answer))


async def main_httptools(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Echo, host, port, backlog=1024)
    print(f"listening on http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kind", choices=("aiohttp", "httptools"), default="aiohttp")
    args = parser.parse_args()
    main = main_aiohttp if args.kind == "aiohttp" else main_httptools
    try:
        import uvloop
        uvloop.run(main(args.host, args.port))
    except ImportError:
        asyncio.run(main(args.host, args.port))
