"""A member under simulation: the production ``GroupMember`` -- its asyncio
shell, its driver (:class:`~client.member_state.driver.MemberDriver`) and its
machine -- on an event loop of its own that the simulation steps
(:class:`~sim.loop.SimLoop`), and an application that acts on its assignment.

What is simulation here, and only that:

- the member's clock (:class:`SimMemberClock`): the process's
  :class:`~sim.events.DriftClock`; a timer armed on it (every wait of the
  member: its driver's ``wake_at``, a call's timeout, a close's) is an event
  of the simulation at its deadline, run on the member's loop;
- its transport (:class:`SimTransport`): a call opens a connection on the
  simulated network (through the member's router with several
  coordinators, :class:`~sim.cluster.SimRouter`); its answer or failure
  comes back as an event; a call the member cancels closes its connection;
- the listener (:class:`SimListener`): each callback is a coroutine that
  takes simulated time (``on_revoked`` commits the final checkpoints first,
  as the chaos worker does), so the member runs the side channel meanwhile;
- the application: it ticks every ``commit_interval_ms``, acts on
  ``owned_at(now)`` (the ``assignment`` property), reports its loads
  (placement seeds) and commits a checkpoint for each resource it acts on
  with ``GroupMember.commit``, one commit at a time;
- faults: a crash loses the loop with everything of the process and closes
  every connection; a paused process (the zombie) runs nothing: every event
  addressed to it is kept and replayed in order when it resumes; its clock
  keeps running, so its ``owned_at`` still empties at its safety deadline.

Each event of the member (an answer, a timer, the application's tick) is one
step of its loop: the callback, then everything it made ready, until the
loop would wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr
from prometheus_client import CollectorRegistry

from client.errors import CoordinatorUnavailableError, FatalMemberError, GroupCoordError
from client.listener import RebalanceListener
from client.member import GroupMember, LoadCallback
from client.member_state import CallbackKind, InvokeListener, MemberConfig, Resource
from client.member_state.driver import Channel
from protocol.messages import Api, CommitRequest, JoinRequest, SyncResponse
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError
from sim.cluster import SimRouter
from sim.events import SimTimer
from sim.loop import SimLoop

if TYPE_CHECKING:
    from sim.events import DriftClock
    from sim.network import Conn, Link
    from sim.world import World

__all__ = ["SimMember"]

UP, PAUSED, DEAD, STOPPED = "up", "paused", "dead", "stopped"
#: GroupMember's settings that are MemberConfig's fields (all but the group and sets).
_SETTINGS = tuple(f.name for f in dataclasses.fields(MemberConfig)
                  if f.init and f.name not in ("group_id", "sets"))


class SimMemberClock:
    """The member's clock (``GroupMember(clock=...)``): its process's drifting
    clock; a timer is an event at the global instant the clock reads its deadline."""

    def __init__(self, member: SimMember) -> None:
        self.member = member

    def now_ms(self) -> int:
        return self.member.local()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> SimTimer:
        member = self.member
        timer = SimTimer(callback)
        member.sim.at(member.clock.global_at(deadline_ms), member.timer_due, timer)
        return timer


class SimTransport:
    """The member's transport: each call a connection on the simulated network."""

    def __init__(self, member: SimMember) -> None:
        self.member = member

    async def call(self, api: str, request: Any) -> Any:
        member = self.member
        if member.state == DEAD:
            raise CoordinatorUnavailableError(f"{api}: the process is gone")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn = member.open(api, request, future)
        try:
            return await future
        except asyncio.CancelledError:
            member.cancelled(conn)
            raise

    def timed_out(self, api: str) -> None:
        """The member's own timeout ended a call: its router gives the
        coordinator up (``CoordinatorRouter.timed_out``)."""
        router = self.member.router
        if router is not None:
            router.routing.timed_out(api)


# Not a native class when mypyc compiles the simulator: it extends the library's.
@mypyc_attr(native_class=False)
class SimListener(RebalanceListener):
    """The application's callbacks: each takes simulated time."""

    def __init__(self, member: SimMember) -> None:
        self.member = member

    async def on_assigned(self, resources: set[Resource]) -> None:
        await self.member.callback(CallbackKind.ASSIGNED, resources)

    async def on_revoked(self, resources: set[Resource]) -> None:
        await self.member.callback(CallbackKind.REVOKED, resources)

    async def on_lost(self, resources: set[Resource]) -> None:
        await self.member.callback(CallbackKind.LOST, resources)

    async def on_standby_dropped(self, resources: set[Resource]) -> None:
        await self.member.callback(CallbackKind.STANDBY_DROPPED, resources)

    async def on_standby(self, resources: set[Resource]) -> None:
        await self.member.warm_up(frozenset(resources))


