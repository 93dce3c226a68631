"""Self-contained HTML reports: one file, PNG plots embedded as base64.

Shared by the analyze and simulate reports. matplotlib runs headless (Agg).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

#: The page fits any window from a phone's up: names (group and member ids,
#: paths) wrap anywhere rather than widen the page, figures never wrap, and a
#: table still wider than the page scrolls inside its own box (``.scroll``),
#: never the page (tests/pipeline/test_pipeline_report.py checks 1,400 and
#: 800 px).
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em;overflow-wrap:break-word}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
td{white-space:nowrap}td.l{white-space:normal;min-width:8em;overflow-wrap:anywhere}
th{background:#f4f4f4}td.l,th.l{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:.8em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em;max-width:100%;
box-sizing:border-box}
.card b{display:block;font-size:1.4em}
.card small{display:block;color:#555;font-size:.85em;max-width:24em;overflow-wrap:anywhere}
.note{color:#666;font-size:.9em}img{max-width:100%;height:auto}
.empty{border:1px dashed #bbb;color:#555;padding:1em;margin:.5em 0}
"""


def figure() -> tuple[Any, Any]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4), dpi=100)
    return fig, ax


def png(fig: Any, title: str = "plot", points: int | None = None) -> str:
    """An ``<img>`` tag with the figure as an embedded PNG; closes the figure.
    ``points``: how many non-empty data points it shows (``data-points``,
    which the report's browser test checks)."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    count = f' data-points="{points}"' if points is not None else ""
    return f'<img class="chart" alt="{esc(title)}"{count} src="data:image/png;base64,{data}">'


def esc(value: object) -> str:
    return html.escape(str(value))


def plural(count: object, noun: str, many: str | None = None) -> str:
    """``noun`` for a count of exactly 1, else its plural (``many``, or
    ``noun`` + "s"): "1 rebalance", "0 rebalances", "2.5 resource-seconds"."""
    try:
        one = float(count) == 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        one = False
    return noun if one else (many if many is not None else noun + "s")


def counted(count: int, noun: str, many: str | None = None) -> str:
    """A count and its noun, agreeing: "1 rebalance", "1,200 rebalances"."""
    return f"{num(count)} {plural(count, noun, many)}"


def num(value: object, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return esc(value)


def amount(value: object) -> str:
    """A figure that may have a fraction (resource-seconds), the same way in
    tiles, tables and chart labels: three significant digits below 100, whole
    numbers with thousands separators above; 0 only when it is 0."""
    if value is None:
        return "-"
    v = float(value)  # type: ignore[arg-type]
    if v == 0:
        return "0"
    if abs(v) < 100:
        return f"{v:.3g}"
    return f"{v:,.0f}"


def empty(what: str) -> str:
    """What stands where a chart would have nothing to show."""
    return f"<p class='empty'>{esc(what)}</p>"


def seconds(ms: object) -> str:
    if ms is None:
        return "-"
    v = float(ms)  # type: ignore[arg-type]
    if v < 1000:
        return f"{v:.0f} ms"
    if v < 120_000:
        return f"{v / 1000:.1f} s"
    if v < 7_200_000:
        return f"{v / 60_000:.1f} min"
    return f"{v / 3_600_000:.1f} h"


def utc(ms: object) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")  # type: ignore[call-overload]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """An HTML table; cells are already-escaped strings; the first ``left``
    columns are left-aligned (names), the rest right-aligned (figures)."""
    head = "".join(f'<th class="{"l" if i < left else ""}">{esc(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def cards(items: Sequence[tuple[str, str] | tuple[str, str, str]]) -> str:
    """Tiles: (label, value already escaped) or (label, value, detail): a
    line in words under the label."""
    def tile(item: tuple[str, ...]) -> str:
        detail = f"<small>{esc(item[2])}</small>" if len(item) > 2 else ""
        return f'<div class="card"><b>{item[1]}</b>{esc(item[0])}{detail}</div>'
    return '<div class="cards">' + "".join(tile(i) for i in items) + "</div>"


def page(title: str, body: Sequence[str]) -> str:
    generated = datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{_STYLE}</style></head><body><h1>{esc(title)}</h1>"
            f"<p class='note'>generated {generated} by groupcoord</p>"
            + "\n".join(body) + "</body></html>\n")
