"""Least privilege for claim status (KEP-4817), proven on the real API server with the
shipped RBAC and a Node-bound token: a node's plugin writes our driver's entries into claims
allocated on its node; it cannot write claims of another node, entries of another driver,
or anything in a claim's status besides devices."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.devcluster import Cluster
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, unique

RESOURCE = "/apis/resource.k8s.io/v1"


def allocated_claim(cluster: Cluster, ns: str, node: str, driver: str = "gpu.nvidia.com") -> dict:
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                   "metadata": {"name": "rbac-any"}, "spec": {}})  # fmt: skip
    name = unique("c")
    obj = cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": name, "namespace": ns},
                         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                             "deviceClassName": "rbac-any"}}]}}})  # fmt: skip
    obj["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": driver, "pool": node,
                                 "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }}  # fmt: skip
    return cluster.rest.request("PUT", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}/status",
                                obj)  # fmt: skip


def body(claim: dict, driver: str = "gpu.nvidia.com", **status: Any) -> dict:
    meta = claim["metadata"]
    pool = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "status": status or {"devices": [{"driver": driver, "pool": pool, "device": "gpu-0",
                                          "data": {"uuid": "GPU-x"}}]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def plugin_client(cluster: Cluster) -> tuple[KubeClient, str]:
    apply_rbac(cluster)
    node = cluster.create_node(unique("status-a"))
    return KubeClient.from_kubeconfig(str(node_bound_kubeconfig(cluster, node))), node["metadata"][
        "name"
    ]


def apply(client: KubeClient, b: dict) -> None:
    meta = b["metadata"]
    client.apply_resource_claim_status(meta["namespace"], meta["name"], b,
                                       field_manager="gpu.nvidia.com")  # fmt: skip


def test_own_node_and_driver_is_allowed(cluster, cluster_namespace, plugin_client) -> None:
    client, node = plugin_client
    claim = allocated_claim(cluster, cluster_namespace, node)
    apply(client, body(claim))
    stored = cluster.rest.get(f"{RESOURCE}/namespaces/{cluster_namespace}/resourceclaims/"
                              f"{claim['metadata']['name']}")  # fmt: skip
    assert stored["status"]["devices"][0]["data"] == {"uuid": "GPU-x"}
    apply(client, body(claim, devices=[]))  # and removed again
    stored = cluster.rest.get(f"{RESOURCE}/namespaces/{cluster_namespace}/resourceclaims/"
                              f"{claim['metadata']['name']}")  # fmt: skip
    assert not stored["status"].get("devices")


def test_another_nodes_claim_is_forbidden(cluster, cluster_namespace, plugin_client) -> None:
    client, _ = plugin_client
    other = cluster.create_node(unique("status-b"))["metadata"]["name"]
    claim = allocated_claim(cluster, cluster_namespace, other)
    with pytest.raises(KubeApiError) as err:
        apply(client, body(claim))
    assert err.value.status == 422 and 'resource "resourceclaims/driver"' in err.value.message


def test_another_drivers_entries_are_forbidden(cluster, cluster_namespace, plugin_client) -> None:
    client, node = plugin_client
    claim = allocated_claim(cluster, cluster_namespace, node, driver="net.example.com")
    with pytest.raises(KubeApiError) as err:
        apply(client, body(claim, driver="net.example.com"))
    assert "net.example.com" in err.value.message


def test_nothing_but_status_patch(cluster, cluster_namespace, plugin_client) -> None:
    client, node = plugin_client
    claim = allocated_claim(cluster, cluster_namespace, node)
    path = (f"{RESOURCE}/namespaces/{cluster_namespace}/resourceclaims/"
            f"{claim['metadata']['name']}/status")  # fmt: skip
    with pytest.raises(KubeApiError) as err:
        client.request("PUT", path, body=claim)  # update is not granted
    assert err.value.status == 403
    moved = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                      "pool": node, "device": "gpu-1"}]},
             "nodeSelector": claim["status"]["allocation"]["nodeSelector"]}  # fmt: skip
    with pytest.raises(KubeApiError) as err:  # nor moving the allocation by apply
        apply(client, body(claim, allocation=moved))
    assert err.value.status == 422
    stored = cluster.rest.get(path.removesuffix("/status"))
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
