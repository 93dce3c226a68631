"""Load the simulator's modules compiled by ``build_sim_mypyc.py``.

``install(directory)`` puts an import hook first on ``sys.meta_path`` that
loads each module named in ``COMPILED`` from its C extension in
``directory``, and leaves every other module (the packages' ``__init__``
files among them) to the ordinary import system, from the source tree. It
refuses a build whose sources have changed since: the extensions must be
the source files as they are now.
"""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["COMPILED", "MANIFEST", "StaleBuildError", "install", "make_picklable",
           "module_file"]

#: The modules compiled: those a seed spends its time in, and what they call
#: often enough to matter (a profile of seeds 0-99, docs/bench-reliability.md).
COMPILED: tuple[str, ...] = (
    "coordinator.core.admin",
    "coordinator.core.checkpoint_store",
    "coordinator.core.checkpoints",
    "coordinator.core.commands",
    "coordinator.core.coordinator",
    "coordinator.core.dispatch",
    "coordinator.core.effects",
    "coordinator.core.group",
    "coordinator.core.health",
    "coordinator.core.kernel",
    "coordinator.core.membership",
    "coordinator.core.operations",
    "coordinator.core.protocol_selection",
    "coordinator.core.rebalance",
    "coordinator.core.replay",
    "coordinator.core.timers",
    "coordinator.core.views",
    "client.lease",
    "client.leader",
    "client.assignors._claims",
    "client.assignors._constrained",
    "client.assignors._layout",
    "client.assignors._plan",
    "client.assignors.cooperative_sticky",
    "client.assignors.incremental_cooperative",
    "client.assignors.range_assignor",
    "client.assignors.roundrobin",
    "client.assignors.sticky",
    "client.assignors.validate",
    "coordinator.runtime.commits",
    "client.member_state.actions",
    "client.member_state.background",
    "client.member_state.closing",
    "client.member_state.config",
    "client.member_state.core",
    "client.member_state.driver",
    "client.member_state.heartbeat",
    "client.member_state.joining",
    "client.member_state.lease",
    "client.member_state.machine",
    "client.member_state.main_channel",
    "client.member_state.recovery",
    "client.member_state.stable",
    "client.member_state.syncing",
    "protocol.codec",
    "protocol.json_wire",
    "protocol.limits",
    "protocol.messages",
    "protocol.resources",
    "protocol.validate",
    "sim.events",
    "sim.network",
    "sim.server",
    "sim.member",
    "sim.cluster",
    "sim.world",
    "sim.scenario",
    "sim.run",
)

#: The file in a build directory naming each compiled module and the SHA-256
#: of the source it was compiled from.
MANIFEST = "compiled-modules.txt"


class StaleBuildError(RuntimeError):
    """The build does not match the source tree (missing, or compiled from
    other sources)."""


def module_file(root: Path, name: str) -> Path:
    """The source file of module ``name`` under the repository ``root``
    (``sim`` lives in ``tests/``)."""
    base = root / "tests" if name.split(".")[0] == "sim" else root
    return base.joinpath(*name.split(".")).with_suffix(".py")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_text(root: Path, names: Sequence[str] = COMPILED) -> str:
    return "".join(f"{name} {source_digest(module_file(root, name))}\n" for name in names)


def _extension(directory: Path, name: str) -> Path:
    parts = name.split(".")
    folder = directory.joinpath(*parts[:-1])
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / (parts[-1] + suffix)
        if candidate.is_file():
            return candidate
    raise StaleBuildError(f"{directory}: no extension for module {name} "
                          f"(run benchmarks/build_sim_mypyc.py)")


class _CompiledFinder(importlib.abc.MetaPathFinder):
    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def install(directory: Path, root: Path | None = None) -> list[str]:
    """Load the modules built in ``directory`` in place of their sources;
    returns their names. Call before anything imports them."""
    root = root if root is not None else Path(__file__).resolve().parents[1]
    directory = directory.resolve()
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise StaleBuildError(f"{directory}: not a build of benchmarks/build_sim_mypyc.py "
                              f"(no {MANIFEST})")
    built = manifest.read_text(encoding="utf-8")
    names = [line.split(" ", 1)[0] for line in built.splitlines() if line]
    current = manifest_text(root, names)
    if built != current:
        changed = sorted(set(built.splitlines()) - set(current.splitlines()))
        raise StaleBuildError(
            f"{directory}: compiled from other sources than {root} "
            f"({', '.join(line.split(' ', 1)[0] for line in changed)}): "
            f"run benchmarks/build_sim_mypyc.py again")
    files = {name: _extension(directory, name) for name in names}
    early = [name for name in names if name in sys.modules]
    if early:
        raise StaleBuildError(f"already imported from source: {', '.join(early)}")
    # The extensions share one library, a top-level module in the directory.
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    sys.meta_path.insert(0, _CompiledFinder(files))
    return names


def _by_fields(obj: Any) -> tuple[type, tuple[Any, ...]]:
    return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


def make_picklable(names: Sequence[str]) -> int:
    """Let the frozen dataclasses of the compiled modules ``names`` (those
    imported so far) cross process boundaries (``--jobs``): a compiled class
    unpickles by setting its attributes one by one, which a frozen dataclass
    refuses (FrozenInstanceError). They are rebuilt through their
    ``__init__`` from their fields instead. Returns how many classes."""
    count = 0
    for name in names:
        module = sys.modules.get(name)
        if module is None:
            continue
        for value in list(vars(module).values()):
            if (isinstance(value, type) and value.__module__ == name
                    and dataclasses.is_dataclass(value)
                    and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
                    and all(f.init for f in dataclasses.fields(value))):
                copyreg.pickle(value, _by_fields)
                count += 1
    return count
