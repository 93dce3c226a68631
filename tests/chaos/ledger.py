"""The chaos harness's ledger and the invariants checked over it.

Every worker process appends JSON lines to its own ledger file; the harness
keeps its own list of faults. All times are ``time.monotonic()`` seconds:
CLOCK_MONOTONIC is one clock for every process on the machine, so events of
different processes can be ordered.

Worker events (``w`` worker slot, ``inc`` incarnation of that slot):

* ``assigned`` / ``revoked`` / ``lost`` with ``res`` (``[[set, index], ...]``),
  ``member`` and ``gen``. ``assigned`` is written when ``on_assigned`` starts
  (processing starts after it), ``revoked`` when ``on_revoked`` has finished
  (its final commit included: the hand-over), ``lost`` when ``on_lost``
  starts (the worker stops at once).
* ``deadline`` with ``until`` (seconds, or ``null``): the member's safety
  deadline (client/member_state/lease.py: "the safety rule") whenever it changes,
  polled every 5 ms; ``call`` events (each join/sync/heartbeat/leave answer,
  logged as it arrives) date the renewals exactly (``_renewal_times``).
* ``commit`` with ``sent``, ``res``, ``value``, ``member``, ``gen`` and
  ``outcome``: ``ok`` (acknowledged), ``refused`` (an error code),
  ``local`` (the library refused before sending) or ``unknown`` (no answer:
  the commit may or may not have been applied). A ``send`` line with the
  value is written before each commit is sent, so a commit in flight when the
  process died counts as ``unknown``.

Invariants (docs/reliability.md, "Safety under faults"):

1. *Exclusive ownership*: no two incarnations own one resource at the same
   moment. An incarnation's ownership of a resource runs from its ``assigned``
   to the first of: its ``revoked``/``lost``, its death (SIGKILL), the end of
   its ledger, and -- while it was frozen (SIGSTOP) -- the moment its own
   safety deadline passed without being renewed: a frozen worker cannot run
   ``on_lost``, but its rule says it must have stopped by then. (A running
   worker's rule shows in its own ``lost`` events.)
2. *Convergence*: at the check time (faults over + 2 session timeouts + the
   rebalance timeout) every resource of every group is owned exactly once,
   and nothing outside the catalog is owned.
3. *Durability*: after every coordinator restart, every resource's stored
   checkpoint is at least the last value acknowledged before the crash
   (values are monotonic clock readings, so a later owner's values are
   larger), and the final store holds only values that some commit sent.
   Where the read may come after later commits (after a restart of the
   database, with the coordinators already writing again), the weaker
   floor: each stored value is at least the last one acknowledged before
   the stop.
4. *Fencing*: a commit sent after the resource had moved to another owner
   is never acknowledged.
5. *Standbys are not owned* (warm-up): ``standby`` (``on_standby`` started),
   ``warm`` (it returned), ``standby_cancelled`` and ``standby_dropped``
   events never open or close ownership: only ``assigned``/``revoked``/
   ``lost`` do. No incarnation is given a resource as standby while it owns
   it, and no commit an incarnation sends (anything the library did not
   refuse itself) falls outside its own ownership of the resource: a standby
   is never acted on.
6. *Drained means empty*: an incarnation whose drain ended (``drained`` with
   ``ok`` true: ``drain()`` returned True, or the member the coordinator told
   to drain stopped cleanly) owns nothing from then on, by its own
   ``owned`` report and by its ownership intervals.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Resource = tuple[str, int]
Owner = tuple[str, int]  # (worker slot, incarnation)

INFINITY = float("inf")


@dataclass(frozen=True)
class Interval:
    owner: Owner
    resource: Resource
    start: float
    end: float
    #: why it ended: revoked, lost, killed, deadline, ledger-end
    why: str


@dataclass(frozen=True)
class Commit:
    owner: Owner
    member: str
    gen: int
    sent: float
    recv: float
    resources: tuple[Resource, ...]
    value: Any
    outcome: str


@dataclass
class CheckResult:
    violations: list[str] = field(default_factory=list)
    intervals: int = 0
    commits_ok: int = 0
    zombie_commits: int = 0
    zombie_commits_refused: int = 0
    durability_checks: int = 0
    #: seconds from the end of the faults to exactly-once ownership (-1: never)
    convergence_s: float = -1.0
    #: times exactly-once ownership was lost again after convergence, without
    #: an injected fault (a stalled process or storage on a loaded machine)
    disturbances: int = 0
    #: one worker's concurrent commits of a resource answered out of send order
    reordered_commits: int = 0
    #: ``on_lost`` calls (a member that lost its membership)
    lost_events: int = 0
    #: drains started (``drain`` events), ended with everything handed over
    #: (``drained`` ok), given up at their timeout (``drained`` not ok)
    drains: int = 0
    drains_done: int = 0
    drains_timed_out: int = 0
    #: ``on_standby`` calls, and those that ran to their end (``warm``)
    standbys: int = 0
    warmups_done: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Read one JSON-lines ledger; a torn last line (SIGKILL mid-write) is skipped."""
    events = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _res(raw: Iterable[Iterable[Any]]) -> list[Resource]:
    return [(str(s), int(i)) for s, i in raw]


