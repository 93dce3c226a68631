"""``balanced``: cooperative placement by load, capacity and home zone
(docs/protocol.md, "The `balanced` assignor (client side)"; the rules and a
worked example are in docs/assignors.md).

The plan, in passes over one shared state (each resource's planned member,
each member's planned load):

1. Loads. A resource weighs what its owner measured (``Subscription.load``)
   or else its catalog weight (``ResourceSet``). Every member has a band:
   ``ideal = u * capacity`` with ``u = total load / total capacity``;
   ``high = (1 + band) * capacity * max(u, largest / largest capacity)``;
   ``low = (1 - band) * ideal``.
2. Drain: a draining member keeps nothing in the plan.
3. Zones: a kept resource outside its home zones moves home when a member
   there has room (stays under its ``high``).
4. Fill: the resources without a member (new, orphaned, drained), homed ones
   first, each heaviest first, go to the least loaded member per capacity of
   a home zone with room, else of the whole group (longest processing time
   first, over heaps).
5. Over: while the busiest member (load per capacity) is above its ``high``,
   its heaviest resource that leaves it at or above ``low`` moves to the
   member where it lands lowest, if that lowers the busiest; until it is
   halfway back inside the band.
6. Under: a member below its ``low`` takes, from the busiest members, the
   heaviest resource each can spare (down to their ideal, or halfway inside
   their band while it is not yet halfway inside its own; never taking a
   resource out of a home zone it is in); up to its ideal.

Then the round: at most ``max_moves`` revocations (drain first, then the
heaviest), held back under warm-up until the receiver reports the resource
warm; KIP-429's rule is kept by construction (a moving resource is revoked
this round and handed to the member it was meant for in the follow-up).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import ClassVar

from ._claims import Claims, read_claims
from ._echo import Echo, encode_echo, read_echo
from ._gc import paused_gc
from ._layout import Layout, Members, clean_catalog, read_members
from .model import Assignment, RebalanceProtocol, Resources, ResourceSet, Subscription, Why

__all__ = ["BalancedAssignor"]

#: causes whose move waits for the receiver to warm up (docs/protocol.md): every
#: move of a resource that has a live owner meanwhile (a member that joined is
#: given its share warm too, as Kafka Streams' warm-up replicas do, KIP-441).
WARMED = frozenset({"load", "zone", "capacity", "balance", "drain", "join"})

# Members tried per move in the "under" pass before giving up on a receiver.
_DONOR_TRIES = 64


@dataclass(frozen=True)
class BalancedAssignor:
    """``band``: relative half-width of the balanced range (0 <= band < 1);
    ``max_moves``: most revocations per round (None: no limit);
    ``warmup``: hand a moving resource to its new owner as ``standby`` first;
    ``warmup_timeout_ms``: move it anyway after this long (enforced when the
    caller passes ``now_ms``, as the leader does);
    ``round_delay_ms``: the ``delay_ms`` asked for while the group is not
    yet where the plan wants it."""

    band: float = 0.05
    max_moves: int | None = None
    warmup: bool = False
    warmup_timeout_ms: int = 60_000
    round_delay_ms: int = 1_000
    name: str = "balanced"
    protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.COOPERATIVE,)
    #: it places by ``Subscription.draining`` itself (client/leader.py).
    reads_draining: ClassVar[bool] = True

    def __post_init__(self) -> None:
        b = self.band
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not 0 <= b < 1:
            raise ValueError(f"balanced: band must be a number in [0, 1), got {b!r}")
        m = self.max_moves
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"balanced: max_moves must be None or an integer >= 1, got {m!r}")
        for key in ("warmup_timeout_ms", "round_delay_ms"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 2**31 - 1:
                raise ValueError(f"balanced: {key} must be an integer in [0, 2**31-1], got {v!r}")

    def assign(
        self,
        resources: Resources,
        subscriptions: Mapping[str, Subscription],
        now_ms: int | None = None,
    ) -> dict[str, Assignment]:
        catalog = clean_catalog(resources)
        with paused_gc(sum(catalog.values())):
            members = read_members(catalog, subscriptions)
            if not members.ids:
                return {}
            layout = Layout(members.names, catalog)
            claims = read_claims(layout, members)
            planner = _Planner(self, resources, catalog, layout, members, claims, now_ms)
            planner.plan()
            return planner.result()


@dataclass
class _Move:
    g: int
    src: int  # the member that owns it now
    cause: str


@dataclass
class _Round:
    revoke: list[list[_Move]] = field(default_factory=list)  # per source member
    standby: list[list[tuple[int, int | None]]] = field(default_factory=list)  # (g, since)
    #: per receiver: what its warm-up completed, revoked from its owner this
    #: round and handed over in the follow-up; still its standby meanwhile (so
    #: it keeps the warm state, never "dropped" between the two rounds), and
    #: in its echo (so the follow-up knows whose it is, should the revoker
    #: have left by then: a drain). (g, since)
    transit: list[list[tuple[int, int | None]]] = field(default_factory=list)
    truncated: bool = False
    next_deadline: int | None = None


class _Planner:
    def __init__(
        self,
        cfg: BalancedAssignor,
        resources: Resources,
        catalog: dict[str, int],
        layout: Layout,
        members: Members,
        claims: Claims,
        now_ms: int | None,
    ) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.layout = layout
        self.members = members
        self.claims = claims
        self.now_ms = now_ms
        ids, subs = members.ids, members.subs
        n_m = len(ids)
        self.index = {m: k for k, m in enumerate(ids)}
        self.cap = [float(s.capacity) for s in subs]
        self.zone = [s.rack for s in subs]
        self.draining = [bool(s.draining) for s in subs]
        self.echo: list[Echo | None] = [read_echo(s.user_data) for s in subs]

        # Weights: catalog, then what each (honoured) owner measured.
        w: list[float] = []
        home: dict[int, tuple[str, ...]] = {}
        for t, name in enumerate(layout.names):
            spec = resources[name]
            o, n = layout.offsets[t], layout.sizes[t]
            if isinstance(spec, ResourceSet):
                row = [spec.default_weight] * n
                for i, x in spec.weights.items():
                    if i < n:
                        row[i] = x
                w += row
                for i, z in spec.zones.items():
                    if i < n:
                        home[o + i] = z
            else:
                w += [1.0] * n
        self.base: list[float] | None = None
        owner = claims.owner
        #: resources whose owner measured them (the rest may carry a load).
        self.reported: set[int] = set()
        for m, sub in enumerate(subs):
            for name, loads in sub.load.items():
                pos = layout.position.get(name)
                if pos is None or not loads:
                    continue
                if self.base is None:
                    self.base = list(w)
                o, n = layout.offsets[pos], layout.sizes[pos]
                for i, x in loads.items():
                    if 0 <= i < n and owner[o + i] == m:
                        w[o + i] = float(x)
                        self.reported.add(o + i)
        # A resource changing hands has no owner to report it: its load is
        # the one its last owner measured (kept in that owner's echo).
        for echo in self.echo:
            if echo is None:
                continue
            for (name, i), (_, _, carried) in echo.revoked.items():
                pos = layout.position.get(name)
                if carried is None or pos is None or not 0 <= i < layout.sizes[pos]:
                    continue
                g = layout.offsets[pos] + i
                if owner[g] < 0:
                    if self.base is None:
                        self.base = list(w)
                    w[g] = carried
        # A resource handed over weighs what it was measured at until its new
        # owner measures it (carried in that owner's echo): planned at its
        # catalog weight meanwhile, a hot resource would be handed on to a
        # member it overloads, which rejoins on its load, and so on.
        for m, echo in enumerate(self.echo):
            if echo is None or not echo.carried:
                continue
            for (name, i), carried in echo.carried.items():
                pos = layout.position.get(name)
                if pos is None or not 0 <= i < layout.sizes[pos]:
                    continue
                g = layout.offsets[pos] + i
                if owner[g] == m and g not in self.reported:
                    if self.base is None:
                        self.base = list(w)
                    w[g] = carried
        self.w = w
        self.home = home

        # Who may hold what: per set, the active (non-draining) subscribers.
        sub_sets = [frozenset(s) for s in members.subscribed]
        self.sub_sets = sub_sets
        classes: dict[tuple[int, ...], int] = {}
        self.class_members: list[list[int]] = []
        self.set_class: list[int] = []
        subscribers: list[list[int]] = [[] for _ in layout.names]
        for m, sets in enumerate(members.subscribed):
            if not self.draining[m]:
                for t in sets:
                    subscribers[t].append(m)
        for t in range(len(layout.names)):
            who = tuple(subscribers[t])
            k = classes.get(who)
            if k is None:
                k = classes[who] = len(self.class_members)
                self.class_members.append(list(who))
            self.set_class.append(k)
        self.active = [not d for d in self.draining]
        #: the members that share the load: active and subscribed to something
        self.act = [m for m in range(n_m) if self.active[m] and sub_sets[m]]
        self.sharing = [False] * n_m
        for m in self.act:
            self.sharing[m] = True
        self.all_eligible = all(self.class_members)
        self.uniform = len(self.class_members) == 1 and len(self.class_members[0]) == len(self.act)

        # The plan's state.
        self.where = list(owner)
        self.load = [0.0] * n_m
        self.held: list[list[int]] = [[] for _ in range(n_m)]
        for m, kept in enumerate(claims.kept):
            gids: list[int] = []
            for t, indexes in kept.items():
                o = layout.offsets[t]
                gids += [o + i for i in indexes] if o else list(indexes)
            self.held[m] = gids
            self.load[m] = math.fsum(map(w.__getitem__, gids)) if gids else 0.0
        self.items: list[list[tuple[float, int]] | None] = [None] * n_m
        self.first_cause: dict[int, str] = {}  # g -> cause of its first planned move
        self.placed_cause: dict[int, str] = {}  # unowned g placed off its home zones
        #: under warm-up, hand-overs placed on the member that warmed them: no
        #: later pass gives them to another this round, which would get them
        #: unowned, so at once and cold (a member joining in the round a
        #: hand-over completes); a move from there waits for a warm-up again.
        self.pinned: set[int] = set()
        self.newcomer = [
            not s.owned and self.echo[m] is None for m, s in enumerate(subs)
        ]
        self._band_figures()
        self._heaps: dict[tuple[int, str | None], list[tuple[float, float, int]]] = {}
        self._member_heaps: list[list[list[tuple[float, float, int]]]] = [
            [] for _ in range(n_m)
        ]

    # ------------------------------------------------------------ the band

    def _band_figures(self) -> None:
        act = self.act
        cap = self.cap
        total_cap = math.fsum(cap[m] for m in act)
        # Load to share among active members: that of the sets some active
        # member subscribes to (the others stay where they are, or unassigned).
        if self.all_eligible:
            total = math.fsum(self.w)
        else:
            layout = self.layout
            total = math.fsum(
                math.fsum(self.w[layout.offsets[t]:layout.offsets[t] + layout.sizes[t]])
                for t in range(len(layout.names))
                if self.class_members[self.set_class[t]]
            )
        self.u = total / total_cap if total_cap > 0 else 0.0
        self.largest = max(self.w, default=0.0)
        top_cap = max((cap[m] for m in act), default=1.0)
        bound = max(self.u, self.largest / top_cap)
        band = self.cfg.band
        self.ideal = [self.u * c for c in cap]
        self.high = [(1 + band) * bound * c for c in cap]
        self.low = [(1 - band) * self.u * c for c in cap]
        # Where a correction stops: halfway back inside the band.
        self.hi_target = [max((1 + band / 2) * self.u, bound) * c for c in cap]
        self.lo_target = [(1 - band / 2) * self.u * c for c in cap]

    def _set_of(self, g: int) -> int:
        return bisect_right(self.layout.offsets, g) - 1

    def _eligible_any(self, g: int) -> bool:
        return self.all_eligible or bool(self.class_members[self.set_class[self._set_of(g)]])

    def _may_hold(self, m: int, t: int) -> bool:
        return self.active[m] and t in self.sub_sets[m]

    # ------------------------------------------------------------ state changes

    def _key(self, m: int) -> float:
        return self.load[m] / self.cap[m]

    def _add(self, m: int, g: int) -> None:
        self.where[g] = m
        self.load[m] += self.w[g]
        self.held[m].append(g)
        items = self.items[m]
        if items is not None:
            insort(items, (self.w[g], g))
        self._touch(m)

    def _remove(self, m: int, g: int) -> None:
        self.where[g] = -1
        self.load[m] -= self.w[g]
        items = self.items[m]
        if items is not None:
            items.remove((self.w[g], g))
        self._touch(m)

    def _touch(self, m: int) -> None:
        heaps = self._member_heaps[m]
        if heaps:
            entry = (self.load[m] / self.cap[m], -self.cap[m], m)
            for h in heaps:
                heapq.heappush(h, entry)

    def _move(self, g: int, src: int, dst: int, cause: str) -> None:
        self._remove(src, g)
        self._add(dst, g)
        if self.claims.owner[g] >= 0:
            self.first_cause.setdefault(g, cause)

    def _items(self, m: int) -> list[tuple[float, int]]:
        """``m``'s planned resources as ascending ``(weight, id)``."""
        items = self.items[m]
        if items is None:
            where, w = self.where, self.w
            items = sorted({(w[g], g) for g in self.held[m] if where[g] == m})
            self.items[m] = items
            self.held[m] = [g for _, g in items]
        return items

    # ------------------------------------------------------------ heaps

    def _build_heaps(self, zoned: bool) -> None:
        """Least-loaded heaps of ``(load / capacity, -capacity, member)``:
        per class and zone (``zoned``), else per class. Entries go stale
        when a load changes; every change pushes a fresh one (``_touch``)
        and readers drop stale ones (``_top``)."""
        self._heaps = {}
        self._member_heaps = [[] for _ in self.cap]
        for k, who in enumerate(self.class_members):
            for m in who:
                if zoned and self.zone[m] is None:
                    continue
                h = self._heaps.setdefault((k, self.zone[m] if zoned else None), [])
                h.append((self._key(m), -self.cap[m], m))
                self._member_heaps[m].append(h)
        for h in self._heaps.values():
            heapq.heapify(h)

    def _top(self, heap: list[tuple[float, float, int]]) -> int:
        load, cap = self.load, self.cap
        while True:
            key, _, m = heap[0]
            if key == load[m] / cap[m]:
                return m
            heapq.heappop(heap)

    # ------------------------------------------------------------ passes

    def plan(self) -> None:
        pool = self._handovers(self._drain())
        if self.home:
            self._build_heaps(zoned=True)
            self._zones()
        self._fill(pool)
        self._member_heaps = [[] for _ in self.cap]  # the later passes scan
        self._over()
        self._under()

    def _drain(self) -> list[int]:
        """Unowned resources and what draining members hold, in id order."""
        claims = self.claims
        pool = claims.free_ids()
        drained: list[int] = []
        for m in range(len(self.cap)):
            if self.active[m] or not self.held[m]:
                continue
            keep: list[int] = []
            for g in self.held[m]:
                if self._eligible_any(g):
                    self.where[g] = -1
                    self.load[m] -= self.w[g]
                    self.first_cause[g] = "drain"
                    drained.append(g)
                else:
                    keep.append(g)
            self.held[m] = keep
        if drained:
            pool = sorted(pool + drained)
        if self.all_eligible:
            return pool
        eligible: list[int] = []
        for g in pool:
            if self._eligible_any(g):
                eligible.append(g)
            elif g not in claims.contested:
                self._to_draining(g)
        return eligible

    def _to_draining(self, g: int) -> None:
        """``g``'s set has no active subscriber: the draining subscriber that
        holds the fewest takes it (left to nobody it would stay unserved, and
        the leader would start a follow-up rebalance after every round)."""
        t = self._set_of(g)
        who = [m for m in range(len(self.cap)) if not self.active[m] and t in self.sub_sets[m]]
        if who:
            self._add(min(who, key=lambda m: (len(self.held[m]), m)), g)

    def _zones(self) -> None:
        """Kept resources outside their home zones go home when there is room."""
        if not self.home:
            return
        w, where, zone = self.w, self.where, self.zone
        astray = [
            g
            for g, zs in self.home.items()
            if where[g] >= 0 and self.active[where[g]] and zone[where[g]] not in zs
            and g not in self.pinned
        ]
        astray.sort(key=lambda g: (-w[g], g))
        for g in astray:
            dst = self._home_with_room(g)
            if dst is not None:
                self._move(g, where[g], dst, "zone")

    def _home_with_room(self, g: int) -> int | None:
        k = self.set_class[self._set_of(g)]
        best: tuple[float, float, int] | None = None
        for z in self.home[g]:
            h = self._heaps.get((k, z))
            if h:
                self._top(h)  # drops stale entries
                if best is None or h[0] < best:
                    best = h[0]
        if best is None:
            return None
        m = best[2]
        return m if self.load[m] + self.w[g] <= self.high[m] else None

    def _handovers(self, pool: list[int]) -> list[int]:
        """A hand-over under way goes to the member it was meant for, before
        any other pass judges room: the zone pass would otherwise fill that
        member with another resource and push this one elsewhere (one move
        home per round, each undoing the last). Returns the rest of ``pool``."""
        meant = self._meant_receivers()
        if not meant:
            return pool
        rest: list[int] = []
        for g in pool:
            m = meant.get(g)
            if m is not None and self._may_hold(m, self._set_of(g)):
                self._add(m, g)
                if self.cfg.warmup:
                    self.pinned.add(g)
            else:
                rest.append(g)
        return rest

    def _fill(self, pool: list[int]) -> None:
        w = self.w
        # Weightless resources are dealt out by count: by load they would
        # all go to the same member.
        weightless = [g for g in pool if w[g] <= 0.0]
        if weightless:
            pool = [g for g in pool if w[g] > 0.0]
            self._deal(weightless)
        homed = [g for g in pool if g in self.home] if self.home else []
        if homed:
            pool = [g for g in pool if g not in self.home]
            homed.sort(key=w.__getitem__, reverse=True)
            # Those with no room at home join the others, heaviest first.
            pool += self._fill_homed(homed)
        self._build_heaps(zoned=False)
        pool.sort(key=w.__getitem__, reverse=True)
        if self.uniform:
            self._fill_one_class(pool)
            return
        for g in pool:
            m = self._top(self._heaps[(self.set_class[self._set_of(g)], None)])
            if g in self.home and self.zone[m] not in self.home[g]:
                self.placed_cause[g] = "balance"
            self._add(m, g)

    def _fill_homed(self, homed: list[int]) -> list[int]:
        """Each (heaviest first) to the least loaded member of a home zone
        with room; returns those that found none."""
        self._build_heaps(zoned=True)  # exact again after the earlier passes
        if not self.uniform:
            return self._fill_homed_any(homed)
        # One class: resources with one home zone compete only within it,
        # so each zone is filled on its own, its heap kept exact.
        load, cap, high, w, where, held = (
            self.load, self.cap, self.high, self.w, self.where, self.held
        )
        by_zone: dict[tuple[str, ...], list[int]] = {}
        for g in homed:
            by_zone.setdefault(self.home[g], []).append(g)
        replace = heapq.heapreplace
        homeless: list[int] = []
        several: list[int] = []
        for zs, gs in by_zone.items():
            if len(zs) > 1:
                several += gs
                continue
            h = self._heaps.get((0, zs[0]))
            if not h:
                homeless += gs
                continue
            for g in gs:
                _, negcap, m = h[0]
                x = load[m] + w[g]
                if x > high[m]:
                    homeless.append(g)
                    continue
                load[m] = x
                where[g] = m
                held[m].append(g)
                replace(h, (x / cap[m], negcap, m))
        if several:
            several.sort(key=w.__getitem__, reverse=True)
            homeless += self._fill_homed_any(several)
        return homeless

    def _fill_homed_any(self, homed: list[int]) -> list[int]:
        """The general case: several classes or several home zones."""
        load, cap, high, w, where, held = (
            self.load, self.cap, self.high, self.w, self.where, self.held
        )
        heaps, member_heaps, home = self._heaps, self._member_heaps, self.home
        pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
        uniform = self.uniform
        homeless: list[int] = []
        for g in homed:
            k = 0 if uniform else self.set_class[self._set_of(g)]
            x = w[g]
            best: tuple[float, float, int] | None = None
            best_heap: list[tuple[float, float, int]] = []
            for z in home[g]:
                h = heaps.get((k, z))
                if not h:
                    continue
                while True:
                    e = h[0]
                    if e[0] == load[e[2]] / cap[e[2]]:
                        break
                    pop(h)
                if best is None or e < best:
                    best, best_heap = e, h
            if best is None or load[best[2]] + x > high[best[2]]:
                homeless.append(g)
                continue
            m = best[2]
            load[m] += x
            where[g] = m
            held[m].append(g)
            entry = (load[m] / cap[m], best[1], m)
            hs = member_heaps[m]
            if len(hs) == 1:
                replace(best_heap, entry)
            else:
                for h in hs:
                    push(h, entry)
        return homeless

    def _deal(self, pool: list[int]) -> None:
        cap = self.cap
        counts = [len(h) for h in self.held]
        heaps: dict[int, list[tuple[float, int]]] = {}
        for g in pool:
            k = self.set_class[self._set_of(g)]
            zs = self.home.get(g)
            if zs is not None:  # by count among its home zones, if present
                near = [m for m in self.class_members[k] if self.zone[m] in zs]
                if near:
                    m = min(near, key=lambda q: (counts[q] / cap[q], q))
                    counts[m] += 1
                    self._add(m, g)
                    continue
            h = heaps.get(k)
            if h is None:
                h = heaps[k] = [(counts[m] / cap[m], m) for m in self.class_members[k]]
                heapq.heapify(h)
            while True:  # a member of several classes may have moved on
                key, m = h[0]
                if key == counts[m] / cap[m]:
                    break
                heapq.heapreplace(h, (counts[m] / cap[m], m))
            counts[m] += 1
            heapq.heapreplace(h, (counts[m] / cap[m], m))
            self._add(m, g)

    def _fill_one_class(self, pool: list[int]) -> None:
        """The common case, one class of members, each in one heap: the heap
        stays exact (the member placed on is always the top)."""
        if not pool:
            return
        heap = self._heaps[(0, None)]
        load, cap, w, where, held = self.load, self.cap, self.w, self.where, self.held
        home, zone, placed = self.home, self.zone, self.placed_cause
        pop, replace = heapq.heappop, heapq.heapreplace
        while True:  # entries left stale by the earlier passes
            key, negcap, m = heap[0]
            if key == load[m] / cap[m]:
                break
            pop(heap)
        for g in pool:
            key, negcap, m = heap[0]
            x = load[m] + w[g]
            load[m] = x
            where[g] = m
            held[m].append(g)
            replace(heap, (x / cap[m], negcap, m))
        if home:
            for g in pool:
                zs = home.get(g)
                if zs is not None and zone[where[g]] not in zs:
                    placed[g] = "balance"

    def _meant_receivers(self) -> dict[int, int]:
        """Resources nobody owns that a member was meant to get: named as
        the receiver of last round's revocation, or (its owner gone) holding
        it as a standby."""
        out: dict[int, int] = {}
        position, offsets, sizes = self.layout.position, self.layout.offsets, self.layout.sizes
        owner, contested = self.claims.owner, self.claims.contested

        def note(name: str, i: int, m: int | None) -> None:
            t = position.get(name)
            if t is not None and m is not None and 0 <= i < sizes[t]:
                g = offsets[t] + i
                if owner[g] < 0 and g not in contested:
                    out.setdefault(g, m)

        for echo in self.echo:
            if echo is not None:
                for (name, i), (_, to, _) in echo.revoked.items():
                    note(name, i, self.index.get(to) if to is not None else None)
        for m, echo in enumerate(self.echo):
            if echo is not None:
                for name, i in echo.standby:
                    note(name, i, m)
        return out

    def _over(self) -> None:
        """Shed from the busiest member while it is above its ``high``."""
        act = self.act
        stuck: set[int] = set()
        budget = 4 * len(self.w) + 16
        while budget > 0:
            budget -= 1
            d = max(
                (m for m in act if m not in stuck),
                key=lambda m: (self.load[m] / self.cap[m], -m),
                default=None,
            )
            if d is None or self.load[d] <= self.high[d] * (1 + 1e-12):
                return
            while self.load[d] > self.hi_target[d] and budget > 0:
                budget -= 1
                if not self._shed_one(d, act):
                    stuck.add(d)
                    break

    def _shed_one(self, d: int, act: list[int]) -> bool:
        items = self._items(d)
        if not items:
            return False
        room = self.load[d] - self.low[d]
        top = bisect_right(items, (room, math.inf))
        # Heaviest that keeps d at or above low first, then the lighter ones.
        order = list(range(top - 1, -1, -1)) + list(range(top, len(items)))
        now = self.load[d] / self.cap[d]
        load, cap, high = self.load, self.cap, self.high
        # First a move that leaves the receiver inside its band; failing
        # that, any move that lowers the busiest.
        for inside in (True, False):
            for pos in order[:_DONOR_TRIES]:
                x, g = items[pos]
                if x <= 0.0 or g in self.pinned:
                    continue
                for dst in self._receivers(g, x, self._set_of(g), act, d):
                    after = load[dst] + x
                    if after / cap[dst] < now and (not inside or after <= high[dst]):
                        self._move(g, d, dst, self._cause(d, dst, g))
                        return True
        return False

    def _receivers(self, g: int, x: float, t: int, act: list[int], d: int) -> list[int]:
        """Where ``g`` would land lowest: in a home zone with room first,
        then anywhere (balance first)."""
        load, cap, high = self.load, self.cap, self.high
        zs = self.home.get(g)
        best: int | None = None
        best_home: int | None = None
        best_key = best_home_key = math.inf
        for m in act:
            if m == d or t not in self.sub_sets[m]:
                continue
            key = (load[m] + x) / cap[m]
            if key < best_key:
                best, best_key = m, key
            if zs is not None and self.zone[m] in zs and key < best_home_key:
                best_home, best_home_key = m, key
        out = [] if best is None else [best]
        if best_home is not None and best_home != best and load[best_home] + x <= high[best_home]:
            out.insert(0, best_home)
        return out

    def _cause(self, d: int, j: int, g: int) -> str:
        """Why ``g`` moves from ``d`` to ``j`` for balance (docs/assignors.md,
        "Why"): ``d``'s capacity fell (``capacity``); ``g`` or ``d`` measured
        more than the catalog says, enough to explain ``d``'s excess
        (``load``); ``j`` is new (``join``); ``j``'s capacity grew
        (``capacity``); else ``balance``."""
        if self._capacity_changed(d) < 0:
            return "capacity"
        base = self.base
        if base is not None:
            measured_excess = math.fsum(
                self.w[h] - base[h] for _, h in self._items(d) if self.w[h] > base[h]
            )
            if self.w[g] > base[g] or (
                measured_excess > 0 and self.load[d] - measured_excess <= self.high[d]
            ):
                return "load"
        if self.newcomer[j]:
            return "join"
        if self._capacity_changed(j) > 0:
            return "capacity"
        return "balance"

    def _capacity_changed(self, m: int) -> int:
        """-1, 0 or 1: ``m``'s capacity fell, stayed or grew since the last
        round (as its echo says)."""
        echo = self.echo[m]
        if echo is None or echo.capacity is None or echo.capacity == self.cap[m]:
            return 0
        return -1 if self.cap[m] < echo.capacity else 1

    def _under(self) -> None:
        """A member below its ``low`` takes from the busiest members."""
        act = self.act
        load, cap = self.load, self.cap
        under = sorted(
            (m for m in act if load[m] < self.low[m] * (1 - 1e-12)),
            key=lambda m: (load[m] / cap[m], m),
        )
        for j in under:
            donors = [(-load[m] / cap[m], m) for m in act if m != j]
            heapq.heapify(donors)
            # Donors give down to their ideal first (so that the load comes
            # evenly off the busiest), down to their lo_target only while j
            # is not halfway inside its band; once it is, j goes on taking
            # up to its ideal from donors above theirs.
            while load[j] < self.ideal[j]:
                moved = False
                inside = load[j] >= self.lo_target[j]
                for floor in (self.ideal,) if inside else (self.ideal, self.lo_target):
                    set_aside: list[tuple[float, int]] = []
                    while donors and len(set_aside) < _DONOR_TRIES:
                        negkey, d = heapq.heappop(donors)
                        if -negkey != load[d] / cap[d]:
                            heapq.heappush(donors, (-load[d] / cap[d], d))
                            continue
                        set_aside.append((negkey, d))
                        g = self._spare(d, j, floor[d])
                        if g is not None:
                            self._move(g, d, j, self._cause(d, j, g))
                            set_aside[-1] = (-load[d] / cap[d], d)
                            moved = True
                            break
                    for entry in set_aside:
                        heapq.heappush(donors, entry)
                    if moved:
                        break
                if not moved:
                    break

    def _spare(self, d: int, j: int, floor: float) -> int | None:
        """The heaviest resource ``d`` can give ``j``: ``d`` stays at or above
        ``floor``, ``j`` at or below its ``hi_target``, the move lowers the
        higher of the two, and no resource leaves its home zone (only an
        overloaded member's resources do that, in ``_over``)."""
        load, cap = self.load, self.cap
        limit = min(load[d] - floor, self.hi_target[j] - load[j])
        if limit <= 0:
            return None
        items = self._items(d)
        pos = bisect_right(items, (limit, math.inf))
        dkey = load[d] / cap[d]
        for k in range(pos - 1, max(-1, pos - 1 - _DONOR_TRIES), -1):
            x, g = items[k]
            if x <= 0.0 or (load[j] + x) / cap[j] >= dkey or g in self.pinned:
                continue
            if not self.uniform and not self._may_hold(j, self._set_of(g)):
                continue
            zs = self.home.get(g)
            if zs is None or self.zone[j] in zs or self.zone[d] not in zs:
                return g
        return None

    # ------------------------------------------------------------ the round

    def _round(self) -> _Round:
        """Which planned moves happen now: at most ``max_moves`` (drain
        first, then heaviest), and under warm-up only those whose receiver
        is warm (or whose warm-up timed out)."""
        n_m = len(self.cap)
        owner, where, w = self.claims.owner, self.where, self.w
        moves = [
            _Move(g, owner[g], self.first_cause.get(g, "balance"))
            for g in sorted(self.first_cause)
            if owner[g] >= 0 and where[g] != owner[g]
        ]
        rnd = _Round([[] for _ in range(n_m)], [[] for _ in range(n_m)],
                     [[] for _ in range(n_m)])
        limit = self.cfg.max_moves
        if limit is not None and len(moves) > limit:
            moves.sort(key=lambda mv: (mv.cause != "drain", -w[mv.g], mv.g))
            rnd.truncated = True
            for mv in moves[limit:]:
                self._cancel(mv)
            moves = sorted(moves[:limit], key=lambda mv: mv.g)
        for mv in moves:
            dst = where[mv.g]
            if self.cfg.warmup and mv.cause in WARMED and dst >= 0:
                ready, since = self._warm(dst, mv.g)
                if not ready:
                    rnd.standby[dst].append((mv.g, since))
                    self._cancel(mv)
                    if since is not None and self.now_ms is not None:
                        due = since + self.cfg.warmup_timeout_ms
                        if rnd.next_deadline is None or due < rnd.next_deadline:
                            rnd.next_deadline = due
                    continue
                if since is not None:
                    # Its warm-up ran out of time (``_warm``): it moves cold,
                    # and its why says so, on both sides of the hand-over.
                    mv = _Move(mv.g, mv.src, "warm_timeout")
                rnd.transit[dst].append((mv.g, since))
            rnd.revoke[mv.src].append(mv)
        return rnd

    def _cancel(self, mv: _Move) -> None:
        dst = self.where[mv.g]
        if dst >= 0:
            self.load[dst] -= self.w[mv.g]
        self.where[mv.g] = mv.src
        self.load[mv.src] += self.w[mv.g]

    def _key_of(self, g: int) -> tuple[str, int]:
        t = self._set_of(g)
        return self.layout.names[t], g - self.layout.offsets[t]

    def _warm(self, m: int, g: int) -> tuple[bool, int | None]:
        """Is ``g`` warm on ``m`` (reported, or its warm-up timed out)? And
        since when ``m`` has had it as standby."""
        name, i = self._key_of(g)
        sub = self.members.subs[m]
        if i in sub.warm.get(name, ()):
            return True, None
        echo = self.echo[m]
        since = echo.standby.get((name, i)) if echo is not None else None
        if since is None:
            return False, self.now_ms
        if self.now_ms is not None and self.now_ms - since >= self.cfg.warmup_timeout_ms:
            return True, since
        return False, since

    def result(self) -> dict[str, Assignment]:
        rnd = self._round()
        layout, claims, members = self.layout, self.claims, self.members
        names, offsets = layout.names, layout.offsets
        where = self.where
        n_m = len(members.ids)

        gains: list[list[int]] = [[] for _ in range(n_m)]
        # What the plan puts on a member that this assignment does not give
        # it: a contested resource, one its owner revokes this round.
        coming = [0.0] * n_m
        w = self.w
        for g in claims.free_ids():
            m = where[g]
            if m >= 0:
                if g in claims.contested:
                    coming[m] += w[g]
                else:
                    gains[m].append(g)
        for moves in rnd.revoke:
            for mv in moves:
                if where[mv.g] >= 0:
                    coming[where[mv.g]] += w[mv.g]
        gain_cause = self._gain_causes()
        sizes = dict(self.catalog)
        top = max((s.generation for s in members.subs if s.owned), default=-1)
        delay = 0
        if rnd.truncated:
            delay = self.cfg.round_delay_ms
        if rnd.next_deadline is not None and self.now_ms is not None:
            wait = max(1, rnd.next_deadline - self.now_ms)
            delay = wait if delay == 0 else min(delay, wait)
        elif any(rnd.standby) and delay == 0:
            delay = self.cfg.warmup_timeout_ms or self.cfg.round_delay_ms

        out: dict[str, Assignment] = {}
        for m, member in enumerate(members.ids):
            kept = claims.kept[m]
            revoked = rnd.revoke[m]
            held: dict[int, list[int]]
            if revoked:
                gone: dict[int, set[int]] = {}
                for mv in revoked:
                    t = layout.set_of(mv.g)
                    gone.setdefault(t, set()).add(mv.g - offsets[t])
                held = {}
                for t, idx in kept.items():
                    drop = gone.get(t)
                    keep = [i for i in idx if i not in drop] if drop else idx
                    if keep:
                        held[t] = keep
            else:
                held = kept
            why: list[Why] = []
            if gains[m]:
                got = layout.group(gains[m])
                merged = dict(held)
                for t, idx in got.items():
                    merged[t] = sorted(merged[t] + idx) if t in merged else idx
                    why += gain_cause.explain(t, idx)
                held = merged
            why += [(*self._key_of(mv.g), mv.cause) for mv in revoked]
            why += self._lost_claims(m, held, top)
            standby = sorted(rnd.standby[m] + rnd.transit[m])
            standby_map: dict[str, list[int]] = {}
            for g, _ in standby:
                name, i = self._key_of(g)
                standby_map.setdefault(name, []).append(i)
            # State only while a hand-over is under way: a settled member
            # echoes nothing, so a static member that restarts (and so has
            # no echo) rejoins with unchanged metadata and no rebalance (the
            # coordinator takes empty user_data for none). Empty, not None:
            # the client keeps echoing the last user_data until an assignment
            # carries another (docs/client.md), and a hand-over over long ago,
            # echoed still, named a stale receiver and load.
            carried = self._carried(held)
            echo = b""
            if revoked or standby or carried:
                echo = encode_echo(
                    sizes,
                    self.cap[m],
                    [
                        (*self._key_of(mv.g), mv.cause, self._receiver(mv.g),
                         self._measured(mv.g))
                        for mv in revoked
                    ],
                    [(*self._key_of(g), since) for g, since in sorted(standby)],
                    carried,
                )
            band = load = None
            if self.sharing[m]:
                band = self._band(m)
                load = (max(0.0, self.load[m] - coming[m]), self.ideal[m])
            out[member] = Assignment(
                {names[t]: held[t] for t in sorted(held) if held[t]},
                echo,
                delay,
                standby_map,
                tuple(why),
                band,
                load,
            )
        return out

    def _band(self, m: int) -> tuple[float, float]:
        """``(low, high)``, widened to hold the member's planned load where
        the plan leaves it outside (lumpy resources, zones), so that the
        member does not rejoin over a load the leader chose."""
        # A member planned to carry nothing may hold a rounding residue below
        # zero (loads added and taken back, as a move held for warm-up is);
        # a band is a load range, never below zero.
        x, margin = max(0.0, self.load[m]), 1 - self.cfg.band
        low, high = self.low[m], self.high[m]
        if x < low:
            low = x * margin
        if x > high:
            high = x / margin
        return low, high

    def _carried(self, held: Mapping[int, list[int]]) -> list[tuple[str, int, float]]:
        """What a member is given (or keeps) whose load was measured by someone
        else, or by nobody but carried so far: that load, until it reports its own."""
        base = self.base
        if base is None:
            return []
        w, offsets, reported = self.w, self.layout.offsets, self.reported
        out: list[tuple[str, int, float]] = []
        for t in sorted(held):
            o = offsets[t]
            for i in held[t]:
                g = o + i
                if g not in reported and w[g] != base[g]:
                    out.append((*self._key_of(g), w[g]))
        return out

    def _measured(self, g: int) -> float | None:
        base = self.base
        return self.w[g] if base is not None and self.w[g] != base[g] else None

    def _receiver(self, g: int) -> str | None:
        m = self.where[g]
        return self.members.ids[m] if m >= 0 else None

    def _gain_causes(self) -> _GainCause:
        return _GainCause(self)

    def _lost_claims(self, m: int, held: Mapping[int, list[int]], top: int) -> list[Why]:
        """Why entries for what ``m`` claimed but neither keeps nor revoked
        by plan: an unknown set or index (``catalog``), a stale generation
        (``expired``), a set it no longer subscribes to (``leave``), a
        conflict with another claimer (``balance``)."""
        sub = self.members.subs[m]
        if not sub.owned:
            return []
        kept_count = self.claims.counts[m]
        raw_count = sum(len(v) for v in sub.owned.values())
        if raw_count == kept_count:
            return []
        layout = self.layout
        out: list[Why] = []
        for name, indexes in sub.owned.items():
            t = layout.position.get(name)
            have = set(held.get(t, ())) if t is not None else set()
            for i in sorted(set(indexes)):
                if i in have:
                    continue
                if t is None or not 0 <= i < layout.sizes[t]:
                    cause = "catalog"
                elif sub.generation < top:
                    cause = "expired"
                elif t not in self.sub_sets[m]:
                    cause = "leave"
                elif self.where[layout.offsets[t] + i] != m and self.claims.owner[
                    layout.offsets[t] + i
                ] == m:
                    continue  # revoked by plan: already explained
                else:
                    cause = "balance"
                out.append((name, i, cause))
        return out


