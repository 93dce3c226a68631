"""Why resources moved, on a real server: the rebalance journal's causes
(``GET /v1/groups/{id}/rebalances``, ``groupcoord rebalances``), one
resource's history (``groupcoord resources why``), the moves counter and the
placement the members reported (``GET /v1/groups/{id}``, the console, the
load-imbalance gauge)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import urllib.request
from typing import Any

from server_harness import GROUPCOORD, ServerProcess, StartServer, call

from client import GroupMember
from client.admin_cli import utc_time
from protocol.resources import MemberMetadata, ResourceAssignment


def run(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GROUPCOORD, *args, "--url", server.admin_url], capture_output=True,
                          text=True, timeout=60)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text: str = answer.read().decode()
    return text


def moves_total(server: ServerProcess) -> dict[str, float]:
    """``groupcoord_resource_moves_total`` by cause, as scraped."""
    text = get(f"{server.admin_url}/metrics")
    return {m[1]: float(m[2]) for m in re.finditer(
        r'^groupcoord_resource_moves_total\{cause="([^"]+)"\} (\S+)$', text, re.M)}


def table_rows(text: str, first_header: str = "GENERATION") -> list[dict[str, str]]:
    """A CLI table's rows, each cell under its header (cells hold no spaces but CAUSES')."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next(n for n, line in enumerate(lines) if line.startswith(first_header))
    header = lines[header_at]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    return [dict(zip(names, [line[a:b].strip() for a, b in zip(
        starts, [*starts[1:], None], strict=True)], strict=True))
        for line in lines[header_at + 1:]]


async def test_a_join_moves_resources_for_join_and_the_tools_say_so(
        start_server: StartServer) -> None:
    """Two members of the ``balanced`` assignor: the first takes all four
    resources, the second joins and two are handed over cooperatively (revoked
    in one generation, assigned in the next). Every step's cause is ``join``."""
    server = start_server(initial_rebalance_delay_ms=0)
    assert (await asyncio.to_thread(run, server, "resources", "set", "shards", "4")
            ).returncode == 0
    before = await asyncio.to_thread(moves_total, server)
    assert before["join"] == 0 and before["other"] == 0  # every cause exported from the start

    def member(name: str) -> GroupMember:
        return GroupMember(server.url, "orders", ["shards"], assignors=["balanced"],
                           client_id=name, session_timeout_ms=10_000)

    async with member("first") as first:
        while len(first.assignment) != 4:
            await asyncio.sleep(0.05)
        async with member("second") as second:
            while (len(first.assignment), len(second.assignment)) != (2, 2) or \
                    first.generation_id != second.generation_id:
                await asyncio.sleep(0.05)
            moved = sorted(second.assignment)[0]
            history = await asyncio.to_thread(run, server, "rebalances", "orders", "--json")
            table = await asyncio.to_thread(run, server, "rebalances", "orders")
            why = await asyncio.to_thread(run, server, "resources", "why", "orders",
                                          moved[0], str(moved[1]))
            why_json = await asyncio.to_thread(run, server, "resources", "why", "orders",
                                               moved[0], str(moved[1]), "--json")
            after = await asyncio.to_thread(moves_total, server)
            first_id, second_id = first.member_id, second.member_id
    assert history.returncode == 0, history.stderr
    rebalances = json.loads(history.stdout)["rebalances"]
    # Newest first: the hand-over's second half, its first half, the first member alone.
    assigned, revoked, initial = [r["resources"] for r in rebalances[:3]]
    assert assigned == {"moved": 0, "assigned": 2, "revoked": 0, "causes": {"join": 2}}
    assert revoked == {"moved": 0, "assigned": 0, "revoked": 2, "causes": {"join": 2}}
    assert initial == {"moved": 0, "assigned": 4, "revoked": 0, "causes": {"join": 4}}

    assert table.returncode == 0, table.stderr
    causes = [row["CAUSES"] for row in table_rows(table.stdout)]
    assert causes[:3] == ["join:2", "join:2", "join:4"], table.stdout

    # One resource's story: the first member's from the start, taken from it,
    # then the second member's; each change for a join.
    assert why.returncode == 0, why.stderr
    story = json.loads(why_json.stdout)["generations"]
    handed, taken, *older = story
    assert (handed["change"], handed["owner"], handed["cause"]) == ("assigned", second_id, "join")
    assert (taken["change"], taken["owner"], taken["cause"]) == ("revoked", None, "join")
    assert (older[-1]["change"], older[-1]["owner"], older[-1]["cause"]) == (
        "assigned", first_id, "join")
    rows = table_rows(why.stdout)
    assert [(r["OWNER"], r["CHANGE"], r["CAUSE"]) for r in rows[:2]] == [
        (second_id, "assigned", "join"), ("-", "revoked", "join")], why.stdout
    assert [r["ENDED"] for r in rows] == [utc_time(g["ended_ms"]) for g in story]

    # The counter: each resource counted once, when its new owner gained it.
    assert after["join"] - before["join"] == 6, after



