"""Command-line entry point: parses flags and their environment twins, sets up logging
once, dispatches, and is the one edge where our errors become a line and an exit code.

Each subcommand lives in its own module under :mod:`dra_driver.commands` and
imports its heavy dependencies only when it runs, so ``--help`` and
``--version`` stay fast. Every long flag of every command has one environment
variable, ``DRA_`` + its name (:mod:`dra_driver.envflags`); ``--log-level``
and ``--log-format`` are accepted before or after the subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

from dra_driver import __version__, envflags
from dra_driver.errors import DriverError
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
LOG_LEVELS = ("debug", "info", "warning", "error")


def _load_commands() -> list[ModuleType]:
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def _add_log_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """On the main parser with defaults; on subcommands with none, so a value given
    after the subcommand overrides one given before it, and nothing else does."""
    env = " (env DRA_LOG_FORMAT)" if sub else ""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS if sub else "text",
        help="log line format: logfmt-style key=value text, or one JSON object per line "
        f"(default text){env}",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS if sub else "info",
        help=f"minimum level logged (default info){' (env DRA_LOG_LEVEL)' if sub else ''}",
    )


def build_parser(
    commands: Sequence[ModuleType], environ: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin and tools). Every "
        "long flag can also be set through its environment variable, DRA_ followed by the "
        "flag's name in upper case with '_' for '-' (shown in each command's --help); a flag "
        "on the command line wins.",
    )
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    _add_log_flags(parser, sub=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in commands:
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        _add_log_flags(cmd, sub=True)
        cmd.set_defaults(_run=module.run)
    envflags.bind(parser, os.environ if environ is None else environ)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_load_commands())
    args = parser.parse_args(argv)
    setup_logging(args.log_format, getattr(logging, args.log_level.upper()))
    try:
        return int(args._run(args))
    except DriverError as exc:
        print(f"dra-driver {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
