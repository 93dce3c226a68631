"""A member under simulation: the real machine and the real driver
(:class:`~client.member_state.driver.MemberDriver`, the step object
``GroupMember`` runs on asyncio) on simulation events, and an application
that acts on ``assignment``.

What is simulation here, and only that:

- the runtime around the driver: each wake-up is an event at the driver's
  ``wake_at`` (on the member's own :class:`~sim.events.DriftClock`), its
  ``Send`` effects open connections on the simulated network, answers and
  failures come back as events, a ``Cancel`` closes the connection;
- the listener callbacks, which take simulated time (``on_revoked`` commits
  the final checkpoints first, as the chaos worker does); they are
  coroutines, so the driver runs the side channel meanwhile;
- the application: it ticks every ``commit_interval_ms``, acts on
  ``machine.owned_at(now)`` (the ``assignment`` property of ``GroupMember``)
  and commits a checkpoint for each resource it acts on, one commit at a
  time, built and bounded by ``MemberDriver.commit_call`` as
  ``GroupMember.commit`` does;
- faults: a crash closes every connection and runs nothing more; a paused
  process (the zombie) runs nothing: every event addressed to it is kept and
  replayed in order when it resumes; its clock keeps running, so its
  ``owned_at`` still empties at its safety deadline.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from client.errors import (
    CoordinatorUnavailableError,
    GroupCoordError,
)
from client.member_state import (
    Call,
    CallbackKind,
    InvokeListener,
    MemberConfig,
    MemberStateMachine,
    Resource,
)
from client.member_state.driver import (
    Cancel,
    Channel,
    DriverEffect,
    MemberDriver,
    Send,
    StartWarmup,
    Stopped,
)
from protocol.messages import CommitRequest, JoinRequest, SyncResponse
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError
from sim.cluster import SimRouter

if TYPE_CHECKING:
    from sim.events import DriftClock
    from sim.network import Conn, Link
    from sim.world import World

__all__ = ["SimMember"]

UP, PAUSED, DEAD, STOPPED = "up", "paused", "dead", "stopped"


class SimMember:
    def __init__(self, world: World, name: str, incarnation: int, config: MemberConfig,
                 clock: DriftClock, link: Link, rng: random.Random, *,
                 commit_interval_ms: int, listener_ms: tuple[int, int]) -> None:
        self.world = world
        self.sim = world.sim
        self.name = name
        self.incarnation = incarnation
        self.tag = f"{name}#{incarnation}"
        self.config = config
        self.clock = clock
        self.link = link
        self.rng = rng
        self.machine = MemberStateMachine(config, rng=rng.random, assignor_clock=world.wall_ms,
                                          incarnation=self.tag)
        self.state = UP
        self.commit_interval_ms = commit_interval_ms
        self.listener_ms = listener_ms
        #: the connection of the call in flight on each of the driver's channels.
        self.main: Conn | None = None
        self.bg: Conn | None = None
        #: the driver GroupMember runs; this class is its runtime.
        self.driver = MemberDriver(self.machine)
        self.commit_conn: Conn | None = None
        self.commit_request: CommitRequest | None = None
        self.commit_value = 0
        #: the running listener waits for the commit lock with these resources.
        self.listener_commit: frozenset[Resource] | None = None
        self._wake_token = 0
        #: close() was called (a drain closes the member itself once drained).
        self.asked_to_close = False
        self.deferred: list[tuple[Callable[[Any], None], Any]] = []
        #: what the latest join claimed (KIP-429 ``owned``) and the latest delivered sync.
        self.join_claims: frozenset[Resource] = frozenset()
        self.last_assigned: frozenset[Resource] | None = None
        self.planned_revoke: frozenset[Resource] | None = None
        #: each standby's latest warm-up, and the warm-ups that ended: a warm
        #: report may name only a standby whose latest warm-up ended.
        self.latest_warmup: dict[Resource, int] = {}
        self.warmups_ended: set[int] = set()
        #: ``owned_at`` as the invariant checker last saw it.
        self.seen: frozenset[Resource] = frozenset()
        #: several coordinators: this process's router (None: one coordinator).
        self.router = SimRouter(self, world.cluster) if world.cluster is not None else None

    # ------------------------------------------------------------ clock and wake-ups

    def local(self) -> int:
        # DriftClock.local, inlined: the driver reads its clock at every step.
        clock = self.clock
        g = self.sim.now
        return clock.offset + g + (g * clock.ppm) // 1_000_000

    def _wake_at(self, local_ms: int | None) -> None:
        self._wake_token += 1
        if local_ms is None:
            return
        self.sim.at(self.clock.global_at(local_ms), self._wake, self._wake_token)

    def _wake(self, token: int) -> None:
        if token != self._wake_token or self.state != UP:
            if self.state == PAUSED and token == self._wake_token:
                self.deferred.append((self._wake, token))
            return
        self.run()
        self.world.touched(self)

    def _defer(self, fn: Callable[[Any], None], arg: Any) -> bool:
        """Keep an event for after a pause; True when it must not run now."""
        if self.state == PAUSED:
            self.deferred.append((fn, arg))
            return True
        return self.state != UP

    # ------------------------------------------------------------ the driver

    def start(self) -> None:
        self.sim.log(f"{self.tag} start {self.config.assignors} "
                     f"static={self.config.group_instance_id is not None}")
        self.run()
        self._schedule_tick()

    def run(self) -> None:
        """Step the driver now and perform what it decides."""
        if self.state != UP:
            return
        driver = self.driver
        effects = driver.step(self.local())
        self._apply(effects)
        if effects and isinstance(effects[-1], InvokeListener):
            # The callback started; it is a coroutine, so the driver is stepped
            # at once while it runs (the side channel).
            self._apply(driver.step(self.local()))
        if driver.stopped:
            return
        self._wake_at(driver.wake_at)

    def _apply(self, effects: list[DriverEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._send(effect.channel, effect.call)
            elif isinstance(effect, Cancel):
                conn = self.main if effect.channel is Channel.MAIN else self.bg
                if effect.channel is Channel.MAIN:
                    self.main = None
                else:
                    self.bg = None
                if conn is not None:
                    if effect.timed_out:
                        self._timed_out(conn)
                    self.world.net.close(conn)
            elif isinstance(effect, InvokeListener):
                self._start_listener(effect)
            elif isinstance(effect, StartWarmup):
                # on_standby, beside the driver's steps: it takes simulated time.
                self.sim.log(f"{self.tag} on_standby {sorted(effect.resources)}")
                self.world.on_warmup(self, effect.resources)
                for r in effect.resources:
                    self.latest_warmup[r] = effect.run
                lo, hi = self.listener_ms
                self.sim.after(self.rng.randint(lo, hi), self._warmup_end,
                               (self.incarnation, effect))
            elif isinstance(effect, Stopped):
                self._stop(effect)
            else:
                # MeasureLoad: asked only of a driver given a load callback; the
                # simulator's members report their loads themselves.
                raise AssertionError(f"{self.tag}: unexpected driver effect {effect!r}")

    def _send(self, channel: Channel, call: Call) -> None:
        if channel is Channel.SIDE:
            if self.sim.verbose:
                self.sim.log(f"{self.tag} send bg-heartbeat {_brief(call.request)}")
            self.bg = self.world.net.open(self, call.api, call.request)
            return
        if self.sim.verbose:
            self.sim.log(f"{self.tag} send {call.api} {_brief(call.request)}")
        if isinstance(call.request, JoinRequest):
            self.world.on_join_sent(self, call.request)
            self.join_claims = _claims(call.request)
        self.main = self.world.net.open(self, call.api, call.request)

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
        if not self.world.config.faulty:
            self.world.on_response(self, conn, response)
        now = self.local()
        if self.sim.verbose:
            self.sim.log(f"{self.tag} recv {conn.api} {_brief(response)}")
        if conn is self.main:
            self.main = None
            if isinstance(response, Exception):
                self.driver.failed(Channel.MAIN, now, response)
            else:
                if isinstance(response, SyncResponse) and response.error is None:
                    self._note_sync(response)
                self.driver.answered(Channel.MAIN, now, response)
            self.run()
        elif conn is self.bg:
            self.bg = None
            if isinstance(response, Exception):
                self.driver.failed(Channel.SIDE, now, response)
            else:
                self.driver.answered(Channel.SIDE, now, response)
            self.run()
        elif conn is self.commit_conn:
            self._commit_done(now, response)
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

    def _stop(self, stopped: Stopped) -> None:
        self.state = STOPPED
        self._wake_token += 1
        self.sim.log(f"{self.tag} stopped error={stopped.error!r}")
        self.world.member_stopped(self, stopped.error)

    # ------------------------------------------------------------ listeners

    @property
    def listener(self) -> InvokeListener | None:
        """The listener callback running."""
        return self.driver.callback

    def _start_listener(self, action: InvokeListener) -> None:
        self.sim.log(f"{self.tag} on_{action.kind.value} {sorted(action.resources)}")
        self.world.on_listener(self, action)
        if action.kind is CallbackKind.REVOKED and action.resources:
            # The hand-over: final checkpoints, then the resources are given up.
            self.listener_commit = action.resources
            self._commit(action.resources)
            return
        self._listener_work()

    def _listener_work(self) -> None:
        lo, hi = self.listener_ms
        self.sim.after(self.rng.randint(lo, hi), self._listener_end, self.incarnation)

    def _listener_end(self, _: int) -> None:
        if self._defer(self._listener_end, _):
            return
        assert self.driver.callback is not None
        self.driver.callback_returned(self.local())
        self.run()
        self.world.touched(self)

    def _warmup_end(self, arg: tuple[int, StartWarmup]) -> None:
        if self._defer(self._warmup_end, arg):
            return
        self.warmups_ended.add(arg[1].run)
        self.driver.warmup_done(self.local(), arg[1])
        self.run()
        self.world.touched(self)

    # ------------------------------------------------------------ the application

    def _schedule_tick(self) -> None:
        self.sim.at(self.clock.global_at(self.local() + self.commit_interval_ms), self._tick,
                    self.incarnation)

    def _tick(self, _: int) -> None:
        if self._defer(self._tick, _):
            return
        now = self.local()
        owned = self.machine.owned_at(now)
        self.world.on_act(self, owned, now)
        # What the application measured (placement seeds); a load outside the
        # band the leader gave asks for a rejoin.
        if (owned and self.world.config.placed and not self.machine.closing
                and self.machine.report_load(now, self.world.true_loads(owned))):
            self.run()
        if owned and self.commit_conn is None and self.listener_commit is None:
            self._commit(owned)
        self._schedule_tick()

    def _commit(self, resources: frozenset[Resource]) -> None:
        if self.commit_conn is not None:
            return  # the listener's commit waits for the one in flight (the commit lock)
        now = self.local()
        value = self.world.next_value()
        try:  # not owned (or no longer, by the safety deadline), closed, no generation
            request, timeout = self.driver.commit_call(now, {r: value for r in resources},
                                                       self.config.request_timeout_ms)
        except GroupCoordError:
            self._commit_finished()
            return
        self.world.on_commit_sent(self, request, now)
        if self.sim.verbose:
            self.sim.log(f"{self.tag} send commit value={value} n={len(resources)} "
                         f"gen={request.generation_id} timeout={timeout}")
        self.commit_request = request
        self.commit_value = value
        self.commit_conn = self.world.net.open(self, "commit", request)
        self.sim.at(self.clock.global_at(now + timeout), self._commit_timeout, self.commit_conn)

    def _commit_timeout(self, conn: Conn) -> None:
        if self._defer(self._commit_timeout, conn):
            return
        if conn is not self.commit_conn:
            return
        self._timed_out(conn)
        self.world.net.close(conn)
        self.sim.log(f"{self.tag} commit value={self.commit_value} timed out")
        self._commit_done(self.local(), CoordinatorUnavailableError("commit: timed out"))
        self.world.touched(self)

    def _commit_done(self, now: int, response: Any) -> None:
        request = self.commit_request
        self.commit_conn = None
        self.commit_request = None
        assert request is not None
        if not isinstance(response, Exception):
            code = response.error
            self.driver.commit_answered(now, request, code)
            if code is None:
                self.world.on_commit_acked(self, request, self.commit_value)
        self._commit_finished()
        self.run()  # GroupMember.commit pokes the driver

    # ------------------------------------------------------------ several coordinators

    def _timed_out(self, conn: Conn) -> None:
        """``GroupMember._timed_out``: the router gives the coordinator up."""
        if self.router is not None:
            self.router.timed_out(conn)

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

    def _commit_finished(self) -> None:
        if self.listener_commit is not None and self.listener is not None:
            self.listener_commit = None
            self._listener_work()

    # ------------------------------------------------------------ faults

    def crash(self) -> None:
        """SIGKILL: nothing more runs; the OS closes every connection."""
        if self.state in (DEAD, STOPPED):
            return
        self.sim.log(f"{self.tag} CRASH")
        self.state = DEAD
        self._wake_token += 1
        self.deferred.clear()
        for conn in (self.main, self.bg, self.commit_conn):
            if conn is not None:
                self.world.net.close(conn)
        self.main = self.bg = self.commit_conn = None

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
        if self.state == UP:
            self.run()
        self.world.touched(self)

    def close(self) -> None:
        """A clean shutdown (SIGTERM in the chaos worker): revoke, leave, stop."""
        if self.state != UP:
            return
        self.sim.log(f"{self.tag} CLOSE")
        self.asked_to_close = True
        self.machine.close()
        self.run()
        self.world.touched(self)

    def reset_connections(self) -> None:
        """A reset on the way: every open call of this member fails now."""
        if self.state not in (UP, PAUSED):
            return
        for conn in (self.main, self.bg, self.commit_conn):
            if conn is not None and not conn.closed:
                self.sim.after(0, self._reset_one, conn)

    def _reset_one(self, conn: Conn) -> None:
        if conn.closed or self.state in (DEAD, STOPPED):
            return
        self.world.net.close(conn)  # the coordinator sees the connection go
        self._reset_delivery(conn)

    def _reset_delivery(self, conn: Conn) -> None:
        if self._defer(self._reset_delivery, conn):
            return
        if conn is self.main or conn is self.bg or conn is self.commit_conn:
            self._deliver(conn, CoordinatorUnavailableError(f"{conn.api}: connection reset"))
            self.world.touched(self)


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
