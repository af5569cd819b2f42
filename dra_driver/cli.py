"""Command-line entry point: parses flags and their environment twins, sets up logging
once, dispatches, and is the one edge where our errors become a line and an exit code.

Each subcommand lives in its own module under :mod:`dra_driver.commands`;
:data:`COMMANDS` maps its name to that module, and only the module of the command
being run is imported (``kubelet-plugin`` never loads ``simulate`` or ``explain``
and what they import); ``--help`` and ``--version`` import none. Every long flag
of every command has one environment variable, ``DRA_`` + its name
(:mod:`dra_driver.envflags`); ``--log-level`` and ``--log-format`` are accepted
before or after the subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Mapping, Sequence

from dra_driver import __version__, envflags
from dra_driver.errors import DriverError
from dra_driver.logs import LOG_FORMATS, setup_logging

COMMANDS: dict[str, tuple[str, str]] = {
    "dev-cluster": (
        "dra_driver.commands.devcluster",
        "run a local Kubernetes control plane (etcd, apiserver, scheduler, controller-manager)",
    ),
    "discover": (
        "dra_driver.commands.discover",
        "discover the node's GPUs (NVML + sysfs) and print them",
    ),
    "slices": ("dra_driver.commands.slices", "print the ResourceSlices this node would publish"),
    "kubelet-plugin": (
        "dra_driver.commands.kubelet_plugin",
        "run the DRA kubelet plugin for this node's GPUs",
    ),
    "compute-domain-plugin": (
        "dra_driver.commands.compute_domain_plugin",
        "run the compute-domain.nvidia.com kubelet plugin (ComputeDomain IMEX channels)",
    ),
    "compute-domain-daemon": (
        "dra_driver.commands.compute_domain_daemon",
        "run a ComputeDomain's IMEX daemon on this node (a domain daemon pod's container)",
    ),
    "mps-daemon": (
        "dra_driver.commands.mps_daemon",
        "run one MPS control daemon in the foreground (an MPS daemon pod's container)",
    ),
    "compute-domain-controller": (
        "dra_driver.commands.compute_domain_controller",
        "run the ComputeDomain controller (IMEX daemons, channel templates, cliques, status)",
    ),
    "report": (
        "dra_driver.commands.report",
        "report claims whose GPUs stayed under-used, with a smaller MIG profile or share",
    ),
    "demo": (
        "dra_driver.commands.demo",
        "run a control plane and two real nodes with emulated GPUs; walk through example claims",
    ),
    "simulate": (
        "dra_driver.commands.simulate",
        "allocate ResourceClaims offline as the kube-scheduler would",
    ),
    "explain": (
        "dra_driver.commands.explain",
        "explain why a ResourceClaim got its devices or why it stays pending",
    ),
    "plan": (
        "dra_driver.commands.plan",
        "GPUs needed and allocation rate of a workload trace under each sharing mode",
    ),
    "scoring-extender": (
        "dra_driver.commands.scoring_extender",
        "serve kube-scheduler a scoring extender that ranks nodes by GPU fragmentation",
    ),
}
"""Command name -> (module, help), in the order ``--help`` lists them. Each module
defines ``add_arguments(parser)`` and ``run(args) -> int``."""
LOG_LEVELS = ("debug", "info", "warning", "error")
_VALUED = ("--log-format", "--log-level")
"""Global options that take a value (skipped when looking for the command's name)."""


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option or an option's
    value), or None."""
    value_next = False
    for arg in argv:
        if value_next:
            value_next = False
        elif arg in _VALUED:
            value_next = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def _to_load(argv: Sequence[str]) -> Collection[str]:
    """The commands whose modules the parser needs for ``argv``: the one named; none for
    plain ``--help``/``--version``; all when the command cannot be told beforehand (an
    abbreviated option, say), so argparse parses and reports exactly as it would."""
    command = command_in(argv)
    if command is not None:
        return (command,)
    if any(a in ("-h", "--help", "--version") for a in argv):
        return ()
    return tuple(COMMANDS)


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
    environ: Mapping[str, str] | None = None, *, load: Collection[str] | None = None
) -> argparse.ArgumentParser:
    """Every command is listed; the flags are those of the commands in ``load`` (default:
    all), whose modules are imported here."""
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
    for name, (module_name, text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=text)
        if load is None or name in load:
            module = importlib.import_module(module_name)
            module.add_arguments(cmd)
            cmd.set_defaults(_run=module.run)
        _add_log_flags(cmd, sub=True)
    envflags.bind(parser, os.environ if environ is None else environ)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(load=_to_load(argv))
    args = parser.parse_args(argv)
    setup_logging(args.log_format, getattr(logging, args.log_level.upper()))
    try:
        return int(args._run(args))
    except DriverError as exc:
        print(f"dra-driver {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """``dra-driver`` and ``python -m dra_driver``: :func:`main`, then exit.

    The kubelet plugin's process ends at once (``os._exit``) once the command has
    stopped everything and its log is flushed: the interpreter's finalization would
    only free memory, and freeing the kubernetes client's thousands of model classes
    took 1.1-1.3 s of a 1.3-1.7 s SIGTERM-to-exit (2026-11-27), while the kubelet waits
    for that exit in a rolling update. Every other command exits normally."""
    argv = sys.argv[1:]
    code = main(argv)
    if command_in(argv) == "kubelet-plugin":
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
