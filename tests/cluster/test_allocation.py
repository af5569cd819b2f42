"""The real kube-scheduler allocates from the slices our driver publishes.

Each scenario publishes emulated nodes exactly as ``dra-driver slices`` would
and pins its pod to them, then checks the devices the scheduler picked. Where
several devices fit equally, the check is the set of acceptable answers;
where the selector singles one out, the exact device.

Nodes are hand-made (no kubelet) with the exact ResourceSlices ``dra-driver
slices`` emits for an emulated profile; pods are pinned to their node (or a
labelled group of nodes) with a nodeSelector, so scenarios never compete for
devices.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.commands.slices import resource_slices
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.emulation import BUILTIN_PROFILES, EmulatedNode
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.inventory import Inventory

DRIVER = "gpu.nvidia.com"
GROUP_LABEL = "dra-test/group"
DEVICECLASSES = Path(__file__).parents[2] / "deploy" / "deviceclasses"
TIMEOUT = 30.0
RESOURCE = "/apis/resource.k8s.io/v1"


def apply_deviceclasses(cluster: Cluster) -> None:
    cluster.apply([yaml.safe_load(p.read_text()) for p in sorted(DEVICECLASSES.glob("*.yaml"))])


def emulated_inventory(profile: str) -> Inventory:
    with tempfile.TemporaryDirectory(prefix="dra-alloc-") as root:
        node = EmulatedNode.create(profile, Path(root))
        with node.nvml():
            return discover(node.host, logging.getLogger("tests.cluster"))


@dataclass
class GpuNode:
    name: str
    profile: str
    slices: list[dict[str, Any]]
    stored: list[dict[str, Any]]


def publish_node(cluster: Cluster, profile: str, group: str | None = None) -> GpuNode:
    name = f"{profile}-{secrets.token_hex(3)}"
    node = cluster.create_node(name, labels={GROUP_LABEL: group} if group else None)
    slices = resource_slices(
        emulated_inventory(profile),
        driver_name=DRIVER,
        node_name=name,
        node_uid=node["metadata"]["uid"],
    )
    stored = [cluster.rest.create(f"{RESOURCE}/resourceslices", s) for s in slices]
    return GpuNode(name=name, profile=profile, slices=slices, stored=stored)


def request(
    name: str,
    device_class: str,
    *selectors: str,
    count: int | None = None,
    all_devices: bool = False,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if all_devices:
        exactly["allocationMode"] = "All"
    elif count is not None:
        exactly["count"] = count
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subrequests: tuple[str, str, str]) -> dict[str, Any]:
    """``(subrequest name, device class, CEL selector)`` in order of preference."""
    return {
        "name": name,
        "firstAvailable": [
            {"name": sub, "deviceClassName": cls, "selectors": [{"cel": {"expression": cel}}]}
            for sub, cls, cel in subrequests
        ],
    }


def attr(name: str) -> str:
    return f"device.attributes['{DRIVER}'].{name}"


def cap(name: str) -> str:
    return f"device.capacity['{DRIVER}'].{name}"


def claim_and_pod(
    cluster: Cluster,
    namespace: str,
    name: str,
    requests: list[dict[str, Any]],
    node_selector: dict[str, str],
    constraints: list[dict[str, Any]] | None = None,
) -> None:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": devices},
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeSelector": node_selector,
                "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/pause:1",
                        "resources": {"claims": [{"name": "gpus"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )


def allocation(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """Wait for the claim's allocation; ``(request, pool, device)`` sorted."""

    def allocated() -> list[tuple[str, str, str]] | None:
        claim = cluster.rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
        alloc = claim.get("status", {}).get("allocation")
        if not alloc:
            return None
        results = alloc["devices"]["results"]
        assert all(r["driver"] == DRIVER for r in results)
        return sorted((r["request"], r["pool"], r["device"]) for r in results)

    def pod_status() -> str:
        pod = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return str(pod.get("status", {}).get("conditions"))

    return wait_until(
        allocated, timeout=TIMEOUT, what=f"claim {name} allocated", describe=pod_status
    )


def stays_unallocated(cluster: Cluster, namespace: str, name: str) -> str:
    """Wait until the scheduler gave up on the pod; the claim must have no allocation."""

    def unschedulable() -> str | None:
        pod = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        for cond in pod.get("status", {}).get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return str(cond.get("message", ""))
        return None

    message = wait_until(unschedulable, timeout=TIMEOUT, what=f"pod {name} unschedulable")
    claim = cluster.rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    assert "allocation" not in claim.get("status", {}), claim["status"]
    return message


GPU, MIG = "gpu.nvidia.com", "mig.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture(scope="module")
def classes(cluster: Cluster) -> None:
    apply_deviceclasses(cluster)


