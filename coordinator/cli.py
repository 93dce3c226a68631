"""The ``groupcoord`` command: one entry point, a subcommand per job.

Each subcommand lives with the code it runs and registers itself through a
``register(subparsers)`` function; registering must stay cheap (no heavy
imports such as pyspark at module level), so ``groupcoord --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

#: modules whose ``register(subparsers)`` adds subcommands, in help order.
SUBCOMMAND_MODULES = (
    "coordinator.serve",  # serve
    "client.demo",        # demo
    "client.admin_cli",   # groups, members, checkpoints, rebalances, resources
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
    try:
        status = run(args)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
    except BrokenPipeError:
        # The reader went away (``groupcoord groups describe g | head``): stop
        # quietly, as the Python docs' SIGPIPE note recommends. The rest of the
        # output goes nowhere, so the flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