def join(server: ServerProcess, instance: str, metadata: MemberMetadata) -> dict[str, Any]:
    return call(server, "join", {
        "group_id": "placed", "member_id": "", "group_instance_id": instance,
        "protocol_type": "resources", "protocols": [["balanced", metadata.encode()]],
        "session_timeout_ms": 300_000, "rebalance_timeout_ms": 10_000, "client_id": instance})


async def test_what_members_report_shows_in_the_group_the_console_and_the_metrics(
        start_server: StartServer) -> None:
    """Two members speaking the protocol by hand, as a v1.2 member and leader
    would: A reports rack, capacity 2 and the load of three resources, B a
    load and that it is draining; the leader gives A those three (two with a
    ``why``, one of a cause this version does not know) and B one, plus a
    standby, each with a band."""
    server = start_server(initial_rebalance_delay_ms=1_000, group_metrics=5)
    assert (await asyncio.to_thread(run, server, "resources", "set", "s", "4")).returncode == 0
    before = await asyncio.to_thread(moves_total, server)
    a_meta = MemberMetadata(sets=("s",), rack="eu-1a", capacity=2.0,
                            load={"s": {0: 3.0, 1: 3.0, 2: 3.0}})
    b_meta = MemberMetadata(sets=("s",), rack="eu-1b", load={"s": {3: 1.0}}, draining=True)
    joined = await asyncio.gather(asyncio.to_thread(join, server, "a", a_meta),
                                  asyncio.to_thread(join, server, "b", b_meta))
    assert all(j["error"] is None for j in joined), joined
    ids = {j["member_id"][0]: j["member_id"] for j in joined}  # client ids "a", "b" lead them
    leader = next(j for j in joined if j["member_id"] == j["leader"])
    given = {
        ids["a"]: ResourceAssignment(assigned={"s": [0, 1, 2]}, band=(5.0, 7.0),
                                     why=(("s", 0, "load"), ("s", 1, "later-cause"))),
        ids["b"]: ResourceAssignment(assigned={"s": [3]}, standby={"s": [0]}, band=(2.0, 4.0)),
    }
    synced = call(server, "sync", {
        "group_id": "placed", "member_id": leader["member_id"],
        "generation_id": leader["generation_id"],
        "group_instance_id": "a" if leader["member_id"] == ids["a"] else "b",
        "assignments": [{"member_id": m, "assignment": a.encode()} for m, a in given.items()]})
    assert synced["error"] is None, synced

    group = json.loads(get(f"{server.admin_url}/v1/groups/placed"))
    shown = {m["group_instance_id"]: {k: m[k] for k in ("rack", "capacity", "load", "draining",
                                                        "standby")}
             for m in group["members"]}
    assert shown == {
        "a": {"rack": "eu-1a", "capacity": 2.0, "load": 9.0, "draining": False, "standby": {}},
        "b": {"rack": "eu-1b", "capacity": None, "load": 1.0, "draining": True,
              "standby": {"s": [0]}},
    }

    page = get(f"{server.admin_url}/console/groups/placed")
    members = page[page.index('<table class="members">'):]
    members = members[:members.index("</table>")]
    head, body_html = members.split("</thead>")

    def cells(html: str) -> list[str]:
        return [re.sub(r"<[^>]+>", "", c).strip()
                for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", html, re.S)]

    header = cells(head)
    body = cells(body_html)
    rows = [dict(zip(header, body[n:n + len(header)], strict=True))
            for n in range(0, len(body), len(header))]
    placed = {r["Instance id"]: (r["Rack"], r["Capacity"], r["Load"], r["Standby"],
                                 r["Warm"], r["Draining"], r["Drain"]) for r in rows}
    nothing = "\u2013"  # the console's mark for none
    # Without authentication the console is an admin's: a Drain button for a
    # member not draining yet.
    assert placed == {"a": ("eu-1a", "2", "9", nothing, nothing, nothing, "Drain"),
                      "b": ("eu-1b", nothing, "1", "1", nothing, "draining", nothing)}, members

    described = await asyncio.to_thread(run, server, "groups", "describe", "placed")
    assert described.returncode == 0, described.stderr
    members_table = next(b for b in described.stdout.split("\n\n") if b.startswith("MEMBER"))
    by_instance = {r["INSTANCE"]: r for r in table_rows(members_table, "MEMBER")}
    assert {i: (r["RACK"], r["CAPACITY"], r["LOAD"], r["STANDBY"], r["WARM"], r["DRAINING"])
            for i, r in by_instance.items()} == {"a": ("eu-1a", "2", "9", "-", "-", "-"),
                                                 "b": ("eu-1b", "-", "1", "s:0", "-", "yes")}

    timeline = page[page.index('<table class="timeline">'):]
    assert "why: later-cause 1, load 1, unknown 2" in re.sub(r"<[^>]+>", "", timeline)

    # The journal: s0 for load, s1 for a cause the server does not know (shown
    # as sent), the other two without a why.
    history = json.loads(get(f"{server.admin_url}/v1/groups/placed/rebalances"))
    assert history["rebalances"][0]["resources"]["causes"] == {
        "later-cause": 1, "load": 1, "unknown": 2}
    story = json.loads(get(f"{server.admin_url}/v1/groups/placed/resources/s/0/history"))
    assert story["generations"][0]["standby"] == ["b"]
    assert story["generations"][0]["owner"] == "a"

    # The counter: what members gained with a why; an unknown cause as "other".
    after = await asyncio.to_thread(moves_total, server)
    assert {c: after[c] - before[c] for c in after if after[c] != before[c]} == {
        "load": 1, "other": 1}

    # A's load per capacity 9/2 over the group's (9 + 1) / (2 + 1).
    metrics = get(f"{server.admin_url}/metrics")
    found = re.search(r'^groupcoord_group_load_imbalance\{group="placed"\} (\S+)$', metrics,
                      re.M)
    assert found is not None, metrics
    assert abs(float(found[1]) - 4.5 / (10 / 3)) < 1e-9


async def test_a_large_assignment_is_read_off_the_event_loop_and_still_counted(
        start_server: StartServer) -> None:
    """10,000 resources handed out with a why each: assignment bytes past the
    size the server decodes on its offload thread (for the counter when the
    assignment arrives, for the history when it is read). The answers are
    those of a small group."""
    server = start_server(initial_rebalance_delay_ms=0)
    size = 10_000
    assert (await asyncio.to_thread(run, server, "resources", "set", "big", str(size))
            ).returncode == 0
    before = await asyncio.to_thread(moves_total, server)
    joined = await asyncio.to_thread(join, server, "a", MemberMetadata(sets=("big",)))
    assignment = ResourceAssignment(assigned={"big": list(range(size))},
                                    why=tuple(("big", i, "catalog") for i in range(size)))
    assert len(assignment.encode()) > 64 * 1024
    synced = call(server, "sync", {
        "group_id": "placed", "member_id": joined["member_id"],
        "generation_id": joined["generation_id"], "group_instance_id": "a",
        "assignments": [{"member_id": joined["member_id"],
                         "assignment": assignment.encode()}]})
    assert synced["error"] is None, synced
    history = json.loads(get(f"{server.admin_url}/v1/groups/placed/rebalances"))
    assert history["rebalances"][0]["resources"]["causes"] == {"catalog": size}
    story = json.loads(get(f"{server.admin_url}/v1/groups/placed/resources/big/9999/history"))
    assert [(g["owner"], g["change"], g["cause"]) for g in story["generations"]] == [
        ("a", "assigned", "catalog")]
    for _ in range(200):  # counted on the offload thread, just after the assignment
        after = await asyncio.to_thread(moves_total, server)
        if after["catalog"] != before["catalog"]:
            break
        await asyncio.sleep(0.05)
    assert after["catalog"] - before["catalog"] == size
