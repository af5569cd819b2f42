"""``dra-driver demo``: one command that shows the driver working end to end.

Needs a source checkout (it builds the Kubernetes control plane, the kubelet,
containerd and the CNI plugins from the pinned Go modules on first use), root,
and runc (``make demo`` installs it with apt when missing). Everything it starts is stopped at the
end; ``--keep`` keeps the work directory with all logs and CDI specs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir", type=Path, default=None,
        help="where logs, CDI specs and state go (default: a temp dir, removed unless --keep)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temp work directory")
    parser.add_argument(
        "--cdi-json", action="store_true", help="print every CDI spec in full instead of a summary"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also show the components' own log lines"
    )


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    try:
        from dra_driver.demo.walkthrough import DemoOptions, run_demo
        from dra_driver.devcluster.binaries import repo_root
    except ModuleNotFoundError as err:
        print(f"dra-driver demo: {err}", file=sys.stderr)
        return 2

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
        cdi_json=args.cdi_json,
    )
    return run_demo(options, lambda line: print(line, flush=True))
