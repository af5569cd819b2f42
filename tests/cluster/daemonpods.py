"""MPS daemon pods as the plugin's :class:`~dra_driver.mpspods.PodRunner` builds them
with the chart's default values, for the tests on the real API server."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from dra_driver.devcluster import ApiError, Cluster
from dra_driver.gpu.sharing.mpsrunners import DaemonSpec
from dra_driver.mpspods import PodRunner
from dra_driver.plugin.kubeclient import KubeClient
from dra_driver.plugin.nodepods import HostMount
from tests.plugin.clusterkit import ROOT, sa_of

DRIVER = "gpu.nvidia.com"
APP_VERSION = yaml.safe_load((ROOT / "deploy" / "chart" / "Chart.yaml").read_text())["appVersion"]
IMAGE = f"dra-driver:{APP_VERSION}"
"""The chart's default image: the only one the shipped pod policy admits."""
STATE_DIR = Path(f"/var/lib/kubelet/plugins/{DRIVER}")
"""The plugin's state dir with the chart's default kubeletRootDir."""


def runner(
    client: KubeClient,
    node: str,
    *,
    driver: str = DRIVER,
    library_path: str = "/driver-root/usr/lib64",
    mounts: tuple[HostMount, ...] = (HostMount("/", "/driver-root", read_only=True),),
) -> PodRunner:
    """The runner as the chart composes it (driverRoot ``/`` at /driver-root)."""
    namespace, _ = sa_of(driver)
    return PodRunner(
        client=client, namespace=namespace, node_name=node, driver_name=driver, image=IMAGE,
        mps_control=Path("/driver-root/usr/bin/nvidia-cuda-mps-control"),
        library_path=library_path, priority_class="system-node-critical", mounts=mounts,
        logger=logging.getLogger("test"),
    )  # fmt: skip


def spec(daemon_id: str, *, state_dir: Path = STATE_DIR, shm: bool = True) -> DaemonSpec:
    base = state_dir / "mps" / daemon_id
    return DaemonSpec(daemon_id=daemon_id, base=base, pipe_dir=base / "pipe",
                      log_dir=base / "log", shm_dir=base / "shm" if shm else None,
                      env={"CUDA_VISIBLE_DEVICES": "GPU-a"},
                      setup=("set_default_active_thread_percentage 25",
                             "set_default_device_pinned_mem_limit GPU-a 1024M"))  # fmt: skip


def force_delete(cluster: Cluster, namespace: str, name: str) -> None:
    """As admin, at once (no kubelet confirms a graceful deletion); gone already is fine."""
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    try:
        cluster.rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", options)
    except ApiError as err:
        if err.status != 404:
            raise