class _GainCause:
    """Why a member gains a resource nobody owned (the inference rules of
    docs/assignors.md): the cause its previous owner was given when it
    revoked it; else ``join`` in a group where nobody owned anything yet;
    else ``catalog`` if the previous round's catalog did not have it (when
    an echo says what it had) or, failing that, if its index is above every
    claimed index of its set (sets grow at their end); else ``leave`` (its
    owner is gone). A resource placed outside its home zones for lack of
    room there says ``balance``; a hand-over completed after warm-up says
    ``warm``."""

    def __init__(self, planner: _Planner) -> None:
        self.p = planner
        revoked: dict[tuple[str, int], str] = {}
        sizes: dict[str, int] | None = None
        for echo in planner.echo:
            if echo is None:
                continue
            for key, (cause, _, _) in echo.revoked.items():
                revoked[key] = cause
            if sizes is None:
                sizes = echo.sizes
        self.revoked = revoked
        self.sizes = sizes
        self.fresh = sizes is None and not any(s.owned for s in planner.members.subs)
        self._top: dict[int, int] = {}

    def _top_claimed(self, t: int) -> int:
        """The highest index of set position ``t`` that somebody claims (-1: none)."""
        top = self._top.get(t)
        if top is None:
            p = self.p
            o, n = p.layout.offsets[t], p.layout.sizes[t]
            owner, contested = p.claims.owner, p.claims.contested
            top = n - 1
            while top >= 0 and owner[o + top] < 0 and (o + top) not in contested:
                top -= 1
            self._top[t] = top
        return top

    def explain(self, t: int, indexes: list[int]) -> list[Why]:
        """The why entries of gaining ``indexes`` of set position ``t``."""
        p = self.p
        name = p.layout.names[t]
        if self.fresh and not p.placed_cause:
            return list(zip(repeat(name), indexes, repeat("join"), strict=False))
        o = p.layout.offsets[t]
        return [(name, i, self._cause(name, i, o + i)) for i in indexes]

    def _cause(self, name: str, i: int, g: int) -> str:
        placed = self.p.placed_cause.get(g)
        if placed is not None:
            return placed
        cause = self.revoked.get((name, i))
        if cause is not None:
            return "warm" if self.p.cfg.warmup and cause in WARMED else cause
        if self.fresh:
            return "join"
        if self.sizes is not None:
            if i >= self.sizes.get(name, 0):
                return "catalog"
        elif i > self._top_claimed(self.p.layout.position[name]):
            return "catalog"
        return "leave"

