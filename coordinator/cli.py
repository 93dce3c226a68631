"""The ``groupcoord`` command: one entry point, a subcommand per job.

Each subcommand lives with the code it runs and registers itself through a
``register(subparsers)`` function; registering must stay cheap (no heavy
imports such as pyspark at module level), so ``groupcoord --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

#: modules whose ``register(subparsers)`` adds subcommands, in help order.
SUBCOMMAND_MODULES = (
    "coordinator.serve",  # serve
    "client.demo",        # demo
    "client.admin_cli",   # groups, checkpoints, rebalances, resources
    "pipeline.cli",       # analyze, simulate, journal export
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="groupcoord",
        description="A group coordinator: Kafka's group membership protocol over HTTP.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
        register = module.register
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.func
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