#: how far a polled deadline may be from the send time + session timeout of
#: the call that set it (the member reads its clock a moment before the call).
_ANCHOR_SLACK_S = 0.05


def _renewal_times(events: list[dict[str, Any]]) -> dict[float, float]:
    """deadline value -> when the answer that set it arrived.

    The worker polls its member's deadline every few milliseconds, so a
    renewal is logged a little after it happened; under load that lag can
    straddle the old deadline. Each successful join/sync/heartbeat is logged
    the moment its answer arrives (``call`` events), and the deadline it sets
    is its send time plus the session timeout: match the two to date each
    renewal exactly.
    """
    start = next((e for e in events if e["ev"] == "start"), None)
    if start is None or "session_timeout_ms" not in start:
        return {}
    st = start["session_timeout_ms"] / 1000
    renewals = sorted((e["sent"] + st, e["t"]) for e in events
                      if e["ev"] == "call" and e.get("error") is None
                      and e.get("api") in ("join", "sync", "heartbeat"))
    out: dict[float, float] = {}
    for mark in (e for e in events if e["ev"] == "deadline" and e["until"] is not None):
        until = mark["until"]
        close = [(abs(u - until), t) for u, t in renewals
                 if until - _ANCHOR_SLACK_S <= u <= until + _ANCHOR_SLACK_S]
        if close:
            out[until] = min(close)[1]
    return out


def _deadline_expiries(events: list[dict[str, Any]], end: float) -> list[float]:
    """Moments the incarnation's safety deadline passed before it was renewed."""
    renewed_at = _renewal_times(events)
    marks = [(min(e["t"], renewed_at.get(e["until"], e["t"])), e["until"])
             for e in events if e["ev"] == "deadline"]
    expiries = []
    for i, (t, until) in enumerate(marks):
        if until is None:
            continue
        next_t = marks[i + 1][0] if i + 1 < len(marks) else end
        if until < next_t:
            expiries.append(max(until, t))
    return expiries


