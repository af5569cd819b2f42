"""Health in dynamic MIG mode on a real node (real kubelet, containerd and scheduler; the
plugin as the chart runs it with ``migMode: dynamic``): an Xid on the MIG instance a pod's
claim was prepared on reaches that pod's status through the kubelet's health stream
(``allocatedResourcesStatus``), and no other pod's; a fatal GPU-wide Xid taints every
device of the GPU, so the real scheduler leaves a new claim for its partitions pending,
and the same claim tolerating the taint is allocated there: the taint is the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.emulation import EmulatedNode
from dra_driver.emulation.migrules import gi_id_for
from tests.cluster.test_allocation import stays_unallocated
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import claim_name_of, get_claim, results
from tests.e2e.test_dynamic_mig import PROFILE, instances, mig_pod, wait_instances

XID = "gpu.nvidia.com/xid"


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    # Faults must outlast the test (nothing heals within 10 minutes without a reset).
    values = {"migMode": "dynamic", "health.healthyPeriodSeconds": "600",
              "health.checkIntervalSeconds": "1"}  # fmt: skip
    with real_gpu_node(cluster, node_binaries, helm_binary, PROFILE, values=values) as node:
        yield node


def pod_health(node: RealGpuNode, namespace: str, pod: str) -> dict[str, str]:
    """CDI device ID -> health, as the kubelet reports it in the pod's container status."""
    statuses = node.pod(namespace, pod)["status"].get("containerStatuses") or []
    return {
        r["resourceID"]: r.get("health", "")
        for s in statuses
        for claim in s.get("allocatedResourcesStatus") or []
        for r in claim["resources"]
    }


def slice_devices(node: RealGpuNode) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in node.slices() for d in s["spec"].get("devices") or []}


def taints(node: RealGpuNode, gpu: int) -> dict[str, list[tuple[str, str, str]]]:
    """Device of one GPU -> (key, value, effect) of its taints, as the API server has them."""
    return {
        name: [(t["key"], t.get("value", ""), t["effect"]) for t in d["taints"]]
        for name, d in slice_devices(node).items()
        if d.get("taints") and (name == f"gpu-{gpu}" or name.startswith(f"gpu-{gpu}-"))
    }


def partition_pod(
    namespace: str, name: str, parent_uuid: str, tolerate: bool = False
) -> list[dict[str, Any]]:
    """A 1g.10gb on one given GPU (``tolerate``: whatever its xid taint says)."""
    objs = mig_pod(namespace, name, "1g.10gb")
    claim = objs[0]["spec"]["devices"]["requests"][0]["exactly"]
    on_gpu = f"device.attributes['gpu.nvidia.com'].parentUUID == '{parent_uuid}'"
    claim["selectors"].append({"cel": {"expression": on_gpu}})
    if tolerate:
        claim["tolerations"] = [{"key": XID, "operator": "Exists"}]
    return objs


def test_a_pod_on_a_partition_sees_its_device_unhealthy_after_an_xid_on_its_instance(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    cluster.apply(keep_running(pin_to_node(mig_pod(ns, "victim", "3g.40gb"), node.name)))
    cluster.apply(keep_running(pin_to_node(mig_pod(ns, "bystander", "1g.10gb"), node.name)))
    for pod in ("victim", "bystander"):
        node.run_pod(ns, pod)
    cdi_ids = {}
    for pod in ("victim", "bystander"):
        claim = get_claim(cluster, ns, claim_name_of(cluster, ns, pod, "mig"))
        device = results(claim)[0]["device"]
        assert device.startswith("gpu-0-mig-"), device  # first fit: both on GPU 0
        cdi_ids[pod] = (f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{device}", device)
    wait_until(lambda: all(pod_health(node, ns, p) == {cdi_ids[p][0]: "Healthy"} for p in cdi_ids),
               timeout=30, what="both pods' devices Healthy in their status")  # fmt: skip

    # The victim's instance, as its claim's prepare created it: GI by placement, CI 0.
    victim = cdi_ids["victim"][1]
    gi = gi_id_for(int(victim.rsplit("-", 1)[1]), 4)
    assert any(g == gi for g, *_ in instances(node)[0])
    EmulatedNode.create(PROFILE, node.host_root).inject_xid(0, 95, gi=gi, ci=0)
    wait_until(lambda: pod_health(node, ns, "victim") == {cdi_ids["victim"][0]: "Unhealthy"},
               timeout=30, what="the victim's device Unhealthy in its pod status",
               describe=lambda: str(node.pod(ns, "victim")["status"]))  # fmt: skip
    assert pod_health(node, ns, "bystander") == {cdi_ids["bystander"][0]: "Healthy"}
    assert taints(node, 0) == {victim: [(XID, "95", "NoSchedule")]}  # the slices agree

    node.delete_pod(ns, "victim")
    node.delete_pod(ns, "bystander")
    wait_instances(node, {})
    # Its instance is gone, and its fault with it: nothing stays tainted.
    wait_until(lambda: taints(node, 0) == {}, timeout=30, what="no taint once the instance went")


def test_a_fatal_gpu_wide_xid_keeps_new_claims_off_that_gpus_partitions(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    devices = slice_devices(node)
    gpu3 = {n for n in devices if n == "gpu-3" or n.startswith("gpu-3-")}
    assert len(gpu3) == 26
    parent = devices["gpu-3"]["attributes"]["uuid"]["string"]
    EmulatedNode.create(PROFILE, node.host_root).inject_xid(3, 79)  # fell off the bus
    wait_until(lambda: set(taints(node, 3)) == gpu3, timeout=30, what="GPU 3's devices tainted",
               describe=lambda: str(taints(node, 3)))  # fmt: skip
    assert all(t == [(XID, "79", "NoSchedule")] for t in taints(node, 3).values())

    cluster.apply(keep_running(pin_to_node(partition_pod(ns, "stranded", parent), node.name)))
    assert "cannot allocate all claims" in stays_unallocated(cluster, ns, "stranded")
    # The taint is the reason: the very same request tolerating it lands on GPU 3.
    tolerant = partition_pod(ns, "tolerant", parent, tolerate=True)
    cluster.apply(keep_running(pin_to_node(tolerant, node.name)))
    allocated = wait_until(
        lambda: (get_claim(cluster, ns, "tolerant").get("status") or {}).get("allocation"),
        timeout=30, what="the tolerating claim allocated",
    )  # fmt: skip
    assert allocated["devices"]["results"][0]["device"].startswith("gpu-3-mig-1g10gb-")
    assert "allocation" not in (get_claim(cluster, ns, "stranded").get("status") or {})
    node.delete_pod(ns, "tolerant")
    node.delete_pod(ns, "stranded")
    wait_instances(node, {})
