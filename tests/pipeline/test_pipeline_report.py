"""report.html of ``groupcoord analyze`` at two time scales, rendered by
headless Chromium (Debian's ``chromium``, driven by Playwright's Python
package; no browser is downloaded): no console errors, every chart it shows
has data, a chart with nothing to show says so in words; buckets, durations
and rounding as docs/pipeline.md says.

Every report is read in a 1,400 px and an 800 px wide window, and nothing
may overflow (:func:`check_fits`): the page never scrolls sideways, no
element sticks out of it, no box cuts its text off. A table wider than an
800 px window scrolls inside its own box; at 1,400 px every table fits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pipeline_journal_builder import HOUR, T0, Row, write_db

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.report import amount, counted, plural

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
MINUTE = 60_000
#: The widths every report is read at: a laptop's browser window, and half a screen.
WIDTHS = (1400, 800)

#: What overflows, per element: its tag, class and the start of its text.
OVERFLOW_JS = """() => {
  const doc = document.documentElement, width = doc.clientWidth;
  const name = e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ' '
      + JSON.stringify((e.innerText || e.alt || '').slice(0, 50));
  const out = {page: doc.scrollWidth, width: width, sticking: [], spilling: [], clipped: [],
               scrolling: [], unscrollable: []};
  for (const e of document.querySelectorAll('body *')) {
    const style = getComputedStyle(e);
    if (e.classList.contains('scroll')) {
      if (e.scrollWidth > e.clientWidth + 1) out.scrolling.push(name(e));
      if (style.overflowX !== 'auto' && style.overflowX !== 'scroll')
        out.unscrollable.push(name(e));
    }
    if (e.parentElement.closest('.scroll')) continue;  // reachable by scrolling its box
    const r = e.getBoundingClientRect();
    if (r.right > width + 0.5 || r.left < -0.5) out.sticking.push(name(e));
    if (!e.classList.contains('scroll') && e.clientWidth > 0
        && e.scrollWidth > e.clientWidth + 1) {
      const hides = ['hidden', 'clip'].includes(style.overflowX) || style.textOverflow !== 'clip';
      (hides ? out.clipped : out.spilling).push(name(e));
    }
  }
  return out;
}"""


def five_minutes() -> list[Row]:
    """A 5-minute incident: a group forms (a 3 s initial join, the
    coordinator's delay), then 12 rebalances within 4 minutes (a storm),
    m3 joining and leaving over and over."""
    rows = [Row("g", 1, "initial", T0, T0 + 3_000, {"m1": {"a": [0, 1]}, "m2": {"a": [2, 3]}},
                joined=("m1", "m2"))]
    for i in range(12):
        t = T0 + 10_000 + i * 20_000
        if i % 2 == 0:
            rows.append(Row("g", i + 2, "join", t, t + 150 + 10 * i,
                            {"m1": {"a": [0]}, "m2": {"a": [2]}, "m3": {"a": [1, 3]}},
                            joined=("m3",)))
        else:
            rows.append(Row("g", i + 2, "leave", t, t + 80,
                            {"m1": {"a": [0, 1]}, "m2": {"a": [2, 3]}}, left=("m3",)))
    return rows


def days() -> list[Row]:
    """Four days, two groups, a rebalance every 5 hours each; no storm."""
    rows: list[Row] = []
    for g, offset in (("a", 0), ("b", 2 * HOUR)):
        rows.append(Row(g, 1, "initial", T0 + offset, T0 + offset + 3_000, {"m1": {"x": [0]}},
                        joined=("m1",)))
        for k in range(1, 20):
            t = T0 + offset + k * 5 * HOUR
            owned = {"m1": {"x": [0]}, "m2": {"x": [1]}} if k % 2 else {"m1": {"x": [0, 1]}}
            rows.append(Row(g, k + 1, "join" if k % 2 else "session_expiry", t, t + 200 + k,
                            owned, joined=("m2",) if k % 2 else (),
                            left=() if k % 2 else ("m2",)))
    return rows


@pytest.fixture(scope="module")
def browser() -> Any:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (Debian's package)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def render(browser: Any, report: Path, width: int = WIDTHS[0]) -> dict[str, Any]:
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    charts = page.eval_on_selector_all(
        "img", "els => els.map(e => ({alt: e.alt, loaded: e.complete && e.naturalWidth > 0,"
        " points: e.dataset.points === undefined ? null : Number(e.dataset.points)}))")
    words = page.eval_on_selector_all(".empty", "els => els.map(e => e.innerText)")
    text = page.inner_text("body")
    overflow = page.evaluate(OVERFLOW_JS)
    page.close()
    return {"errors": errors, "charts": charts, "empty": words, "text": text,
            "overflow": overflow, "width": width}


def check_fits(seen: dict[str, Any]) -> None:
    """Nothing overflows for a reader of this window: no sideways scroll of
    the page, no element past its edge, no element whose content is wider
    than its box (spilling over its border, or cut off); a table too wide
    for the window scrolls in its own box, and at 1,400 px none needs to."""
    o, width = seen["overflow"], seen["width"]
    assert o["page"] <= o["width"] == width, (width, o)
    for kind in ("sticking", "spilling", "clipped", "unscrollable"):
        assert o[kind] == [], (width, kind, o[kind])
    if width >= 1400:
        assert o["scrolling"] == [], (width, o["scrolling"])


def read_at_every_width(browser: Any, report: Path) -> dict[str, Any]:
    """The report read at each of WIDTHS, checked to fit; what the widest showed."""
    seen = [render(browser, report, w) for w in WIDTHS]
    for s in seen:
        check_fits(s)
    return seen[0]


def run(spark: Any, tmp_path: Path, rows: list[Row], *more: list[Row],
        storm_threshold: int = 5) -> tuple[Path, dict[str, Any]]:
    """analyze over a database of ``rows`` (source ``coord``) and one more
    per ``more`` (``coord1``, ...); the report, and groups/ by group id."""
    dbs = [write_db(tmp_path / f"coord{i or ''}.db", r) for i, r in enumerate((rows, *more))]
    res = analyze(spark, [str(db) for db in dbs], tmp_path / "out",
                  AnalyzeOptions(storm_window_ms=600_000, storm_threshold=storm_threshold,
                                 progress=False))
    return res.report, {r["group_id"]: r.asDict() for r in
                        spark.read.parquet(str(tmp_path / "out" / "groups")).collect()}


def check_page(seen: dict[str, Any]) -> None:
    assert seen["errors"] == []
    assert seen["charts"], "no chart"
    for chart in seen["charts"]:
        assert chart["loaded"], chart
        assert chart["points"] is not None and chart["points"] > 0, chart


def test_a_five_minute_journal_reads_in_minutes(spark: Any, browser: Any,
                                                tmp_path: Path) -> None:
    report, _ = run(spark, tmp_path, five_minutes())
    seen = read_at_every_width(browser, report)
    check_page(seen)
    text = seen["text"]
    assert "Trend over time (per minute)" in text
    assert "Rebalances per minute" in " ".join(c["alt"] for c in seen["charts"]) or \
        any(c["alt"] == "rebalances by reason" for c in seen["charts"])
    # The storm is drawn, not announced as missing.
    assert not any("No storm" in w for w in seen["empty"])
    # The 3 s initial join is apart: the longest rebalance is 250 ms.
    assert re.search(r"250 ms\s*longest rebalance", text), text[:2000]
    assert re.search(r"3\.0 s\s*initial join p95", text), text[:2000]
    # m3 started all 12 (6 joins, 6 leaves).
    assert re.search(r"m3\s+g\s+12\s+6\s+0\s+6", text), text


def test_a_four_day_journal_reads_in_hours(spark: Any, browser: Any, tmp_path: Path) -> None:
    report, groups = run(spark, tmp_path, days())
    seen = read_at_every_width(browser, report)
    check_page(seen)
    text = seen["text"]
    assert "Trend over time (per hour)" in text
    # No storm: the chart of groups is there, and the words say there is none.
    assert any("No storm" in w for w in seen["empty"]), seen["empty"]
    # One rounding for the same figure in the tile and the table.
    unowned = sum(int(g["unavailable_ms"] or 0) for g in groups.values()) / 1000
    assert re.search(rf"{re.escape(amount(unowned))}\s*unowned resource-seconds", text), text


def test_amounts_round_the_same_everywhere() -> None:
    assert [amount(x) for x in (0, 0.43, 0.0043, 12.345, 99.94, 1234.5, None)] == \
        ["0", "0.43", "0.0043", "12.3", "99.9", "1,234", "-"]


#: Names as real fleets have them: no space or hyphen to wrap at.
LONG_GROUP = "payments_ledger_reconciliation_consumer_eu_west_1_blue_green_canary_v2"
LONG_MEMBER = "worker_pool_17_host_ip_10_42_7_133_pid_48213_" + "0123456789abcdef" * 3


def wide() -> tuple[list[Row], list[Row]]:
    """Two coordinators' journals. The first: a group with long names that
    forms in 6 s (the initial join) and then rebalances in 4 s, and in
    which a member with a long id joins and leaves over and over; the second:
    one small group."""
    a, b = {LONG_MEMBER: {"ledger": [0, 1]}}, {"m2": {"ledger": [2, 3]}}
    rows = [Row(LONG_GROUP, 1, "initial", T0, T0 + 6_000, {**a, **b}, joined=(LONG_MEMBER, "m2")),
            Row(LONG_GROUP, 2, "join", T0 + MINUTE, T0 + MINUTE + 4_000,
                {**a, **b, "m3": {"ledger": [4]}}, joined=("m3",))]
    for i in range(6):
        t = T0 + (2 + i) * MINUTE
        rows.append(Row(LONG_GROUP, 3 + i, "leave" if i % 2 == 0 else "join", t, t + 300,
                        b if i % 2 == 0 else {**a, **b},
                        left=(LONG_MEMBER,) if i % 2 == 0 else (),
                        joined=() if i % 2 == 0 else (LONG_MEMBER,)))
    other = [Row("billing", 1, "initial", T0, T0 + 3_000, {"m1": {"x": [0]}}, joined=("m1",)),
             Row("billing", 2, "join", T0 + 30_000, T0 + 30_500,
                 {"m1": {"x": [0]}, "m2": {"x": [1]}}, joined=("m2",))]
    return rows, other


def test_long_names_fit_the_window_and_every_duration_leaves_out_initial_joins(
        spark: Any, browser: Any, tmp_path: Path) -> None:
    """Read at 1,400 and 800 px, with two journals and names that do not
    wrap at spaces: nothing overflows. The longest rebalance is one figure
    with one definition: 4.0 s in the tile and in the worst groups' table
    (the 6 s initial join is counted apart, and named so)."""
    report, groups = run(spark, tmp_path, *wide())
    seen = read_at_every_width(browser, report)
    check_page(seen)
    text = seen["text"]
    g = groups[LONG_GROUP]
    assert (g["duration_max_ms"], g["rebalance_max_ms"]) == (6_000, 4_000)
    assert groups["billing"]["rebalance_max_ms"] == 500
    assert re.search(r"4\.0 s\s*longest rebalance\s*initial joins left out", text), text[:3000]
    assert re.search(r"6\.0 s\s*longest initial join", text), text[:3000]
    header = re.search(r"group\s+protocol\s+rebalances\s+peak in window\s+storm rebalances"
                       r"\s+rebalance p95\s+longest rebalance\s", text)
    assert header, text
    row = re.search(rf"coord/{LONG_GROUP}\s+range\s+8\s+8\s+\d+\s+(\S+ m?s)\s+(\S+ m?s)\s",
                    text)
    assert row and row.group(2) == "4.0 s", text[header.start():]
    # Two journals: the tile names them, and group names carry them.
    assert re.search(r"2\s*journals\s*coord, coord1 \(groups below are journal/group\)", text), \
        text[:1500]
    assert "coord1/billing" in text


def test_one_of_everything_is_singular(spark: Any, browser: Any, tmp_path: Path) -> None:
    """A journal of one group that formed and rebalanced once: every count
    of 1 with its noun in the singular, on the page."""
    rows = [Row("g", 1, "initial", T0, T0 + 3_000, {"m1": {"a": [0, 1]}}, joined=("m1",)),
            Row("g", 2, "join", T0 + MINUTE, T0 + MINUTE + 200,
                {"m1": {"a": [0]}, "m2": {"a": [1]}}, joined=("m2",))]
    report, _ = run(spark, tmp_path, rows)
    text = read_at_every_width(browser, report)["text"]
    wrong = re.findall(r"(?<![\d.,])1\s+(rebalances|groups|journals|initial joins|resources|"
                       r"follow-ups|revoked resources)\b", text)
    assert wrong == [], text[:2500]
    for phrase in (r"1\s*group\b", r"1\s*journal\b", r"of 1 rebalance,", r"1\s*initial join\b",
                   r"1\s*resource moved", r"2\s*rebalances\s*1 initial join among them",
                   r"Worst groups \(top 1 of 1 group\)"):
        assert re.search(phrase, text), (phrase, text[:2500])


def test_counts_agree_with_their_nouns() -> None:
    assert [counted(n, "rebalance") for n in (0, 1, 2, 1_500)] == \
        ["0 rebalances", "1 rebalance", "2 rebalances", "1,500 rebalances"]
    assert plural("1", "resource-second") == "resource-second"
    assert plural("0.43", "resource-second") == "resource-seconds"
    assert counted(1, "journal row") == "1 journal row"



def test_the_simulation_report_counts_one_cell_in_the_singular() -> None:
    from pipeline.simulate_report import render as render_simulation
    row = {"assignor": "range", "group": "a", "members": 3, "resources": 6,
           "subscription": "all", "churn": "none", "cells": 1, "failed": 0, "converged": 1.0,
           "initial_cpu_ms_p50": 0.2, "cpu_ms_max": 0.3, "final_balance": 0.0, "moved": 0,
           "min_moves": 0, "rounds": 1.0, "unavailable_ms": 0.0, "episodes": 0.0}
    html = render_simulation([row], "tiny")
    for tile in ("<b>1</b>cell<", "<b>1</b>assignor<", "<b>1</b>group<", "<b>1</b>churn pattern<"):
        assert tile in html, html[:3000]
