"""The simulated network between each member and the coordinator.

Every call travels on its own connection (:class:`Conn`, as the client's
HTTP pool opens one per concurrent call): the request one way, the answer
(or an error) the other way, and -- when the member gives up on the call --
the close, which reaches the coordinator after the request (TCP order), so a
request the member timed out on may still be applied, and a parked one is
then cancelled (``Cancelled``), as with the real runtime.

Each member has a :class:`Link`: a latency distribution (base, jitter, a
tail of slow messages) and the faults on it, the ones the chaos harness's
TCP proxy makes (tests/chaos/proxy.py) plus loss:

* extra latency for a while;
* a partition that heals: nothing flows meanwhile; when it heals, what was
  sent is delivered late (TCP's retransmissions after a short partition) or,
  for a *cut* partition, every connection it touched is reset (one that
  outlived TCP's retransmission timeout) -- the member's calls fail, the
  coordinator sees the closes;
* resets: every open call of the member fails at once;
* drops: a message is lost and its connection hangs (a middlebox that lost
  the connection's state without a reset): only the caller's timeout ends it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from client.errors import CoordinatorUnavailableError
from client.routing import RoutedCall

if TYPE_CHECKING:
    from sim.events import Sim
    from sim.member import SimMember
    from sim.server import SimCoordinator

__all__ = ["Conn", "Link", "Network"]


class Conn:
    __slots__ = ("api", "arrive_at", "closed", "finding", "id", "leg", "member", "request",
                 "rid", "routed", "server", "target", "url")

    def __init__(self, cid: int, member: SimMember, api: str, request: Any) -> None:
        self.id = cid
        self.member = member
        self.api = api
        self.request = request
        #: the coordinator's request id once applied there.
        self.rid: int | None = None
        #: when the request reaches the coordinator (None: not on its way).
        self.arrive_at: int | None = None
        #: the member is done with it (answered, gave up, reset, crashed).
        self.closed = False
        # Several coordinators (sim.cluster): the call travels in legs (a
        # find_coordinator, then the call, again after a NOT_COORDINATOR), one
        # at a time, each to ``target``; answers of an older leg are dropped.
        self.leg = 0
        self.target: Any = None
        self.server: Any = None
        self.url = ""
        self.finding = False
        #: the call as the router's :class:`~client.routing.Routing` sees it.
        self.routed: RoutedCall | None = None


class Link:
    """One member's network: a latency distribution and the faults on it."""

    __slots__ = ("base_ms", "cut", "drop", "extra_ms", "extra_until", "held", "jitter_ms",
                 "partition_token", "partitioned", "tail", "tail_ms")

    def __init__(self, base_ms: int, jitter_ms: int, tail: float, tail_ms: int) -> None:
        self.base_ms = base_ms
        self.jitter_ms = jitter_ms
        #: probability of a slow message, and how slow (uniform up to tail_ms).
        self.tail = tail
        self.tail_ms = tail_ms
        self.drop = 0.0
        self.extra_ms = 0
        self.extra_until = -1
        self.partitioned = False
        self.cut = False
        self.partition_token = 0
        #: messages held by a partition: delivered (or reset) when it heals.
        self.held: list[tuple[Callable[[Any], None], Any]] = []

    def latency(self, rng: random.Random, now: int) -> int:
        # int(random() * (n + 1)) is randint(0, n), at a fraction of its cost.
        ms = self.base_ms + (int(rng.random() * (self.jitter_ms + 1)) if self.jitter_ms else 0)
        if self.tail and rng.random() < self.tail:
            ms += int(rng.random() * (self.tail_ms + 1))
        if now < self.extra_until:
            ms += self.extra_ms
        return max(1, ms)


