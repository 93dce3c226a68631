"""One cell of ``groupcoord simulate``: a pure simulation of a group with a real assignor.

No server and no sockets: the coordinator's part is played by a small
discrete-event loop with a simulated clock, the leader's part by the assignor
from client/assignors (docs/pipeline.md, "Simulation model"):

* membership changes (join, leave, crash, rolling restart) happen at
  simulated times; a change starts a rebalance *round*, which takes
  ``round_ms``; a crash is noticed ``session_timeout_ms`` later;
* in a round every member sends what it owns (and the assignor's
  ``user_data`` back); an eager group gives up everything for the round, a
  cooperative one keeps what it owns (KIP-429);
* a cooperative assignor leaves moved resources out of the round; the
  revoking members rejoin at once (the follow-up round); ``delay_ms`` asks for
  another round that much later (deferred imbalance resolution, KIP-415);
* an *episode* runs from a membership change until the group is settled (no
  follow-up or delayed round due); a change during an episode extends it.

Figures: rounds and assignment CPU time, balance, resources moved versus the
minimum (the formula of shared/bench/scenarios.py ``evaluate``: orphaned plus
the fewest taken from members over their quota; exact for uniform
subscriptions), and resource-milliseconds during which a resource that had
been owned had no live owner.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Resource = tuple[str, int]


# ---------------------------------------------------------------- inputs


def names(prefix: str, n: int) -> list[str]:
    """Zero-padded so that name order is number order (as shared/bench/scenarios.py)."""
    w = max(3, len(str(max(n - 1, 0))))
    return [f"{prefix}-{i:0{w}d}" for i in range(n)]


def subscriptions_for(members: list[str], sets: list[str], shape: Mapping[str, Any],
                      seed: int) -> dict[str, list[str]]:
    """Each member's sets: ``uniform`` (all), or ``random`` (a seeded ``fraction``
    of the sets each; a set nobody picked goes to one seeded-random member).

    ``random`` draws exactly as shared/bench/scenarios.py
    ``nonuniform_subscriptions`` does, so scenario e gets the same inputs.
    """
    kind = shape.get("kind", "uniform")
    ordered = sorted(sets)
    if kind == "uniform":
        return {m: list(ordered) for m in members}
    if kind != "random":
        raise ValueError(f"subscription kind {kind!r}: expected 'uniform' or 'random'")
    rng = random.Random(seed)
    k = max(1, round(float(shape["fraction"]) * len(ordered)))
    subs = {m: sorted(rng.sample(ordered, k)) for m in members}
    covered = {t for s in subs.values() for t in s}
    for t in ordered:
        if t not in covered:
            m = rng.choice(members)
            subs[m] = sorted([*subs[m], t])
    return subs


@dataclass(frozen=True)
class Event:
    at_ms: int
    kind: str        # "join" | "leave" | "crash" | "expire"
    member: str


def churn_timeline(members: list[str], events: Sequence[Mapping[str, Any]], seed: int,
                   session_timeout_ms: int, start_ms: int) -> list[Event]:
    """Membership changes for a churn pattern (one TOML ``[[churn]]`` entry).

    Each entry: ``kind`` = join | leave | crash | restart, ``count`` (-1: every
    member, for restart), ``pick`` = random (seeded) | middle (the member at
    index n // 2, as the benchmark's one_leaves), ``gap_ms`` between
    consecutive changes, ``restart_ms`` from a restarted member's leave to its
    rejoin (it comes back under a new member id, as a dynamic member does).
    """
    rng = random.Random(seed * 7919 + 1)
    alive = sorted(members)
    out: list[Event] = []
    t = start_ms
    fresh = 0
    for spec in events:
        kind = str(spec["kind"])
        count = int(spec.get("count", 1))
        gap = int(spec.get("gap_ms", 30_000))
        if kind == "restart" and count < 0:
            count = len(alive)
        for _ in range(count):
            if kind == "join":
                fresh += 1
                out.append(Event(t, "join", f"joiner-{fresh:04d}"))
                alive.append(f"joiner-{fresh:04d}")
            else:
                if not alive:
                    break
                if spec.get("pick", "random") == "middle":
                    who = sorted(alive)[len(alive) // 2]
                else:
                    who = rng.choice(sorted(alive))
                alive.remove(who)
                if kind == "leave":
                    out.append(Event(t, "leave", who))
                elif kind == "crash":
                    out.append(Event(t, "crash", who))
                    out.append(Event(t + session_timeout_ms, "expire", who))
                elif kind == "restart":
                    out.append(Event(t, "leave", who))
                    fresh += 1
                    back = f"{who}-r{fresh}"
                    out.append(Event(t + int(spec.get("restart_ms", 5_000)), "join", back))
                    alive.append(back)
                else:
                    raise ValueError(f"churn kind {kind!r}: expected join, leave, crash or "
                                     "restart")
            t += gap
    return sorted(out, key=lambda e: (e.at_ms, e.kind, e.member))


# ---------------------------------------------------------------- the simulation


@dataclass
class Episode:
    start_ms: int
    triggers: list[str]
    owners_before: dict[Resource, str]
    rounds: int = 0
    cpu_ms: float = 0.0
    end_ms: int = 0
    moved: int = 0
    min_moves: int = 0
    balance_after: int = 0
    unavailable_ms: int = 0


@dataclass
class CellResult:
    initial_rounds: int = 0
    initial_cpu_ms: float = 0.0
    initial_balance: int = 0
    assign_calls: int = 0
    cpu_ms_total: float = 0.0
    cpu_ms_max: float = 0.0
    valid: bool = True
    invalid_reason: str | None = None
    converged: bool = True
    final_balance: int = 0
    unassigned_at_end: int = 0
    episodes: list[Episode] = field(default_factory=list)


class Simulation:
    def __init__(self, assignor: Any, catalog: dict[str, int], subs: dict[str, list[str]],
                 round_ms: int, max_rounds: int) -> None:
        from client.assignors import RebalanceProtocol
        self.assignor = assignor
        self.cooperative = assignor.protocols[0] == RebalanceProtocol.COOPERATIVE
        self.takes_clock = "now_ms" in inspect.signature(assignor.assign).parameters
        self.catalog = catalog
        self.subs = dict(subs)                       # present members -> sets
        self.owned: dict[str, dict[str, list[int]]] = {m: {} for m in subs}
        self.user_data: dict[str, bytes | None] = {m: None for m in subs}
        self.dead: set[str] = set()                  # crashed, not yet expired
        self.generation = 0
        self.round_ms = round_ms
        self.max_rounds = max_rounds
        self.tracked: set[Resource] = set()          # resources owned at least once
        self.revoked = False                         # the last round took something away
        self._last_cpu = 0.0
        self.result = CellResult()

    # -- ownership views

    def expected(self) -> set[Resource]:
        wanted = {s for m, sets in self.subs.items() for s in sets}
        return {(s, i) for s in wanted if s in self.catalog for i in range(self.catalog[s])}

    def owner_map(self) -> dict[Resource, str]:
        return {(s, i): m for m, sets in self.owned.items() for s, idx in sets.items()
                for i in idx}

    def live_owned(self) -> set[Resource]:
        return {(s, i) for m, sets in self.owned.items() if m in self.subs and m not in self.dead
                for s, idx in sets.items() for i in idx}

    def counts(self) -> list[int]:
        return [sum(len(i) for i in self.owned.get(m, {}).values()) for m in self.subs]

    # -- one round

    def round(self, now_ms: int) -> int:
        """Run one rebalance round at ``now_ms``; returns the smallest
        ``delay_ms`` asked for (0: none)."""
        from client.assignors import AssignmentError, Subscription, validate_assignment
        members = {m: Subscription(sets=self.subs[m], owned=self.owned.get(m, {}),
                                   generation=self.generation if self.owned.get(m) else -1,
                                   user_data=self.user_data.get(m))
                   for m in sorted(self.subs)}
        start = time.process_time()
        if self.takes_clock:
            out = self.assignor.assign(self.catalog, members, now_ms=now_ms)
        else:
            out = self.assignor.assign(self.catalog, members)
        cpu = (time.process_time() - start) * 1000
        self.result.assign_calls += 1
        self.result.cpu_ms_total += cpu
        self.result.cpu_ms_max = max(self.result.cpu_ms_max, cpu)
        if self.result.valid:
            try:
                validate_assignment(self.catalog, members, out, self.cooperative)
            except AssignmentError as exc:
                self.result.valid = False
                self.result.invalid_reason = str(exc)[:300]
        self.generation += 1
        before = {m: {(s, i) for s, idx in self.owned.get(m, {}).items() for i in idx}
                  for m in self.subs}
        self.owned = {m: {s: list(i) for s, i in out[m].assigned.items()} if m in out else {}
                      for m in self.subs}
        self.revoked = any(before[m] - {(s, i) for s, idx in self.owned[m].items() for i in idx}
                           for m in self.subs)
        self.user_data = {m: out[m].user_data if m in out else None for m in self.subs}
        self.tracked |= {(s, i) for sets in self.owned.values() for s, idx in sets.items()
                         for i in idx}
        self._last_cpu = cpu
        delays = [a.delay_ms for a in out.values() if a.delay_ms > 0]
        return min(delays) if delays else 0

    def needs_follow_up(self) -> bool:
        """Cooperative: a member gave something up in the last round, so it
        rejoins at once and the follow-up hands it over (KIP-429). Resources
        held back on purpose (``delay_ms``) wait for the delayed round."""
        return self.cooperative and self.revoked


def _min_moves(owners_before: Mapping[Resource, str], subs: Mapping[str, list[str]],
               expected: set[Resource]) -> int:
    """orphaned + over_quota, as shared/bench/scenarios.py ``evaluate`` counts it."""
    sets_of = {m: set(s) for m, s in subs.items()}
    keep: dict[str, int] = dict.fromkeys(subs, 0)
    orphaned = 0
    for r, m in owners_before.items():
        if r not in expected:
            continue
        if m in sets_of and r[0] in sets_of[m]:
            keep[m] += 1
        else:
            orphaned += 1
    n = len(subs)
    if not n:
        return orphaned
    q, extra = divmod(len(expected), n)
    kept = sorted(keep.values(), reverse=True)
    over = sum(max(0, k - (q + 1 if i < extra else q)) for i, k in enumerate(kept))
    return orphaned + over


def simulate(assignor: Any, catalog: dict[str, int], subs: dict[str, list[str]],
             timeline: list[Event], new_member_sets: list[str] | None,
             round_ms: int, max_rounds: int) -> CellResult:
    """Run the initial assignment, then the timeline; see the module docs."""
    sim = Simulation(assignor, catalog, subs, round_ms, max_rounds)
    res = sim.result
    now = 0
    # The initial assignment: everyone joins at 0 (not an episode: nothing was owned).
    next_round: int | None = 0
    while next_round is not None and res.initial_rounds < max_rounds:
        now = next_round
        delay = sim.round(now)
        now += round_ms
        res.initial_rounds += 1
        res.initial_cpu_ms += sim._last_cpu
        next_round = now if sim.needs_follow_up() else (now + delay if delay else None)
    if next_round is not None:
        res.converged = False
    res.initial_balance = max(sim.counts(), default=0) - min(sim.counts(), default=0)

    events = sorted(timeline, key=lambda e: e.at_ms)
    base = max(now, 1)
    events = [Event(e.at_ms + base, e.kind, e.member) for e in events]
    episode: Episode | None = None
    clock = now            # unavailability is accounted up to here
    busy_until = now       # a round in progress ends here
    budget = max_rounds * (1 + len(events))

    def unowned_now() -> int:
        return len((sim.tracked & sim.expected()) - sim.live_owned())

    def advance(t: int, unowned: int) -> None:
        # resource-ms with no live owner, for resources that had been owned
        nonlocal clock
        if t > clock:
            if episode is not None:
                episode.unavailable_ms += (t - clock) * unowned
            clock = t

    def finish(ep: Episode, t: int) -> None:
        after = sim.owner_map()
        exp = sim.expected()
        ep.end_ms = t
        ep.moved = sum(1 for r, m in ep.owners_before.items() if r in exp and after.get(r) != m)
        ep.min_moves = _min_moves(ep.owners_before, sim.subs, exp)
        c = sim.counts()
        ep.balance_after = max(c, default=0) - min(c, default=0)
        res.episodes.append(ep)

    i = 0
    next_round = None
    while i < len(events) or next_round is not None:
        t_event = events[i].at_ms if i < len(events) else None
        if t_event is not None and (next_round is None or t_event <= next_round):
            advance(t_event, unowned_now())
            e = events[i]
            i += 1
            if episode is None:
                episode = Episode(t_event, [], sim.owner_map())
            episode.triggers.append(e.kind)
            if e.kind == "crash":
                sim.dead.add(e.member)   # unnoticed until its session expires
                continue
            if e.kind == "join":
                sim.subs[e.member] = list(new_member_sets or sorted(catalog))
                sim.owned[e.member] = {}
            else:  # leave, expire
                sim.subs.pop(e.member, None)
                sim.dead.discard(e.member)
            # the change joins the next round; a round in progress finishes first
            due = max(t_event, busy_until)
            next_round = due if next_round is None else min(next_round, due)
            continue
        assert next_round is not None
        if budget <= 0:
            res.converged = False
            break
        budget -= 1
        start = next_round
        advance(start, unowned_now())
        if episode is None:  # defensive: a round always belongs to an episode
            episode = Episode(start, ["scheduled"], sim.owner_map())
        # While the round runs, an eager group owns nothing (KIP-429: members
        # revoke everything before they rejoin); a cooperative one keeps what
        # it owns, and what it revokes is released at the round's end.
        during = len(sim.tracked & sim.expected()) if not sim.cooperative else unowned_now()
        delay = sim.round(start)
        now = busy_until = start + round_ms
        advance(now, during)
        episode.rounds += 1
        episode.cpu_ms += sim._last_cpu
        if sim.needs_follow_up():
            next_round = now
        elif delay:
            next_round = now + delay
        else:
            next_round = None
            if i >= len(events) or events[i].at_ms > now:
                finish(episode, now)
                episode = None
    if episode is not None:
        res.converged = False
        finish(episode, now)
    c = sim.counts()
    res.final_balance = max(c, default=0) - min(c, default=0)
    res.unassigned_at_end = len(sim.expected() - set(sim.owner_map()))
    return res
