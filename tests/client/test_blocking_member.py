"""BlockingGroupMember against the real server: the caller's thread blocks,
callbacks run on the member thread, close revokes and leaves."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from client_harness import admin_put_resource

from client import BlockingGroupMember, RebalanceListener, Resource

pytestmark = pytest.mark.timeout(60)


def closed_with_its_final_commits(server: Any, member: BlockingGroupMember) -> None:
    """``member`` (of group g, on s with two partitions) closed: it left, and
    the final commits of its on_revoked are stored; stops the server."""
    assert member.member.state.value == "closed"
    with urllib.request.urlopen(f"{server.admin_url}/v1/groups/g", timeout=5) as resp:
        assert json.loads(resp.read())["members"] == []  # it left
    with BlockingGroupMember(server.url, "g", ["s"], session_timeout_ms=6_000) as successor:
        assert successor.fetch() == {("s", 0): "final", ("s", 1): "final"}
    assert server.terminate() == 0


def test_blocking_member_commits_fetches_and_closes(start_server: Any, tmp_path: Path) -> None:
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 3)
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


def test_ctrl_c_while_closing_still_lets_on_revoked_make_its_final_commit(
        start_server: Any, tmp_path: Path) -> None:
    # A blocking worker closes (leaving its `with` block on a first Ctrl-C, say)
    # and is interrupted again while on_revoked runs: the close used to stop
    # the member thread at once, the final commit and the leave never sent.
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 2)
    revoking = threading.Event()
    interrupted = threading.Event()
    holder: list[BlockingGroupMember] = []

    class SlowRevoke(RebalanceListener):
        async def on_revoked(self, resources: set[Resource]) -> None:
            revoking.set()
            # Still running when the Ctrl-C comes, however loaded the machine
            # (a fixed sleep here once ended before the interrupt was sent).
            for _ in range(200):
                if interrupted.is_set():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the main thread takes the interrupt meanwhile
            await holder[0].member.commit({r: "final" for r in resources})

    def interrupt_while_revoking() -> None:
        if revoking.wait(20):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            interrupted.set()

    member = BlockingGroupMember(server.url, "g", ["s"], listener=SlowRevoke(),
                                 session_timeout_ms=6_000)
    holder.append(member)
    member.start()
    interrupter = threading.Thread(target=interrupt_while_revoking, daemon=True)
    # Ctrl-C as Python delivers it by default, whatever an earlier test of this
    # process left installed (the whole suite in one worker once had it fail).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            member.close()  # raises the interrupt once the close is done
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupter.join(5)
    closed_with_its_final_commits(server, member)


@pytest.mark.parametrize("lands", ["before", "after"])
def test_ctrl_c_landing_as_the_close_is_scheduled_still_closes(
        start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lands: str) -> None:
    # The Ctrl-C lands while close() is still handing the close to the member
    # thread (before it is scheduled, or after, before close() holds its
    # future): on a loaded machine on_revoked can already be running by then.
    # It once propagated at once: no final commit waited for, the member thread
    # left running in the group.
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", 2)
    holder: list[BlockingGroupMember] = []

    class FinalCommit(RebalanceListener):
        async def on_revoked(self, resources: set[Resource]) -> None:
            await asyncio.sleep(0.2)
            await holder[0].member.commit({r: "final" for r in resources})

    member = BlockingGroupMember(server.url, "g", ["s"], listener=FinalCommit(),
                                 session_timeout_ms=6_000)
    holder.append(member)
    member.start()
    schedule = asyncio.run_coroutine_threadsafe
    interrupts = [KeyboardInterrupt()]

    def interrupted_scheduling(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        if interrupts and lands == "before":
            coro.close()  # never scheduled
            raise interrupts.pop()
        future = schedule(coro, loop)
        if interrupts:
            raise interrupts.pop()
        return future

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", interrupted_scheduling)
    with pytest.raises(KeyboardInterrupt):
        member.close()  # raises the interrupt once the close is done
    monkeypatch.undo()
    closed_with_its_final_commits(server, member)
