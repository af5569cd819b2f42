"""The flags every kubelet plugin command of this image takes (``kubelet-plugin`` for
``gpu.nvidia.com``, ``compute-domain-plugin`` for ``compute-domain.nvidia.com``): where
the kubelet's dirs and the CDI dir are, how to reach the API server, the rolling-update
UID and the health port. One definition, so the two containers of the chart's pod are
configured alike; each command's own flags stay in its module."""

from __future__ import annotations

import argparse
from pathlib import Path


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) or -1 (off)."""
    try:
        value = int(text)
    except ValueError:
        value = -2
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 1-65535, 0 or -1")
    return value


def add_kubelet_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path("/var/run/cdi"),
        help="where claim CDI specs are written (default %(default)s)",
    )
    parser.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=Path("/var/lib/kubelet/plugins_registry"),
        help="kubelet plugin registry dir (default %(default)s)",
    )
    parser.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=Path("/var/lib/kubelet/plugins"),
        help="kubelet plugins dir (default %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file, or several joined by ':' (the first file naming an entry "
        "wins) (default: the pod's service account)",
    )
    parser.add_argument(
        "--rolling-update-uid",
        default=None,
        help="pod UID: UID-suffixed sockets so two plugin pods can overlap "
        "during an update (the chart sets DRA_ROLLING_UPDATE_UID from the downward API; "
        "default: off)",
    )
    parser.add_argument(
        "--health-port",
        type=port,
        default=-1,
        help="TCP port of the HTTP /healthz and /readyz endpoint for the pod's probes; "
        "0 picks a free port, -1 serves none (default: none)",
    )
