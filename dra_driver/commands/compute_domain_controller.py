"""``dra-driver compute-domain-controller``: the ComputeDomain controller (one replica, the
chart's Deployment), until SIGTERM or SIGINT.

It watches ComputeDomains in every namespace and, in ``--namespace`` (the driver's), the
daemon ResourceClaimTemplates, DaemonSets, daemon pods and clique objects it makes
(:mod:`dra_driver.computedomain.controller`). A reconcile worker that dies of a bug
ends the process with code 1, so the Deployment restarts it; being level-triggered,
the new process converges from whatever the old one left.
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
        "--namespace", required=True,
        help="the driver's namespace: daemon DaemonSets, templates and cliques go there",
    )  # fmt: skip
    parser.add_argument(
        "--image", required=True, help="image of the IMEX daemon pods (the driver's own)"
    )
    parser.add_argument(
        "--image-pull-policy", default="IfNotPresent",
        choices=("Always", "IfNotPresent", "Never"),
        help="pull policy of the daemon pods (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--daemon-service-account", default="default",
        help="ServiceAccount of the daemon pods, in --namespace (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--daemon-priority-class", default="", help="priorityClassName of the daemon pods"
    )
    parser.add_argument(
        "--workers", type=int, default=4,
        help="domains reconciled at once, 1-64 (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--resync-interval", type=float, default=300.0,
        help="seconds between looks at every cached object, 1-86400 (default %(default)g)",
    )  # fmt: skip
    parser.add_argument(
        "--kubeconfig", type=Path, default=None,
        help="kubeconfig file (default: the pod's service account)",
    )  # fmt: skip


class SettingsError(DriverError):
    exit_code = 2


def run(args: argparse.Namespace) -> int:
    from dra_driver.computedomain.controller.controller import Controller, ControllerSettings
    from dra_driver.computedomain.controller.kubeapi import ControllerApi
    from dra_driver.computedomain.controller.objects import DaemonSettings

    if not 1 <= args.workers <= 64:
        raise SettingsError(f"--workers (DRA_WORKERS): {args.workers}; want 1-64")
    if not 1 <= args.resync_interval <= 86400:
        raise SettingsError(
            f"--resync-interval (DRA_RESYNC_INTERVAL): {args.resync_interval:g}; want 1-86400"
        )
    from dra_driver.plugin import kubeauth

    credentials = (kubeauth.kubeconfig(str(args.kubeconfig)) if args.kubeconfig
                   else kubeauth.in_cluster(os.environ))  # fmt: skip
    api = ControllerApi(credentials)
    settings = ControllerSettings(
        daemon=DaemonSettings(
            namespace=args.namespace, image=args.image, pull_policy=args.image_pull_policy,
            service_account=args.daemon_service_account,
            priority_class=args.daemon_priority_class,
        ),
        workers=args.workers, resync_s=args.resync_interval,
    )  # fmt: skip
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    controller = Controller(api, settings)
    logger.info("compute-domain controller starting", extra={"namespace": args.namespace})
    try:
        controller.run(stop)
    finally:
        api.close()
        counts = api.counts
        logger.info("api writes", extra={"writes": counts.writes, "conflicts": counts.conflicts})
    if controller.failed is not None:
        return 1
    logger.info("compute-domain controller stopped")
    return 0