def _incarnation_intervals(owner: Owner, events: list[dict[str, Any]], death: float,
                           frozen: list[tuple[float, float]]) -> list[Interval]:
    events = sorted(events, key=lambda e: e["t"])
    ledger_end = events[-1]["t"] if events else 0.0
    exited = any(e["ev"] == "exit" for e in events)
    hard_end = min(death, ledger_end if exited else INFINITY)
    # The rule's deadline ends ownership when the worker could not act on it
    # itself: it passed while the process was frozen. A running worker calls
    # on_lost at its deadline (logged), unless an answer renewing its lease
    # arrived first -- then its ownership really was continuous: that request
    # reset its session on the coordinator before the old deadline.
    expiries = [x for x in _deadline_expiries(events, hard_end)
                if any(stop <= x < cont for stop, cont in frozen)]
    opened: dict[Resource, float] = {}
    out: list[Interval] = []

    def close(r: Resource, at: float, why: str) -> None:
        start = opened.pop(r)
        # The safety rule: ownership ended when the deadline passed unrenewed.
        cut = next((x for x in expiries if start < x < at), None)
        if cut is not None:
            at, why = cut, "deadline"
        out.append(Interval(owner, r, start, at, why))

    for e in events:
        if e["t"] > hard_end:
            break
        if e["ev"] == "assigned":
            for r in _res(e["res"]):
                opened.setdefault(r, e["t"])
        elif e["ev"] in ("revoked", "lost"):
            for r in _res(e["res"]):
                if r in opened:
                    close(r, e["t"], e["ev"])
    for r in list(opened):
        if death < INFINITY:
            close(r, death, "killed")
        elif exited:
            close(r, ledger_end, "ledger-end")
        else:
            close(r, INFINITY, "running")
    return out


def ownership_intervals(worker_events: Mapping[Owner, list[dict[str, Any]]],
                        deaths: Mapping[Owner, float],
                        frozen: Mapping[Owner, list[tuple[float, float]]] | None = None,
                        ) -> list[Interval]:
    """Invariant 1's intervals, per incarnation and resource.

    ``frozen``: the (SIGSTOP, SIGCONT) periods of each incarnation.
    """
    intervals: list[Interval] = []
    for owner, events in worker_events.items():
        intervals += _incarnation_intervals(owner, events, deaths.get(owner, INFINITY),
                                            (frozen or {}).get(owner, []))
    return intervals


def check_exclusive(intervals: list[Interval]) -> list[str]:
    by_resource: dict[Resource, list[Interval]] = defaultdict(list)
    for iv in intervals:
        if iv.end > iv.start:
            by_resource[iv.resource].append(iv)
    problems = []
    for r, ivs in sorted(by_resource.items()):
        ivs.sort(key=lambda iv: iv.start)
        for i, a in enumerate(ivs):
            for b in ivs[i + 1:]:
                if b.start >= a.end:
                    break
                if b.owner != a.owner:
                    problems.append(
                        f"{r[0]}[{r[1]}] owned by {a.owner} [{a.start:.3f}, {a.end:.3f} "
                        f"{a.why}] and {b.owner} [{b.start:.3f}, {b.end:.3f} {b.why}] "
                        f"at once ({min(a.end, b.end) - b.start:.3f}s overlap)")
    return problems


def owners_at(intervals: list[Interval], t: float) -> dict[Resource, list[Owner]]:
    owners: dict[Resource, list[Owner]] = defaultdict(list)
    for iv in intervals:
        if iv.start <= t < iv.end:
            owners[iv.resource].append(iv.owner)
    return owners


def check_converged(intervals: list[Interval], t: float,
                    expected: Mapping[str, set[Resource]],
                    group_of: Mapping[Owner, str]) -> list[str]:
    """Invariant 2 at time ``t``: ``expected`` maps group -> resources it must own."""
    problems = []
    owners = owners_at(intervals, t)
    for group, resources in sorted(expected.items()):
        for r in sorted(resources):
            got = [o for o in owners.get(r, []) if group_of.get(o) == group]
            if len(got) != 1:
                problems.append(f"group {group}: {r[0]}[{r[1]}] has {len(got)} owners "
                                f"{got} at the convergence deadline")
        extra = sorted({r for r, os in owners.items()
                        for o in os if group_of.get(o) == group} - resources)
        if extra:
            problems.append(f"group {group}: owns resources outside the catalog: {extra}")
    return problems


