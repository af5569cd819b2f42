"""``dra-driver compute-domain-controller``: the ComputeDomain controller (the chart's
Deployment), until SIGTERM or SIGINT.

It watches ComputeDomains in every namespace and, in ``--namespace`` (the driver's), the
daemon ResourceClaimTemplates, DaemonSets, daemon pods and clique objects it makes
(:mod:`dra_driver.computedomain.controller`). With ``--leader-elect`` (the default) it
reconciles only while it holds a Lease in ``--namespace``, so several replicas may
run: the others stand by and one takes over when the leader stops or stalls. A
reconcile worker that dies of a bug, or a leader that loses its Lease, ends the process
with code 1, so the Deployment restarts it; being level-triggered, a new leader
converges from whatever the old one left.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
import threading
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from dra_driver.errors import DriverError

if TYPE_CHECKING:
    from dra_driver.computedomain.controller.controller import Controller, Health
    from dra_driver.computedomain.controller.kubeapi import ControllerApi
    from dra_driver.computedomain.controller.leader import LeaseElector

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
        "--leader-elect", action=argparse.BooleanOptionalAction, default=True,
        help="reconcile only while holding the Lease compute-domain-controller in "
        "--namespace, so replicas > 1 are safe (default: on)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-duration", type=float, default=15.0,
        help="seconds a standby waits for an unrenewed Lease before taking it, 3-300; "
        "the leader renews every 2/15 of it and gives up after 2/3 (default %(default)g)",
    )  # fmt: skip
    parser.add_argument(
        "--health-port", type=int, default=-1,
        help="port of /healthz and /readyz, 0-65535; -1: none (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--kubeconfig", type=Path, default=None,
        help="kubeconfig file (default: the pod's service account)",
    )  # fmt: skip


class SettingsError(DriverError):
    exit_code = 2


LEASE_NAME = "compute-domain-controller"


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.workers <= 64:
        raise SettingsError(f"--workers (DRA_WORKERS): {args.workers}; want 1-64")
    if not 1 <= args.resync_interval <= 86400:
        raise SettingsError(
            f"--resync-interval (DRA_RESYNC_INTERVAL): {args.resync_interval:g}; want 1-86400"
        )
    if not 3 <= args.lease_duration <= 300:
        raise SettingsError(
            f"--lease-duration (DRA_LEASE_DURATION): {args.lease_duration:g}; want 3-300"
        )
    if not -1 <= args.health_port <= 65535:
        raise SettingsError(
            f"--health-port (DRA_HEALTH_PORT): {args.health_port}; want 0-65535, or -1"
        )


def run(args: argparse.Namespace) -> int:
    from dra_driver.computedomain.controller.controller import Controller, ControllerSettings
    from dra_driver.computedomain.controller.events import EventRecorder
    from dra_driver.computedomain.controller.kubeapi import ControllerApi
    from dra_driver.computedomain.controller.objects import DaemonSettings

    _check(args)
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
    """Set by SIGTERM/SIGINT: stop, and give the Lease up."""
    halt = threading.Event()
    """Set by a signal or by losing the Lease: the workers stop."""

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()
        halt.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    identity = f"{socket.gethostname()}_{secrets.token_hex(4)}"
    controller = Controller(api, settings, events=EventRecorder(api, identity))
    elector = _elector(api, args, identity)
    lost = threading.Event()
    logger.info("compute-domain controller starting",
                extra={"namespace": args.namespace, "identity": identity})  # fmt: skip
    with ExitStack() as stack:
        stack.callback(_closing, api)
        if args.health_port >= 0:
            from dra_driver.plugin.healthz import HealthServer

            health = HealthServer(
                readiness=lambda: _health(controller, elector), port=args.health_port,
                logger=logging.getLogger("dra_driver.computedomain.controller"),
            )  # fmt: skip
            health.start()
            stack.callback(health.stop)
        if elector is not None:
            if not elector.acquire(stop):
                return 0
            keeper = threading.Thread(target=_keep, args=(elector, stop, lost, halt),
                                      name="lease", daemon=True)  # fmt: skip
            keeper.start()
            stack.callback(keeper.join, 10)
        controller.run(halt)
        halt.set()
        stop.set()  # the workers are done: the keeper gives the Lease up
    if controller.failed is not None:
        return 1
    if lost.is_set():
        logger.error("compute-domain controller stopped: the lease was lost")
        return 1
    logger.info("compute-domain controller stopped")
    return 0


def _elector(api: ControllerApi, args: argparse.Namespace, identity: str) -> LeaseElector | None:
    from dra_driver.computedomain.controller.leader import ElectionSettings, LeaseElector

    if not args.leader_elect:
        return None
    duration = float(args.lease_duration)
    settings = ElectionSettings(
        namespace=args.namespace, name=LEASE_NAME, identity=identity,
        lease_duration_s=duration, renew_deadline_s=duration * 2 / 3, retry_s=duration * 2 / 15,
    )  # fmt: skip
    return LeaseElector(api, settings)


def _keep(
    elector: LeaseElector, stop: threading.Event, lost: threading.Event, halt: threading.Event
) -> None:
    elector.keep(stop, lost)
    halt.set()


def _health(controller: Controller, elector: LeaseElector | None) -> Health:
    from dra_driver.computedomain.controller.controller import Health

    failed = controller.failed
    return Health(
        failed=f"{type(failed).__name__}: {failed}" if failed is not None else "",
        lease_ok=elector is None or elector.healthy(),
        leading=elector is None or elector.leading,
        synced=controller.synced(),
    )


def _closing(api: ControllerApi) -> None:
    api.close()
    counts = api.counts
    logger.info("api writes", extra={"writes": counts.writes, "conflicts": counts.conflicts})
