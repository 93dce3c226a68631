"""A bare aiohttp msgpack endpoint: the ceiling the heartbeat benchmark compares with.

``POST /v1/heartbeat`` decodes the msgpack body and answers a heartbeat-shaped
msgpack map, with nothing else in between: no validation, no state, no
metrics. Same loop (uvloop when installed) and same server settings as
``groupcoord serve``. Prints ``listening on http://HOST:PORT`` when ready.

    python benchmarks/server_echo.py [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio

import msgpack
from aiohttp import web


async def heartbeat(request: web.Request) -> web.Response:
    body = msgpack.unpackb(await request.read(), raw=False)
    answer = {"error": None, "resources_epoch": 0 if body.get("group_id") else 1}
    return web.Response(body=msgpack.packb(answer, use_bin_type=True),
                        content_type="application/msgpack")


async def main(host: str, port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/heartbeat", heartbeat)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"listening on http://{host}:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.run(main(args.host, args.port))
    except ImportError:
        asyncio.run(main(args.host, args.port))
