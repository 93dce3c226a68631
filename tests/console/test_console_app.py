"""The web console through aiohttp's test client, with the real runtime, core and SQLite.

What the pages show (groups, members, the assignment grid and its moves,
checkpoints, the timeline), sign-in with the server's tokens, the checkpoint
reset's two steps, and the live event streams and their bounds. The browser
tests (test_console_browser.py) drive the same pages in Chromium.
"""

from __future__ import annotations

import asyncio
import html as html_text
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jinja2
import msgpack
import pytest
from aiohttp import DummyCookieJar, web
from aiohttp.test_utils import TestClient, TestServer
from listeners_kit import InProcess, serve_in_process
from server_harness import free_port

from coordinator.auth import TokenEntry, TokenStore, hash_token
from coordinator.console import CONSOLE_KEY
from coordinator.console.live import MAX_STREAMS_PER_CLIENT, StreamLimits
from coordinator.console.sessions import COOKIE
from coordinator.console.views import assignment_grid
from coordinator.core.commands import PutResource
from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http.app import build_admin_app
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage
from protocol.catalog import Placement, Weights, Zones
from protocol.resources import ResourceAssignment

MSGPACK = {"Content-Type": "application/msgpack"}
OPS = "ops-token-0123456789abcdef0123456789abcdef"          # admin, every group
TEAM = "team-token-0123456789abcdef0123456789abcdef"        # admin, orders-* only
VIEWER = "viewer-token-0123456789abcdef0123456789abcdef"    # viewer, every group
APP = "app-token-0123456789abcdef0123456789abcdef0"         # member: protocol calls only


def _store() -> TokenStore:
    def entry(name: str, token: str, groups: tuple[str, ...], role: str) -> TokenEntry:
        return TokenEntry(name, bytes.fromhex(hash_token(token)[len("sha256:"):]), groups, role)
    return TokenStore([entry("ops", OPS, ("",), "admin"),
                       entry("team", TEAM, ("orders-",), "admin"),
                       entry("viewer", VIEWER, ("",), "viewer"),
                       entry("app", APP, ("",), "member")])


