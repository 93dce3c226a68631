"""The loader of the mypyc-compiled simulator (benchmarks/sim_compiled.py).

The build itself (benchmarks/build_sim_mypyc.py: a C compiler, minutes) is
not run here; CI runs the simulator interpreted. What is pinned: every
compiled module names a source file, and a build that does not match the
sources is refused before anything is loaded from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_compiled import (  # noqa: E402
    COMPILED,
    MANIFEST,
    StaleBuildError,
    install,
    manifest_text,
    module_file,
)


def test_every_compiled_module_has_its_source() -> None:
    missing = [name for name in COMPILED if not module_file(ROOT, name).is_file()]
    assert missing == []
    assert module_file(ROOT, "sim.events") == ROOT / "tests" / "sim" / "events.py"
    assert module_file(ROOT, "coordinator.core.kernel") == ROOT / "coordinator/core/kernel.py"


def test_a_directory_without_a_build_is_refused(tmp_path: Path) -> None:
    hooks = list(sys.meta_path)
    with pytest.raises(StaleBuildError, match=f"no {MANIFEST}"):
        install(tmp_path, ROOT)
    assert sys.meta_path == hooks


def test_a_build_of_other_sources_is_refused(tmp_path: Path) -> None:
    text = manifest_text(ROOT, ["sim.events", "protocol.codec"])
    stale = text.replace(text.split()[1], "0" * 64, 1)  # sim.events compiled from another text
    (tmp_path / MANIFEST).write_text(stale, encoding="utf-8")
    hooks = list(sys.meta_path)
    with pytest.raises(StaleBuildError, match=r"other sources .*\(sim\.events\)"):
        install(tmp_path, ROOT)
    assert sys.meta_path == hooks


def test_a_build_missing_an_extension_is_refused(tmp_path: Path) -> None:
    # The manifest matches the sources, but the extension is not there.
    (tmp_path / MANIFEST).write_text(manifest_text(ROOT, ["coordinator.core.admin"]),
                                     encoding="utf-8")
    hooks = list(sys.meta_path)
    with pytest.raises(StaleBuildError, match=r"no extension for module coordinator\.core\.admin"):
        install(tmp_path, ROOT)
    assert sys.meta_path == hooks
