"""Log injection through ids, against the real server.

A group id or client id holding a newline used to write a forged ``CRITICAL``
line into the server's log; CR, ANSI escapes and bidi controls passed too.
Now every id and name field refuses control and format characters with a 400
``INVALID_REQUEST`` naming the field, and ids that are logged are quoted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from server_harness import StartServer, wait_until

from protocol import codec
from protocol.messages import JoinRequest

MSGPACK = {"Content-Type": codec.CONTENT_TYPE}
FORGED = "2026-01-01 00:00:00,000 CRITICAL groupcoord.runtime: forged line"


def _join(group_id: str, **changes: Any) -> dict[str, Any]:
    wire = JoinRequest(group_id, "", "resources", (("range", b"m"),), 200, 1_000,
                       client_id="cli").to_wire()
    wire.update(changes)
    return wire


async def _post(url: str, api: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, \
            session.post(f"{url}/v1/{api}", data=codec.encode(body), headers=MSGPACK) as resp:
        return resp.status, codec.decode(await resp.read())


async def test_ids_with_line_breaks_or_escapes_are_refused_and_never_logged(
        start_server: StartServer, tmp_path: Path) -> None:
    server = start_server(tmp_path / "inject.db")
    cases = [
        (_join(f"g\n{FORGED}"), "group_id"),
        (_join(f"g\r{FORGED}"), "group_id"),
        (_join("g", client_id=f"c\n{FORGED}"), "client_id"),
        (_join("g", group_instance_id="\x1b[2Ji"), "group_instance_id"),
        (_join("g\u202eevil"), "group_id"),
    ]
    for body, field in cases:
        status, answer = await _post(server.url, "join", body)
        assert status == 400, (field, answer)
        assert answer["error"] == "INVALID_REQUEST"
        assert answer["message"].startswith(f"{field}: must not contain control")
    # A valid id with a quote and a space is served, and logged quoted: a
    # static member joins, its group is created and then expires.
    group = "team 'a' \u00a0orders"
    status, answer = await _post(server.url, "join", _join(group, group_instance_id="i1"))
    assert status == 200 and answer["error"] is None, answer
    assert wait_until(lambda: "member" in server.stderr and "expired" in server.stderr,
                      timeout_s=10)
    await asyncio.sleep(0)
    assert server.terminate() == 0
    assert "forged line" not in server.stderr
    assert not any("CRITICAL" in line for line in server.stderr_lines)
    assert f"group {group!r}: member " in server.stderr
    assert f"group {group!r}: (new) -> Empty" in server.stderr
