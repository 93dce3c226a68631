"""The settings the docs list are the settings ``groupcoord serve`` has.

The settings are declared once (``CoreConfig`` and ``ServerConfig``'s fields,
listed by ``coordinator.config.SETTINGS``); the docs describe them in prose, so
they are checked against the declarations rather than generated:

- docs/operations.md, "Settings": every setting has its row, with its flag,
  its environment variable and its default (a code span holding the value, or
  words such as "off" for an empty string); no row names a flag that does not
  exist; the TOML example uses real keys;
- every other flag table of docs/operations.md names real flags and variables;
- README.md, "Configuration", names every flag and no other.
"""

from __future__ import annotations

import re
from pathlib import Path

from coordinator.config import ENV_PREFIX, SETTINGS, Setting

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
README = ROOT / "README.md"

BY_FLAG = {s.flag: s for s in SETTINGS}
CONFIG_FLAG = "--config"
FLAG = re.compile(r"`(--[a-z][a-z-]*)`")
ENV = re.compile(r"`(" + ENV_PREFIX + r"[A-Z_]+)`")


def section(text: str, heading: str) -> str:
    """The body of the section ``heading`` (a whole line), up to the next heading of
    its level or above."""
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n") + len(heading) + 2
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start:], re.MULTILINE)
    return text[start:] if end is None else text[start:start + end.start()]


def flag_rows(text: str) -> list[list[str]]:
    """The cells of the rows of every ``| flag | environment | default |`` table."""
    rows = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| flag | environment | default |"):
            in_table = True
        elif in_table and line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        else:
            in_table = False
    return rows


def split_top(cell: str) -> list[str]:
    """``a, b (c, d), e`` -> ``["a", "b (c, d)", "e"]``."""
    items, depth, current = [], 0, ""
    for ch in cell:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    return [*items, current.strip()]


def shows_default(item: str, setting: Setting) -> bool:
    if setting.default == "":
        # Nothing to quote: the cell says what an empty value means ("off", "none",
        # "the `--host` value"), and must not claim a value.
        return not item.startswith("`")
    return item.startswith(f"`{setting.default}`")


def test_the_settings_table_lists_every_setting_with_its_variable_and_default() -> None:
    rows = flag_rows(section(OPERATIONS.read_text(), "## Settings"))
    documented: list[str] = []
    for cells in rows:
        assert len(cells) == 4, f"docs/operations.md, Settings: not 4 cells: {cells}"
        flags = FLAG.findall(cells[0])
        assert flags, f"docs/operations.md, Settings: a row without a flag: {cells[0]}"
        unknown = [f for f in flags if f not in BY_FLAG]
        assert not unknown, f"docs/operations.md, Settings: no such setting {unknown}"
        settings = [BY_FLAG[f] for f in flags]
        assert ENV.findall(cells[1]) == [s.env for s in settings], cells
        defaults = split_top(cells[2])
        if len(defaults) == 1:
            defaults *= len(settings)
        assert len(defaults) == len(settings), (
            f"docs/operations.md, Settings: {cells[0]}: give one default, or one per flag: "
            f"{cells[2]}")
        for setting, item in zip(settings, defaults, strict=True):
            assert shows_default(item, setting), (
                f"docs/operations.md, Settings: {setting.flag} defaults to "
                f"{setting.default!r}, the table says {item}")
        documented += flags
    missing = [s.flag for s in SETTINGS if s.flag not in documented]
    assert not missing, f"docs/operations.md, Settings: no row for {missing}"
    assert len(documented) == len(set(documented)), "a flag has two rows"


def test_the_settings_toml_example_uses_real_keys() -> None:
    text = section(OPERATIONS.read_text(), "## Settings")
    example = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert example is not None
    keys = [line.split("=")[0].strip() for line in example.group(1).splitlines()
            if "=" in line]
    assert keys and all(k.replace("-", "_") in {s.name for s in SETTINGS} for k in keys), keys


def test_every_flag_table_names_real_flags_and_variables() -> None:
    rows = flag_rows(OPERATIONS.read_text())
    assert len(rows) > len(SETTINGS) // 2
    for cells in rows:
        flags = FLAG.findall(cells[0])
        assert flags and all(f in BY_FLAG for f in flags), f"docs/operations.md: {cells[0]}"
        assert ENV.findall(cells[1]) == [BY_FLAG[f].env for f in flags], cells


def test_the_readme_names_every_flag_and_no_other() -> None:
    text = section(README.read_text(), "## Configuration")
    named = set(FLAG.findall(text))
    assert named - {CONFIG_FLAG} - set(BY_FLAG) == set(), "README.md names unknown flags"
    missing = [s.flag for s in SETTINGS if s.flag not in named]
    assert not missing, f"README.md, Configuration: does not name {missing}"