class Console:
    def __init__(self, client: TestClient[Any, Any], runtime: Runtime, app: web.Application,
                 token: str | None, protocol: InProcess) -> None:
        self.client = client
        self.runtime = runtime
        self.app = app
        self.token = token
        #: the protocol listener of the same runtime (the members' calls).
        self.protocol = protocol
        #: (group, client id) -> member id, so that a member rejoins as itself.
        self.members: dict[tuple[str, str], str] = {}

    async def call(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = dict(MSGPACK)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        async with self.protocol.post(f"/v1/{api}", data=msgpack.packb(body),
                                      headers=headers) as resp:
            data = await resp.read()
            assert resp.status == 200, data
        doc: dict[str, Any] = msgpack.unpackb(data, raw=False)
        return doc

    async def join(self, group: str, client_id: str) -> dict[str, Any]:
        member_id = self.members.get((group, client_id), "")
        body = {"group_id": group, "member_id": member_id, "protocol_type": "resources",
                "protocols": [["range", b""]], "session_timeout_ms": 10_000,
                "rebalance_timeout_ms": 10_000, "client_id": client_id}
        answer = await self.call("join", body)
        if answer["error"] == "MEMBER_ID_REQUIRED":
            body["member_id"] = answer["member_id"]
            answer = await self.call("join", body)
        self.members[(group, client_id)] = answer["member_id"]
        return answer

    async def stable(self, group: str, plan: dict[str, dict[str, list[int]]]) -> dict[str, str]:
        """Members (by client id) join one after the other, the last one leads a
        generation with ``plan`` (client id -> {set: [indexes]}); member ids by client id."""
        names = list(plan)
        ids: dict[str, str] = {}
        # Newcomers first: their join starts the rebalance the others then rejoin.
        tasks = {n: asyncio.ensure_future(self.join(group, n)) for n in names
                 if (group, n) not in self.members}
        if len(tasks) < len(names):
            for _ in range(100):
                view = self.runtime.core.describe_group(group)
                if view is not None and view.state == "PreparingRebalance":
                    break
                await asyncio.sleep(0.01)
        for n in names:
            if n not in tasks:
                tasks[n] = asyncio.ensure_future(self.join(group, n))
        answers = await asyncio.gather(*(tasks[n] for n in names))
        for name, answer in zip(names, answers, strict=True):
            ids[name] = answer["member_id"]
        generation = answers[0]["generation_id"]
        leader = next(a for a in answers if a["leader"] == a["member_id"])
        by_id = {ids[n]: n for n in names}
        syncs = []
        for answer in answers:
            body: dict[str, Any] = {"group_id": group, "member_id": answer["member_id"],
                                    "generation_id": generation}
            if answer is leader:
                body["assignments"] = [
                    {"member_id": m, "assignment": ResourceAssignment(plan[by_id[m]]).encode()}
                    for m in ids.values()]
            syncs.append(asyncio.ensure_future(self.call("sync", body)))
        for done in await asyncio.gather(*syncs):
            assert done["error"] is None, done
        return ids

    async def page(self, path: str, status: int = 200, **kw: Any) -> str:
        resp = await self.client.get(path, allow_redirects=False, **kw)
        text = await resp.text()
        assert resp.status == status, text
        return text


async def _console(tmp_path: Path, tokens: TokenStore | None, token: str | None
                   ) -> AsyncIterator[Console]:
    storage = await Storage.open(tmp_path / "g.db")
    core = GroupCoordinator(CoreConfig(min_session_timeout_ms=100, initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()
    await runtime.call(PutResource(runtime.new_request_id(), "orders", 4))
    app = build_admin_app(runtime, metrics, max_body_bytes=64 * 1024, tokens=tokens)
    # No cookie jar: each request says which session cookie it sends.
    async with TestClient(TestServer(app), cookie_jar=DummyCookieJar()) as client, \
            serve_in_process(runtime, metrics, max_body_bytes=64 * 1024,
                             tokens=tokens) as protocol:
        yield Console(client, runtime, app, token, protocol)
    await runtime.stop()
    await storage.close()


@pytest.fixture
async def open_console(tmp_path: Path) -> AsyncIterator[Console]:
    async for c in _console(tmp_path, None, None):
        yield c


@pytest.fixture
async def auth_console(tmp_path: Path) -> AsyncIterator[Console]:
    async for c in _console(tmp_path, _store(), OPS):
        yield c


def _text(html: str) -> str:
    """The page's text, tags dropped and spaces squeezed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# ---------------------------------------------------------------- pages


async def test_overview_lists_groups_with_their_last_rebalance(open_console: Console) -> None:
    await open_console.stable("orders-eu", {"a": {"orders": [0, 1]}, "b": {"orders": [2, 3]}})
    html = await open_console.page("/console/")
    text = _text(html)
    assert 'href="/console/groups/orders-eu"' in html
    assert "orders-eu Stable 1 2 OK" in text
    assert "generation 1" in text and "took" in text
    # The last rebalance's reason is the journal's.
    rows = await open_console.runtime.storage.rebalances("orders-eu", 1)
    assert rows[0]["reason"] in text
    # The group's health (coordinator/core/health.py) has its column.
    assert "Health" in text and "orders-eu Stable 1 2 OK" in text
    # /console without its slash goes to the overview.
    resp = await open_console.client.get("/console", allow_redirects=False)
    assert resp.status == 308 and resp.headers["Location"] == "/console/"


async def test_group_page_members_grid_moves_checkpoints_and_timeline(
        open_console: Console) -> None:
    c = open_console
    first = await c.stable("orders-eu", {"a": {"orders": [0, 1, 2, 3]}})
    # b joins: the next generation gives it 2 and 3, which moved from a.
    second = await c.stable("orders-eu", {"a": {"orders": [0, 1]}, "b": {"orders": [2, 3]}})
    assert second["a"] == first["a"]
    html = await c.page("/console/groups/orders-eu")
    text = _text(html)
    assert "State Stable" in text and "Generation 2" in text
    # Which coordinator serves the group (a one-process server: this one).
    assert f"Coordinator {c.runtime.advertised_url or 'this one'} (partition 0)" in text, text
    assert second["b"] in html and "127.0.0.1" in text and "10.0 s" in text
    # The grid: four rows, two member columns, the two moved cells marked.
    grid = html[html.index('<table class="grid">'):html.index("</table>", html.index(
        '<table class="grid">'))]
    assert grid.count('<th scope="row">') == 4
    assert grid.count("cell own moved") == 2
    assert "orders[2]" in grid and "moved here from a" in grid
    assert "generation 2: 2 resources" in text
    # The timeline: newest first, with the journal's reasons and what moved.
    timeline = _text(html[html.index('<table class="timeline">'):])
    assert timeline.index(" 2 ") < timeline.index(" 1 ")
    assert "2 moved, 0 assigned, 0 revoked" in timeline
    assert "0 moved, 4 assigned, 0 revoked" in timeline
    # Checkpoints: a member's commit shows.
    done = await c.call("commit", {"group_id": "orders-eu", "member_id": second["a"],
                                   "generation_id": 2, "checkpoints": [
                                       ["orders", 0, 41], ["orders", 1, b"offset-42"],
                                       ["orders", 2, b"\xff\x00"]]})
    assert done["error"] is None
    text = _text(await c.page("/console/groups/orders-eu"))
    assert "orders[0] 41" in text
    # Bytes that are text show as text, other bytes in base64; both labelled.
    shown = html_text.unescape(text)
    assert 'orders[1] utf-8:"offset-42"' in shown and "orders[2] base64:/wA=" in shown


async def test_pages_escape_what_clients_send(open_console: Console) -> None:
    await open_console.stable("<b>x</b>", {"<i>c</i>": {"orders": [0]}})
    html = await open_console.page("/console/")
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert 'href="/console/groups/%3Cb%3Ex%3C%2Fb%3E"' in html
    page = await open_console.page("/console/groups/%3Cb%3Ex%3C%2Fb%3E")
    assert "<i>c</i>" not in page and "&lt;i&gt;c&lt;/i&gt;" in page


async def test_the_catalog_shows_each_sets_weights_and_zones(open_console: Console) -> None:
    c = open_console
    hot = Placement(Weights(1.0, ((1, 40.0), (3, 12.5))),
                    Zones(None, ((1, ("eu-1a",)), (2, ("eu-1a", "<b>eu-1b</b>")))))
    runtime = c.runtime
    await runtime.call(PutResource(runtime.new_request_id(), "orders", 4, hot.weights, hot.zones))
    await runtime.call(PutResource(runtime.new_request_id(), "users", 6, zones=Zones(("eu-1c",))))
    await c.stable("orders-eu", {"a": {"orders": [0, 1]}, "b": {"orders": [2, 3]}})
    html = await c.page("/console/")
    catalog = _text(html[html.index('<table class="catalog">'):])
    assert ("orders 4 default 1, 2 overrides, load 54.5 default anywhere; 2 overrides "
            "(eu-1a, &lt;b&gt;eu-1b&lt;/b&gt;)") in catalog
    assert "users 6 default 1, 0 overrides, load 6 default eu-1c" in catalog
    assert "<b>eu-1b</b>" not in html
    # The group page: its sets in short, and each resource's weight and zones.
    page = await c.page("/console/groups/orders-eu")
    text = _text(page)
    assert ("orders : 4 resources; weights default 1, 2 overrides, load 54.5; zones default "
            "anywhere; 2 overrides") in text
    assert "users :" not in text                    # not a set of this group
    grid = _text(page[page.index('<table class="grid">'):])
    assert "orders[0] w 1 " in grid and "orders[1] w 40 eu-1a " in grid
    assert "orders[2] w 1 eu-1a, &lt;b&gt;eu-1b&lt;/b&gt; " in grid
    assert "orders[3] w 12.5 " in grid
    # The live stream renders the same catalog fragment.
    assert 'id="live-catalog"' in html


async def test_unknown_group_is_a_404_page(open_console: Console) -> None:
    html = await open_console.page("/console/groups/nope", status=404)
    assert "There is no group &#39;nope&#39;" in html


def test_grid_marks_only_the_moves_of_the_current_generation() -> None:
    def row(generation: int, owners: dict[str, list[int]]) -> dict[str, Any]:
        return {"generation_id": generation, "protocol_type": "resources",
                "members": [[m, None, m] for m in owners],
                "assignments": {m: ResourceAssignment({"s": v}).encode()
                                for m, v in owners.items()}}
    group = {"protocol_type": "resources", "generation_id": 3, "members": [
        {"member_id": "a", "group_instance_id": None, "client_id": "a",
         "assignment": {"s": [0]}},
        {"member_id": "b", "group_instance_id": None, "client_id": "b",
         "assignment": {"s": [1, 2]}}]}
    journal = [row(3, {"a": [0], "b": [1, 2]}), row(2, {"a": [0, 1]})]
    grid = assignment_grid(group, {"s": 4}, journal)
    assert grid is not None
    assert [(r.index, r.owner, r.moved, r.moved_from) for r in grid.rows] == [
        (0, 0, False, None), (1, 1, True, "a"), (2, 1, True, None), (3, None, False, None)]
    assert grid.moved_count == 2 and grid.moves_of == 3
    # The journal has not caught up with generation 4 yet: nothing is marked.
    stale = assignment_grid({**group, "generation_id": 4}, {"s": 4}, journal)
    assert stale is not None and stale.moves_of is None
    assert not any(r.moved for r in stale.rows)


# ---------------------------------------------------------------- sign-in


def _cookie(resp: Any) -> str:
    header = resp.headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/console/" in header
    assert "Secure" not in header  # plain HTTP here; under TLS the cookie is Secure
    value = header.split(";", 1)[0].split("=", 1)[1]
    assert value and OPS not in header and TEAM not in header
    return value


async def _login(c: Console, token: str, status: int = 303) -> Any:
    resp = await c.client.post("/console/login", data={"token": token, "next": "/console/"},
                               allow_redirects=False)
    assert resp.status == status, await resp.text()
    return resp


async def test_with_tokens_the_console_needs_a_viewer_or_admin_token(auth_console: Console) -> None:
    c = auth_console
    resp = await c.client.get("/console/groups/orders-eu", allow_redirects=False)
    assert resp.status == 303
    assert resp.headers["Location"] == "/console/login?next=/console/groups/orders-eu"
    login = await c.page("/console/login")
    assert 'type="password"' in login and OPS not in login
    assert (await c.client.get("/console/events?page=overview")).status == 401
    # Wrong token, then a valid token without the admin flag: refused, no cookie.
    bad = await _login(c, "x" * 40, status=401)
    assert "Set-Cookie" not in bad.headers and "not a valid token" in await bad.text()
    app = await _login(c, APP, status=403)
    assert "Set-Cookie" not in app.headers
    assert "(role member) may not read through the admin API" in await app.text()
    # An admin token: a session cookie, the token itself nowhere.
    ok = await _login(c, OPS)
    assert ok.headers["Location"] == "/console/"
    session = _cookie(ok)
    page = await c.page("/console/", headers={"Cookie": f"{COOKIE}={session}"})
    assert "Signed in as <strong>ops</strong> (admin)" in page and OPS not in page
    # The cookie is no bearer token for the JSON API.
    api = await c.client.get("/v1/groups", headers={"Cookie": f"{COOKIE}={session}"})
    assert api.status == 401
    # Signing out ends the session.
    out = await c.client.post("/console/logout", headers={"Cookie": f"{COOKIE}={session}"},
                              allow_redirects=False)
    assert out.status == 303
    again = await c.client.get("/console/", headers={"Cookie": f"{COOKIE}={session}"},
                               allow_redirects=False)
    assert again.status == 303 and again.headers["Location"].startswith("/console/login")


async def test_the_console_shows_only_the_groups_the_token_is_granted(
        auth_console: Console) -> None:
    c = auth_console
    await c.stable("orders-eu", {"a": {"orders": [0]}})
    await c.stable("billing", {"a": {"orders": [1]}})
    team = {"Cookie": f"{COOKIE}={_cookie(await _login(c, TEAM))}"}
    overview = await c.page("/console/", headers=team)
    assert "orders-eu" in overview and "billing" not in overview
    denied = await c.page("/console/groups/billing", status=403, headers=team)
    assert "not granted group &#39;billing&#39;" in denied
    assert (await c.client.get("/console/events?page=group&group=billing",
                               headers=team)).status == 403
    reset = await c.client.post("/console/groups/billing/reset", headers=team,
                                data={"mode": "delete"})
    assert reset.status == 403
    ops = {"Cookie": f"{COOKIE}={_cookie(await _login(c, OPS))}"}
    assert "billing" in await c.page("/console/", headers=ops)


async def test_a_viewer_sees_the_groups_but_cannot_reset(auth_console: Console) -> None:
    c = auth_console
    await c.stable("orders-eu", {"a": {"orders": [0]}})
    viewer = {"Cookie": f"{COOKIE}={_cookie(await _login(c, VIEWER))}"}
    assert "orders-eu" in await c.page("/console/", headers=viewer)
    page = await c.page("/console/groups/orders-eu", headers=viewer)
    assert "Preview reset" not in page and "needs a token of the admin role" in page
    refused = await c.client.post("/console/groups/orders-eu/reset", headers=viewer,
                                  data={"mode": "delete"})
    assert refused.status == 403
    assert "resetting checkpoints needs the admin role" in await refused.text()
    admin = {"Cookie": f"{COOKIE}={_cookie(await _login(c, OPS))}"}
    assert "Preview reset" in await c.page("/console/groups/orders-eu", headers=admin)


async def test_only_an_admin_gets_drain_buttons_on_the_page_and_live(
        auth_console: Console) -> None:
    """The members' Drain buttons (v1.2) are an admin's: not in a viewer's page nor
    in its live updates, and a viewer's drain is refused; an admin's is done and
    the page then says the member is asked."""
    c = auth_console
    ids = await c.stable("orders-eu", {"a": {"orders": [0]}})
    viewer = {"Cookie": f"{COOKIE}={_cookie(await _login(c, VIEWER))}"}
    admin = {"Cookie": f"{COOKIE}={_cookie(await _login(c, OPS))}"}
    assert 'class="drain"' not in await c.page("/console/groups/orders-eu", headers=viewer)
    assert 'class="drain"' in await c.page("/console/groups/orders-eu", headers=admin)
    for headers, shown in ((viewer, False), (admin, True)):
        stream = await c.client.get("/console/events?page=group&group=orders-eu",
                                    headers=headers)
        got = await _events(stream, lambda e: any(m["id"] == "live-members" for _, m in e),
                            5.0)
        html = next(m["html"] for _, m in got if m["id"] == "live-members")
        assert ('class="drain"' in html) is shown
        stream.close()
    path = f"/console/groups/orders-eu/members/{ids['a']}/drain"
    refused = await c.client.post(path, headers=viewer)
    assert refused.status == 403
    assert "draining a member needs the admin role" in await refused.text()
    view = c.runtime.core.describe_group("orders-eu")
    assert view is not None and view.members[0].drain_requested_ms is None
    done = await c.client.post(path, headers=admin, allow_redirects=False)
    assert (done.status, done.headers["Location"]) == (303, "/console/groups/orders-eu")
    page = await c.page("/console/groups/orders-eu", headers=admin)
    assert "drain requested" in _text(page) and 'class="drain"' not in page
    gone = await c.client.post("/console/groups/orders-eu/members/ghost/drain", headers=admin)
    assert gone.status == 404 and "no member &#39;ghost&#39;" in await gone.text()


async def test_a_form_from_another_site_is_refused(auth_console: Console) -> None:
    resp = await auth_console.client.post(
        "/console/login", data={"token": OPS}, allow_redirects=False,
        headers={"Origin": "https://evil.example"})
    assert resp.status == 403 and "Set-Cookie" not in resp.headers
    # A sign-in may only send the browser on to a console page.
    resp = await auth_console.client.post(
        "/console/login", data={"token": OPS, "next": "//evil.example/x"}, allow_redirects=False)
    assert resp.headers["Location"] == "/console/"


# ---------------------------------------------------------------- reset


async def _checkpoints(c: Console, group: str) -> dict[tuple[str, int], object]:
    return dict(c.runtime.core.checkpoints(group))


async def test_reset_is_a_dry_run_first_then_executed(open_console: Console) -> None:
    c = open_console
    # A "simple" commit (no generation), as a tool that loads checkpoints makes.
    done = await c.call("commit", {"group_id": "orders-eu", "member_id": "loader",
                                   "generation_id": -1,
                                   "checkpoints": [["orders", 0, 10], ["orders", 1, 20]]})
    assert done["error"] is None
    form = {"mode": "shift_by", "value": "-5", "kind": "integer", "resources": "orders:1",
            "step": "preview"}
    resp = await c.client.post("/console/groups/orders-eu/reset", data=form)
    html = await resp.text()
    assert resp.status == 200, html
    text = _text(html)
    assert "dry run" in text and "Nothing has changed yet" in text
    assert "orders[1] 20 15 yes" in text and "orders[0]" not in text
    assert await _checkpoints(c, "orders-eu") == {("orders", 0): 10, ("orders", 1): 20}
    # The second step carries the same fields and executes.
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))
    assert hidden == {**form, "step": "execute"}
    resp = await c.client.post("/console/groups/orders-eu/reset", data=hidden)
    assert resp.status == 200
    assert "Done: 1 checkpoint changed" in _text(await resp.text())
    assert await _checkpoints(c, "orders-eu") == {("orders", 0): 10, ("orders", 1): 15}


async def test_reset_of_an_active_group_or_bad_input_is_refused(open_console: Console) -> None:
    c = open_console
    ids = await c.stable("orders-eu", {"a": {"orders": [0]}})
    await c.call("commit", {"group_id": "orders-eu", "member_id": ids["a"], "generation_id": 1,
                            "checkpoints": [["orders", 0, 7]]})
    resp = await c.client.post("/console/groups/orders-eu/reset",
                               data={"mode": "to_value", "value": "0", "kind": "integer"})
    assert resp.status == 409
    assert "is Stable. Checkpoints can be reset only while the group is Empty" in await resp.text()
    resp = await c.client.post("/console/groups/orders-eu/reset",
                               data={"mode": "to_value", "value": "zero", "kind": "integer"})
    assert resp.status == 400
    assert "value: expected an integer, got &#39;zero&#39;" in await resp.text()
    resp = await c.client.post("/console/groups/orders-eu/reset",
                               data={"mode": "delete", "resources": "orders:9-3"})
    assert resp.status == 400 and "resources:" in await resp.text()
    assert await _checkpoints(c, "orders-eu") == {("orders", 0): 7}


# ---------------------------------------------------------------- live


async def _events(resp: Any, until: Any, timeout_s: float) -> list[tuple[str, Any]]:
    """Read server-sent events until ``until(events)`` or the timeout."""
    seen: list[tuple[str, Any]] = []
    name = None
    async def read() -> None:
        nonlocal name
        while not until(seen):
            line = (await resp.content.readline()).decode()
            if not line:
                return
            if line.startswith("event: "):
                name = line[7:].strip()
            elif line.startswith("data: "):
                seen.append((name, json.loads(line[6:])))
    await asyncio.wait_for(read(), timeout_s)
    return seen


async def test_a_change_reaches_an_open_page_within_two_seconds(open_console: Console) -> None:
    c = open_console
    await c.stable("orders-eu", {"a": {"orders": [0, 1, 2, 3]}})
    resp = await c.client.get("/console/events?page=group&group=orders-eu")
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    first = await _events(resp, lambda e: {m["id"] for _, m in e} >= {
        "live-summary", "live-members", "live-grid", "live-checkpoints", "live-timeline"}, 2.0)
    assert all(name == "fragment" for name, _ in first)
    joined = asyncio.ensure_future(c.join("orders-eu", "newcomer"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    changed = await _events(resp, lambda e: any(
        m["id"] == "live-members" and "newcomer" in m["html"] for _, m in e), 2.0)
    assert loop.time() - started < 2.0
    # Only what changed is sent: the checkpoints fragment did not change.
    assert "live-checkpoints" not in {m["id"] for _, m in changed}
    joined.cancel()
    resp.close()


async def test_streams_are_bounded_and_end_on_shutdown(open_console: Console) -> None:
    c = open_console
    console = next(sub for sub in _subapps(c.app))[CONSOLE_KEY]
    streams = console.streams
    streams.limits = StreamLimits(max_streams=2)
    a = await c.client.get("/console/events?page=overview")
    b = await c.client.get("/console/events?page=overview")
    assert a.status == b.status == 200
    refused = await c.client.get("/console/events?page=overview")
    assert refused.status == 503 and "too many live pages" in await refused.text()
    # A client that goes away frees its place.
    a.close()
    for _ in range(40):
        if streams.open < 2:
            break
        await asyncio.sleep(0.05)
    assert streams.open == 1
    # Shutdown ends the streams that are open, at once.
    await streams.stop()
    ended = await _events(b, lambda e: any(name == "end" for name, _ in e), 2.0)
    assert ended[-1][1]["message"] == "The server is shutting down."
    assert (await c.client.get("/console/events?page=overview")).status == 503
    for _ in range(40):
        if streams.open == 0:
            break
        await asyncio.sleep(0.05)
    assert streams.open == 0


def _subapps(app: web.Application) -> list[web.Application]:
    return [resource.get_info()["app"] for resource in app.router.resources()
            if "app" in resource.get_info()]


async def test_under_tls_the_session_cookie_is_secure(tmp_path: Path) -> None:
    import ssl

    import aiohttp
    import trustme

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    async for c in _console(tmp_path, _store(), OPS):
        app = build_admin_app(c.runtime, Metrics(), max_body_bytes=64 * 1024, tokens=_store())
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context).start()
        try:
            async with aiohttp.ClientSession(cookie_jar=DummyCookieJar()) as session, \
                    session.post(f"https://127.0.0.1:{port}/console/login", data={"token": OPS},
                                 ssl=client_context, allow_redirects=False) as resp:
                assert resp.status == 303
                cookie = resp.headers["Set-Cookie"]
                assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        finally:
            await runner.cleanup()


def _served_streams(c: Console) -> Any:
    """The live streams of the server's own admin listener (``c.protocol``): unlike
    the test client's server, it does not cancel a handler whose client left, as
    ``groupcoord serve`` does not."""
    return next(sub for sub in _subapps(c.protocol.listeners.admin_app))[CONSOLE_KEY].streams


async def _first_fragment(resp: Any) -> list[tuple[str, Any]]:
    assert resp.status == 200, await resp.text()
    return await _events(resp, lambda e: any(name == "fragment" for name, _ in e), 5.0)


async def test_open_overviews_list_the_groups_once_and_render_only_what_changed(
        open_console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    c = open_console
    for i in range(20):
        await c.stable(f"orders-{i:02d}", {"a": {"orders": [0]}})
    listings = 0

    def counted(read: Any) -> Any:
        def listing(core: GroupCoordinator) -> Any:
            nonlocal listings
            listings += 1
            return read(core)
        return listing

    renders: Counter[str] = Counter()
    render = jinja2.Template.render

    def counted_render(template: jinja2.Template, *args: Any, **kwargs: Any) -> str:
        renders[str(template.name)] += 1
        return render(template, *args, **kwargs)

    # Reading the groups, as a summary each or as their ids.
    monkeypatch.setattr(GroupCoordinator, "list_groups", counted(GroupCoordinator.list_groups))
    monkeypatch.setattr(GroupCoordinator, "group_ids", counted(GroupCoordinator.group_ids))
    monkeypatch.setattr(jinja2.Template, "render", counted_render)
    pages = [await c.client.get("/console/events?page=overview") for _ in range(6)]
    for page in pages:
        await _first_fragment(page)
    # Three ticks with nothing changing: the groups are listed once a tick for the
    # six pages together, and nothing is rendered.
    listings = 0
    renders.clear()
    await asyncio.sleep(1.5)
    assert renders["_groups.html"] == 0 and renders["_group_row.html"] == 0
    assert listings <= 5, listings
    # A new group: every page gets it, from one rendering per version (not one per
    # page), and only the new row is rendered.
    await c.stable("orders-new", {"a": {"orders": [0]}})
    seen = []
    for page in pages:
        got = await _events(page, lambda e: any(
            "orders-new" in m["html"] and "Stable" in m["html"].split("orders-new")[-1]
            for _, m in e), 5.0)
        seen.append({m["digest"] for _, m in got if m["id"] == "live-groups"})
    # (A version the pages see is one rendering; one more may have found nothing new.)
    assert len(seen[0]) <= renders["_groups.html"] <= 3, (renders, seen)
    assert all(digests == seen[0] for digests in seen)
    assert renders["_group_row.html"] == renders["_groups.html"]
    for page in pages:
        page.close()


async def test_open_group_pages_are_rendered_once_per_change(
        open_console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    c = open_console
    await c.stable("orders-eu", {"a": {"orders": [0, 1]}, "b": {"orders": [2, 3]}})
    renders: Counter[str] = Counter()
    render = jinja2.Template.render

    def counted_render(template: jinja2.Template, *args: Any, **kwargs: Any) -> str:
        renders[str(template.name)] += 1
        return render(template, *args, **kwargs)

    monkeypatch.setattr(jinja2.Template, "render", counted_render)
    pages = [await c.client.get("/console/events?page=group&group=orders-eu")
             for _ in range(4)]
    for page in pages:
        assert page.status == 200
        await _events(page, lambda e: {m["id"] for _, m in e} >= {
            "live-summary", "live-members", "live-grid", "live-checkpoints", "live-timeline"},
            5.0)
    renders.clear()
    await asyncio.sleep(1.5)
    assert renders == Counter(), renders
    joined = asyncio.ensure_future(c.join("orders-eu", "newcomer"))
    seen = []
    for page in pages:
        got = await _events(page, lambda e: any(
            m["id"] == "live-members" and "newcomer" in m["html"] for _, m in e), 5.0)
        seen.append({m["digest"] for _, m in got if m["id"] == "live-members"})
    assert len(seen[0]) <= renders["_members.html"] <= 3, (renders, seen)
    joined.cancel()
    for page in pages:
        page.close()


async def test_a_live_overview_shows_each_token_only_its_groups(auth_console: Console) -> None:
    c = auth_console
    await c.stable("orders-eu", {"a": {"orders": [0]}})
    team = {"Cookie": f"{COOKIE}={_cookie(await _login(c, TEAM))}"}
    ops = {"Cookie": f"{COOKIE}={_cookie(await _login(c, OPS))}"}
    team_page = await c.client.get("/console/events?page=overview", headers=team)
    ops_page = await c.client.get("/console/events?page=overview", headers=ops)
    await _first_fragment(team_page)
    await _first_fragment(ops_page)
    await c.stable("billing", {"a": {"orders": [1]}})
    await c.stable("orders-us", {"a": {"orders": [2]}})
    await _events(ops_page, lambda e: any(
        "orders-us" in m["html"] and "billing" in m["html"] for _, m in e), 5.0)
    got = await _events(team_page, lambda e: any("orders-us" in m["html"] for _, m in e), 5.0)
    assert all("billing" not in m["html"] for _, m in got)
    assert "1 group<" not in got[-1][1]["html"] and "2 groups" in got[-1][1]["html"]
    team_page.close()
    ops_page.close()


async def test_one_client_cannot_take_every_live_page(open_console: Console) -> None:
    c = open_console
    mine = [await c.client.get("/console/events?page=overview")
            for _ in range(MAX_STREAMS_PER_CLIENT)]
    assert all(page.status == 200 for page in mine)
    refused = await c.client.get("/console/events?page=overview")
    assert refused.status == 429
    assert f"at most {MAX_STREAMS_PER_CLIENT} per client" in await refused.text()
    # Another address (127.0.0.2 is loopback too) still gets a live page.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as other:
        resp = await other.get(str(c.client.make_url("/console/events?page=overview")))
        await _first_fragment(resp)
        resp.close()
    for page in mine:
        page.close()


async def test_with_tokens_the_live_page_limit_is_per_token(auth_console: Console) -> None:
    c = auth_console
    pages = []
    for _ in range(MAX_STREAMS_PER_CLIENT):
        # A session each: signing in again gives no more places.
        viewer = {"Cookie": f"{COOKIE}={_cookie(await _login(c, VIEWER))}"}
        pages.append(await c.client.get("/console/events?page=overview", headers=viewer))
    assert all(page.status == 200 for page in pages)
    viewer = {"Cookie": f"{COOKIE}={_cookie(await _login(c, VIEWER))}"}
    assert (await c.client.get("/console/events?page=overview", headers=viewer)).status == 429
    ops = {"Cookie": f"{COOKIE}={_cookie(await _login(c, OPS))}"}
    await _first_fragment(await c.client.get("/console/events?page=overview", headers=ops))
    for page in pages:
        page.close()


async def test_a_client_that_leaves_frees_its_place_at_once(open_console: Console) -> None:
    c = open_console
    await c.stable("orders-eu", {"a": {"orders": [0]}})
    streams = _served_streams(c)
    page = await c.protocol.get("/console/events?page=overview")
    await _first_fragment(page)
    assert streams.open == 1
    # Nothing changes on the page, so the server has nothing to write.
    page.close()
    loop = asyncio.get_running_loop()
    left = loop.time()
    while streams.open and loop.time() - left < 5.0:
        await asyncio.sleep(0.02)
    assert streams.open == 0 and loop.time() - left < 1.0, loop.time() - left


async def test_a_place_freed_by_a_client_that_left_is_taken_again(open_console: Console) -> None:
    c = open_console
    pages = [await c.protocol.get("/console/events?page=overview")
             for _ in range(MAX_STREAMS_PER_CLIENT)]
    for page in pages:
        await _first_fragment(page)
    pages[0].close()
    await asyncio.sleep(1.0)
    again = await c.protocol.get("/console/events?page=overview")
    await _first_fragment(again)
    for page in [*pages[1:], again]:
        page.close()


async def test_a_stream_whose_client_left_is_one_debug_line(
        open_console: Console, caplog: pytest.LogCaptureFixture) -> None:
    c = open_console
    caplog.set_level(logging.DEBUG, logger="groupcoord.console")
    await c.stable("orders-eu", {"a": {"orders": [0]}})
    page = await c.protocol.get("/console/events?page=overview")
    await _first_fragment(page)
    page.close()
    # The page changes after the client left: there is something to send.
    await c.stable("orders-us", {"a": {"orders": [1]}})
    await asyncio.sleep(1.5)
    console_records = [r for r in caplog.records if r.name == "groupcoord.console"]
    assert [r for r in console_records if r.levelno > logging.DEBUG] == []
    gone = [r for r in console_records if "went away" in r.getMessage()]
    assert len(gone) == 1 and gone[0].exc_info is None