def _on(node: GpuNode) -> dict[str, str]:
    return {"kubernetes.io/hostname": node.name}


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_published_slices_are_accepted_and_read_back_unchanged(
    cluster: Cluster, classes: None, profile: str
) -> None:
    node = publish_node(cluster, profile)
    assert len(node.stored) == 1
    for sent, stored in zip(node.slices, node.stored, strict=True):
        assert stored["spec"] == sent["spec"]
        read = cluster.rest.get(f"{RESOURCE}/resourceslices/{sent['metadata']['name']}")
        assert read["spec"] == sent["spec"]  # no field dropped or re-canonicalised
        assert read["metadata"]["ownerReferences"] == sent["metadata"]["ownerReferences"]
    # Static MIG (the default): MIG-mode GPUs publish only the instances that exist.
    devices = {"dgx-a100-mig": 16, "dgx-a100": 8, "dgx-a100-mig-on": 0, "dgx-h100": 8,
               "h100-l4-mixed": 3, "h200": 1, "l4-x4": 4, "t4": 1, "a100-pcie-nvlink": 4,
               "hgx-h100-fabric": 8, "hgx-h100-fabric-clique8": 8,
               "hgx-h100-no-clique": 8}  # fmt: skip
    assert len(node.stored[0]["spec"].get("devices", [])) == devices[profile]


