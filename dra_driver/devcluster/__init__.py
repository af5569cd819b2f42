# ruff: noqa: E402 (the extra check must run before the submodules import their deps)
"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) on loopback, and real nodes (kubelet + containerd), for
the test tiers, ``dra-driver dev-cluster up`` and ``dra-driver demo``. Test and
developer tooling only: the driver never imports it. Needs the ``dev`` extra.
"""

import importlib.util

DEV_EXTRA_HINT = "pip install 'dra-driver[dev]'"
_missing = [m for m in ("cryptography", "kubernetes") if importlib.util.find_spec(m) is None]
if _missing:
    raise ModuleNotFoundError(
        f"dra_driver.devcluster needs {', '.join(_missing)}, the developer tools of the "
        f"'dev' extra: {DEV_EXTRA_HINT}",
        name=_missing[0],
    )

from dra_driver.devcluster.api import ApiError, ToolClient, api_client
from dra_driver.devcluster.binaries import Binaries, BinariesError, find_binaries
from dra_driver.devcluster.cluster import Cluster, StartupTimes
from dra_driver.devcluster.controlplane import DRA_CONTROLLERS, ClusterOptions
from dra_driver.devcluster.processes import ComponentError
from dra_driver.devcluster.wait import wait_until

__all__ = [
    "DRA_CONTROLLERS",
    "ApiError",
    "Binaries",
    "BinariesError",
    "Cluster",
    "ClusterOptions",
    "ComponentError",
    "ToolClient",
    "api_client",
    "StartupTimes",
    "find_binaries",
    "wait_until",
]