class Network:
    def __init__(self, sim: Sim, rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.server: SimCoordinator | None = None
        #: a cut partition healed: reset every open connection of the link's member.
        self.on_cut: Callable[[Link], None] | None = None
        #: a join or sync (or its answer) was lost on its connection, which hangs.
        self.on_lost_call: Callable[[Conn], None] | None = None
        self._ids = 0

    def _lost(self, conn: Conn) -> bool:
        link = conn.member.link
        if link.drop and self.rng.random() < link.drop:
            self.sim.log(f"LOST {conn.api}")
            if conn.api in ("join", "sync") and not conn.finding \
                    and self.on_lost_call is not None:
                self.on_lost_call(conn)
            return True
        return False

    def _send(self, link: Link, fn: Callable[[Any], None], arg: Any) -> int | None:
        """Deliver ``fn(arg)`` after the link's latency (held while partitioned);
        returns the delivery time if known now."""
        if link.partitioned:
            link.held.append((fn, arg))
            return None
        when = self.sim.now + link.latency(self.rng, self.sim.now)
        self.sim.at(when, fn, arg)
        return when

    # ------------------------------------------------------------ member -> coordinator

    def open(self, member: SimMember, api: str, request: Any) -> Conn:
        self._ids += 1
        conn = Conn(self._ids, member, api, request)
        if member.router is not None:
            member.router.open(conn)
            return conn
        if not self._lost(conn):
            assert self.server is not None
            conn.arrive_at = self._send(member.link, self._arrive, conn)
        return conn

    def _arrive(self, conn: Conn) -> None:
        if conn.member.state == "dead":
            # A killed process's request still on its way is dropped with it
            # (a simplification: on a real network the bytes already sent may
            # still arrive; Kafka would then fence a restarted static member by
            # its dead predecessor's join, where ours refuses the older
            # incarnation, as it does a closed process's late join: seed 108585).
            conn.arrive_at = None
            return
        if conn.arrive_at is None:
            conn.arrive_at = self.sim.now
        assert self.server is not None
        self.server.on_request(conn)

    def send_leg(self, conn: Conn, target: Any) -> None:
        """The next leg of a routed call, to the coordinator ``target``."""
        conn.leg += 1
        conn.target = target
        conn.server = None
        conn.rid = None
        conn.arrive_at = None
        if not self._lost(conn):
            conn.arrive_at = self._send(conn.member.link, self._arrive_leg, (conn, conn.leg))

    def _arrive_leg(self, arg: tuple[Conn, int]) -> None:
        conn, leg = arg
        if conn.leg != leg or conn.member.state == "dead":
            return  # given up (a find that timed out), or its process died
        if conn.arrive_at is None:
            conn.arrive_at = self.sim.now
        conn.target.on_request(conn)

    def close(self, conn: Conn) -> None:
        """The member closed the connection (gave up, or its process died)."""
        if conn.closed:
            return
        conn.closed = True
        member = conn.member
        if member.router is not None and member.state != "dead":
            member.router.cancelled(conn)  # ends the call's routing (a find it had under way)
        link = member.link
        if link.partitioned:
            link.held.append((self._close_arrive, conn))
            return
        if conn.arrive_at is None:
            return  # the request never left, or is held: nothing to tell
        when = max(self.sim.now + link.latency(self.rng, self.sim.now), conn.arrive_at)
        self.sim.at(when, self._close_arrive, conn)

    def _close_arrive(self, conn: Conn) -> None:
        if conn.target is not None:
            conn.target.on_close(conn)
            return
        if self.server is None:
            return  # a routed call closed before any leg (it waited for a find round)
        self.server.on_close(conn)

    # ------------------------------------------------------------ coordinator -> member

    def answer(self, conn: Conn, response: Any) -> None:
        if self._lost(conn):
            return  # lost: the connection hangs until the member gives up on it
        self._send(conn.member.link, conn.member.on_answer, (conn, response, conn.leg))

    def reset(self, conn: Conn, why: str) -> None:
        """The connection broke on the coordinator's side (crash, refused)."""
        self._send(conn.member.link, conn.member.on_answer,
                   (conn, CoordinatorUnavailableError(f"{conn.api}: {why}"), conn.leg))

    # ------------------------------------------------------------ partitions

    def partition(self, link: Link, duration: int, cut: bool) -> None:
        link.partitioned = True
        link.cut = link.cut or cut
        link.partition_token += 1
        self.sim.after(duration, self._heal_event, (link, link.partition_token))

    def _heal_event(self, arg: tuple[Link, int]) -> None:
        link, token = arg
        if token == link.partition_token:
            self.heal(link)

    def heal(self, link: Link) -> None:
        """End every fault of the link; a partition delivers what it held or,
        cut, resets the member's connections (``on_cut``)."""
        link.drop = 0.0
        link.extra_until = -1
        if not link.partitioned:
            return
        link.partitioned = False
        held, link.held = link.held, []
        cut, link.cut = link.cut, False
        for fn, arg in held:
            if cut and fn != self._close_arrive:
                continue  # on a connection the cut resets
            self.sim.after(link.latency(self.rng, self.sim.now), fn, arg)
        if cut and self.on_cut is not None:
            self.on_cut(link)