def converged_since(intervals: list[Interval], start: float, end: float,
                    expected: Mapping[str, set[Resource]],
                    group_of: Mapping[Owner, str]) -> float | None:
    """When ownership became exactly-once and stayed so until ``end``, or None."""
    segments = exactly_once_segments(intervals, start, end, expected, group_of)
    if segments and segments[-1][1] >= end:
        return segments[-1][0]
    return None


def first_stable_convergence(intervals: list[Interval], start: float, end: float,
                             expected: Mapping[str, set[Resource]],
                             group_of: Mapping[Owner, str],
                             hold: float) -> tuple[float | None, int]:
    """(When ownership first became exactly-once for at least ``hold`` seconds
    (or until ``end``), how many times it was disturbed after that)."""
    segments = exactly_once_segments(intervals, start, end, expected, group_of)
    for i, (a, b) in enumerate(segments):
        if b - a >= hold or b >= end:
            return a, len(segments) - i - 1 + (0 if segments[-1][1] >= end else 1)
    return None, 0


def exactly_once_segments(intervals: list[Interval], start: float, end: float,
                          expected: Mapping[str, set[Resource]],
                          group_of: Mapping[Owner, str]) -> list[tuple[float, float]]:
    """The stretches of ``[start, end)`` in which ownership was exactly-once.

    A sweep over the interval boundaries, keeping owner counts per (group,
    resource): linear in the number of intervals, so the harness can afford
    it (a quadratic scan stalled its event loop).
    """
    counts: dict[tuple[str, Resource], int] = defaultdict(int)
    bad = {(g, r) for g, rs in expected.items() for r in rs}

    def apply(group: str, r: Resource, delta: int) -> None:
        key = (group, r)
        counts[key] += delta
        wanted = r in expected.get(group, set())
        if (counts[key] != 1) if wanted else (counts[key] > 0):
            bad.add(key)
        else:
            bad.discard(key)

    changes: list[tuple[float, int, str, Resource]] = []
    for iv in intervals:
        group = group_of.get(iv.owner)
        if group is None or iv.end <= start or iv.start >= end or iv.end <= iv.start:
            continue
        if iv.start <= start:
            apply(group, iv.resource, +1)
        else:
            changes.append((iv.start, +1, group, iv.resource))
        if iv.end < end:
            changes.append((iv.end, -1, group, iv.resource))
    segments: list[tuple[float, float]] = []
    good_since: float | None = start if not bad else None
    changes.sort(key=lambda c: c[0])
    i = 0
    while i < len(changes):
        at = changes[i][0]
        while i < len(changes) and changes[i][0] == at:
            _, delta, group, r = changes[i]
            apply(group, r, delta)
            i += 1
        if bad and good_since is not None:
            segments.append((good_since, at))
            good_since = None
        elif not bad and good_since is None:
            good_since = at
    if good_since is not None:
        segments.append((good_since, end))
    return segments


def commits_of(worker_events: Mapping[Owner, list[dict[str, Any]]]) -> list[Commit]:
    """Every commit; one sent but never answered (the process died) is ``unknown``."""
    out = []
    for owner, events in worker_events.items():
        answered = {e["value"] for e in events if e["ev"] == "commit"}
        for e in events:
            if e["ev"] == "commit":
                out.append(Commit(owner, e.get("member", ""), e.get("gen", -1), e["sent"],
                                  e["t"], tuple(_res(e["res"])), e["value"], e["outcome"]))
            elif e["ev"] == "send" and e["value"] not in answered:
                out.append(Commit(owner, e.get("member", ""), e.get("gen", -1), e["sent"],
                                  INFINITY, tuple(_res(e["res"])), e["value"], "unknown"))
    return out


