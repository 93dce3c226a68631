"""The web console in a real headless Chromium (Playwright), against the real
``groupcoord serve`` and real member processes.

Chromium is Debian's ``/usr/bin/chromium`` (``executable_path``; Playwright
downloads no browser), with a fresh profile per test and no network beyond
the server. Every test fails on an error in the browser's console or an
uncaught exception in the page.

``GROUPCOORD_CONSOLE_SCREENSHOTS=docs/img`` also writes the screenshots shown
in docs/operations.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from server_harness import ServerProcess, StartServer, wait_until

from coordinator.auth import hash_token
from protocol import codec

playwright_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.timeout(180)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
MEMBER_PROC = str(Path(__file__).parent.parent / "client" / "member_proc.py")
GROUP = "orders-app"
SESSION_MS = 1_500
SCREENSHOTS = os.environ.get("GROUPCOORD_CONSOLE_SCREENSHOTS")

if not Path(CHROMIUM).exists():  # .ci/run installs it; say so rather than pass
    pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=True)


@dataclass
class Browser:
    page: Any
    #: console messages of type error/warning and uncaught page errors.
    problems: list[str] = field(default_factory=list)

    def screenshot(self, tmp_path: Path, name: str, *, docs: bool = True) -> None:
        self.page.screenshot(path=str(tmp_path / name), full_page=True)
        if SCREENSHOTS and docs:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=True)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1200, "height": 800})
        context.set_default_timeout(10_000)
        page = context.pages[0] if context.pages else context.new_page()
        b = Browser(page)
        page.on("console", lambda m: b.problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: b.problems.append(f"page error: {e}"))
        try:
            yield b
        finally:
            context.close()
    assert b.problems == [], b.problems


# ---------------------------------------------------------------- server and members


def _request(server: ServerProcess, method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json", token: str | None = None) -> Any:
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    # Protocol calls go to the protocol listener, everything else to the admin one.
    base = server.url if content_type == codec.CONTENT_TYPE else server.admin_url
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        data = resp.read()
    return codec.decode(data) if content_type == codec.CONTENT_TYPE else json.loads(data or b"{}")


def _put_resource(server: ServerProcess, name: str, partitions: int,
                  token: str | None = None) -> None:
    _request(server, "PUT", f"/v1/resources/{name}",
             json.dumps({"partitions": partitions}).encode(), token=token)


def _simple_commit(server: ServerProcess, group: str, checkpoints: list[list[Any]],
                   token: str | None = None) -> None:
    """Checkpoints of an Empty group, as a tool that loads them would commit them."""
    answer = _request(server, "POST", "/v1/commit", codec.encode(
        {"group_id": group, "member_id": "loader", "generation_id": -1,
         "checkpoints": checkpoints}), content_type=codec.CONTENT_TYPE, token=token)
    assert answer["error"] is None, answer


def _one_member_group(server: ServerProcess, group: str, token: str) -> None:
    """A Stable group of one member, made with raw protocol calls (join, join, sync)."""
    def call(api: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = _request(server, "POST", f"/v1/{api}", codec.encode(body),
                                          content_type=codec.CONTENT_TYPE, token=token)
        return answer
    join = {"group_id": group, "member_id": "", "protocol_type": "resources",
            "protocols": [["range", b""]], "session_timeout_ms": 60_000,
            "rebalance_timeout_ms": 10_000, "client_id": "tool"}
    first = call("join", join)
    joined = call("join", {**join, "member_id": first["member_id"]})
    assert joined["error"] is None, joined
    synced = call("sync", {"group_id": group, "member_id": first["member_id"],
                           "generation_id": joined["generation_id"],
                           "assignments": [{"member_id": first["member_id"],
                                            "assignment": b""}]})
    assert synced["error"] is None, synced


@pytest.fixture
def members(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _start_member(procs: dict[str, subprocess.Popen[bytes]], server: ServerProcess,
                  name: str, tmp_path: Path) -> None:
    procs[name] = subprocess.Popen(
        [sys.executable, MEMBER_PROC, server.url, name, str(tmp_path / f"{name}.jsonl"),
         "--group", GROUP, "--sets", "orders", "--session-ms", str(SESSION_MS),
         "--heartbeat-ms", "300"], stderr=subprocess.DEVNULL)


def _rows(page: Any, table: str) -> list[str]:
    return [r.strip() for r in page.locator(f"{table} tbody tr").all_inner_texts()]


# ---------------------------------------------------------------- tests


def test_a_group_of_member_processes_shows_live_and_a_kill_updates_the_page(
        start_server: StartServer, browser: Browser, members: dict[str, Any],
        tmp_path: Path) -> None:
    server = start_server()
    _put_resource(server, "orders", 12)
    _simple_commit(server, GROUP, [["orders", i, 1000 + 10 * i] for i in range(4)])
    # A group that never formed (checkpoints only): listed, with no rebalance.
    _simple_commit(server, "billing-nightly", [["orders", 0, 1]])
    page = browser.page
    page.goto(f"{server.admin_url}/console/")
    page.evaluate("window.__sameDocument = true")
    # Members start after the page loaded: the group appears without a reload.
    for name in ("worker-1", "worker-2", "worker-3"):
        _start_member(members, server, name, tmp_path)
    row = page.locator("table.groups tbody tr", has_text=GROUP)
    row.filter(has_text="Stable").wait_for()
    assert wait_until(lambda: "3" in row.locator("td").nth(2).inner_text(), 15)
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("#live-status").get_attribute("data-state") == "on"
    browser.screenshot(tmp_path, "console-overview.png")

    page.click(f"text={GROUP}")
    page.wait_for_url(f"**/console/groups/{GROUP}")
    page.evaluate("window.__sameDocument = true")
    members_rows = page.locator("table.members tbody tr")
    assert members_rows.count() == 3
    assert page.locator("table.grid tbody tr").count() == 12
    assert "1000" in page.locator("table.checkpoints").inner_text()
    browser.screenshot(tmp_path, "console-group-before-kill.png", docs=False)

    # Kill one member: the page shows the group without it, and what moved, on its own.
    generation = int(page.locator("#live-summary dd").nth(1).inner_text())
    # The keyboard focus is in the grid (its scrolling region): a live swap keeps it there.
    page.focus("[data-key=grid]")
    killed_at = time.monotonic()
    members["worker-2"].send_signal(signal.SIGKILL)
    members["worker-2"].wait(10)
    page.locator("table.members tbody tr").nth(2).wait_for(state="detached", timeout=15_000)
    assert "worker-2" not in page.locator("table.members").inner_text()
    page.locator(".legend", has_text=f"generation {generation + 1}:").or_(
        page.locator(".legend", has_text=f"generation {generation + 2}:")).wait_for(
        timeout=15_000)
    took = time.monotonic() - killed_at
    assert took < 15, took
    assert page.evaluate("window.__sameDocument") is True  # no reload
    assert page.evaluate("document.activeElement.getAttribute('data-key')") == "grid"
    # What worker-2 owned moved to the others, and the grid marks it.
    assert page.locator("table.grid td.moved").count() >= 1
    assert page.locator("table.grid tbody tr.unowned").count() == 0
    timeline = page.locator("table.timeline tbody tr").first.inner_text()
    assert re.search(r"[1-9]\d* moved", timeline), timeline
    browser.screenshot(tmp_path, "console-group.png")

    # SIGTERM with a live page open: the server still stops promptly, and the page says so.
    started = time.monotonic()
    assert server.terminate(timeout_s=10) == 0
    assert time.monotonic() - started < 5
    page.locator("#live-status[data-state='off']").wait_for(timeout=5_000)


def test_reset_in_the_console_shows_before_and_after_then_executes(
        start_server: StartServer, browser: Browser, tmp_path: Path) -> None:
    server = start_server()
    _put_resource(server, "orders", 8)
    _simple_commit(server, GROUP, [["orders", i, 500 + i] for i in range(6)])
    page = browser.page
    page.goto(f"{server.admin_url}/console/groups/{GROUP}")
    page.check("#mode-shift-by")
    page.fill("#reset-value", "-100")
    page.fill("#reset-resources", "orders:0-2")
    page.press("#reset-resources", "Enter")
    page.wait_for_url(f"**/console/groups/{GROUP}/reset")
    assert "dry run" in page.locator("h1").inner_text()
    rows = _rows(page, "table.compare")
    assert [r.split() for r in rows] == [
        ["orders[0]", "500", "400", "yes"], ["orders[1]", "501", "401", "yes"],
        ["orders[2]", "502", "402", "yes"]]
    # Nothing changed yet.
    checkpoints = _request(server, "GET", f"/v1/groups/{GROUP}/checkpoints")["checkpoints"]
    assert [c["value"] for c in checkpoints[:3]] == [500, 501, 502]
    browser.screenshot(tmp_path, "console-reset-dry-run.png")

    page.click("text=Execute this reset")
    page.locator("text=Done: 3 checkpoints changed").wait_for()
    checkpoints = _request(server, "GET", f"/v1/groups/{GROUP}/checkpoints")["checkpoints"]
    assert [c["value"] for c in checkpoints] == [400, 401, 402, 503, 504, 505]


def test_the_pages_work_with_the_keyboard(start_server: StartServer, browser: Browser) -> None:
    server = start_server()
    _simple_commit(server, GROUP, [["orders", 0, 7]])
    page = browser.page
    page.goto(f"{server.admin_url}/console/")

    def focused() -> dict[str, Any]:
        info: dict[str, Any] = page.evaluate("""() => {
            const el = document.activeElement;
            const style = getComputedStyle(el);
            const box = el.getBoundingClientRect();
            return {tag: el.tagName, text: (el.innerText || el.value || "").trim(),
                    id: el.id, outline: style.outlineStyle, top: box.top};
        }""")
        return info

    # The first Tab reaches the skip link, shown with a visible focus ring; Enter skips.
    page.keyboard.press("Tab")
    first = focused()
    assert first["text"] == "Skip to content" and first["outline"] != "none"
    assert first["top"] >= 0
    page.keyboard.press("Enter")
    assert focused()["id"] == "main"
    # From the content, Tab reaches the group's link; Enter opens it.
    page.keyboard.press("Tab")
    link = focused()
    assert (link["tag"], link["text"]) == ("A", GROUP) and link["outline"] != "none"
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/console/groups/{GROUP}")

    # On the group page, the reset form is filled in and sent with the keyboard alone.
    def tab_to(text: str = "", element_id: str = "") -> dict[str, Any]:
        for _ in range(40):
            page.keyboard.press("Tab")
            now = focused()
            if (text and now["text"] == text) or (element_id and now["id"] == element_id):
                assert now["outline"] != "none", now
                return now
        pytest.fail(f"Tab never reached {text or element_id!r}")

    tab_to(element_id="reset-value")
    page.keyboard.type("5")
    tab_to(text="Preview reset (dry run)")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/console/groups/{GROUP}/reset")
    assert "dry run" in page.locator("h1").inner_text()
    assert [r.split() for r in _rows(page, "table.compare")] == [["orders[0]", "7", "5", "yes"]]
    tab_to(text="Execute this reset")
    page.keyboard.press("Enter")
    page.locator("text=Done: 1 checkpoint changed").wait_for()
    # Every data table has column headers.
    page.goto(f"{server.admin_url}/console/groups/{GROUP}")
    for table in page.locator("table").all():
        assert table.locator("thead th[scope=col]").count() > 0
        assert table.locator("caption").count() == 1


def test_with_tokens_the_console_signs_in_with_an_admin_token(
        start_server: StartServer, browser: Browser, tmp_path: Path) -> None:
    ops = "ops-" + "0123456789abcdef" * 3       # admin, orders-* only
    loader = "loader-" + "0123456789abcdef" * 3  # every group, not admin
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(
        json.dumps({"name": "ops", "hash": hash_token(ops), "groups": ["orders-"],
                    "role": "admin"}) + "\n"
        + json.dumps({"name": "loader", "hash": hash_token(loader), "groups": ["*"]}) + "\n")
    server = start_server(auth_tokens=tokens)
    _one_member_group(server, GROUP, loader)
    _one_member_group(server, "billing", loader)
    page = browser.page
    page.goto(f"{server.admin_url}/console/groups/{GROUP}")
    page.wait_for_url(lambda url: "/console/login?next=" in url)
    page.fill("#token", ops)
    page.press("#token", "Enter")
    page.wait_for_url(f"**/console/groups/{GROUP}")
    assert "Signed in as ops (admin)" in page.locator("header").inner_text()
    # The session cookie is out of the scripts' reach, and the token is in no page.
    assert page.evaluate("document.cookie") == ""
    assert ops not in page.content()
    page.goto(f"{server.admin_url}/console/")
    overview = page.locator("table.groups").inner_text()
    assert GROUP in overview and "billing" not in overview  # outside the token's grant
    page.locator("#live-status[data-state='on']").wait_for()
    page.click("text=Sign out")
    page.wait_for_url("**/console/login")


def test_a_page_over_the_live_page_limit_says_updates_are_off(
        start_server: StartServer, browser: Browser) -> None:
    server = start_server(console_max_streams_per_client=1)
    _simple_commit(server, GROUP, [["orders", 0, 7]])
    first = browser.page
    first.goto(f"{server.admin_url}/console/")
    first.locator("#live-status[data-state='on']").wait_for()
    # A second tab of the same client: refused (429), the page still shows the groups.
    second = first.context.new_page()
    second.goto(f"{server.admin_url}/console/")
    second.locator("#live-status[data-state='off']").wait_for()
    assert "Live updates are off" in second.locator("#live-status").inner_text()
    assert GROUP in second.locator("table.groups").inner_text()
    # The first tab leaves: its place is free at once, and a reload is live again.
    first.close()
    time.sleep(1.0)
    second.reload()
    second.locator("#live-status[data-state='on']").wait_for()
    second.close()


def test_the_catalog_shows_weights_and_zones_and_follows_a_change(
        start_server: StartServer, browser: Browser, tmp_path: Path) -> None:
    server = start_server()
    _request(server, "PUT", "/v1/resources/orders", json.dumps({
        "partitions": 8, "weights": {"overrides": [[3, 40], [7, 12.5]]},
        "zones": {"overrides": [[3, ["eu-1a"]]]}}).encode())
    _simple_commit(server, GROUP, [["orders", 0, 7]])
    page = browser.page
    page.goto(f"{server.admin_url}/console/")
    assert _rows(page, "table.catalog") == [
        "orders\t8\tdefault 1, 2 overrides, load 58.5\tdefault anywhere; 1 override (eu-1a)"]
    page.locator("#live-status[data-state='on']").wait_for()
    browser.screenshot(tmp_path, "console-catalog.png", docs=False)
    # Changed through the API: the open page follows (its live stream).
    _request(server, "PUT", "/v1/resources/orders", json.dumps({
        "partitions": 8, "zones": {"default": ["eu-1b"]}}).encode())
    page.locator("table.catalog", has_text="default eu-1b").wait_for()
    assert _rows(page, "table.catalog") == [
        "orders\t8\tdefault 1, 2 overrides, load 58.5\tdefault eu-1b"]


def test_the_drain_button_asks_first_then_the_member_hands_over_and_leaves(
        start_server: StartServer, browser: Browser, members: dict[str, Any],
        tmp_path: Path) -> None:
    """Two member processes of a "resources" group (the balanced assignor): an
    operator clicks a member's Drain button. Declining the confirmation sends
    nothing; accepting it sends the drain request: the member hears it at its
    next heartbeat, hands its resources over and leaves, its process ends, and
    the open page follows until the other member owns everything."""
    server = start_server()
    _put_resource(server, "orders", 4)
    for name in ("worker-1", "worker-2"):
        members[name] = subprocess.Popen(
            [sys.executable, MEMBER_PROC, server.url, name, str(tmp_path / f"{name}.jsonl"),
             "--group", GROUP, "--sets", "orders", "--assignor", "balanced",
             "--session-ms", str(SESSION_MS), "--heartbeat-ms", "300"],
            stderr=subprocess.DEVNULL)

    def shown() -> dict[str, bool]:
        group = _request(server, "GET", f"/v1/groups/{GROUP}")
        return {m["client_id"]: m["drain_requested"] for m in group["members"]}

    def formed() -> bool:
        try:
            return len(shown()) == 2
        except urllib.error.HTTPError:
            return False  # not created yet

    assert wait_until(formed, 15)
    page = browser.page
    page.goto(f"{server.admin_url}/console/groups/{GROUP}")
    rows = page.locator("table.members tbody tr")
    assert wait_until(lambda: rows.count() == 2, 15)
    row = rows.filter(has_text="worker-2")
    asked: list[str] = []

    # Declined: nothing is asked.
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    row.locator("form.drain button").click()
    assert wait_until(lambda: len(asked) == 1, 5)
    assert asked[0].startswith("Drain member worker-2?"), asked
    time.sleep(0.5)
    assert shown() == {"worker-1": False, "worker-2": False}
    assert row.locator("form.drain button").count() == 1

    # Accepted: the request is sent; the member drains and leaves.
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("form.drain button").click()
    page.wait_for_url(f"**/console/groups/{GROUP}")
    assert members["worker-2"].wait(timeout=30) == 0
    group = _request(server, "GET", f"/v1/groups/{GROUP}")
    assert [m["client_id"] for m in group["members"]] == ["worker-1"]
    assert wait_until(lambda: _request(server, "GET", f"/v1/groups/{GROUP}")["members"][0]
                      ["assignment"] == {"orders": [0, 1, 2, 3]}, 30)
    page.locator("table.members tbody tr", has_text="worker-2").wait_for(state="detached")
    assert rows.count() == 1
    assert rows.first.locator("form.drain button").count() == 1
    browser.screenshot(tmp_path, "console-drain-done.png", docs=False)


def test_the_focus_comes_back_when_a_swap_brings_its_element_back(
        start_server: StartServer, browser: Browser, members: dict[str, Any],
        tmp_path: Path) -> None:
    """The keyboard focus in the grid stays there across live swaps, even when
    one swap takes the grid away (its only member left: nothing assigned) and a
    later one brings it back (a member joins again)."""
    server = start_server()
    _put_resource(server, "orders", 4)
    _start_member(members, server, "worker-1", tmp_path)
    page = browser.page
    page.goto(f"{server.admin_url}/console/")
    page.locator("table.groups tbody tr", has_text=GROUP).filter(has_text="Stable").wait_for()
    page.goto(f"{server.admin_url}/console/groups/{GROUP}")
    page.locator("[data-key=grid]").wait_for()
    page.locator("#live-status[data-state='on']").wait_for()
    page.focus("[data-key=grid]")
    members["worker-1"].terminate()
    assert members["worker-1"].wait(30) == 0
    page.locator("[data-key=grid]").wait_for(state="detached", timeout=15_000)
    assert page.evaluate("document.activeElement === document.body")
    _start_member(members, server, "worker-2", tmp_path)
    page.locator("[data-key=grid]").wait_for(timeout=15_000)
    assert wait_until(lambda: page.evaluate(
        "document.activeElement.getAttribute('data-key')") == "grid", 5)
