"""``dra-driver scoring-extender``: kube-scheduler's HTTP scoring extender that ranks
nodes by how little usable GPU capacity a placement would strand
(:mod:`dra_driver.scoring.fragmentation`), from a watched view of nodes, pods,
ResourceSlices and ResourceClaims; until SIGTERM or SIGINT.

kube-scheduler calls ``POST <urlPrefix>/prioritize`` per pod (configure it with
``nodeCacheCapable: true`` and ``ignorable: true``: deploy/scheduler/, the chart's
README); ``GET /healthz`` answers 200 once every kind was listed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from dra_driver.errors import DriverError

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind-address", default="0.0.0.0:8888",
        help="HOST:PORT the extender serves on (default %(default)s; port 0 picks one)",
    )  # fmt: skip
    parser.add_argument(
        "--kubeconfig", type=Path, default=None,
        help="kubeconfig file (default: the pod's service account)",
    )  # fmt: skip
    parser.add_argument(
        "--driver", default="gpu.nvidia.com",
        help="driver whose GPUs are scored (default %(default)s)",
    )  # fmt: skip


class SettingsError(DriverError):
    exit_code = 2


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"--bind-address (DRA_BIND_ADDRESS): {text!r}; want HOST:PORT")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    host, port = _address(args.bind_address)
    from dra_driver.extender.serving import ExtenderServer
    from dra_driver.extender.view import ClusterView
    from dra_driver.extender.watching import Watcher
    from dra_driver.plugin.kubeclient import KubeClient

    client = (KubeClient.from_kubeconfig(str(args.kubeconfig)) if args.kubeconfig
              else KubeClient.in_cluster(os.environ))  # fmt: skip
    client.connect()
    view = ClusterView(driver=args.driver)
    watcher = Watcher(client, view, logger)
    server = ExtenderServer(view=view, logger=logger, host=host, port=port)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    watcher.start()
    server.start()
    try:
        stop.wait()
    finally:
        server.stop()
        watcher.stop()
        client.close()
    logger.info("scoring extender stopped")
    return 0
