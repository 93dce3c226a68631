"""The documentation stands on its own in a clone of the repository.

- Every relative Markdown link of README.md and docs/*.md names a file that
  exists, and a ``#anchor`` names a heading of that file (GitHub's slugs).
- Every ``*.md`` file the prose names (``docs/client.md``, ``protocol.md``, a
  path in a code span) exists: in the repository root, in docs/, or beside
  the page that names it.
- Nothing in the repository cites a file outside it: the wire contract is
  docs/protocol.md and the architecture notes docs/architecture.md.
- The user docs and the measurement history name behaviours and areas, not
  issue numbers or "finding N".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

#: what the source tree is made of: every text file under these is searched.
SOURCE_ROOTS = ("README.md", "pyproject.toml", ".ci", "docs", "protocol", "coordinator",
                "client", "pipeline", "tests", "benchmarks", "deploy", "examples")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".json", ".html", ".js", ".css",
                 ".txt", ".cfg", ".ini", ".sh", ".service", ".properties", ""}
#: The one path outside the repository that is a real input: the benchmark
#: scenarios kept beside it (``shared/bench``), optional, which
#: benchmarks/assignors.py reads by default and CI has beside the clone
#: (tests/pipeline/test_pipeline_simulate.py skips without them).
OUTSIDE_ALLOWED = {".ci/run", "benchmarks/assignors.py"}
PARENT_SHARED = "../" + "shared"
#: the names the contract and the design notes had outside the repository.
OUTSIDE_DOCS = ("PROTOCOL" + ".md", "DESIGN" + ".md")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MD_NAME = re.compile(r"(?<![\w/.:-])((?:\.\./|\./)?[\w./-]*[\w-]\.md)\b(?!\w)")
NUMBERED = re.compile(
    r"\bfindings? \d|\bissues? #?\d|(?<![\w&/\]\(])#\d+\b", re.IGNORECASE)


def text_without_code_blocks(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-``
    and ``_`` kept), each space a hyphen."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; repeats get ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in text_without_code_blocks(page):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    for n, line in text_without_code_blocks(page):
        for m in LINK.finditer(line):
            yield n, m.group(1)


def where(page: Path, n: int) -> str:
    return f"{page.relative_to(ROOT)}:{n}"


@pytest.mark.parametrize(("heading", "anchor"), [
    ("HTTP details beyond the protocol", "http-details-beyond-the-protocol"),
    ('The embedded "resources" protocol (client side)',
     "the-embedded-resources-protocol-client-side"),
    ("POST /v1/commit and POST /v1/fetch", "post-v1commit-and-post-v1fetch"),
    ("Several coordinators (`--coordinators N`)", "several-coordinators---coordinators-n"),
    ("v1.2 additions: placement by load and zone, planned hand-over",
     "v12-additions-placement-by-load-and-zone-planned-hand-over"),
])
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Results\n\n```\n## not a heading\n```\n\n## Results\n")
    assert anchors(page) == {"title", "results", "results-1"}


def test_the_pages_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "protocol.md", "architecture.md", "client.md",
            "operations.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for n, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{where(page, n)}: {target}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{where(page, n)}: {target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where(page, n)}: {target}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_named_exists(page: Path) -> None:
    """A page named in prose or a code span (``docs/operations.md``,
    ``client.md``) is a file of the repository."""
    missing: list[str] = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in MD_NAME.finditer(line):
            name = m.group(1)
            if "://" in line[max(0, m.start() - 80):m.start()] and "/" in name:
                continue  # part of a URL
            candidates = (ROOT / name, DOCS / name, page.parent / name)
            if not any(c.resolve().is_file() and c.resolve().is_relative_to(ROOT)
                       for c in candidates):
                missing.append(f"{where(page, n)}: {name}")
    assert not missing, "pages named but not in the repository:\n" + "\n".join(missing)


def source_files() -> Iterator[Path]:
    for top in SOURCE_ROOTS:
        base = ROOT / top
        if base.is_file():
            yield base
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix in TEXT_SUFFIXES:
                yield path


def test_nothing_cites_a_file_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found: list[str] = []
    for path in source_files():
        if path.resolve() == this:
            continue
        rel = path.relative_to(ROOT).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if PARENT_SHARED in line and rel not in OUTSIDE_ALLOWED:
                found.append(f"{rel}:{n}: {line.strip()}")
            for name in OUTSIDE_DOCS:
                if name in line:
                    found.append(f"{rel}:{n}: {line.strip()} "
                                 f"(cite docs/protocol.md or docs/architecture.md)")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_no_issue_or_finding_numbers(page: Path) -> None:
    hits = [f"{where(page, n)}: {line.strip()}"
            for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if NUMBERED.search(line)]
    assert not hits, "say what the behaviour or the measurement is instead:\n" + "\n".join(hits)
