"""The simulated network between each member and the coordinator.

Every call travels on its own connection (:class:`Conn`, as the client's
HTTP pool opens one per concurrent call): the request one way, the answer
(or an error) the other way, and -- when the member gives up on the call --
the close, which reaches the coordinator after the request (TCP order), so a
request the member timed out on may still be applied, and a parked one is
then cancelled (``Cancelled``), as with the real runtime.

Each member has a :class:`Link` with its latency distribution and its
faults: extra latency for a while, a drop probability (a message is lost: the
caller's timeout ends the call), resets (the call fails at once at the member,
the coordinator sees the close), and partitions that heal, either *cut*
(connections are refused: calls fail after a round trip) or *blackholed*
(nothing arrives, nothing is answered).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from client.errors import CoordinatorUnavailableError

if TYPE_CHECKING:
    from sim.events import Sim
    from sim.member import SimMember
    from sim.server import SimCoordinator

__all__ = ["Conn", "Link", "Network"]


class Conn:
    __slots__ = ("api", "arrive_at", "closed", "id", "member", "request", "rid", "sent_global")

    def __init__(self, cid: int, member: SimMember, api: str, request: Any, now: int) -> None:
        self.id = cid
        self.member = member
        self.api = api
        self.request = request
        #: the coordinator's request id once applied there.
        self.rid: int | None = None
        #: when the request reaches the coordinator (None: lost on the way).
        self.arrive_at: int | None = None
        #: the member gave up on it (timeout, interrupt, reset, crash).
        self.closed = False
        self.sent_global = now


class Link:
    """One member's network: a latency distribution and the faults on it."""

    __slots__ = ("base_ms", "blackhole", "drop", "extra_ms", "extra_until", "jitter_ms",
                 "partition_until", "tail", "tail_ms")

    def __init__(self, base_ms: int, jitter_ms: int, tail: float, tail_ms: int) -> None:
        self.base_ms = base_ms
        self.jitter_ms = jitter_ms
        #: probability of a slow message, and how slow (uniform up to tail_ms).
        self.tail = tail
        self.tail_ms = tail_ms
        self.drop = 0.0
        self.extra_ms = 0
        self.extra_until = -1
        self.partition_until = -1
        self.blackhole = False

    def latency(self, rng: random.Random, now: int) -> int:
        ms = self.base_ms + (rng.randint(0, self.jitter_ms) if self.jitter_ms else 0)
        if self.tail and rng.random() < self.tail:
            ms += rng.randint(0, self.tail_ms)
        if now < self.extra_until:
            ms += self.extra_ms
        return max(1, ms)

    def partitioned(self, now: int) -> bool:
        return now < self.partition_until

    def heal(self) -> None:
        self.drop = 0.0
        self.extra_until = -1
        self.partition_until = -1


class Network:
    def __init__(self, sim: Sim, rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.server: SimCoordinator | None = None
        self._ids = 0
        self.messages = 0

    def open(self, member: SimMember, api: str, request: Any) -> Conn:
        self._ids += 1
        conn = Conn(self._ids, member, api, request, self.sim.now)
        self._send_request(conn)
        return conn

    # ------------------------------------------------------------ member -> coordinator

    def _send_request(self, conn: Conn) -> None:
        sim, link = self.sim, conn.member.link
        self.messages += 1
        now = sim.now
        if link.partitioned(now):
            if not link.blackhole:
                # Cut: the connection is refused; the caller learns it after a round trip.
                sim.after(2 * link.latency(self.rng, now), self._fail,
                          (conn, "connection refused (partition)"))
            return
        if link.drop and self.rng.random() < link.drop:
            return  # lost: the member's timeout ends the call
        conn.arrive_at = now + link.latency(self.rng, now)
        assert self.server is not None
        sim.at(conn.arrive_at, self.server.on_request, conn)

    def close(self, conn: Conn) -> None:
        """The member closed the connection (gave up, or its process died)."""
        if conn.closed:
            return
        conn.closed = True
        link, now = conn.member.link, self.sim.now
        if conn.arrive_at is None or link.partitioned(now):
            return  # nothing reached the coordinator, or the FIN is lost too
        assert self.server is not None
        when = max(now + link.latency(self.rng, now), conn.arrive_at)
        self.sim.at(when, self.server.on_close, conn)

    # ------------------------------------------------------------ coordinator -> member

    def answer(self, conn: Conn, response: Any) -> None:
        link, now = conn.member.link, self.sim.now
        self.messages += 1
        if link.partitioned(now) or (link.drop and self.rng.random() < link.drop):
            return  # lost: the member's timeout ends the call
        self.sim.after(link.latency(self.rng, now), conn.member.on_answer, (conn, response))

    def reset(self, conn: Conn, why: str) -> None:
        """The connection broke (coordinator crash, a reset on the way)."""
        link, now = conn.member.link, self.sim.now
        if link.partitioned(now) and link.blackhole:
            return
        self.sim.after(link.latency(self.rng, now), self._fail, (conn, why))

    def _fail(self, arg: tuple[Conn, str]) -> None:
        conn, why = arg
        conn.member.on_answer((conn, CoordinatorUnavailableError(f"{conn.api}: {why}")))
