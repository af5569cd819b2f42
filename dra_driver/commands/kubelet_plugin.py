"""``dra-driver kubelet-plugin``: the node daemon's flags.

Flags (each with its ``DRA_*`` environment variable, :mod:`dra_driver.envflags`)
become validated :class:`~dra_driver.settings.DaemonSettings`
(:func:`~dra_driver.settings.daemon_settings`), which the composition root
:func:`dra_driver.daemon.run` turns into a running plugin: re-discovery every
``--rediscover-interval`` seconds and on SIGHUP (a GPU that disappeared is
gone from the next slice generation), a clean stop on SIGTERM/SIGINT (slices
stay for the next instance unless ``--uninstall-on-exit``), exit 1 when a
background thread fails for good.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from dra_driver.commands import observability
from dra_driver.commands.discover import add_host_arguments
from dra_driver.commands.pluginflags import add_kubelet_plugin_arguments
from dra_driver.commands.slices import consumable_gpus, mps_slots

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        required=True,
        help="this node's name: pool name and slices' nodeName (the chart sets "
        "DRA_NODE_NAME from the downward API)",
    )
    parser.add_argument(
        "--driver-name",
        default="gpu.nvidia.com",
        help="DRA driver name, a DNS subdomain (default %(default)s)",
    )
    add_host_arguments(parser)
    add_kubelet_plugin_arguments(parser)
    parser.add_argument(
        "--host-driver-root",
        type=Path,
        default=None,
        help="where the container runtime finds the driver root, when this process sees it "
        "elsewhere (in the chart's pod it is mounted at /driver-root): CDI specs name "
        "runtime paths (default: --driver-root)",
    )
    parser.add_argument(
        "--cdi-hook-path",
        type=Path,
        default=None,
        help="where the container runtime runs NVIDIA's nvidia-cdi-hook, which every CDI spec "
        "names (ld cache, libcuda.so link, CUDA forward compatibility); a host path this "
        "process sees at the same place (default <kubelet-plugins-dir>/<driver-name>/"
        "nvidia-cdi-hook)",
    )
    parser.add_argument(
        "--cdi-hook-local-path",
        type=Path,
        default=None,
        help="where this process sees the file at --cdi-hook-path, when not at the same path "
        "(the chart mounts a custom path's dir at /cdi-hook) (default: --cdi-hook-path)",
    )
    parser.add_argument(
        "--cdi-hook-source",
        default="nvidia-cdi-hook",
        help="the nvidia-cdi-hook binary installed at --cdi-hook-path at start (a bare name "
        "is looked up on PATH: the image ships it); 'none': install nothing and use NVIDIA's "
        "own hook already at --cdi-hook-path (default %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="checkpoint, MPS daemons and lock files (default <kubelet-plugins-dir>/<driver-name>)",
    )
    parser.add_argument(
        "--context",
        default=None,
        help="kubeconfig context to use (default: its current-context; needs --kubeconfig)",
    )
    parser.add_argument(
        "--rediscover-interval",
        type=float,
        default=300.0,
        help="seconds between GPU re-discoveries, 5-86400; 0: only on SIGHUP (default %(default)g)",
    )
    parser.add_argument(
        "--taint-degraded",
        action="store_true",
        help="publish degraded GPUs with a NoSchedule taint (needs the "
        "DRADeviceTaints gate) instead of leaving them out",
    )
    parser.add_argument(
        "--mig-mode",
        choices=("static", "dynamic"),
        default="static",
        help="static: GPUs in MIG mode publish the MIG devices that exist; dynamic: every "
        "MIG profile and placement through shared counters, the instance created at prepare "
        "and destroyed at unprepare (GPUs with MIG off stay whole; MIG mode is never "
        "changed) (default %(default)s)",
    )
    parser.add_argument(
        "--dynamic-mig-attributes",
        choices=("full", "compact"),
        default="full",
        help="what each dynamic MIG device carries: full (every attribute NVIDIA's driver "
        "publishes on a MIG device, plus ours) or compact (8 of 13: no brand, architecture, "
        "driverVersion, cudaDriverVersion or numaNode; about 0.7x the control plane's "
        "memory per node; claims reading those fail to schedule) (default %(default)s)",
    )
    parser.add_argument(
        "--consumable-gpus",
        type=consumable_gpus,
        default="none",
        help="full GPUs published for sharing by many claims (consumable capacity: memory and "
        "computeShare): none, all, or product names and GPU UUIDs separated by commas "
        "(default none)",
    )
    parser.add_argument(
        "--mps-slots",
        type=mps_slots,
        default="none",
        help="GPUs split into N equal MPS slots, each claim one slot, enforced by one MPS "
        "daemon per GPU whose defaults are one slot (drivers before r615; from r615 a "
        "daemon per claim): none, or <product name or GPU UUID>=<N> separated by commas, "
        "N 2-64, e.g. 'NVIDIA L4=4,GPU-0c9f...=2'; a GPU named here and in "
        "--consumable-gpus is split into slots (default none)",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=10.0,
        help="seconds between full device-health updates to the kubelet, 1-300 "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--cleanup-interval",
        type=float,
        default=600.0,
        help="seconds between checks that prepared claims still exist, 10-86400 "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--nvidia-smi",
        type=Path,
        default=None,
        help="nvidia-smi to run (default: found under the driver root)",
    )
    parser.add_argument(
        "--mps-control",
        type=Path,
        default=None,
        help="nvidia-cuda-mps-control to run (default: found under the driver root)",
    )
    parser.add_argument(
        "--mps-daemons",
        choices=("process", "pod"),
        default="process",
        help="how MPS control daemons run: pod: one pod per daemon on this node, run by the "
        "kubelet, so daemons and their clients survive a plugin restart or upgrade (needs "
        "--namespace and --mps-daemon-image; the chart's default); process: children of this "
        "process, which end with its container (default %(default)s)",
    )
    parser.add_argument(
        "--mps-daemon-image",
        default=None,
        help="image of the MPS daemon pods: the plugin's own (the chart passes it)",
    )
    parser.add_argument(
        "--mps-daemon-priority-class",
        default="",
        help="priorityClassName of the MPS daemon pods (the chart passes the plugin's) "
        "(default: none)",
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="this plugin's namespace, where MPS daemon pods are created (the chart sets "
        "DRA_NAMESPACE from the downward API)",
    )
    parser.add_argument(
        "--uninstall-on-exit",
        action="store_true",
        help="delete this node's slices on exit (clean uninstall)",
    )
    observability.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from dra_driver import daemon
    from dra_driver.settings import daemon_settings

    return daemon.run(daemon_settings(args), environ=os.environ)