class SimMember:
    def __init__(self, world: World, name: str, incarnation: int, config: MemberConfig,
                 clock: DriftClock, link: Link, rng: random.Random, *,
                 commit_interval_ms: int, listener_ms: tuple[int, int],
                 registry: CollectorRegistry | None = None) -> None:
        self.world = world
        self.sim = world.sim
        self.name = name
        self.incarnation = incarnation
        self.tag = f"{name}#{incarnation}"
        self.config = config
        self.clock = clock
        self.link = link
        self.rng = rng
        self.state = UP
        self.commit_interval_ms = commit_interval_ms
        self.listener_ms = listener_ms
        #: the process's event loop; its errors are findings.
        self.loop = SimLoop(world.core_errors)
        settings: dict[str, Any] = {name: getattr(config, name) for name in _SETTINGS}
        #: how the application reports its loads (placement seeds): from its tick
        #: (``report_load``), or when the member asks (``load_callback``: a plain
        #: function, or a coroutine that takes simulated time).
        self.load_by = (rng.choice(("tick", "callback", "coroutine")) if world.config.placed
                        else "tick")
        load_callback: LoadCallback | None = None
        if self.load_by == "callback":
            load_callback = self._loads
        elif self.load_by == "coroutine":
            load_callback = self._measure_loads
        #: the process's clock, the member's.
        self.time = SimMemberClock(self)
        #: the production member this process runs.
        self.member = GroupMember(SimTransport(self), config.group_id, config.sets,
                                  listener=SimListener(self), clock=self.time,
                                  rng=rng.random, wall_clock=world.wall_ms,
                                  registry=registry, load_callback=load_callback, **settings)
        # The checker reads the member's machine and driver (its state, what it
        # owns, its safety deadline, the callback running).
        self.machine = self.member._machine
        self.driver = self.member._driver
        # A static member's incarnation id names this process in the trace
        # (GroupMember draws a random one).
        self.machine.incarnation = self.tag
        #: each open call's connection -> the future its answer resolves.
        self._calls: dict[Conn, asyncio.Future[Any]] = {}
        #: the application's commit in flight, and the request it sent.
        self.committing = False
        self.commit_sent: CommitRequest | None = None
        #: on_revoked's final commit is under way (the tick's commits wait).
        self.listener_commit = False
        #: what the listener was told the process owns: given from the start
        #: of on_assigned, given up at the start of on_lost and at the end of
        #: on_revoked. ``assignment`` and the commits sent stay within it.
        self.handed: frozenset[Resource] = frozenset()
        #: close() was called (a drain closes the member itself once drained).
        self.asked_to_close = False
        #: inside ``async with``: it had its first assignment; told to leave it.
        self.working = False
        self._stop_asked: asyncio.Future[None] | None = None
        self.deferred: list[tuple[Callable[[Any], None], Any]] = []
        #: what the latest join claimed (KIP-429 ``owned``) and the latest delivered sync.
        self.join_claims: frozenset[Resource] = frozenset()
        self.last_assigned: frozenset[Resource] | None = None
        self.planned_revoke: frozenset[Resource] | None = None
        #: each standby's latest warm-up, and the warm-ups that ended: a warm
        #: report may name only a standby whose latest warm-up ended.
        self.latest_warmup: dict[Resource, int] = {}
        self.warmups_ended: set[int] = set()
        self._warmups = 0
        #: ``owned_at`` as the invariant checker last saw it.
        self.seen: frozenset[Resource] = frozenset()
        #: several coordinators: this process's router (None: one coordinator).
        self.router = SimRouter(self, world.cluster) if world.cluster is not None else None
        self.sim.at_end.append(self.shut_down)

    # ------------------------------------------------------------ clock and steps

    def local(self) -> int:
        # DriftClock.local, inlined: the member reads its clock at every step.
        clock = self.clock
        g = self.sim.now
        return clock.offset + g + (g * clock.ppm) // 1_000_000

    def _defer(self, fn: Callable[[Any], None], arg: Any) -> bool:
        """Keep an event for after a pause; True when it must not run now."""
        if self.state == PAUSED:
            self.deferred.append((fn, arg))
            return True
        return self.state != UP

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` as one step of the member's loop (at once when inside one)."""
        self.loop.run(fn, *args)

    def _task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.loop.create_task(coroutine)

    def timer_due(self, timer: SimTimer) -> None:
        """A timer of the member's clock is due."""
        if self._defer(self.timer_due, timer):
            return
        if not timer.cancelled:
            self.run(timer.callback)
            self.world.touched(self)

    async def sleep(self, ms: int) -> None:
        """Simulated work of the application, on the member's clock."""
        future: asyncio.Future[None] = self.loop.create_future()
        self.time.call_at(self.local() + ms,
                          lambda: None if future.done() else future.set_result(None))
        await future

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self.sim.log(f"{self.tag} start {self.config.assignors} "
                     f"static={self.config.group_instance_id is not None}")
        self.run(self._begin)
        self._schedule_tick()

    def _begin(self) -> None:
        stop = self._stop_asked = self.loop.create_future()
        self._task(self._main(stop))
        self._task(self._watch())

    async def _main(self, stop: asyncio.Future[None]) -> None:
        """The worker's main: ``async with GroupMember(...)`` -- start, wait for
        the first assignment, work (the ticks) until asked to stop, close."""
        with contextlib.suppress(GroupCoordError):  # it failed: its stop says so
            async with self.member:
                self.working = True
                await stop

    def shut_down(self, _: Any = None) -> None:
        """The process is gone (killed, stopped, or the run is over): its tasks
        are cancelled and run to their end -- nothing of them reaches the
        network any more -- and its loop is closed."""
        loop = self.loop
        if loop.is_closed():
            return
        if self.state in (UP, PAUSED):
            self.state = DEAD
        loop.dead = True
        for _ in range(10):
            tasks = asyncio.all_tasks(loop)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            loop.step()
        loop.close()

    async def _watch(self) -> None:
        """The member's driver task ended: it stopped (left, closed, or failed)."""
        with contextlib.suppress(GroupCoordError):  # its failure: read below
            await self.member.wait_closed()
        if self.state in (UP, PAUSED):
            failure = self.member.failure
            error = failure if isinstance(failure, FatalMemberError) else None
            self.state = STOPPED
            self.sim.log(f"{self.tag} stopped error={error!r}")
            self.world.member_stopped(self, error)
            self.sim.after(0, self.shut_down)

    @property
    def listener(self) -> InvokeListener | None:
        """The listener callback running."""
        return self.driver.callback

    # ------------------------------------------------------------ the network side

    def open(self, api: str, request: Any, future: asyncio.Future[Any]) -> Conn:
        """``SimTransport.call``: a connection for the call, its answer to ``future``."""
        side = self.driver.in_flight(Channel.SIDE)
        if self.sim.verbose:
            what = ("bg-heartbeat" if side is not None and side.request is request
                    else "commit" if api == Api.COMMIT else api)
            self.sim.log(f"{self.tag} send {what} {_brief(request)}")
        if isinstance(request, JoinRequest):
            self.world.on_join_sent(self, request)
            self.join_claims = _claims(request)
        elif isinstance(request, CommitRequest):
            self.world.on_commit_sent(self, request, self.local())
            self.commit_sent = request
        conn = self.world.net.open(self, api, request)
        self._calls[conn] = future
        return conn

    def on_side_channel(self, conn: Conn) -> bool:
        """Whether ``conn`` carries the driver's side-channel call (a heartbeat
        beside the main channel); until its answer reaches the driver."""
        side = self.driver.in_flight(Channel.SIDE)
        return side is not None and side.request is conn.request

    def cancelled(self, conn: Conn) -> None:
        """The member gave up on a call (its timeout, a cancel): the connection closes."""
        if self._calls.pop(conn, None) is not None:
            self.world.net.close(conn)

    def on_answer(self, arg: tuple[Conn, Any, int]) -> None:
        if self._defer(self.on_answer, arg):
            return
        conn, response, leg = arg
        if conn.closed:
            return
        if self.router is not None:
            final, response = self.router.on_answer(conn, response, leg)
            if not final:
                return  # the router sent the call on (a redirect, after a find)
        conn.closed = True  # answered: back to the pool, nothing more on it
        self._deliver(conn, response)

    def _deliver(self, conn: Conn, response: Any) -> None:
        future = self._calls.pop(conn, None)
        if future is None:
            return
        if not self.world.config.faulty:
            self.world.on_response(self, conn, response)
        if self.sim.verbose:
            self.sim.log(f"{self.tag} recv {conn.api} {_brief(response)}")
        if isinstance(response, SyncResponse) and response.error is None:
            self._note_sync(response)
        if isinstance(response, Exception):
            self.run(_fail, future, response)
        else:
            self.run(_resolve, future, response)
        self.world.touched(self)

    def _note_sync(self, response: SyncResponse) -> None:
        try:
            assignment = ResourceAssignment.decode(response.assignment)
        except ValidationError:
            return
        if assignment.error is not None:
            return
        assigned = frozenset((s, i) for s, idx in assignment.assigned.items() for i in idx)
        self.last_assigned = assigned
        self.planned_revoke = self.join_claims - assigned

    # ------------------------------------------------------------ listeners

    async def callback(self, kind: CallbackKind, resources: set[Resource]) -> None:
        """A listener callback: simulated work (``on_revoked``: the final commits first)."""
        self.sim.log(f"{self.tag} on_{kind.value} {sorted(resources)}")
        self.world.on_listener(self, InvokeListener(kind, frozenset(resources)))
        if kind is CallbackKind.ASSIGNED:
            self.handed |= resources
        elif kind is CallbackKind.LOST:
            self.handed -= resources
        if kind is CallbackKind.ASSIGNED and resources:
            # Beside the callback, as an application reads its state back.
            self._task(self._read_back(frozenset(resources)))
        if kind is CallbackKind.REVOKED and resources:
            # The hand-over: final checkpoints, then the resources are given up.
            self.listener_commit = True
            try:
                await self._commit(frozenset(resources))
            finally:
                self.listener_commit = False
        lo, hi = self.listener_ms
        await self.sleep(self.rng.randint(lo, hi))
        if kind is CallbackKind.REVOKED:
            self.handed -= resources

    async def _read_back(self, resources: frozenset[Resource]) -> None:
        """What a new owner does first: read the checkpoints of what it was given
        (``GroupMember.fetch``), each at least the value last acknowledged."""
        floors = {r: self.world.acked[r] for r in resources if r in self.world.acked}
        try:
            found = await self.member.fetch(resources)
        except GroupCoordError:
            return  # no coordinator, or no answer in time: nothing read
        self.world.on_fetched(self, floors, found)

    async def warm_up(self, resources: frozenset[Resource]) -> None:
        """``on_standby``: it takes simulated time, beside the member's steps."""
        self.sim.log(f"{self.tag} on_standby {sorted(resources)}")
        self.world.on_warmup(self, resources)
        self._warmups += 1
        run = self._warmups
        for r in resources:
            self.latest_warmup[r] = run
        lo, hi = self.listener_ms
        await self.sleep(self.rng.randint(lo, hi))
        self.warmups_ended.add(run)

    # ------------------------------------------------------------ the application

    def _schedule_tick(self) -> None:
        self.sim.at(self.clock.global_at(self.local() + self.commit_interval_ms), self._tick,
                    self.incarnation)

    def _tick(self, _: int) -> None:
        if self._defer(self._tick, _):
            return
        self.run(self._act)
        self._schedule_tick()

    def _act(self) -> None:
        owned = self.member.assignment
        self.world.on_act(self, owned, self.local())
        if self.member.failure is not None:
            return
        # What the application measured (placement seeds); a load outside the
        # band the leader gave asks for a rejoin.
        if owned and self.load_by == "tick" and self.world.config.placed \
                and not self.machine.closing:
            self.member.report_load(self.world.true_loads(owned))
        if owned and not self.committing and not self.listener_commit:
            self._task(self._commit(owned))

    def _loads(self, owned: frozenset[Resource]) -> Mapping[Resource, float]:
        """``load_callback``: what the application measures on ``owned``."""
        return self.world.true_loads(owned)

    async def _measure_loads(self, owned: frozenset[Resource]) -> Mapping[Resource, float]:
        """``load_callback`` as a coroutine: the measurement takes simulated time."""
        lo, hi = self.listener_ms
        await self.sleep(self.rng.randint(lo, hi))
        return self.world.true_loads(owned)

    async def _commit(self, resources: frozenset[Resource]) -> None:
        """One commit of a new value for ``resources`` (``GroupMember.commit``)."""
        self.committing = True
        value = self.world.next_value()
        try:
            await self.member.commit({r: value for r in resources})
        except GroupCoordError as exc:
            # Not owned (or no longer, by the safety deadline), closed, no
            # generation, refused, or no answer in time.
            if self.sim.verbose:
                self.sim.log(f"{self.tag} commit value={value} failed: {exc}")
            return
        finally:
            self.committing = False
        # The request this call sent: commits are sent one at a time (the commit
        # lock), and this coroutine goes on before the next one is sent.
        request = self.commit_sent
        assert request is not None and request.checkpoints[0][2] == value, request
        self.world.on_commit_acked(self, request, value)

    def drain(self) -> None:
        """``GroupMember.drain()``: hand everything over, then leave."""
        self.run(self._task, self._drain())
        self.world.touched(self)

    async def _drain(self) -> None:
        with contextlib.suppress(GroupCoordError):  # failed or closed meanwhile: its stop says
            await self.member.drain()

    # ------------------------------------------------------------ several coordinators

    def router_event(self, arg: tuple[Callable[[Any], None], Any]) -> None:
        """An event of this process's router (waits while the process is paused)."""
        if self._defer(self.router_event, arg):
            return
        fn, inner = arg
        fn(inner)

    def router_final(self, conn: Conn, response: Any) -> None:
        """The router ended a call itself (no coordinator found)."""
        if conn.closed:
            return
        conn.closed = True
        self._deliver(conn, response)

    def gone(self, arg: tuple[Conn, Exception]) -> None:
        """Another coordinator was found: a call still waiting on the old one
        fails (``error``), its connection closed."""
        conn, error = arg
        if conn.closed:
            return
        self.world.net.close(conn)
        self._deliver(conn, error)

    # ------------------------------------------------------------ faults

    def crash(self) -> None:
        """SIGKILL: nothing more runs; the OS closes every connection."""
        if self.state in (DEAD, STOPPED):
            return
        self.sim.log(f"{self.tag} CRASH")
        self.state = DEAD
        self.deferred.clear()
        calls, self._calls = self._calls, {}
        for conn in calls:
            self.world.net.close(conn)
        self.shut_down()

    def pause(self) -> None:
        if self.state == UP:
            self.sim.log(f"{self.tag} PAUSE")
            self.state = PAUSED

    def resume(self, _: Any = None) -> None:
        if self.state != PAUSED:
            return
        self.sim.log(f"{self.tag} RESUME")
        self.state = UP
        deferred, self.deferred = self.deferred, []
        for fn, arg in deferred:
            if self.state != UP:
                break
            fn(arg)
        self.world.touched(self)

    def close(self) -> None:
        """A clean shutdown (SIGTERM in the chaos worker): revoke, leave, stop."""
        if self.state != UP:
            return
        self.sim.log(f"{self.tag} CLOSE")
        self.asked_to_close = True
        self.run(self._close)
        self.world.touched(self)

    def _close(self) -> None:
        """SIGTERM's handler: the worker leaves its ``async with`` (which closes
        the member); before its first assignment it closes the member itself."""
        if not self.working:
            self._task(self.member.close())
        if self._stop_asked is not None and not self._stop_asked.done():
            self._stop_asked.set_result(None)

    def reset_connections(self) -> None:
        """A reset on the way: every open call of this member fails now."""
        if self.state not in (UP, PAUSED):
            return
        for conn in list(self._calls):
            if not conn.closed:
                self.sim.after(0, self._reset_one, conn)

    def _reset_one(self, conn: Conn) -> None:
        if conn.closed or self.state in (DEAD, STOPPED):
            return
        self.world.net.close(conn)  # the coordinator sees the connection go
        self._reset_delivery(conn)

    def _reset_delivery(self, conn: Conn) -> None:
        if self._defer(self._reset_delivery, conn):
            return
        self._deliver(conn, CoordinatorUnavailableError(f"{conn.api}: connection reset"))


def _resolve(future: asyncio.Future[Any], response: Any) -> None:
    if not future.done():
        future.set_result(response)


def _fail(future: asyncio.Future[Any], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


def _claims(request: JoinRequest) -> frozenset[Resource]:
    if not request.protocols:
        return frozenset()
    try:
        meta = MemberMetadata.decode(request.protocols[0][1])
    except ValidationError:
        return frozenset()
    return frozenset((s, i) for s, idx in meta.owned.items() for i in idx)


def _brief(message: Any) -> str:
    """A short, deterministic description of a request or an answer."""
    if isinstance(message, Exception):
        return f"ERR {message}"
    error = getattr(message, "error", None)
    parts = [type(message).__name__]
    if error is not None:
        parts.append(str(error.value))
    for attr in ("member_id", "generation_id", "wait_ms"):
        value = getattr(message, attr, None)
        if value not in (None, ""):
            parts.append(f"{attr[:3]}={value}")
    return " ".join(parts)
