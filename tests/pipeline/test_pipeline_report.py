"""report.html of ``groupcoord analyze`` at two time scales, rendered by
headless Chromium (Debian's ``chromium``, driven by Playwright's Python
package; no browser is downloaded): no console errors, every chart it shows
has data, a chart with nothing to show says so in words; buckets, durations
and rounding as docs/pipeline.md says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pipeline_journal_builder import HOUR, T0, Row, write_db

from pipeline.analyze import AnalyzeOptions, analyze
from pipeline.report import amount

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
MINUTE = 60_000


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


def render(browser: Any, report: Path) -> dict[str, Any]:
    page = browser.new_page()
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
    page.close()
    return {"errors": errors, "charts": charts, "empty": words, "text": text}


def run(spark: Any, tmp_path: Path, rows: list[Row]) -> tuple[Path, dict[str, Any]]:
    db = write_db(tmp_path / "coord.db", rows)
    res = analyze(spark, [str(db)], tmp_path / "out",
                  AnalyzeOptions(storm_window_ms=600_000, storm_threshold=5, progress=False))
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
    seen = render(browser, report)
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
    seen = render(browser, report)
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
