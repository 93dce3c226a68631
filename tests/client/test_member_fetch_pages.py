"""``GroupMember.fetch`` reads a group bigger than one fetch answer.

The coordinator answers at most ``MAX_FETCH_CHECKPOINTS`` checkpoints per fetch
(docs/protocol.md, "Additions of this release"); the client follows ``next`` for a
whole-group fetch and
asks for a long list of resources in slices. Against the real server.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
from server_harness import StartServer

from client import GroupMember
from protocol import codec
from protocol.limits import MAX_FETCH_CHECKPOINTS


async def test_fetch_follows_pages_and_slices_long_lists(start_server: StartServer,
                                                         tmp_path: Path) -> None:
    server = start_server(tmp_path / "pages.db")
    total = 2 * MAX_FETCH_CHECKPOINTS + 345
    commit = {"group_id": "big", "member_id": "tool", "generation_id": -1,
              "checkpoints": [[f"s{i % 2}", i, i] for i in range(total)]}
    async with aiohttp.ClientSession() as session, session.post(
            f"{server.url}/v1/commit", data=codec.encode(commit),
            headers={"Content-Type": codec.CONTENT_TYPE}) as resp:
        assert resp.status == 200 and codec.decode(await resp.read())["error"] is None
    member = GroupMember(server.url, "big", ["s0", "s1"])
    try:
        everything = await member.fetch()
        assert everything == {(f"s{i % 2}", i): i for i in range(total)}
        wanted = [(f"s{i % 2}", i) for i in range(0, total + 10, 2)]  # some absent
        some = await member.fetch(wanted)
        assert some == {(s, i): i for s, i in wanted if i < total}
        assert await member.fetch([]) == {}
    finally:
        await member.close()
    assert server.terminate() == 0
