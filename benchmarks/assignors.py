"""Time the assignors on the shared benchmark scenarios.

    python benchmarks/assignors.py [--scenarios a_fresh,b_one_leaves,...]
        [--assignors sticky,cooperative-sticky,...] [--repeat 5] [--smoke]
        [--shared ../shared/bench] [--no-memory] [--no-peers]

Inputs come from the shared ``scenarios.py`` (``../shared/bench`` relative to
the repository root unless ``--shared`` says otherwise), the same inputs the
peer figures in its README were measured on. For each assignor and scenario it
prints:

* ``cpu ms``: median CPU time (``time.process_time``) of one ``assign()``
  call over ``--repeat`` calls, as the README's peer figures are;
* ``peak MiB``: the peak of memory allocated *during* one ``assign()`` call,
  measured by ``tracemalloc`` in a separate, untimed call (inputs excluded);
  the process's max RSS is printed at the end;
* balance (max - min per member) next to the scenario's achievable balance,
  resources moved and the minimum that had to move (``evaluate``), and how
  many were held back for a cooperative follow-up rebalance.

If kafka-python or aiokafka is importable (the ``bench`` extra), their
assignors run on the same inputs (once each, not on the 1,000,000-resource
scenarios, where they need minutes and > 13 GB) and the ratio peer/ours is
printed; otherwise the run says they were skipped.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client.assignors import (  # noqa: E402
    ASSIGNOR_NAMES,
    Assignment,
    Subscription,
    get_assignor,
)

Flat = dict[str, list[tuple[str, int]]]
PeerFn = Callable[[dict[str, Any]], Flat]

# Our assignor -> the peer assignors it is compared with.
PEER_OF = {
    "range": ("range",),
    "roundrobin": ("roundrobin",),
    "sticky": ("sticky",),
    "cooperative-sticky": ("cooperative-sticky", "sticky"),
    "incremental-cooperative": (),
}


def load_scenarios(shared: Path) -> Any:
    sys.path.insert(0, str(shared))
    return importlib.import_module("scenarios")


def to_subscriptions(scenario: Mapping[str, Any]) -> dict[str, Subscription]:
    previous = scenario["previous_assignment"] or {}
    generation = scenario["generation"] if scenario["generation"] is not None else -1
    subs: dict[str, Subscription] = {}
    for member, sets in scenario["subscriptions"].items():
        owned: dict[str, list[int]] = {}
        for s, i in previous.get(member, ()):
            owned.setdefault(s, []).append(i)
        subs[member] = Subscription(
            sets=list(sets), owned=owned, generation=generation if owned else -1
        )
    return subs


def flatten(result: Mapping[str, Assignment]) -> Flat:
    return {m: [(s, i) for s, idx in a.assigned.items() for i in idx] for m, a in result.items()}


def cpu_median(call: Callable[[], object], repeat: int) -> tuple[float, object]:
    times: list[float] = []
    out: object = None
    for _ in range(repeat):
        out = None
        gc.collect()
        start = time.process_time()
        out = call()
        times.append(time.process_time() - start)
    return statistics.median(times), out


def traced_peak(call: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        out = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return peak / 2**20


# ------------------------------------------------------------------ peers


def peer_functions() -> tuple[dict[str, dict[str, PeerFn]], list[str]]:
    """``{package: {assignor name: fn(scenario) -> Flat}}`` and notes."""
    found: dict[str, dict[str, PeerFn]] = {}
    notes: list[str] = []
    for package in ("kafka", "aiokafka"):
        label = "kafka-python" if package == "kafka" else package
        try:
            fns = _peer_module(package)
        except ImportError as exc:
            notes.append(f"{label}: skipped (not importable: {exc})")
            continue
        try:
            version = importlib.import_module(package).__version__
        except AttributeError:
            version = "?"
        found[f"{label} {version}"] = fns
    return found, notes


class _Cluster:
    """The two methods of ClusterMetadata the peers' assignors call."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        self._topics = topics

    def topics(self) -> set[str]:
        return set(self._topics)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self._topics.get(topic)
        return None if n is None else set(range(n))


