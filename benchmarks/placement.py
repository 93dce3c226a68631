"""Placement by load: the ``balanced`` assignor against cooperative-sticky on
the same inputs, in the same run.

    python benchmarks/placement.py [--resources 10000] [--members 20]
        [--seed 1] [--no-scale | --scale-only] [--big]

Each scenario runs the cooperative protocol to rest: every round the
assignor assigns, members revoke what they were not given back, keep what
they were given, echo ``user_data`` and report their measured ``load``; the
next round follows until a round changes nothing. Weights: Zipf (s = 0.8,
rank shuffled) and lognormal (sigma = 1.5). ``bound`` is the lower bound of
the busiest member's load per capacity: ``max(total / total capacity,
largest / largest capacity)``. Figures printed, for both assignors:

* balance: busiest / bound, equal members and capacities 1, 2, 4;
* join / leave: load moved over the newcomer's fair share / the leaver's load
  (a leaver over 1.3 is named, with the least any plan that keeps every
  member inside the band could move);
* hot: one resource's measured load rises 20x (the resource whose weight is
  nearest 2 % of the ideal member load): busiest / bound after, resources moved;
* zones: 3 zones of 8, 8, 4 members, 40 / 40 / 20 % of the resources homed
  there: share of the load served in its home zone, busiest / bound; the
  third zone loses every member (what is left unserved), then comes back;
* max_moves = 20: 4 members join 20 at once: most revocations in a round,
  rounds, busiest / bound at the end;
* scale (unless ``--no-scale``): 100,000 x 1,000 with weights and zones,
  fresh and one leaves; ``--big`` adds 1,000,000 x 2,000 (wall and CPU
  time, and the process's peak memory, each in a child process).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client.assignors import (  # noqa: E402
    Assignor,
    ResourceSet,
    Subscription,
    get_assignor,
    validate_assignment,
)
from client.assignors.balanced import BalancedAssignor  # noqa: E402

SET = "s"
#: balanced's default band
BAND = BalancedAssignor().band
Weights = list[float]


# ---------------------------------------------------------------- inputs


def zipf_weights(n: int, rng: random.Random, s: float = 0.8) -> Weights:
    w = [1.0 / (k + 1) ** s for k in range(n)]
    rng.shuffle(w)
    return w


def lognormal_weights(n: int, rng: random.Random, sigma: float = 1.5) -> Weights:
    return [rng.lognormvariate(0.0, sigma) for _ in range(n)]


def catalog(w: Weights, zones: Mapping[int, str] | None = None) -> dict[str, ResourceSet]:
    return {
        SET: ResourceSet(
            len(w),
            weights=dict(enumerate(w)),
            zones={i: (z,) for i, z in (zones or {}).items()},
        )
    }


# ---------------------------------------------------------------- the protocol


@dataclass
class Member:
    rack: str | None = None
    capacity: float = 1.0
    owned: tuple[int, ...] = ()
    user_data: bytes | None = None
    generation: int = -1


@dataclass
class Settled:
    members: dict[str, Member]
    rounds: int
    most_revoked: int  # in one round


def subscriptions(
    group: Mapping[str, Member], true_load: Weights | None
) -> dict[str, Subscription]:
    out = {}
    for m, st in group.items():
        load = {SET: {i: true_load[i] for i in st.owned}} if true_load and st.owned else {}
        out[m] = Subscription(
            sets=[SET],
            owned={SET: list(st.owned)} if st.owned else {},
            generation=st.generation,
            rack=st.rack,
            user_data=st.user_data,
            capacity=st.capacity,
            load=load,
        )
    return out


def settle(
    assignor: Assignor,
    resources: Mapping[str, ResourceSet],
    group: dict[str, Member],
    true_load: Weights | None = None,
    max_rounds: int = 100,
) -> Settled:
    """Run cooperative rounds until one changes nothing."""
    group = {m: replace(st) for m, st in group.items()}
    most = 0
    for rounds in range(1, max_rounds + 1):
        subs = subscriptions(group, true_load)
        result = assignor.assign(resources, subs)
        validate_assignment(resources, subs, result, cooperative=True)
        changed = False
        generation = 1 + max((st.generation for st in group.values()), default=0)
        revoked = 0
        for m, st in group.items():
            got = tuple(result[m].assigned.get(SET, ()))
            revoked += len(set(st.owned) - set(got))
            changed |= got != st.owned
            # The client keeps the last user_data until an assignment carries
            # another (docs/client.md).
            echo = st.user_data if result[m].user_data is None else result[m].user_data
            group[m] = replace(st, owned=got, user_data=echo, generation=generation)
        most = max(most, revoked)
        if not changed:
            return Settled(group, rounds, most)
    raise RuntimeError(f"{assignor.name}: no rest after {max_rounds} rounds")


# ---------------------------------------------------------------- figures


def owners(group: Mapping[str, Member]) -> dict[int, str]:
    return {i: m for m, st in group.items() for i in st.owned}


def loads(group: Mapping[str, Member], w: Weights) -> dict[str, float]:
    return {m: math.fsum(w[i] for i in st.owned) for m, st in group.items()}


def bound(group: Mapping[str, Member], w: Weights) -> float:
    caps = [st.capacity for st in group.values()]
    return max(math.fsum(w) / math.fsum(caps), max(w) / max(caps))


def busiest(group: Mapping[str, Member], w: Weights) -> float:
    """Busiest load per capacity over the bound."""
    load = loads(group, w)
    return max(load[m] / st.capacity for m, st in group.items()) / bound(group, w)


def moved(
    before: Mapping[str, Member], after: Mapping[str, Member], w: Weights
) -> tuple[float, int]:
    a, b = owners(before), owners(after)
    changed = [i for i, m in b.items() if a.get(i) is not None and a[i] != m]
    return math.fsum(w[i] for i in changed), len(changed)


def least_leave_move(group: Mapping[str, Member], leaver: str, w: Weights,
                     band: float = BAND) -> float:
    """A lower bound of the load any plan moves when ``leaver`` leaves and
    every member is to end inside the band (at most ``(1 + band) * bound``
    per capacity): the leaver's load, plus what the member that takes its
    heaviest resource must shed to come back under that, on the member where
    that is least."""
    rest = {m: st for m, st in group.items() if m != leaver}
    load = loads(group, w)
    top = bound(rest, w) * (1 + band)
    big = max((w[i] for i in group[leaver].owned), default=0.0)
    shed = min(max(0.0, load[m] + big - top * st.capacity) for m, st in rest.items())
    return load[leaver] + shed


def unserved(group: Mapping[str, Member], n: int) -> int:
    return n - sum(len(st.owned) for st in group.values())


def in_home(group: Mapping[str, Member], w: Weights, home: Mapping[int, str]) -> float:
    at = 0.0
    total = 0.0
    for st in group.values():
        for i in st.owned:
            if i in home:
                total += w[i]
                at += w[i] if st.rack == home[i] else 0.0
    return at / total if total else 1.0


# ---------------------------------------------------------------- scenarios


def equal_group(n: int, caps: Callable[[int], float] = lambda k: 1.0) -> dict[str, Member]:
    return {f"m{k:03d}": Member(capacity=caps(k)) for k in range(n)}


def scenarios(names: list[str], w: Weights, n_members: int, rng: random.Random) -> None:
    coop = get_assignor("cooperative-sticky")
    bal = get_assignor("balanced")
    res = catalog(w)
    n = len(w)
    pair = [("balanced", bal), ("cooperative-sticky", coop)]

    def row(label: str, figures: Mapping[str, str]) -> None:
        print(f"  {label:<44} " + "   ".join(f"{k}: {v}" for k, v in figures.items()))

    # Balance, equal members and capacities 1, 2, 4.
    for label, caps in (("equal members", lambda k: 1.0),
                        ("capacities 1, 2, 4", lambda k: (1.0, 2.0, 4.0)[k % 3])):
        row(f"busiest / bound, {label}", {
            name: f"{busiest(settle(a, res, equal_group(n_members, caps)).members, w):.3f}"
            for name, a in pair})

    # Join and leave from the settled state.
    for name, a in pair:
        base = settle(a, res, equal_group(n_members)).members
        joined = dict(base)
        joined["zz-new"] = Member()
        after = settle(a, res, joined)
        fair = math.fsum(w) / (n_members + 1)
        load_moved, count = moved(base, after.members, w)
        row(f"{name}: join", {"moved / fair share": f"{load_moved / fair:.3f}",
                              "resources": str(count), "rounds": str(after.rounds),
                              "busiest/bound": f"{busiest(after.members, w):.3f}"})
        # Each member leaves in turn (from the same settled state).
        ratios = []
        worst_after = 0.0
        for leaver in sorted(base):
            left = {m: st for m, st in base.items() if m != leaver}
            after_leave = settle(a, res, left)
            lmoved, _ = moved(base, after_leave.members, w)
            share = max(w[i] for i in base[leaver].owned) / loads(base, w)[leaver]
            least = least_leave_move(base, leaver, w) / loads(base, w)[leaver]
            ratios.append((lmoved / loads(base, w)[leaver], leaver, share, least))
            worst_after = max(worst_after, busiest(after_leave.members, w))
        ratios.sort()
        over = [f"{who} {r:.3f} (largest resource {100 * share:.0f} % of its load; "
                f"least possible inside the band {least:.3f})"
                for r, who, share, least in ratios if r > 1.3]
        row(f"{name}: leave (each member in turn)", {
            "moved / leaver's load median": f"{ratios[len(ratios) // 2][0]:.3f}",
            "max": f"{ratios[-1][0]:.3f}",
            "over 1.3": ", ".join(over) or "none",
            "busiest/bound worst": f"{worst_after:.3f}"})

    # One resource's measured load rises 20x: one whose weight is 2 % of an
    # ideal member's load (20x does not fit in any other member's room),
    # and one of 0.3 % (20x: 6 %, fits).
    ideal = math.fsum(w) / n_members
    for share in (0.02, 0.003):
        hot = min(range(n), key=lambda i: (abs(w[i] - share * ideal), i))
        hot_w = list(w)
        hot_w[hot] = 20 * w[hot]
        for name, a in pair:
            base = settle(a, res, equal_group(n_members), true_load=w).members
            after = settle(a, res, base, true_load=hot_w)
            _, count = moved(base, after.members, hot_w)
            hot_moved = owners(base)[hot] != owners(after.members)[hot]
            row(f"{name}: a {100 * share:g} % resource 20x", {
                "busiest/bound before": f"{busiest(base, hot_w):.3f}",
                "after": f"{busiest(after.members, hot_w):.3f}",
                "moved": f"{count} ({100 * count / n:.2f} %)",
                "the hot one moved": "yes" if hot_moved else "no",
                "rounds": str(after.rounds)})

    # Zones 8 / 8 / 4, resources homed 40 / 40 / 20 %.
    zone_of = {i: rng.choices("abc", weights=(40, 40, 20))[0] for i in range(n)}
    zres = catalog(w, zone_of)
    racks = ["a"] * 8 + ["b"] * 8 + ["c"] * 4
    zgroup = {f"m{k:03d}": Member(rack=racks[k]) for k in range(20)}
    for name, a in pair:
        base = settle(a, zres, zgroup).members
        row(f"{name}: zones 8/8/4, 40/40/20 %", {
            "in home zone": f"{100 * in_home(base, w, zone_of):.2f} %",
            "busiest/bound": f"{busiest(base, w):.3f}"})
        lost = {m: st for m, st in base.items() if st.rack != "c"}
        gone = settle(a, zres, lost)
        back = dict(gone.members)
        back.update({f"n{k:03d}": Member(rack="c") for k in range(4)})
        returned = settle(a, zres, back)
        row(f"{name}: zone c lost, then back", {
            "unserved while lost": str(unserved(gone.members, n)),
            "busiest/bound lost": f"{busiest(gone.members, w):.3f}",
            "in home zone after return": f"{100 * in_home(returned.members, w, zone_of):.2f} %",
            "busiest/bound": f"{busiest(returned.members, w):.3f}",
            "rounds": f"{gone.rounds}+{returned.rounds}"})

    # max_moves = 20: four members join at once.
    limited = get_assignor("balanced", max_moves=20)
    base = settle(limited, res, equal_group(n_members)).members
    grown = dict(base)
    grown.update({f"zz{k}": Member() for k in range(4)})
    after = settle(limited, res, grown)
    row("balanced max_moves=20: 4 join 20", {
        "most revoked in a round": str(after.most_revoked), "rounds": str(after.rounds),
        "busiest/bound": f"{busiest(after.members, w):.3f}"})
    del names


# ---------------------------------------------------------------- scale


def scale_input(
    n: int, members: int, seed: int
) -> tuple[dict[str, ResourceSet], dict[str, Subscription]]:
    rng = random.Random(seed)
    w = lognormal_weights(n, rng)
    zones = "abc"
    homes = {i: zones[i % 3] for i in range(0, n, 2)}  # half the resources homed
    subs = {f"m{k:05d}": Subscription(sets=[SET], rack=zones[k % 3]) for k in range(members)}
    return catalog(w, homes), subs


def scale_child(name: str, n: int, members: int, seed: int) -> dict[str, float]:
    """One fresh assignment and one where a member has left, timed; run in a
    child process so that its peak memory is its own."""
    res, subs = scale_input(n, members, seed)
    a = get_assignor(name)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    fresh = a.assign(res, subs)
    t_fresh, c_fresh = time.perf_counter() - t, time.process_time() - c
    nxt = {
        m: Subscription(sets=[SET], rack=s.rack, owned=fresh[m].assigned, generation=1,
                        user_data=fresh[m].user_data)
        for m, s in subs.items()
    }
    del nxt[min(nxt)]
    del fresh
    t, c = time.perf_counter(), time.process_time()
    a.assign(res, nxt)
    t_leave, c_leave = time.perf_counter() - t, time.process_time() - c
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"fresh_s": t_fresh, "leave_s": t_leave, "fresh_cpu": c_fresh, "leave_cpu": c_leave,
            "peak_mib": rss / 1024,
            "input_mib": rss0 / 1024}


def scale(n: int, members: int, seed: int) -> None:
    for name in ("balanced", "cooperative-sticky"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, str(n), str(members), str(seed)],
            check=True, capture_output=True, text=True,
        ).stdout
        f = json.loads(out)
        print(f"  {n:,} x {members:,} {name:<20} fresh {f['fresh_s']:.2f} s "
              f"({f['fresh_cpu']:.2f} CPU-s), one leaves {f['leave_s']:.2f} s "
              f"({f['leave_cpu']:.2f} CPU-s), process peak {f['peak_mib']:.0f} MiB "
              f"(inputs alone {f['input_mib']:.0f} MiB)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, n, members, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(scale_child(name, n, members, seed)))
        return
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--resources", type=int, default=10_000)
    p.add_argument("--members", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-scale", action="store_true")
    p.add_argument("--scale-only", action="store_true", help="only the scale figures")
    p.add_argument("--big", action="store_true", help="also 1,000,000 x 2,000")
    args = p.parse_args()
    print(f"placement: {args.resources:,} resources, {args.members} members, seed {args.seed}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for label, make in (() if args.scale_only else (
            ("Zipf 0.8", zipf_weights), ("lognormal sigma 1.5", lognormal_weights))):
        rng = random.Random(args.seed)
        w = make(args.resources, rng)
        print(f"\n{label}: total {math.fsum(w):.1f}, largest {max(w):.3f}, "
              f"ideal member {math.fsum(w) / args.members:.3f}")
        scenarios([], w, args.members, rng)
    if not args.no_scale:
        print("\nscale (weights lognormal 1.5, 3 zones, half the resources homed):")
        scale(100_000, 1_000, args.seed)
        if args.big:
            scale(1_000_000, 2_000, args.seed)


if __name__ == "__main__":
    main()