def check_fencing(intervals: list[Interval], commits: list[Commit],
                  result: CheckResult) -> list[str]:
    """Invariant 4: a commit sent after its resource moved on is never acknowledged."""
    by_resource: dict[Resource, list[Interval]] = defaultdict(list)
    for iv in intervals:
        by_resource[iv.resource].append(iv)
    problems = []
    for c in commits:
        for r in c.resources:
            own = [iv for iv in by_resource[r] if iv.owner == c.owner and iv.start <= c.sent]
            if not own:
                continue  # never owned it: the library refuses such commits itself
            mine = max(own, key=lambda iv: iv.start)
            moved = any(iv.owner != c.owner and mine.start < iv.start <= c.sent
                        for iv in by_resource[r])
            if not moved:
                continue
            result.zombie_commits += 1
            if c.outcome == "ok":
                problems.append(f"zombie commit acknowledged: {c.owner} committed "
                                f"{r[0]}[{r[1]}]={c.value} (generation {c.gen}) at "
                                f"{c.sent:.3f}, after the resource moved to another owner")
            else:
                result.zombie_commits_refused += 1
    return problems


def check_durability(commits: list[Commit], crash_at: float,
                     stored: Mapping[Resource, Any], *, final: bool) -> list[str]:
    """Invariant 3 for one restart: what was acknowledged before ``crash_at`` survived.

    The stored value must be one the store may legitimately hold: a commit
    (acknowledged, or unanswered: it may have arrived late) sent before the
    crash that no acknowledged commit *sent after it was answered* superseded.
    Commits in flight at the same time are unordered (separate connections),
    so any of them may be the last one applied.
    """
    by_resource: dict[Resource, list[Commit]] = defaultdict(list)
    for c in commits:
        for r in c.resources:
            by_resource[r].append(c)
    problems = []
    for r, cs in sorted(by_resource.items()):
        acked = [c for c in cs if c.outcome == "ok" and c.recv <= crash_at]
        candidates = [c for c in cs if c.outcome in ("ok", "unknown") and c.sent <= crash_at]
        allowed = {c.value for c in candidates
                   if not any(a.sent > c.recv for a in acked)}
        got = stored.get(r)
        if acked and got is None:
            last = max(acked, key=lambda c: c.recv)
            problems.append(f"{r[0]}[{r[1]}]: acknowledged checkpoint {last.value} lost "
                            f"(nothing stored) after the crash at {crash_at:.3f}")
        elif acked and got not in allowed:
            last = max(acked, key=lambda c: c.recv)
            problems.append(f"{r[0]}[{r[1]}]: stored {got!r} was superseded by the acknowledged "
                            f"{last.value} before the crash at {crash_at:.3f}")
    if final:
        sent_values = {r: {c.value for c in cs if c.outcome in ("ok", "unknown")}
                       for r, cs in by_resource.items()}
        for r, got in sorted(stored.items()):
            if got not in sent_values.get(r, set()):
                problems.append(f"{r[0]}[{r[1]}]: stored {got!r} was never committed by an "
                                "owner (or only by a refused commit)")
    return problems


def check_durability_floor(commits: list[Commit], stop_at: float,
                           stored: Mapping[Resource, Any]) -> list[str]:
    """Invariant 3 read late: each resource's stored checkpoint is at least the last
    value acknowledged before ``stop_at``. Values are clock readings and ownership is
    exclusive, so a commit acknowledged later can only have stored a larger one."""
    last: dict[Resource, Commit] = {}
    for c in commits:
        if c.outcome != "ok" or c.recv > stop_at:
            continue
        for r in c.resources:
            if r not in last or c.value > last[r].value:
                last[r] = c
    problems = []
    for r, c in sorted(last.items()):
        got = stored.get(r)
        if got is None or got < c.value:
            problems.append(f"{r[0]}[{r[1]}]: stored {got!r} after the restart at "
                            f"{stop_at:.3f}, below the acknowledged {c.value} (committed "
                            f"by {c.owner} at {c.sent:.3f})")
    return problems


