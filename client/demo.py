"""``groupcoord demo``: a newcomer's first five minutes, in about twenty seconds.

It starts a coordinator (``groupcoord serve --port 0`` on a temporary
database) and a few workers, each a separate process running this module's
worker (a ``GroupMember`` that prints every callback as a JSON line), creates
a catalog, then adds one worker and kills another with SIGKILL, and prints
each worker's resources as they change. Everything it started is stopped
before it returns, also on Ctrl-C or a timeout.

``python -m client.demo worker URL NAME`` is the worker process alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["register", "run_demo"]

GROUP = "demo"
SET_NAME = "shards"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="start a coordinator and a few workers and watch them share resources",
        description="Start a coordinator on a temporary database and a few worker processes; "
                    "create a catalog, add a worker, kill one, and print who owns what.")
    parser.add_argument("--workers", type=int, default=3, help="workers at the start (3)")
    parser.add_argument("--partitions", type=int, default=12,
                        help=f"resources in the set {SET_NAME!r} (12)")
    parser.add_argument("--assignor", default="cooperative-sticky",
                        help="assignor the workers use (cooperative-sticky)")
    parser.add_argument("--session-timeout-ms", type=int, default=2_000,
                        help="worker session timeout; a killed worker is noticed after it")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="give up after this many seconds (60)")
    parser.set_defaults(func=run_demo)


# ---------------------------------------------------------------- the worker process


def worker_main(argv: Sequence[str]) -> int:
    """One demo worker: joins, prints callbacks as JSON lines, commits a
    counter per resource every half second, leaves on SIGTERM."""
    import asyncio

    parser = argparse.ArgumentParser(prog="python -m client.demo worker")
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("--assignor", default="cooperative-sticky")
    parser.add_argument("--session-timeout-ms", type=int, default=2_000)
    args = parser.parse_args(argv)
    return asyncio.run(_worker(args.url, args.name, args.assignor, args.session_timeout_ms))


async def _worker(url: str, name: str, assignor: str, session_ms: int) -> int:
    import asyncio

    from client import GroupCoordError, GroupMember, RebalanceListener, Resource

    def say(event: str, resources: set[Resource], owned: frozenset[Resource]) -> None:
        print(json.dumps({"worker": name, "event": event, "t": time.time(),
                          "resources": sorted(i for _, i in resources),
                          "owned": sorted(i for _, i in owned)}), flush=True)

    member: GroupMember | None = None

    class Printer(RebalanceListener):
        async def on_assigned(self, resources: set[Resource]) -> None:
            assert member is not None
            say("assigned", resources, member.assignment)

        async def on_revoked(self, resources: set[Resource]) -> None:
            assert member is not None
            say("revoked", resources, member.assignment - resources)

        async def on_lost(self, resources: set[Resource]) -> None:
            assert member is not None
            say("lost", resources, member.assignment)

    member = GroupMember(url, GROUP, [SET_NAME], assignors=[assignor], listener=Printer(),
                         client_id=name, session_timeout_ms=session_ms,
                         rebalance_timeout_ms=10_000)  # the interval follows the timing rule
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    member.start()
    counter = 0
    while not stop.is_set():
        with_timeout = asyncio.ensure_future(stop.wait())
        await asyncio.wait({with_timeout}, timeout=0.5)
        with_timeout.cancel()
        owned = member.assignment
        if member.failure is not None:
            print(json.dumps({"worker": name, "event": "failed",
                              "error": str(member.failure)}), flush=True)
            return 1
        if owned:
            counter += 1
            # A rebalance may be moving things; the next round commits again.
            with contextlib.suppress(GroupCoordError):
                await member.commit(dict.fromkeys(owned, counter))
    await member.close()
    print(json.dumps({"worker": name, "event": "closed", "t": time.time()}), flush=True)
    return 0


# ---------------------------------------------------------------- the demo


class _Demo:
    def __init__(self, args: argparse.Namespace, tmp: Path, out: TextIO) -> None:
        self.args = args
        self.tmp = tmp
        self.out = out
        self.procs: list[subprocess.Popen[str]] = []
        self.workers: dict[str, subprocess.Popen[str]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.owned: dict[str, list[int]] = {}
        self.url = ""
        self.admin_url = ""
        self.deadline = time.monotonic() + args.timeout

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def start_server(self) -> None:
        cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--host", "127.0.0.1",
               "--port", "0", "--admin-port", "0", "--db", str(self.tmp / "demo.db"),
               "--initial-rebalance-delay-ms", "0", "--min-session-timeout-ms", "500",
               "--log-level", "WARNING"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        found: list[str] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                # "admin listening on URL" comes first, then "listening on URL".
                if line.startswith(("admin listening on ", "listening on ")):
                    found.append(line.split()[-1])
                if line.startswith("listening on "):
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(20)
        if len(found) < 2:
            raise RuntimeError("the coordinator did not start within 20 s")
        self.admin_url, self.url = found[0], found[1]
        self.say(f"coordinator listening on {self.url}")

    def put_catalog(self) -> None:
        body = json.dumps({"partitions": self.args.partitions}).encode()
        req = urllib.request.Request(f"{self.admin_url}/v1/resources/{SET_NAME}", data=body,
                                     method="PUT",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
        self.say(f"catalog: {SET_NAME} with {self.args.partitions} resources")

    def start_worker(self, name: str) -> None:
        cmd = [sys.executable, "-m", "client.demo", "worker", self.url, name,
               "--assignor", self.args.assignor,
               "--session-timeout-ms", str(self.args.session_timeout_ms)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        self.procs.append(proc)
        self.workers[name] = proc
        threading.Thread(target=self._pump, args=(name, proc), daemon=True).start()
        self.say(f"+ started worker {name} (pid {proc.pid})")

    def _pump(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                continue

    def settle(self, expect_workers: set[str], quiet_s: float = 1.0) -> bool:
        """Print events until every resource is owned exactly once by the
        expected workers and nothing changed for ``quiet_s``."""
        last_change = time.monotonic()
        while time.monotonic() < self.deadline:
            try:
                ev = self.events.get(timeout=0.1)
            except queue.Empty:
                if self._settled(expect_workers) and time.monotonic() - last_change > quiet_s:
                    return True
                continue
            last_change = time.monotonic()
            self._show(ev)
        self.say("! timed out waiting for the group to settle")
        return False

    def _settled(self, expect: set[str]) -> bool:
        held = [i for w, idx in self.owned.items() if w in expect for i in idx]
        return (sorted(held) == list(range(self.args.partitions))
                and all(self.owned.get(w) for w in expect))

    def _show(self, ev: dict[str, Any]) -> None:
        name = ev.get("worker", "?")
        kind = ev.get("event")
        if kind in ("assigned", "revoked", "lost"):
            self.owned[name] = ev.get("owned", [])
            res = ev.get("resources", [])
            if kind == "assigned" and not res:
                self.say(f"  {name}: rebalance done, keeps {_fmt(self.owned[name])}")
            else:
                self.say(f"  {name}: {kind:8s} {_fmt(res):28s} -> owns {_fmt(self.owned[name])}")
        elif kind == "closed":
            self.owned.pop(name, None)
            self.say(f"  {name}: left the group")
        elif kind == "failed":
            self.say(f"  {name}: FAILED: {ev.get('error')}")

    def table(self) -> None:
        for name in sorted(self.owned):
            if name in self.workers and self.workers[name].poll() is None:
                self.say(f"    {name}: {_fmt(self.owned[name])}")

    def cleanup(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _fmt(indexes: Sequence[int]) -> str:
    return "[" + " ".join(str(i) for i in sorted(indexes)) + "]"


def run_demo(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.partitions < 1:
        print("groupcoord demo: --workers and --partitions must be at least 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="groupcoord-demo-") as tmp:
        demo = _Demo(args, Path(tmp), sys.stdout)
        try:
            demo.start_server()
            demo.put_catalog()
            names = [f"w{i + 1}" for i in range(args.workers)]
            for name in names:
                demo.start_worker(name)
            ok = demo.settle(set(names))
            demo.say("== settled:" if ok else "== state:")
            demo.table()
            new = f"w{args.workers + 1}"
            demo.say(f"== adding {new}")
            demo.start_worker(new)
            names.append(new)
            ok = demo.settle(set(names)) and ok
            demo.table()
            victim = names.pop(0)
            demo.say(f"== kill -9 {victim}: the others notice after its session timeout "
                     f"({args.session_timeout_ms} ms)")
            demo.workers[victim].kill()
            demo.owned.pop(victim, None)
            ok = demo.settle(set(names)) and ok
            demo.table()
            demo.say("== stopping (workers revoke and leave)")
            return 0 if ok else 1
        except KeyboardInterrupt:
            return 130
        except (OSError, RuntimeError) as exc:
            print(f"groupcoord demo: {exc}", file=sys.stderr)
            return 1
        finally:
            demo.cleanup()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    print("usage: python -m client.demo worker URL NAME (or: groupcoord demo)", file=sys.stderr)
    sys.exit(2)
