"""Kubernetes 1.37 attributes on the real API server and scheduler.

- ``resource.kubernetes.io/numaNode`` (KEP-6072), scalar form: claims select and
  ``matchAttribute`` on it; list form (``ints``, KEP-5491) on a control plane with
  DRAListTypeAttributes: ``matchAttribute`` matches GPUs whose NUMA lists intersect, which
  the scalar form cannot, and without the gate the publisher reports what was dropped.
- ``nvlinkDomain``: a two-GPU claim matching on it gets a bridged pair even where
  first-fit would take two GPUs of different bridges; a fabric node's GPUs share a domain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.devcluster import (
    BinariesError,
    Cluster,
    ClusterOptions,
    ComponentError,
    find_binaries,
    wait_until,
)
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from tests.cluster.test_allocation import (
    GPU,
    RESOURCE,
    allocation,
    apply_deviceclasses,
    claim_and_pod,
    emulated_inventory,
    request,
    stays_unallocated,
)
from tests.cluster.test_health_taints import health_node

DRIVER = "gpu.nvidia.com"
STD = "resource.kubernetes.io"


def publish(cluster: Cluster, profile: str, name: str, numa_form: str = "scalar") -> list[Any]:
    from dra_driver.commands.slices import resource_slices

    node = cluster.create_node(name)
    slices = resource_slices(
        emulated_inventory(profile), driver_name=DRIVER, node_name=name,
        node_uid=node["metadata"]["uid"], numa_attribute_form=numa_form,  # type: ignore[arg-type]
    )  # fmt: skip
    return [cluster.rest.create(f"{RESOURCE}/resourceslices", s) for s in slices]


def on(name: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": name}


def match(attribute: str) -> list[dict[str, Any]]:
    return [{"matchAttribute": attribute}]


def devices(cluster: Cluster, ns: str, name: str) -> set[str]:
    return {d for _, _, d in allocation(cluster, ns, name)}


def test_standard_numa_node_selects_and_matches(cluster: Cluster, cluster_namespace: str) -> None:
    apply_deviceclasses(cluster)
    ns, node = cluster_namespace, "std-numa-a100"
    stored = publish(cluster, "dgx-a100", node)
    assert stored[0]["spec"]["devices"][4]["attributes"][f"{STD}/numaNode"] == {"int": 1}
    claim_and_pod(cluster, ns, "numa1", [request("gpus", GPU,
                  f"device.attributes['{STD}'].numaNode == 1")], on(node))  # fmt: skip
    assert devices(cluster, ns, "numa1") <= {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}
    claim_and_pod(cluster, ns, "four", [request("gpus", GPU, count=4)], on(node),
                  constraints=match(f"{STD}/numaNode"))  # fmt: skip
    assert devices(cluster, ns, "four") == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}


def test_nvlink_pair_is_allocated_where_first_fit_would_split_it(
    cluster: Cluster, cluster_namespace: str
) -> None:
    apply_deviceclasses(cluster)
    ns, node = cluster_namespace, "nvlink-pairs"
    publish(cluster, "a100-pcie-nvlink", node)
    # gpu-0 taken: first fit for two GPUs is gpu-1 + gpu-2, which sit on different bridges.
    claim_and_pod(cluster, ns, "one", [request("gpus", GPU)], on(node))
    assert devices(cluster, ns, "one") == {"gpu-0"}
    claim_and_pod(cluster, ns, "any-two", [request("gpus", GPU, count=2)], on(node))
    assert devices(cluster, ns, "any-two") == {"gpu-1", "gpu-2"}
    cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/any-two")
    cluster.rest.delete(f"{RESOURCE}/namespaces/{ns}/resourceclaims/any-two")
    wait_until(
        lambda: not any(
            r["metadata"]["name"] == "any-two"
            for r in cluster.rest.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
        ),
        timeout=30, what="claim any-two gone",
    )  # fmt: skip
    claim_and_pod(cluster, ns, "pair", [request("gpus", GPU, count=2)], on(node),
                  constraints=match(f"{DRIVER}/nvlinkDomain"))  # fmt: skip
    assert devices(cluster, ns, "pair") == {"gpu-2", "gpu-3"}  # the intact bridged pair
    claim_and_pod(cluster, ns, "pair2", [request("gpus", GPU, count=2)], on(node),
                  constraints=match(f"{DRIVER}/nvlinkDomain"))  # fmt: skip
    assert "cannot allocate" in stays_unallocated(cluster, ns, "pair2")  # gpu-1 alone left


def test_fabric_gpus_share_one_nvlink_domain(cluster: Cluster, cluster_namespace: str) -> None:
    apply_deviceclasses(cluster)
    ns, node = cluster_namespace, "nvlink-fabric"
    stored = publish(cluster, "hgx-h100-fabric", node)
    attrs = stored[0]["spec"]["devices"][0]["attributes"]
    assert attrs["nvlinkDomain"] == {"string": "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"}
    assert attrs["fabricCliqueID"] == {"int": 7}
    claim_and_pod(cluster, ns, "eight", [request("gpus", GPU, count=8)], on(node),
                  constraints=match(f"{DRIVER}/nvlinkDomain"))  # fmt: skip
    assert len(devices(cluster, ns, "eight")) == 8


@pytest.fixture(scope="module")
def list_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane with list-type attributes (alpha in 1.37)."""
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    cluster = Cluster(
        binaries,
        tmp_path_factory.mktemp("lists"),
        ClusterOptions(feature_gates={"DRAListTypeAttributes": True}, controllers=()),
    )
    try:
        cluster.start()
    except ComponentError as err:
        pytest.fail(f"control plane with DRAListTypeAttributes failed: {err}", pytrace=False)
    yield cluster
    cluster.stop()


