"""``dra-driver compute-domain-plugin``: the ``compute-domain.nvidia.com`` kubelet plugin.

A second container of the driver's DaemonSet, same image as ``kubelet-plugin``: its own
sockets (``<plugins dir>/compute-domain.nvidia.com/``), slices, checkpoint and process,
so a GPU-plugin restart never interrupts a domain's prepares and the feature is off
by leaving the container out. See :mod:`dra_driver.computedomain.node.backend`.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from dra_driver.commands.discover import add_host_arguments
from dra_driver.commands.pluginflags import add_kubelet_plugin_arguments
from dra_driver.computedomain.names import DRIVER_NAME
from dra_driver.envflags import env_name
from dra_driver.settings import (
    SettingsError,
    check_namespace,
    check_node_name,
    check_rolling_update_uid,
    host_settings,
)

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", required=True, help="this node's name (pool, label)")
    parser.add_argument(
        "--namespace",
        required=True,
        help="the driver's namespace, where the domains' daemon pods run",
    )
    add_host_arguments(parser)
    add_kubelet_plugin_arguments(parser)
    parser.add_argument(
        "--host-driver-root",
        type=Path,
        default=None,
        help="where the container runtime finds the driver root, when this "
        "process sees it elsewhere (default: --driver-root)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="checkpoint and the domains' host directories, a host path seen "
        "at the same place (default <kubelet-plugins-dir>/" + DRIVER_NAME + ")",
    )
    parser.add_argument(
        "--ready-wait",
        type=float,
        default=2.0,
        help="seconds a channel prepare waits for the node's daemon pod to be "
        "Ready before failing retryably (the kubelet retries), 0-30 "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--clique-node-label",
        type=_boolean,
        default=True,
        help="set nvidia.com/gpu.clique=<clique> on this node while it has a clique, "
        "as GPU Feature Discovery does; false where GFD runs (default true)",
    )
    parser.add_argument(
        "--claim-status",
        type=_boolean,
        default=True,
        help="write prepared devices into claims' status.devices (default true)",
    )


def _boolean(text: str) -> bool:
    from dra_driver.commands.observability import boolean

    return boolean(text)


def run(args: argparse.Namespace) -> int:
    from dra_driver.commands.discover import gpu_host, install_emulated_imex_tools
    from dra_driver.computedomain.node.running import ComputeDomainPluginSettings
    from dra_driver.computedomain.node.running import run as run_plugin
    from dra_driver.plugin.settings import PluginSettings

    node = args.node_name
    check_node_name(node)
    check_namespace(args.namespace, "expected the driver's namespace, where daemon pods run")
    check_rolling_update_uid(args.rolling_update_uid)
    if not 0 <= args.ready_wait <= 30:
        raise SettingsError(
            f"--ready-wait ({env_name('--ready-wait')}) is {args.ready_wait:g}: use 0-30 seconds"
        )
    hosts = host_settings(args)
    with gpu_host(hosts) as (host, emulated):
        extra: list[str] = []
        if emulated is not None:
            install_emulated_imex_tools(emulated)
            extra.append(str(host.root))  # the daemons' emulated tools and their record
        settings = ComputeDomainPluginSettings(
            plugin=PluginSettings(
                driver_name=DRIVER_NAME, node_name=node,
                registry_dir=args.kubelet_registry_dir, plugins_dir=args.kubelet_plugins_dir,
                rolling_update_uid=args.rolling_update_uid, kubeconfig=args.kubeconfig,
                claim_status=args.claim_status,
            ),
            namespace=args.namespace,
            cdi_dir=args.cdi_dir,
            state_dir=args.state_dir or args.kubelet_plugins_dir / DRIVER_NAME,
            runtime_driver_root=args.host_driver_root or host.driver_root,
            extra_mounts=tuple(extra),
            ready_wait_s=args.ready_wait,
            health_port=args.health_port,
            clique_node_label=args.clique_node_label,
        )  # fmt: skip
        return run_plugin(settings, host=host, environ=os.environ)
