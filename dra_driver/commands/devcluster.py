"""``dra-driver dev-cluster up``: run the test control plane in the foreground.

The same :class:`~dra_driver.devcluster.Cluster` the test suite uses, for a
person to poke at with kubectl: it prints the admin kubeconfig path, keeps
running until Ctrl-C or SIGTERM, then stops every component by PID.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up",), help="up: start and stay in the foreground")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="directory for certificates, kubeconfigs and logs (default: a new temp dir)",
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help="directory with etcd and the kube-* binaries (default: $DRA_K8S_BIN_DIR, "
        "else scripts/build-k8s.sh builds or reuses them)",
    )
    parser.add_argument(
        "--node",
        action="append",
        dest="nodes",
        metavar="NAME",
        help="create a Ready Node object with this name (repeatable; default: dev-node-0)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here so `dra-driver --help` does not pay for the devcluster stack.
    try:
        from dra_driver.devcluster import (
            Binaries,
            BinariesError,
            Cluster,
            ComponentError,
            find_binaries,
        )
    except ModuleNotFoundError as err:
        print(f"dra-driver dev-cluster: {err}", file=sys.stderr)
        return 2

    try:
        binaries = Binaries.from_dir(args.bin_dir) if args.bin_dir else find_binaries()
    except BinariesError as err:
        logger.error("control-plane binaries unavailable", extra={"error": str(err)})
        return 2
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="dra-dev-cluster-"))

    stop = threading.Event()
    received: list[int] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        # Only flag it: logging from a signal handler could deadlock on its lock.
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = Cluster(binaries, workdir)
    try:
        try:
            times = cluster.start()
        except ComponentError as err:
            logger.error("control plane failed to start", extra={"error": str(err)})
            return 1
        for node in args.nodes or ["dev-node-0"]:
            cluster.create_node(node)
        out = sys.stdout
        print(
            f"control plane ready in {times.total:.1f}s (apiserver /readyz {times.apiserver:.1f}s)",
            file=out,
        )
        print(f"kubeconfig: {cluster.kubeconfig}", file=out)
        print(f"server: {cluster.server}", file=out)
        print(f"logs: {cluster.log_dir}", file=out)
        print(f"try:\n  export KUBECONFIG={cluster.kubeconfig}\n  kubectl get nodes", file=out)
        print("Ctrl-C or SIGTERM stops it.", file=out, flush=True)
        while not stop.wait(1.0):
            try:
                cluster.check_running()
            except ComponentError as err:
                logger.error("control-plane component died", extra={"error": str(err)})
                return 1
        logger.info("stopping control plane", extra={"signal": signal.Signals(received[0]).name})
        return 0
    finally:
        cluster.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        logger.info("control plane stopped", extra={"logs": str(cluster.log_dir)})
