"""Several coordinators, the member's side, in virtual time.

The real member (driver, machine, :class:`~client.transport.CoordinatorRouter`)
and the real coordinator runtime and core; between them a fake cluster of
coordinator URLs, each of which serves (forwards to the one runtime, so the
group is resumed "at its generation with its assignments", as a takeover
does), redirects (``NOT_COORDINATOR``), loads, refuses connections (killed)
or never answers (paused), and answers ``find_coordinator`` with the owner
the test names. The same scenarios over real HTTP are in
test_member_routing_http.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from client_harness import (
    InProcessCoordinator,
    InProcessTransport,
    Ledger,
    LedgerListener,
    MemoryStore,
)
from virtual_time import LoopClock, loop_ms, run_virtual

from client.errors import CoordinatorUnavailableError, NotCoordinatorError
from client.member import GroupMember
from client.member_state import ERROR_ACTIONS, ErrorAction
from client.transport import CoordinatorRouter
from coordinator.core import CoreConfig, GroupCoordinator
from coordinator.runtime.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.messages import Api, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse

pytestmark = pytest.mark.timeout(60)

A, B, C = "http://a:9080", "http://b:9080", "http://c:9080"
SESSION_MS = 3_000  # lease 3000 ms, heartbeat interval 1000 ms, reply allowance 500 ms
RTT_MS = 4
SHARDS = 12


class Cluster:
    """Coordinator URLs in front of one in-process coordinator.

    ``modes[url]``: ``serve``, ``redirect`` (NOT_COORDINATOR naming ``owner``
    when ``hints``), ``loading`` (COORDINATOR_LOAD_IN_PROGRESS), ``down``
    (connection refused; a call in flight is reset), ``silent`` (never
    answers; a call in flight is never answered). ``find_coordinator`` is
    answered by any URL that is not down or silent: ``owner``, or
    COORDINATOR_NOT_AVAILABLE while it is None."""

    def __init__(self, coordinator: InProcessCoordinator) -> None:
        self.inner = InProcessTransport(coordinator)
        self.modes: dict[str, str] = {}
        self.owner: str | None = None
        self.hints = True
        self.calls: list[tuple[float, str, str]] = []

    def connect(self, url: str) -> Node:
        return Node(self, url)

    def move(self, owner: str | None, **modes: str) -> None:
        self.owner = owner
        self.modes.update({_url(k): v for k, v in modes.items()})

    def count(self, url: str, api: str, since: float = 0.0) -> int:
        return sum(1 for t, u, a in self.calls if u == url and a == api and t >= since)


def _url(name: str) -> str:
    return {"a": A, "b": B, "c": C}[name]


class Node:
    def __init__(self, cluster: Cluster, url: str) -> None:
        self.cluster = cluster
        self.url = url

    async def _gate(self, api: str) -> None:
        mode = self.cluster.modes.get(self.url, "down")
        if mode == "down":
            raise CoordinatorUnavailableError(
                f"{api}: ClientConnectorError: Cannot connect to host {self.url}")
        if mode == "silent":
            await asyncio.get_running_loop().create_future()

    async def call(self, api: str, request: Any) -> Any:
        self.cluster.calls.append((asyncio.get_running_loop().time(), self.url, api))
        await asyncio.sleep(RTT_MS / 2000)
        await self._gate(api)
        cluster = self.cluster
        if api == Api.FIND_COORDINATOR:
            response: Any = (FindCoordinatorResponse(None, cluster.owner, 7) if cluster.owner
                             else FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        else:
            mode = cluster.modes[self.url]
            if mode == "redirect":
                hint = (cluster.owner or "") if cluster.hints else ""
                raise NotCoordinatorError(f"{api}: NOT_COORDINATOR at {self.url}",
                                          ErrorCode.NOT_COORDINATOR, hint)
            if mode == "loading":
                raise NotCoordinatorError(f"{api}: COORDINATOR_LOAD_IN_PROGRESS at {self.url}",
                                          ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            response = await cluster.inner.call(api, request)
        await self._gate(api)  # killed or paused while the call was in flight
        await asyncio.sleep(RTT_MS / 2000)
        return response


class World:
    def __init__(self, runtime: Runtime, cluster: Cluster, member: GroupMember,
                 ledger: Ledger) -> None:
        self.runtime = runtime
        self.cluster = cluster
        self.member = member
        self.ledger = ledger

    def generation(self) -> int:
        view = self.runtime.core.describe_group("g")
        assert view is not None
        return view.generation_id

    def lost(self) -> int:
        return self.ledger.count("w1", "lost")

    def assigned(self) -> int:
        return self.ledger.count("w1", "assigned")


async def _start_world(bootstrap: list[str], owner: str, modes: dict[str, str],
                       listener: LedgerListener | None = None) -> World:
    """The coordinator, the cluster in front of it, and member w1 started
    (``listener``: its listener, on a ledger of its own)."""
    runtime = Runtime(GroupCoordinator(CoreConfig(min_session_timeout_ms=100,
                                                  initial_rebalance_delay_ms=0)),
                      MemoryStore(), LoopClock())
    await runtime.start()
    coordinator = InProcessCoordinator(runtime)
    await coordinator.put_resource("shards", SHARDS)
    cluster = Cluster(coordinator)
    cluster.move(owner, **modes)
    listener = listener or Ledger().listener("w1")
    router = CoordinatorRouter(bootstrap, "g", cluster.connect, find_timeout_ms=500, name="w1")
    member = GroupMember(router, "g", ["shards"], listener=listener,
                         client_id="w1", session_timeout_ms=SESSION_MS, clock=loop_ms)
    assert member.config.heartbeat_interval_ms == 1_000
    assert member.config.timing.reply_ms == 500
    member.start()
    return World(runtime, cluster, member, listener.ledger)


async def _world(bootstrap: list[str], owner: str, **modes: str) -> World:
    """``_start_world``, once w1 owns every resource."""
    w = await _start_world(bootstrap, owner, modes)
    await w.member.wait_assigned(30)
    await asyncio.sleep(1)
    assert len(w.member.assignment) == SHARDS
    return w


async def _stop(world: World) -> None:
    await world.member.close()
    await world.runtime.stop()


def _keeps_everything(world: World, generation: int) -> None:
    assert world.lost() == 0, world.ledger.events
    assert world.assigned() == 1, world.ledger.events  # no rebalance delivered anything new
    assert world.generation() == generation
    assert len(world.member.assignment) == SHARDS


def test_a_member_finds_its_coordinator_through_the_list_and_follows_not_coordinator(
        caplog: pytest.LogCaptureFixture) -> None:
    """Joins at the owner find_coordinator names (not at the first URL), then
    the group moves: the old owner answers NOT_COORDINATOR naming the new one;
    the member heartbeats there and keeps its resources: no on_lost, no
    rebalance, the same generation."""

    async def main() -> None:
        w = await _world([A, B], owner=B, a="redirect", b="serve")
        assert w.member.coordinator_url == B
        assert w.cluster.count(A, "join") == 0  # went where find_coordinator said
        generation = w.generation()
        moved = asyncio.get_running_loop().time()
        w.cluster.move(A, a="serve", b="redirect")
        await asyncio.sleep(4 * SESSION_MS / 1000)
        assert w.member.coordinator_url == A
        assert w.cluster.count(A, "heartbeat", since=moved) >= 8
        assert w.cluster.count(B, "heartbeat", since=moved) == 1  # the one redirected
        _keeps_everything(w, generation)
        await _stop(w)

    with caplog.at_level(logging.INFO, logger="groupcoord.client"):
        run_virtual(main)
    changes = [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]
    assert changes == [
        f"member w1: the coordinator of group 'g' is now {B} "
        f"(find_coordinator at {A})",
        f"member w1: the coordinator of group 'g' is now {A} "
        f"(NOT_COORDINATOR from {B}; was {B})"], changes


def test_a_member_given_one_url_follows_not_coordinator_away_from_it() -> None:
    """One URL in front of several coordinators (a load balancer): the group
    moves, the URL answers NOT_COORDINATOR naming the owner, and the member
    follows it, keeping its resources. (Before v1.1 the member retried the
    same URL until its deadline and lost them.) Over real HTTP for ~4 s of
    real time before the virtual-time loop; the HTTP stand-ins still serve the list cases
    in test_member_routing_http.py."""

    async def main() -> None:
        w = await _world([A], owner=A, a="serve")
        generation = w.generation()
        moved = asyncio.get_running_loop().time()
        w.cluster.move(B, a="redirect", b="serve")
        await asyncio.sleep(SESSION_MS / 1000 + 0.5)
        assert w.cluster.count(B, "heartbeat", since=moved) >= 2
        assert sum(w.cluster.count(u, Api.FIND_COORDINATOR) for u in (A, B)) == 0
        _keeps_everything(w, generation)
        await _stop(w)

    run_virtual(main)


def test_not_coordinator_without_an_owner_sends_the_member_to_find_coordinator() -> None:
    async def main() -> None:
        w = await _world([A, B], owner=A, a="serve", b="redirect")
        generation = w.generation()
        w.cluster.hints = False
        moved = asyncio.get_running_loop().time()
        w.cluster.move(B, a="redirect", b="serve")
        await asyncio.sleep(3 * SESSION_MS / 1000)
        assert w.member.coordinator_url == B
        assert sum(w.cluster.count(u, Api.FIND_COORDINATOR, since=moved) for u in (A, B)) == 1
        _keeps_everything(w, generation)
        await _stop(w)

    run_virtual(main)


def test_a_killed_coordinator_is_found_again_through_the_list_before_the_deadline() -> None:
    """The owner is killed (connections refused); for a second the others
    still name it (its lease has not run out), then the new owner. The member
    keeps everything: it reaches the new owner before its safety deadline."""

    async def main() -> None:
        w = await _world([A, B, C], owner=A, a="serve", b="redirect", c="redirect")
        generation = w.generation()
        deadline = w.member.safety_deadline_ms()
        assert deadline is not None
        w.cluster.move(A, a="down")
        await asyncio.sleep(1.0)
        w.cluster.move(C, b="redirect", c="serve")
        await asyncio.sleep(3 * SESSION_MS / 1000)
        assert w.member.coordinator_url == C
        _keeps_everything(w, generation)
        await _stop(w)

    run_virtual(main)


def test_a_paused_coordinator_is_given_up_when_its_heartbeat_times_out() -> None:
    """The owner accepts connections and answers nothing (SIGSTOP): the
    member's heartbeat times out (its hold plus the reply allowance), the
    router forgets that coordinator, find_coordinator asks the others first,
    and the new owner is reached before the deadline."""

    async def main() -> None:
        w = await _world([A, B], owner=A, a="serve", b="redirect")
        generation = w.generation()
        paused = asyncio.get_running_loop().time()
        w.cluster.move(B, a="silent", b="serve")
        await asyncio.sleep(3 * SESSION_MS / 1000)
        assert w.member.coordinator_url == B
        # found by asking B, not by waiting on the paused A
        assert w.cluster.count(A, Api.FIND_COORDINATOR, since=paused) == 0
        _keeps_everything(w, generation)
        await _stop(w)

    run_virtual(main)


def test_a_coordinator_loading_the_group_is_waited_for_within_the_lease() -> None:
    async def main() -> None:
        w = await _world([A, B], owner=A, a="serve", b="redirect")
        generation = w.generation()
        w.cluster.move(B, a="redirect", b="loading")
        await asyncio.sleep(1.5)
        assert w.member.coordinator_url == B  # the owner, loading: stays with it
        assert len(w.member.assignment) == SHARDS
        w.cluster.move(B, b="serve")
        await asyncio.sleep(3 * SESSION_MS / 1000)
        _keeps_everything(w, generation)
        await _stop(w)

    run_virtual(main)


def test_the_member_loses_its_resources_at_the_deadline_when_no_coordinator_answers() -> None:
    """The owner dies and no other takes the group (find_coordinator:
    COORDINATOR_NOT_AVAILABLE): the member keeps its resources until its
    safety deadline, not a moment longer (on_lost), and joins again once a
    coordinator serves the group."""

    async def main() -> None:
        w = await _world([A, B], owner=A, a="serve", b="redirect")
        w.cluster.move(None, a="down")
        deadline = w.member.safety_deadline_ms()
        assert deadline is not None
        await asyncio.sleep((deadline - loop_ms()) / 1000 - 0.01)
        assert len(w.member.assignment) == SHARDS and w.lost() == 0
        await asyncio.sleep(0.02)
        assert w.member.assignment == frozenset()  # read against the clock
        await asyncio.sleep(0.1)
        assert w.lost() == 1
        assert w.member.coordinator_url is None
        w.cluster.move(B, b="serve")
        await asyncio.sleep(2 * SESSION_MS / 1000)
        assert len(w.member.assignment) == SHARDS
        assert w.member.coordinator_url == B
        await _stop(w)

    run_virtual(main)


def test_redirects_are_followed_a_bounded_number_of_times_per_call() -> None:
    """Two coordinators naming each other (a hand-off seen half-way): the
    call fails after MAX_REDIRECTS follows, retriably; nothing loops."""

    async def main() -> None:
        runtime = Runtime(GroupCoordinator(CoreConfig()), MemoryStore(), LoopClock())
        await runtime.start()
        cluster = Cluster(InProcessCoordinator(runtime))
        nodes = {A: B, B: A}  # find_coordinator says A, and each names the other

        class Pingpong(Node):
            async def call(self, api: str, request: Any) -> Any:
                if api == Api.FIND_COORDINATOR:
                    return FindCoordinatorResponse(None, A)
                self.cluster.calls.append((0.0, self.url, api))
                raise NotCoordinatorError(f"{api}: NOT_COORDINATOR", ErrorCode.NOT_COORDINATOR,
                                          nodes[self.url])

        router = CoordinatorRouter([A, B], "g", lambda url: Pingpong(cluster, url))
        with pytest.raises(NotCoordinatorError):
            await router.call("heartbeat", HeartbeatRequest("g", "m", 1))
        assert len(cluster.calls) == CoordinatorRouter.MAX_REDIRECTS + 1
        await runtime.stop()

    run_virtual(main)


async def _router_over_a_and_b(owner: str, **modes: str) -> tuple[Runtime, Cluster,
                                                                   CoordinatorRouter]:
    """A started runtime, the cluster in front of it (``owner``, ``modes``) and
    a router over A and B (no member)."""
    runtime = Runtime(GroupCoordinator(CoreConfig()), MemoryStore(), LoopClock())
    await runtime.start()
    cluster = Cluster(InProcessCoordinator(runtime))
    cluster.move(owner, **modes)
    return runtime, cluster, CoordinatorRouter([A, B], "g", cluster.connect,
                                               find_timeout_ms=500)


def test_calls_that_need_the_coordinator_together_share_one_find_round() -> None:
    """Three calls sent while the coordinator is unknown: one asks
    find_coordinator (a paused first URL costs it the find timeout), the others
    wait for that round and go where it found, instead of each paying the
    timeout of its own round."""

    async def main() -> None:
        runtime, cluster, router = await _router_over_a_and_b(B, a="silent", b="serve")
        beat = HeartbeatRequest("g", "nobody", 1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        answers = await asyncio.gather(*(router.call("heartbeat", beat) for _ in range(3)))
        assert [a.error for a in answers] == [ErrorCode.UNKNOWN_MEMBER_ID] * 3
        assert cluster.count(A, Api.FIND_COORDINATOR) == 1
        assert cluster.count(B, Api.FIND_COORDINATOR) == 1
        assert loop.time() - start < 0.6  # one find timeout, not one per call
        assert router.current_url == B
        await runtime.stop()

    run_virtual(main)


def test_a_router_refuses_bad_settings_and_names_the_url() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CoordinatorRouter([], "g", lambda url: Node(Cluster.__new__(Cluster), url))
    with pytest.raises(ValueError, match="find_timeout_ms"):
        CoordinatorRouter([A], "g", lambda url: Node(Cluster.__new__(Cluster), url),
                          find_timeout_ms=0)


def test_a_member_given_https_urls_follows_no_server_to_http() -> None:
    """A server naming an http:// coordinator to a member given https:// URLs
    is not followed (the member's token would travel in clear)."""

    class Names:
        def __init__(self, url: str) -> None:
            self.url = url

        async def call(self, api: str, request: Any) -> Any:
            if api == Api.FIND_COORDINATOR:
                return FindCoordinatorResponse(None, "http://plain:9080")
            raise NotCoordinatorError(f"{api}: NOT_COORDINATOR", ErrorCode.NOT_COORDINATOR,
                                      "http://plain:9080")

    async def main() -> None:
        router = CoordinatorRouter(["https://a:9080", "https://b:9080"], "g", Names)
        with pytest.raises(CoordinatorUnavailableError, match="not an https:// URL"):
            await router.call("heartbeat", HeartbeatRequest("g", "m", 1))
        assert router.current_url is None
        one = CoordinatorRouter(["https://a:9080"], "g", Names)
        with pytest.raises(NotCoordinatorError):
            await one.call("heartbeat", HeartbeatRequest("g", "m", 1))
        assert one.current_url is None

    run_virtual(main)


def test_calls_waiting_on_a_coordinator_given_up_fail_when_another_is_found() -> None:
    """A join parked at a coordinator that then stops answering (paused): when
    another call times out there, the router gives that coordinator up, and
    once it finds the next one the parked join fails at once (retriable)
    instead of waiting out its own timeout (a rebalance timeout) at a
    coordinator that no longer serves."""

    async def main() -> None:
        runtime, cluster, router = await _router_over_a_and_b(A, a="serve", b="redirect")
        beat = HeartbeatRequest("g", "nobody", 1)
        assert (await router.call("heartbeat", beat)).error is ErrorCode.UNKNOWN_MEMBER_ID
        assert router.current_url == A
        cluster.move(B, a="silent", b="serve")
        parked = asyncio.ensure_future(router.call("heartbeat", beat))  # never answered
        await asyncio.sleep(5)
        assert not parked.done()
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(router.call("commit", beat), 0.5)
        router.timed_out("commit")
        assert router.current_url is None
        await asyncio.sleep(1)
        assert not parked.done()  # given up, but no other coordinator found yet
        assert (await router.call("heartbeat", beat)).error is ErrorCode.UNKNOWN_MEMBER_ID
        assert router.current_url == B
        found = loop.time()
        with pytest.raises(CoordinatorUnavailableError, match="gave up waiting on"):
            await parked
        assert loop.time() - found < 0.001
        await runtime.stop()

    run_virtual(main)


def test_find_coordinator_answers_without_a_url_or_404_name_the_server_asked() -> None:
    """A v1 server (no find_coordinator: HTTP 404) and a server answering no
    error and no URL both serve the group themselves; COORDINATOR_NOT_AVAILABLE
    fails the call retriably and leaves the coordinator unknown."""
    answers: dict[str, Any] = {}

    class Answers:
        def __init__(self, url: str) -> None:
            self.url = url

        async def call(self, api: str, request: Any) -> Any:
            if api != Api.FIND_COORDINATOR:
                return HeartbeatResponse(None)
            answer = answers[self.url]
            if isinstance(answer, Exception):
                raise answer
            return answer

    async def main() -> None:
        beat = HeartbeatRequest("g", "m", 1)
        answers[A] = CoordinatorUnavailableError("find_coordinator: HTTP 404: no such call",
                                                 http_status=404)
        router = CoordinatorRouter([A, B], "g", Answers)
        assert (await router.call("heartbeat", beat)).error is None
        assert router.current_url == A
        answers[A] = CoordinatorUnavailableError("refused")
        answers[B] = FindCoordinatorResponse(None, "")
        router = CoordinatorRouter([A, B], "g", Answers)
        assert (await router.call("heartbeat", beat)).error is None
        assert router.current_url == B
        answers[B] = FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        router = CoordinatorRouter([A, B], "g", Answers)
        with pytest.raises(CoordinatorUnavailableError, match="COORDINATOR_NOT_AVAILABLE"):
            await router.call("heartbeat", beat)
        assert router.current_url is None

    run_virtual(main)


def test_not_coordinator_reaching_the_machine_is_retried_not_a_loss() -> None:
    """Should a transport hand NOT_COORDINATOR to the machine as a response
    (one without a router), the error table retries the step: the member
    keeps its membership, as for COORDINATOR_NOT_AVAILABLE."""
    assert ERROR_ACTIONS[ErrorCode.NOT_COORDINATOR] is ErrorAction.RETRY
    assert ERROR_ACTIONS[ErrorCode.COORDINATOR_NOT_AVAILABLE] is ErrorAction.RETRY


def test_a_call_timed_out_gives_its_coordinator_up_even_after_other_answers() -> None:
    """A paused coordinator: a member's held heartbeat was sent just before its coordinator
    was paused, and a commit sent later was answered just before the pause. When the
    heartbeat times out the coordinator must still be given up: keeping it because
    it "answered something since" sent the next heartbeat to the paused process and
    cost the member its resources."""

    class Split:
        """A's heartbeats are never answered (paused mid-hold); everything else is."""

        def __init__(self, url: str) -> None:
            self.url = url

        async def call(self, api: str, request: Any) -> Any:
            if api == Api.FIND_COORDINATOR:
                return FindCoordinatorResponse(None, A, 0)
            if api == "heartbeat" and self.url == A:
                await asyncio.get_running_loop().create_future()
            return HeartbeatResponse(None)

    async def main() -> None:
        router = CoordinatorRouter([A, B], "g", Split)
        beat = HeartbeatRequest("g", "m", 1)
        held = asyncio.ensure_future(asyncio.wait_for(router.call("heartbeat", beat), 1.5))
        await asyncio.sleep(0.1)
        assert (await router.call("commit", beat)).error is None   # answered meanwhile
        assert router.current_url == A
        with pytest.raises(TimeoutError):
            await held
        router.timed_out("heartbeat")
        assert router.current_url is None

    run_virtual(main)


class _HoldsAssigned(LedgerListener):
    """``on_assigned`` awaits ``hold_s`` (virtual) seconds, ``started`` set meanwhile."""

    def __init__(self, ledger: Ledger, member: str, hold_s: float) -> None:
        super().__init__(ledger, member)
        self.hold_s = hold_s
        self.started = asyncio.Event()

    async def on_assigned(self, resources: set[tuple[str, int]]) -> None:
        self.started.set()
        await asyncio.sleep(self.hold_s)
        await super().on_assigned(resources)


def test_a_side_heartbeat_timed_out_during_a_callback_gives_its_coordinator_up() -> None:
    """The owner stops answering (SIGSTOP) while ``on_assigned`` awaits for
    three sessions: the side channel's heartbeat times out, the router forgets
    that coordinator, the next heartbeat finds the new owner and renews the
    lease, so the member comes out of the callback owning everything. (Before,
    a side heartbeat's time-out never reached the router: every later one went
    to the paused owner, the lease ran out during the callback and the member
    lost everything.)"""

    async def main() -> None:
        listener = _HoldsAssigned(Ledger(), "w1", hold_s=3 * SESSION_MS / 1000)
        w = await _start_world([A, B], A, {"a": "serve", "b": "redirect"}, listener)
        await asyncio.wait_for(listener.started.wait(), 30)
        w.cluster.move(B, a="silent", b="serve")
        await w.member.wait_assigned(30)
        await asyncio.sleep(1)
        assert w.member.coordinator_url == B
        assert w.lost() == 0, w.ledger.events
        assert len(w.member.assignment) == SHARDS
        await _stop(w)

    run_virtual(main)
