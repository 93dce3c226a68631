"""Compile the simulator's hot modules with mypyc, outside the source tree.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/build_sim_mypyc.py [--out build/sim-mypyc]

Compiles the modules a simulated seed spends its time in (the coordinator
core, the member machine, the protocol codec and the simulator itself,
``COMPILED`` below) from the source files as they are into C extensions in
``--out`` (default ``build/sim-mypyc``, git-ignored), and prints that
directory. Nothing is copied or changed in the source tree: the build reads
the same files the interpreter runs. ``benchmarks/simulate_groups.py
--compiled DIR`` and ``benchmarks/simulate_hashes.py --compiled DIR`` then
load these extensions in place of those modules (``sim_compiled.py``); every
other module stays interpreted. Rebuild after any change to a compiled
module: the runner refuses a build older than its sources.

Needs mypy (with mypyc), setuptools, a C compiler and the Python headers. It
is not part of the test suite or CI, which run the simulator interpreted;
the compiled build must give the same trace hashes
(``benchmarks/simulate_hashes.py``; docs/bench-reliability.md, "Figures").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_compiled import COMPILED, MANIFEST, manifest_text, module_file  # noqa: E402


def _register_object_type() -> None:
    """mypyc 1.x-2.4 compiles a dataclass field annotated ``object`` (e.g.
    ``client.member_state.actions.Call.request``) into a lookup of ``object``
    in the module's globals, which fails at import (KeyError: 'object'):
    ``builtins.object`` is missing from its table of builtin type objects.
    Registering it there makes the annotation load ``object`` itself."""
    from mypyc.ir.rtypes import object_rprimitive
    from mypyc.primitives.registry import builtin_names, load_address_op

    if "builtins.object" not in builtin_names:
        load_address_op(name="builtins.object", type=object_rprimitive,
                        src="PyBaseObject_Type")


def build(out: Path, *, opt_level: str = "3", jobs: int = 2) -> Path:
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]

    _register_object_type()

    sources = [module_file(ROOT, name) for name in COMPILED]
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise SystemExit(f"build_sim_mypyc: no such source file(s): {', '.join(missing)}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sim-mypyc-") as temp:
        cwd = os.getcwd()
        os.chdir(ROOT)  # mypy names the modules from paths relative to the root
        # tests/ is not a package: ``sim`` is found through the mypy path.
        old_path = os.environ.get("MYPYPATH")
        os.environ["MYPYPATH"] = str(ROOT / "tests")
        try:
            paths = [str(s.relative_to(ROOT)) for s in sources]
            extensions = mypycify(paths, opt_level=opt_level,
                                  target_dir=str(Path(temp) / "c"))
            # setuptools logs to stdout: stdout is kept for the directory.
            with contextlib.redirect_stdout(sys.stderr):
                setup(name="groupcoord-sim-mypyc", ext_modules=extensions,
                      script_args=["build_ext", "--build-lib", str(out),
                                   "--build-temp", str(Path(temp) / "obj"),
                                   "--parallel", str(jobs)])
        finally:
            os.chdir(cwd)
            if old_path is None:
                os.environ.pop("MYPYPATH", None)
            else:
                os.environ["MYPYPATH"] = old_path
    # The per-module extensions sit at their package paths under ``out``;
    # the packages' __init__ files are not compiled (sim_compiled.py loads
    # the extensions by name, so the source packages stay the packages).
    (out / MANIFEST).write_text(manifest_text(ROOT), encoding="utf-8")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "sim-mypyc",
                   help="where the extensions go (default build/sim-mypyc; emptied first)")
    p.add_argument("--opt-level", default="3", choices=("0", "1", "2", "3"),
                   help="the C compiler's optimisation level (default 3)")
    args = p.parse_args()
    if args.out.exists():
        # Empty only a directory that is an earlier build (or empty).
        if any(args.out.iterdir()) and not (args.out / MANIFEST).is_file():
            p.error(f"--out {args.out}: exists and is not an earlier build "
                    f"(no {MANIFEST}); give a new or empty directory")
        shutil.rmtree(args.out)
    started = time.monotonic()
    out = build(args.out, opt_level=args.opt_level)
    print(f"built {len(COMPILED)} modules in {time.monotonic() - started:.0f} s: {out}",
          file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