def test_list_form_matches_by_intersection(list_cluster: Cluster) -> None:
    cluster = list_cluster
    apply_deviceclasses(cluster)
    ns = "lists"
    cluster.create_namespace(ns)
    stored = publish(cluster, "a100-pcie-nvlink", "list-numa", numa_form="list")
    attrs = [d["attributes"][f"{STD}/numaNode"] for d in stored[0]["spec"]["devices"]]
    assert attrs == [{"ints": [0, 1, 2, 3]}] * 2 + [{"ints": [4, 5, 6, 7]}] * 2
    # gpu-0 (NUMA 0) and gpu-1 (NUMA 1) are on one socket: their lists intersect.
    claim_and_pod(cluster, ns, "socket", [request("gpus", GPU, count=2)], on("list-numa"),
                  constraints=match(f"{STD}/numaNode"))  # fmt: skip
    assert devices(cluster, ns, "socket") == {"gpu-0", "gpu-1"}
    claim_and_pod(cluster, ns, "near5", [request("gpus", GPU,
                  f"device.attributes['{STD}'].numaNode.includes(5)")],
                  on("list-numa"))  # fmt: skip
    assert devices(cluster, ns, "near5") <= {"gpu-2", "gpu-3"}
    # The same node in scalar form: NUMA 0 and 1 differ, no pair exists.
    publish(cluster, "a100-pcie-nvlink", "scalar-numa")
    claim_and_pod(cluster, ns, "no-pair", [request("gpus", GPU, count=2)], on("scalar-numa"),
                  constraints=match(f"{STD}/numaNode"))  # fmt: skip
    assert "cannot allocate" in stays_unallocated(cluster, ns, "no-pair")


def test_list_form_without_the_gate_is_reported_not_silently_lost(cluster: Cluster) -> None:
    """The admin chose ``list`` on a cluster without the gate: the plugin says so."""
    policy = HealthPolicy()
    with health_node(cluster, "l4-x4", policy, numa_attribute_form="list") as h:

        def reported() -> list[str]:
            problems = h.on_node.plugin.readiness().problems
            return [p for p in problems if "numaNode" in p or "ints" in p]

        problems = wait_until(
            reported, timeout=30, what="readiness names the list attribute",
            describe=lambda: str(h.on_node.plugin.readiness().problems),
        )  # fmt: skip
        assert not h.on_node.plugin.readiness().ready
        assert "need the DRAListTypeAttributes feature gate" in problems[0]