def test_memory_quantity_selects_exact_devices(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    node = publish_node(cluster, "dgx-a100-mig")
    ns = cluster_namespace
    claim_and_pod(
        cluster,
        ns,
        "mig-20g",
        [
            request(
                "gpus",
                MIG,
                f"{cap('memory')}.compareTo(quantity('19Gi')) >= 0",
                f"{cap('memory')}.compareTo(quantity('20Gi')) <= 0",
            )
        ],
        _on(node),
    )
    assert allocation(cluster, ns, "mig-20g") == [("gpus", node.name, "gpu-0-mig-2g20gb-14-4")]
    claim_and_pod(
        cluster,
        ns,
        "full-80g",
        [request("gpus", GPU, f"{cap('memory')}.compareTo(quantity('80Gi')) >= 0")],
        _on(node),
    )
    ((_, pool, device),) = allocation(cluster, ns, "full-80g")
    assert pool == node.name and device in {"gpu-2", "gpu-3", "gpu-6", "gpu-7"}


def test_compute_capability_semver_and_product_name_pick_the_right_node(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    group = {GROUP_LABEL: "cc-and-name"}
    a100 = publish_node(cluster, "dgx-a100", group=group[GROUP_LABEL])
    h100 = publish_node(cluster, "dgx-h100", group=group[GROUP_LABEL])
    ns = cluster_namespace
    claim_and_pod(
        cluster,
        ns,
        "hopper",
        [request("gpus", GPU, f"{attr('cudaComputeCapability')}.compareTo(semver('9.0.0')) >= 0")],
        group,
    )
    claim_and_pod(
        cluster,
        ns,
        "pre-hopper",
        [request("gpus", GPU, f"{attr('cudaComputeCapability')}.isLessThan(semver('9.0.0'))")],
        group,
    )
    claim_and_pod(
        cluster, ns, "by-name", [request("gpus", GPU, f"{attr('productName')} == '{H100}'")], group
    )
    for claim, node in (("hopper", h100), ("pre-hopper", a100), ("by-name", h100)):
        ((_, pool, device),) = allocation(cluster, ns, claim)
        assert pool == node.name and device.startswith("gpu-"), claim


def test_numa_node_and_mig_profile_selectors(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    node = publish_node(cluster, "dgx-a100-mig")
    ns = cluster_namespace
    claim_and_pod(
        cluster, ns, "numa1-gpu", [request("gpus", GPU, f"{attr('numaNode')} == 1")], _on(node)
    )
    numa1_3g = f"{attr('numaNode')} == 1 && {attr('profile')} == '3g.40gb'"  # GPU 0's is NUMA 0
    claim_and_pod(cluster, ns, "numa1-mig", [request("gpus", MIG, numa1_3g)], _on(node))
    claim_and_pod(
        cluster, ns, "mig-4g", [request("gpus", MIG, f"{attr('profile')} == '4g.40gb'")], _on(node)
    )
    claim_and_pod(
        cluster,
        ns,
        "mig-1g-x3",
        [request("gpus", MIG, f"{attr('profile')} == '1g.10gb'", count=3)],
        _on(node),
    )
    ((_, _, numa_gpu),) = allocation(cluster, ns, "numa1-gpu")
    assert numa_gpu in {"gpu-6", "gpu-7"}
    assert allocation(cluster, ns, "numa1-mig") == [("gpus", node.name, "gpu-4-mig-3g40gb-9-4")]
    assert allocation(cluster, ns, "mig-4g") == [("gpus", node.name, "gpu-4-mig-4g40gb-5-0")]
    ones = [d for _, _, d in allocation(cluster, ns, "mig-1g-x3")]
    assert len(set(ones)) == 3 and all("-mig-1g10gb-19-" in d for d in ones)


def test_count_two_with_match_attribute(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    a100 = publish_node(cluster, "dgx-a100")
    h100 = publish_node(cluster, "dgx-h100")
    mig = publish_node(cluster, "dgx-a100-mig")
    ns = cluster_namespace
    same_root = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    same_numa = [{"matchAttribute": f"{DRIVER}/numaNode"}]
    claim_and_pod(cluster, ns, "pair-root", [request("gpus", GPU, count=2)], _on(a100), same_root)
    claim_and_pod(cluster, ns, "pair-numa", [request("gpus", GPU, count=2)], _on(mig), same_numa)
    pair = {d for _, _, d in allocation(cluster, ns, "pair-root")}
    assert pair in ({"gpu-0", "gpu-1"}, {"gpu-2", "gpu-3"}, {"gpu-4", "gpu-5"}, {"gpu-6", "gpu-7"})
    numa_pair = {d for _, _, d in allocation(cluster, ns, "pair-numa")}
    assert numa_pair in ({"gpu-2", "gpu-3"}, {"gpu-6", "gpu-7"})
    # Every H100 has its own root port; only two full GPUs per NUMA node remain in MIG node.
    claim_and_pod(
        cluster, ns, "h100-same-root", [request("gpus", GPU, count=2)], _on(h100), same_root
    )
    claim_and_pod(
        cluster, ns, "three-same-numa", [request("gpus", GPU, count=3)], _on(mig), same_numa
    )
    assert "cannot allocate" in stays_unallocated(cluster, ns, "h100-same-root")
    stays_unallocated(cluster, ns, "three-same-numa")


def test_allocation_mode_all(cluster: Cluster, cluster_namespace: str, classes: None) -> None:
    node = publish_node(cluster, "dgx-a100")
    ns = cluster_namespace
    claim_and_pod(
        cluster,
        ns,
        "all-numa0",
        [request("gpus", GPU, f"{attr('numaNode')} == 0", all_devices=True)],
        _on(node),
    )
    assert allocation(cluster, ns, "all-numa0") == [
        ("gpus", node.name, f"gpu-{i}") for i in range(4)
    ]


def test_first_available_prefers_h100_then_falls_back_to_a100(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    only_a100 = publish_node(cluster, "dgx-a100", group="fallback")
    mixed_a100 = publish_node(cluster, "dgx-a100", group="both")
    mixed_h100 = publish_node(cluster, "dgx-h100", group="both")
    prefer = first_available(
        "gpu",
        ("h100", GPU, f"{attr('productName')} == '{H100}'"),
        ("a100", GPU, f"{attr('productName')} == '{A100}'"),
    )
    ns = cluster_namespace
    claim_and_pod(cluster, ns, "prefer-fallback", [prefer], {GROUP_LABEL: "fallback"})
    claim_and_pod(cluster, ns, "prefer-both", [prefer], {GROUP_LABEL: "both"})
    ((req, pool, _),) = allocation(cluster, ns, "prefer-fallback")
    assert (req, pool) == ("gpu/a100", only_a100.name)
    ((req, pool, _),) = allocation(cluster, ns, "prefer-both")
    assert (req, pool) == ("gpu/h100", mixed_h100.name)
    assert mixed_a100.name != pool


def test_unsatisfiable_claims_stay_unallocated(
    cluster: Cluster, cluster_namespace: str, classes: None
) -> None:
    node = publish_node(cluster, "dgx-a100-mig")
    ns = cluster_namespace
    claim_and_pod(
        cluster,
        ns,
        "too-big",
        [request("gpus", GPU, f"{cap('memory')}.compareTo(quantity('1Ti')) >= 0")],
        _on(node),
    )
    claim_and_pod(
        cluster, ns, "no-7g", [request("gpus", MIG, f"{attr('profile')} == '7g.80gb'")], _on(node)
    )
    claim_and_pod(
        cluster,
        ns,
        "blackwell",
        [request("gpus", GPU, f"{attr('cudaComputeCapability')}.compareTo(semver('10.0.0')) >= 0")],
        _on(node),
    )
    for claim in ("too-big", "no-7g", "blackwell"):
        assert "cannot allocate all claims" in stays_unallocated(cluster, ns, claim)
