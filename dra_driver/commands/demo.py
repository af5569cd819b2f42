"""``dra-driver demo``: one command that shows the driver working end to end.

Needs a source checkout (it builds the Kubernetes binaries and the Go kubelet
harness from the pinned Go modules on first use) and, to run the containers,
root with runc and busybox installed. Everything it starts is stopped at the
end; ``--keep`` keeps the work directory with all logs and CDI specs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

NAME = "demo"
HELP = "run a local control plane with emulated GPU nodes and walk through example claims"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir", type=Path, default=None,
        help="where logs, CDI specs and state go (default: a temp dir, removed unless --keep)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temp work directory")
    parser.add_argument(
        "--no-containers", action="store_true",
        help="do not run the pods' containers with runc (prepare and unprepare only)",
    )  # fmt: skip
    parser.add_argument(
        "--cdi-json", action="store_true", help="print every CDI spec in full instead of a summary"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also show the components' own log lines"
    )


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from dra_driver.demo.walkthrough import DemoOptions, run_demo
    from dra_driver.devcluster.binaries import repo_root

    repo = repo_root()
    if repo is None:
        print("dra-driver demo needs a source checkout (scripts/, deploy/, tests/go/).",
              file=sys.stderr)  # fmt: skip
        return 2
    if not args.verbose:
        logging.getLogger("dra_driver").setLevel(logging.WARNING)
    # SIGTERM unwinds like Ctrl-C, so every process, MPS daemon and mount the
    # demo started is stopped and removed on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    options = DemoOptions(
        repo=repo,
        workdir=args.workdir,
        keep=args.keep,
        run_containers=not args.no_containers,
        cdi_json=args.cdi_json,
    )
    return run_demo(options, lambda line: print(line, flush=True))
