"""BlockingGroupMember against the real server: the caller's thread blocks,
callbacks run on the member thread, close revokes and leaves."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from client import BlockingGroupMember, RebalanceListener, Resource

pytestmark = pytest.mark.timeout(60)


def test_blocking_member_commits_fetches_and_closes(start_server: Any, tmp_path: Path) -> None:
    server = start_server(tmp_path / "g.db")
    req = urllib.request.Request(f"{server.admin_url}/v1/resources/s", method="PUT",
                                 data=json.dumps({"partitions": 3}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()
    calls: list[tuple[str, frozenset[Resource], str]] = []
    errors: list[BaseException] = []
    holder: list[BlockingGroupMember] = []

    class Recorder(RebalanceListener):
        def on_assigned(self, resources: set[Resource]) -> None:
            calls.append(("assigned", frozenset(resources), threading.current_thread().name))
            try:  # blocking methods from a callback would deadlock: refused
                holder[0].commit({})
            except RuntimeError as exc:
                errors.append(exc)

        def on_revoked(self, resources: set[Resource]) -> None:
            calls.append(("revoked", frozenset(resources), threading.current_thread().name))

    member = BlockingGroupMember(server.url, "g", ["s"], listener=Recorder(),
                                 session_timeout_ms=1_000, heartbeat_interval_ms=200)
    holder.append(member)
    with member:
        everything = frozenset(("s", i) for i in range(3))
        assert member.assignment == everything
        member.commit({("s", 0): 5})
        assert member.fetch() == {("s", 0): 5}
    assert calls[0][:2] == ("assigned", everything)
    assert calls[-1][:2] == ("revoked", everything)
    assert all(name == "groupcoord-member" for _, _, name in calls)  # the member thread
    assert len(errors) == 1 and "listener callback" in str(errors[0])
    with urllib.request.urlopen(f"{server.admin_url}/v1/groups/g", timeout=5) as resp:
        assert json.loads(resp.read())["members"] == []  # it left
    assert server.terminate() == 0
