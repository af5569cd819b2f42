"""Building the compute-domain backend on an emulated node, claims, and daemon pods."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver.commands.discover import install_emulated_imex_tools
from dra_driver.computedomain.names import (
    API_GROUP,
    API_VERSION,
    CHANNEL_CONFIG_KIND,
    CHANNEL_DEVICE,
    DAEMON_CONFIG_KIND,
    DAEMON_DEVICE,
    DOMAIN_LABEL,
)
from dra_driver.computedomain.node.backend import ComputeDomainBackend
from dra_driver.computedomain.node.checkpoint import CheckpointStore
from dra_driver.computedomain.node.hostinfo import read_host
from dra_driver.computedomain.node.kubeapi import DaemonPods, NodeLabel
from dra_driver.devcluster import Cluster
from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.hardware.nvml import Nvml
from dra_driver.plugin.claims import AllocatedDevice, Claim, ClaimRef, OpaqueConfig
from dra_driver.plugin.kubeclient import KubeClient

NAMESPACE = "dra-driver"
"""The driver's namespace (deploy/rbac), where daemon pods run."""
API = f"{API_GROUP}/{API_VERSION}"


def paths(root: Path) -> tuple[Path, Path, Path]:
    """(emulated host root, CDI dir, state dir) under ``root``."""
    return root / "host", root / "cdi", root / "state"


@contextmanager
def backend(
    root: Path,
    client: KubeClient,
    node_name: str,
    *,
    profile: str = "hgx-h100-fabric",
    on_step: Callable[[str], None] | None = None,
    ready_wait_s: float = 0.0,
) -> Iterator[ComputeDomainBackend]:
    host_root, cdi_dir, state_dir = paths(root)
    node = EmulatedNode.create(profile, host_root)
    install_emulated_imex_tools(node)  # as compute-domain-plugin does on an emulated node
    with node.nvml():
        nvml = Nvml()
        nvml.init()
        try:
            host = read_host(node.host, nvml)
        finally:
            nvml.shutdown()
    store = CheckpointStore(
        state_dir=state_dir, boot_id_file=node.host.proc("sys", "kernel", "random", "boot_id")
    )
    b = ComputeDomainBackend(
        driver_name="compute-domain.nvidia.com", node_name=node_name, host=host,
        cdi_dir=cdi_dir, state_dir=state_dir, store=store, label=NodeLabel(client, node_name),
        daemons=DaemonPods(client, NAMESPACE, node_name), logger=logging.getLogger("test.cd"),
        runtime_driver_root=node.host.driver_root, ready_wait_s=ready_wait_s, poll_s=0.05,
        on_step=on_step,
    )  # fmt: skip
    b.recover()
    try:
        yield b
    finally:
        store.close()


def channel_claim(uid: str, domain: str, node: str, mode: str | None = None,
                  name: str = "channel") -> Claim:  # fmt: skip
    params: dict[str, Any] = {"apiVersion": API, "kind": CHANNEL_CONFIG_KIND, "domainID": domain}
    if mode is not None:
        params["allocationMode"] = mode
    return Claim(
        ref=ClaimRef("team-a", name, uid),
        devices=(AllocatedDevice("channel", node, CHANNEL_DEVICE),),
        configs=(OpaqueConfig("FromClaim", ("channel",), params),),
    )


def daemon_claim(uid: str, domain: str, node: str) -> Claim:
    params = {"apiVersion": API, "kind": DAEMON_CONFIG_KIND, "domainID": domain}
    return Claim(
        ref=ClaimRef(NAMESPACE, "daemon", uid),
        devices=(AllocatedDevice("daemon", node, DAEMON_DEVICE),),
        configs=(OpaqueConfig("FromClass", (), params),),
    )


def daemon_pod(cluster: Cluster, name: str, domain: str, node: str) -> str:
    """A daemon pod of ``domain`` bound to ``node`` (no kubelet: it stays Pending)."""
    cluster.rest.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {DOMAIN_LABEL: domain}},
        "spec": {"nodeName": node, "containers": [{"name": "imex", "image": "busybox"}]},
    })  # fmt: skip
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"


def set_ready(cluster: Cluster, pod_path: str, ready: bool) -> None:
    """What the kubelet writes once the readiness probe (nvidia-imex-ctl -q) passes."""
    condition = {"type": "Ready", "status": "True" if ready else "False",
                 "reason": "" if ready else "ContainersNotReady"}  # fmt: skip
    cluster.rest.merge_patch(
        pod_path + "/status", {"status": {"phase": "Running", "conditions": [condition]}}
    )


def node_label(cluster: Cluster, node: str) -> str | None:
    labels = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    value = labels.get(DOMAIN_LABEL)
    return None if value is None else str(value)
