"""``dra-driver compute-domain-daemon [run|check]``: a ComputeDomain's IMEX daemon.

``run`` (default) is the daemon pod's container command, ``check`` its readiness probe
(``nvidia-imex-ctl -q`` answers READY: exit 0). The pod's identity comes from the
environment the controller's DaemonSet and the daemon claim's CDI spec set
(``NODE_NAME``, ``POD_NAME``, ``POD_NAMESPACE``, ``POD_IP``, ``DOMAIN_UID``,
``CLIQUE_ID``, ``IMEX_BIN_DIR``); a flag of the same name wins. See
:mod:`dra_driver.computedomain.node.imexdaemon`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from dra_driver.settings import SettingsError

_FROM_ENV = {
    "node_name": "NODE_NAME", "pod_name": "POD_NAME", "namespace": "POD_NAMESPACE",
    "pod_ip": "POD_IP", "domain_uid": "DOMAIN_UID", "clique_id": "CLIQUE_ID",
    "imex_bin_dir": "IMEX_BIN_DIR",
}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=("run", "check"),
        default="run",
        help="run the daemon (default) or check its readiness",
    )
    for dest, env in _FROM_ENV.items():
        parser.add_argument(
            "--" + dest.replace("_", "-"), dest=dest, default=None, help=f"(default: ${env})"
        )
    parser.add_argument(
        "--imex-dir",
        type=Path,
        default=Path("/etc/nvidia-imex"),
        help="the domain's host directory in this container (default %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: the pod's service account)",
    )


_NAMES = {
    # What each value may hold: they go into API paths, object names and a label value.
    "node_name": re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"),
    "pod_name": re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"),
    "namespace": re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
    "clique_id": re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"),
}


def _value(args: argparse.Namespace, dest: str) -> str:
    value = str(getattr(args, dest) or os.environ.get(_FROM_ENV[dest], ""))
    flag = "--" + dest.replace("_", "-")
    if not value:
        raise SettingsError(f"{flag} / ${_FROM_ENV[dest]} is not set")
    rule = _NAMES.get(dest)
    if rule is not None and not rule.match(value):
        raise SettingsError(
            f"{flag} / ${_FROM_ENV[dest]} is {value!r}: not a valid "
            f"{'label value' if dest == 'clique_id' else 'Kubernetes name'}"
        )
    return value


def run(args: argparse.Namespace) -> int:
    from dra_driver.computedomain.node import imexdaemon

    bin_dir = Path(args.imex_bin_dir or os.environ.get("IMEX_BIN_DIR") or "/usr/bin")
    if args.action == "check":
        ready, said = imexdaemon.check(args.imex_dir, bin_dir)
        print(said or ("READY" if ready else "NOT_READY"), file=sys.stdout if ready else sys.stderr)
        return 0 if ready else 1
    from dra_driver.computedomain.node.config import validate_domain_id
    from dra_driver.plugin.kubeclient import KubeClient

    settings = imexdaemon.ImexDaemonSettings(
        node_name=_value(args, "node_name"), pod_name=_value(args, "pod_name"),
        namespace=_value(args, "namespace"), pod_ip=_value(args, "pod_ip"),
        domain_uid=validate_domain_id(_value(args, "domain_uid"), "DOMAIN_UID", "daemon"),
        clique_id=_value(args, "clique_id"), imex_dir=args.imex_dir, imex_bin_dir=bin_dir,
    )  # fmt: skip
    client = (KubeClient.from_kubeconfig(str(args.kubeconfig)) if args.kubeconfig
              else KubeClient.in_cluster(os.environ))  # fmt: skip
    try:
        return imexdaemon.run(settings, client)
    finally:
        client.close()