def reordered_commits(commits: list[Commit]) -> int:
    """Pairs of one incarnation's acknowledged commits of a resource answered in
    the opposite order to the one they were sent in (concurrent requests)."""
    count = 0
    by_key: dict[tuple[Owner, Resource], list[Commit]] = defaultdict(list)
    for c in commits:
        if c.outcome == "ok":
            for r in c.resources:
                by_key[(c.owner, r)].append(c)
    for cs in by_key.values():
        cs.sort(key=lambda c: c.sent)
        count += sum(1 for a, b in itertools.pairwise(cs) if b.recv < a.recv)
    return count


def raw_intervals(worker_events: Mapping[Owner, list[dict[str, Any]]],
                  deaths: Mapping[Owner, float]) -> list[Interval]:
    """Ownership as each incarnation saw it: from ``assigned`` to its own
    ``revoked``/``lost``, its death or its exit, with no safety-deadline cut
    (what the worker itself may act on)."""
    return ownership_intervals(worker_events, deaths, None)


def check_standbys(worker_events: Mapping[Owner, list[dict[str, Any]]],
                   intervals: list[Interval], commits: list[Commit],
                   result: CheckResult) -> list[str]:
    """Invariant 5 over ``raw_intervals``: no standby of an owned resource, no
    commit outside the sender's ownership."""
    mine: dict[tuple[Owner, Resource], list[Interval]] = defaultdict(list)
    for iv in intervals:
        mine[(iv.owner, iv.resource)].append(iv)

    def owned(owner: Owner, r: Resource, t: float) -> bool:
        return any(iv.start <= t <= iv.end for iv in mine[(owner, r)])

    problems = []
    for owner, events in sorted(worker_events.items()):
        for e in events:
            if e["ev"] == "standby":
                result.standbys += 1
                both = [r for r in _res(e["res"]) if any(
                    iv.start <= e["t"] < iv.end for iv in mine[(owner, r)])]
                if both:
                    problems.append(f"{owner} was given {both} as standby at {e['t']:.3f} "
                                    "while it owned them")
            elif e["ev"] == "warm":
                result.warmups_done += 1
    for c in commits:
        if c.outcome == "local":
            continue  # the library refused it before sending: nothing was acted on
        outside = [r for r in c.resources if not owned(c.owner, r, c.sent)]
        if outside:
            standby = _standby_at(worker_events.get(c.owner, []), c.sent)
            what = [f"{r[0]}[{r[1]}]" + (" (a standby)" if r in standby else "")
                    for r in outside]
            problems.append(f"{c.owner} committed {', '.join(what)} at {c.sent:.3f} "
                            f"(outcome {c.outcome}) without owning it")
    return problems


def _standby_at(events: list[dict[str, Any]], t: float) -> set[Resource]:
    """The resources an incarnation held as standby at ``t``."""
    held: set[Resource] = set()
    for e in sorted(events, key=lambda e: e["t"]):
        if e["t"] > t:
            break
        if e["ev"] == "standby":
            held |= set(_res(e["res"]))
        elif e["ev"] in ("assigned", "standby_dropped"):
            held -= set(_res(e["res"]))
    return held


def check_drained(worker_events: Mapping[Owner, list[dict[str, Any]]],
                  intervals: list[Interval], result: CheckResult) -> list[str]:
    """Invariant 6 over ``raw_intervals``: a finished drain leaves nothing owned."""
    problems = []
    for owner, events in sorted(worker_events.items()):
        # A drain that ended before the worker's 5 ms poll saw it logs only ``drained``.
        result.drains += any(e["ev"] in ("drain", "drained") for e in events)
        for e in events:
            if e["ev"] != "drained":
                continue
            if not e["ok"]:
                result.drains_timed_out += 1
                continue
            result.drains_done += 1
            held = sorted({iv.resource for iv in intervals
                           if iv.owner == owner and iv.end > e["t"]})
            if e.get("owned") or held:
                problems.append(f"{owner} drained at {e['t']:.3f} but still owned "
                                f"{_res(e.get('owned') or []) or held}")
    return problems
