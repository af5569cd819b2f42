"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) on loopback, for the test tiers and ``dra-driver
dev-cluster up``. Test and developer tooling only: the driver never imports it.
"""

from dra_driver.devcluster.binaries import Binaries, BinariesError, find_binaries
from dra_driver.devcluster.cluster import DRA_CONTROLLERS, Cluster, ClusterOptions, StartupTimes
from dra_driver.devcluster.processes import ComponentError
from dra_driver.devcluster.rest import ApiError, RestClient
from dra_driver.devcluster.wait import wait_until

__all__ = [
    "DRA_CONTROLLERS",
    "ApiError",
    "Binaries",
    "BinariesError",
    "Cluster",
    "ClusterOptions",
    "ComponentError",
    "RestClient",
    "StartupTimes",
    "find_binaries",
    "wait_until",
]
