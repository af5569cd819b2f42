"""The real kube-scheduler allocates from the slices our driver publishes.

Each scenario publishes emulated nodes exactly as ``dra-driver slices`` would
and pins its pod to them, then checks the devices the scheduler picked. Where
several devices fit equally, the check is the set of acceptable answers;
where the selector singles one out, the exact device.
"""

from __future__ import annotations

import pytest

from dra_driver.devcluster import Cluster
from dra_driver.gpu.emulation import BUILTIN_PROFILES
from tests.cluster.gpunodes import (
    DRIVER,
    GROUP_LABEL,
    RESOURCE,
    GpuNode,
    allocation,
    apply_deviceclasses,
    attr,
    cap,
    claim_and_pod,
    first_available,
    publish_node,
    request,
    stays_unallocated,
)

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
    devices = {"dgx-a100-mig": 16, "dgx-a100": 8, "dgx-h100": 8, "h200": 1, "l4-x4": 4, "t4": 1}
    assert len(node.stored[0]["spec"]["devices"]) == devices[profile]


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
