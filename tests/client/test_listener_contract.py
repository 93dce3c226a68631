"""``on_assigned`` after every completed rebalance, also with an empty set (Kafka's
``ConsumerRebalanceListener`` contract; docs/client.md, "Listener semantics"),
with real members against a real ``groupcoord serve``."""

from __future__ import annotations

import asyncio

import pytest
from client_harness import admin_put_resource
from server_harness import StartServer

from client import GroupMember, RebalanceListener
from client.listener import Resource

pytestmark = pytest.mark.timeout(120)


class Calls(RebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, set[Resource]]] = []

    def on_assigned(self, resources: set[Resource]) -> None:
        self.calls.append(("assigned", resources))

    def on_revoked(self, resources: set[Resource]) -> None:
        self.calls.append(("revoked", resources))

    def on_lost(self, resources: set[Resource]) -> None:
        self.calls.append(("lost", resources))


async def test_on_assigned_follows_every_rebalance_even_when_nothing_is_new(
        start_server: StartServer) -> None:
    server = start_server()
    admin_put_resource(server.admin_url, "shards", 4)
    first_calls, second_calls = Calls(), Calls()

    def member(name: str, listener: Calls) -> GroupMember:
        return GroupMember(server.url, "g", ["shards"], assignors=["cooperative-sticky"],
                           client_id=name, listener=listener, session_timeout_ms=6_000)

    async with member("first", first_calls) as first:
        assert first_calls.calls == [("assigned", {("shards", i) for i in range(4)})]
        async with member("second", second_calls) as second:
            # Its first rebalance gives it nothing yet (the first member still owns
            # everything and hands two over in a follow-up): on_assigned(set()),
            # which is what `async with` waited for.
            assert second_calls.calls[0] == ("assigned", set())
            while len(second.assignment) != 2 or first.generation_id != second.generation_id:
                await asyncio.sleep(0.05)
            moved = set(second.assignment)
            await asyncio.sleep(0.2)
            # The first member revoked what moved and was then told "rebalance done",
            # with nothing new for it (and so after the follow-up rebalance too).
            revoked = first_calls.calls.index(("revoked", moved))
            after = first_calls.calls[revoked + 1:]
            assert after and all(call == ("assigned", set()) for call in after), \
                first_calls.calls
