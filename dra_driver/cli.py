"""Command-line entry point: parses flags, sets up logging once, dispatches.

Each subcommand lives in its own module under :mod:`dra_driver.commands` and
imports its heavy dependencies only when it runs, so ``--help`` and
``--version`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from dra_driver import __version__
from dra_driver.logs import LOG_FORMATS, setup_logging

# Subcommand modules, in the order `--help` lists them. Each defines NAME, HELP,
# add_arguments(parser) and run(args) -> int.
COMMAND_MODULES: tuple[str, ...] = (
    "dra_driver.commands.devcluster",
    "dra_driver.commands.discover",
    "dra_driver.commands.slices",
    "dra_driver.commands.kubelet_plugin",
    "dra_driver.commands.report",
    "dra_driver.commands.demo",
    "dra_driver.commands.simulate",
    "dra_driver.commands.explain",
)


def _load_commands() -> list[ModuleType]:
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def build_parser(commands: Sequence[ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin and tools).",
    )
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get("DRA_LOG_FORMAT", "text"),
        help="log line format: logfmt-style key=value text, or one JSON object per line "
        "(env DRA_LOG_FORMAT; default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=os.environ.get("DRA_LOG_LEVEL", "info"),
        help="minimum level logged (env DRA_LOG_LEVEL; default %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in commands:
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_load_commands())
    args = parser.parse_args(argv)
    setup_logging(args.log_format, getattr(logging, args.log_level.upper()))
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