class _Member:
    """kafka-python 3's JoinGroupResponseMember, as its assignors read it."""

    def __init__(self, member_id: str, metadata: Any) -> None:
        self.member_id = member_id
        self.group_instance_id = None
        self.metadata = metadata


def _peer_module(package: str) -> dict[str, PeerFn]:
    """kafka-python 3.x (instances; a list of members with
    ConsumerProtocolSubscription metadata) and aiokafka (classmethods; a dict
    of ConsumerProtocolMemberMetadata) have different assignor APIs."""
    base = f"{package}.coordinator.assignors"
    structs = importlib.import_module(f"{package}.structs")
    classes: dict[str, Any] = {
        "range": importlib.import_module(f"{base}.range").RangePartitionAssignor,
        "roundrobin": importlib.import_module(f"{base}.roundrobin").RoundRobinPartitionAssignor,
        "sticky": importlib.import_module(f"{base}.sticky.sticky_assignor").StickyPartitionAssignor,
    }
    try:
        coop = importlib.import_module(f"{base}.cooperative_sticky")
        classes["cooperative-sticky"] = coop.CooperativeStickyAssignor
    except (ImportError, AttributeError):
        pass
    modern = package == "kafka"
    if modern:
        meta = importlib.import_module("kafka.protocol.consumer.metadata")
        subscription_cls: Any = meta.ConsumerProtocolSubscription
    else:
        subscription_cls = importlib.import_module(
            f"{package}.coordinator.protocol"
        ).ConsumerProtocolMemberMetadata

    def make(cls: Any, name: str) -> PeerFn:
        def run(scenario: dict[str, Any]) -> Flat:
            previous = scenario["previous_assignment"] or {}
            generation = scenario["generation"] if scenario["generation"] is not None else -1
            metadata: dict[str, Any] = {}
            for member, sets in scenario["subscriptions"].items():
                owned = previous.get(member, ())
                if name == "sticky":
                    tps = [structs.TopicPartition(t, p) for t, p in owned]
                    metadata[member] = cls._metadata(sets, tps if tps else None, generation)
                elif name == "cooperative-sticky":
                    by_topic: dict[str, list[int]] = {}
                    for t, p in owned:
                        by_topic.setdefault(t, []).append(p)
                    tp_cls = subscription_cls.TopicPartition
                    metadata[member] = subscription_cls(
                        version=2,
                        topics=sorted(sets),
                        user_data=b"",
                        owned_partitions=[
                            tp_cls(topic=t, partitions=ps) for t, ps in by_topic.items()
                        ],
                        generation_id=generation,
                    )
                else:
                    metadata[member] = subscription_cls(0, list(sets), b"")
            cluster = _Cluster(scenario["topics"])
            if modern:
                members = [_Member(m, md) for m, md in metadata.items()]
                result = cls().assign(cluster, members)
            else:
                result = cls.assign(cluster, metadata)
            return {m: [(t, p) for t, ps in a.assignment for p in ps] for m, a in result.items()}

        return run

    return {name: make(cls, name) for name, cls in classes.items()}


# ------------------------------------------------------------------ main


def _ok(ev: Mapping[str, Any], name: str) -> str:
    """``evaluate``'s validity, except that a cooperative round may hold
    resources back (column ``held``) for its follow-up rebalance."""
    broken = ev["duplicated"] or ev["not_subscribed"] or ev["unknown_member"]
    broken = broken or ev["unknown_partition"]
    if "cooperative" not in name and ev["unassigned"]:
        broken = True
    return "INVALID" if broken else "ok"


