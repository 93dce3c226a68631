"""Members in separate processes against the real ``groupcoord serve``.

The smoke test of the drivers: real processes, real HTTP, the
asyncio ``GroupMember`` and a ``BlockingGroupMember`` newcomer, a member
killed with SIGKILL. The logic (what each assignor revokes and keeps, for
both protocols) is checked on the same scenario in virtual time by
test_member_group_changes.py, which runs in well under a second.

4 members share 64 resources, a 5th joins, then one is killed with SIGKILL.
Every member process writes a ledger of its callbacks (JSON lines with
``time.time()``); the test replays the merged ledger and checks:

- at no instant do two members hold one resource (a killed process stops
  holding anything the moment it is killed);
- after the changes settle, every resource is owned exactly once;
- cooperative: a member never sees a resource revoked that it keeps.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from client_harness import admin_put_resource, check_ledger, read_ledger_files

pytestmark = pytest.mark.timeout(120)

MEMBER_PROC = str(Path(__file__).with_name("member_proc.py"))
TOTAL = 64
SESSION_MS = 1_500


@dataclass
class Cluster:
    url: str
    tmp: Path
    assignor: list[str]
    procs: dict[str, subprocess.Popen[bytes]]
    killed: dict[str, float]

    def start(self, name: str, *extra: str) -> None:
        cmd = [sys.executable, MEMBER_PROC, self.url, name, str(self.ledger_path(name)),
               "--assignor", *self.assignor, "--session-ms", str(SESSION_MS),
               "--heartbeat-ms", "300", *extra]
        self.procs[name] = subprocess.Popen(cmd, stderr=subprocess.PIPE)

    def ledger_path(self, name: str) -> Path:
        return self.tmp / f"{name}.jsonl"

    def kill(self, name: str) -> None:
        self.killed[name] = time.time()
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def events(self) -> list[tuple[float, str, str, list[tuple[str, int]]]]:
        events = read_ledger_files(self.ledger_path(n) for n in self.procs)
        # A killed process stops processing the moment it dies.
        for name, at in self.killed.items():
            held = check_ledger([e for e in events if e[0] <= at and e[1] == name])
            events.append((at, name, "lost", sorted(held)))
        return events

    def holders(self) -> dict[tuple[str, int], str]:
        return check_ledger(self.events())

    def wait_settled(self, members: set[str], timeout_s: float = 30.0) -> dict[
            tuple[str, int], str]:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            holders = self.holders()  # also checks no double ownership so far
            good = (len(holders) == TOTAL and set(holders.values()) == members)
            if holders != last:
                last, stable_since = holders, time.monotonic()
            elif good and time.monotonic() - stable_since > 0.8:
                return holders
            for name, proc in self.procs.items():
                if name not in self.killed and proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise AssertionError(f"member {name} exited {proc.returncode}: {err}")
            time.sleep(0.1)
        raise AssertionError(f"not settled within {timeout_s}s: {len(last or {})} resources "
                             f"held by {sorted(set((last or {}).values()))}")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def run_scenario(start_server: Any, tmp_path: Path, assignor: list[str],
                 blocking_newcomer: bool = False) -> tuple[Cluster, dict[str, Any]]:
    server = start_server(tmp_path / "g.db")
    admin_put_resource(server.admin_url, "s", TOTAL)
    cluster = Cluster(server.url, tmp_path, assignor, {}, {})
    report: dict[str, Any] = {}
    try:
        first = {"m1", "m2", "m3", "m4"}
        for name in sorted(first):
            cluster.start(name)
        before_join = cluster.wait_settled(first)
        t_join = time.time()
        cluster.start("m5", *(["--blocking"] if blocking_newcomer else []))
        after_join = cluster.wait_settled(first | {"m5"})
        t_kill = time.time()
        cluster.kill("m2")
        after_kill = cluster.wait_settled({"m1", "m3", "m4", "m5"})
        report.update(before_join=before_join, after_join=after_join, after_kill=after_kill,
                      t_join=t_join, t_kill=t_kill, t_end=time.time())
        # the merged ledger, checked once more in full, and every resource once at the end
        final = check_ledger(cluster.events())
        assert sorted(final) == [("s", i) for i in range(TOTAL)]
    finally:
        cluster.stop_all()
    # after a clean stop nobody holds anything, and nothing was ever held twice
    assert check_ledger(cluster.events()) == {}
    assert server.terminate() == 0
    return cluster, report


def summarize(label: str, cluster: Cluster, rep: dict[str, Any]) -> None:
    """Print revocations per phase (``pytest -s`` shows them; docs/client.md
    records one run)."""
    for phase, start, end in (("join", rep["t_join"], rep["t_kill"]),
                              ("kill", rep["t_kill"], rep["t_end"])):
        revoked = sum(len(revoked_between(cluster, m, start, end))
                      for m in ("m1", "m3", "m4"))
        print(f"{label} {phase}: survivors m1/m3/m4 revoked {revoked} resources")


def revoked_between(cluster: Cluster, member: str, start: float, end: float) -> set[
        tuple[str, int]]:
    return {r for t, m, k, rs in cluster.events() if m == member and start <= t < end
            and k in ("revoked", "lost") for r in rs}


def test_cooperative_join_and_kill_never_revoke_what_a_member_keeps(
        start_server: Any, tmp_path: Path) -> None:
    cluster, rep = run_scenario(start_server, tmp_path, ["cooperative-sticky"],
                                blocking_newcomer=True)
    summarize("cooperative", cluster, rep)
    for phase, (before, after, start, end) in {
        "join": (rep["before_join"], rep["after_join"], rep["t_join"], rep["t_kill"]),
        "kill": (rep["after_join"], rep["after_kill"], rep["t_kill"], rep["t_end"]),
    }.items():
        for member in sorted(set(before.values()) - set(cluster.killed)):
            kept = {r for r, m in after.items() if m == member} & {
                r for r, m in before.items() if m == member}
            revoked = revoked_between(cluster, member, start, end)
            assert not revoked & kept, f"{phase}: {member} revoked resources it kept"
            moved = {r for r, m in before.items() if m == member} - kept
            assert revoked == moved, f"{phase}: {member} revoked {revoked}, moved {moved}"
    # the newcomer took about a fifth, and only from the others' surplus
    assert 12 <= sum(1 for m in rep["after_join"].values() if m == "m5") <= 13