def run_scenario(
    scenarios: Any,
    key: str,
    names: list[str],
    peers: dict[str, dict[str, PeerFn]],
    args: argparse.Namespace,
) -> None:
    scenario = scenarios.build(key, smoke=args.smoke)
    subs = to_subscriptions(scenario)
    resources = dict(scenario["topics"])
    ours: dict[str, float] = {}
    for name in names:
        assignor = get_assignor(name)

        def call(a: Any = assignor, r: Any = resources, s: Any = subs) -> dict[str, Assignment]:
            return a.assign(r, s)  # type: ignore[no-any-return]

        seconds, result = cpu_median(call, args.repeat)
        assert isinstance(result, dict)
        ours[name] = seconds
        peak = float("nan") if args.no_memory else traced_peak(call)
        ev = scenarios.evaluate(scenario, flatten(result))
        print(
            f"{key:<14} {name:<38} {seconds * 1e3:>9.1f} {peak:>9.1f} "
            f"{ev['balance']:>4} {ev['achievable_balance']:>4} "
            f"{ev.get('moved', '-')!s:>8} {ev.get('min_moves', '-')!s:>8} "
            f"{ev['unassigned']:>6} {_ok(ev, name)}"
        )
        del result
    large = key.startswith("d_") and not args.smoke
    for label, fns in peers.items():
        for name in names:
            for peer_name in PEER_OF.get(name, ()):
                fn = fns.get(peer_name)
                if fn is None:
                    continue
                tag = f"{label} {peer_name}"
                if large and peer_name not in ("range", "roundrobin"):
                    print(f"{key:<14} {tag:<38} skipped (minutes, > 13 GB: see README)")
                    break
                try:
                    seconds, flat = cpu_median(lambda f=fn, sc=scenario: f(sc), 1)
                except Exception as exc:  # a peer's own failure, reported
                    print(f"{key:<14} {tag:<38} failed: {type(exc).__name__}: {exc}")
                    continue
                assert isinstance(flat, dict)
                ev = scenarios.evaluate(scenario, flat)
                print(
                    f"{key:<14} {tag:<38} {seconds * 1e3:>9.1f} {'':>9} "
                    f"{ev['balance']:>4} {ev['achievable_balance']:>4} "
                    f"{ev.get('moved', '-')!s:>8} {ev.get('min_moves', '-')!s:>8} "
                    f"{ev['unassigned']:>6} {_ok(ev, peer_name)}   "
                    f"peer/ours = {seconds / max(ours[name], 1e-9):.1f}x ({name})"
                )
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--scenarios", default="", help="comma-separated keys (default: all)")
    parser.add_argument("--assignors", default="", help="comma-separated names (default: all)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="the scenarios' smoke sizes")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc call")
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args(argv)

    scenarios = load_scenarios(args.shared)
    keys = args.scenarios.split(",") if args.scenarios else list(scenarios.SCENARIOS)
    names = args.assignors.split(",") if args.assignors else list(ASSIGNOR_NAMES)
    for key in keys:
        if key not in scenarios.SCENARIOS:
            parser.error(f"unknown scenario {key!r}; known: {', '.join(scenarios.SCENARIOS)}")
    for name in names:
        if name not in ASSIGNOR_NAMES:
            parser.error(f"unknown assignor {name!r}; known: {', '.join(ASSIGNOR_NAMES)}")
    peers: dict[str, dict[str, PeerFn]] = {}
    if args.no_peers:
        print("peers: skipped (--no-peers)")
    else:
        peers, notes = peer_functions()
        for note in notes:
            print(f"peers: {note}")

    print(f"python {sys.version.split()[0]}, repeat {args.repeat}, smoke {args.smoke}")
    header = (
        f"{'scenario':<14} {'assignor':<38} {'cpu ms':>9} {'peak MiB':>9} "
        f"{'bal':>4} {'ach':>4} {'moved':>8} {'min':>8} {'held':>6} valid"
    )
    print(header)
    print("-" * len(header))
    for key in keys:
        run_scenario(scenarios, key, names, peers, args)
        gc.collect()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process (scenario data included): {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
