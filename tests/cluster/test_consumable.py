"""Fractional GPUs on the real scheduler: one GPU of an emulated dgx-a100 is published with
``--consumable-gpus <its UUID>`` (consumable ``memory`` and ``computeShare``), the other
seven stay exclusive. Shares of mixed sizes pack onto it until a capacity runs out, the
next claim stays pending with the scheduler's reason, deleting a share frees exactly its
capacity, and a claim that asks for no capacity takes the whole GPU or nothing."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from dra_driver.commands.slices import resource_slices
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import ApiError, Cluster, wait_until
from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.gpu.hardware.inventory import Inventory
from tests.cluster.test_allocation import (
    DRIVER,
    GPU,
    RESOURCE,
    TIMEOUT,
    apply_deviceclasses,
    emulated_inventory,
    stays_unallocated,
)

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"


@pytest.fixture(scope="module")
def shared_gpu(cluster: Cluster) -> tuple[str, str]:
    """``(node name, UUID of its one consumable GPU)``."""
    apply_deviceclasses(cluster)
    inventory = emulated_inventory("dgx-a100")
    uuid = inventory.gpus[3].uuid
    consumable = ConsumableGpus(names=frozenset({uuid}))
    return published_node(cluster, inventory, "consumable", consumable=consumable), uuid


def published_node(cluster: Cluster, inventory: Inventory, prefix: str, **options: Any) -> str:
    """A node ``<prefix>-<hex>`` and its ``inventory``'s ResourceSlices (``options``:
    :func:`resource_slices`'), stored as published; its name."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    node = cluster.create_node(name)
    for s in resource_slices(
        inventory, driver_name=DRIVER, node_name=name, node_uid=node["metadata"]["uid"], **options
    ):
        stored = cluster.rest.create(f"{RESOURCE}/resourceslices", s)
        # policies, allowMultipleAllocations, validValues and mpsSlots kept
        assert stored["spec"] == s["spec"]
    return name


def share(
    cluster: Cluster,
    ns: str,
    name: str,
    node: str,
    uuid: str | None,
    capacity: dict[str, str] | None = None,
) -> None:
    """A claim for one device of ``node`` (the GPU ``uuid`` when given) and a pod using it."""
    exactly: dict[str, Any] = {"deviceClassName": GPU}
    if uuid is not None:
        cel = f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    claim_and_pod(cluster, ns, name, node, exactly, capacity)


def claim_and_pod(
    cluster: Cluster,
    ns: str,
    name: str,
    node: str,
    exactly: dict[str, Any],
    capacity: dict[str, str] | None = None,
) -> None:
    """A claim ``name`` with one request ``gpu`` (``exactly``, with ``capacity`` when
    given), and a pod ``name`` on ``node`` using it."""
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/pause:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )


def result(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    """The claim's one allocation result, once allocated."""

    def allocated() -> dict[str, Any] | None:
        claim = cluster.rest.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        alloc = claim.get("status", {}).get("allocation")
        return alloc["devices"]["results"][0] if alloc else None

    return wait_until(allocated, timeout=TIMEOUT, what=f"claim {name} allocated")


def delete(cluster: Cluster, ns: str, name: str) -> None:
    """Pod (force: no kubelet confirms), then the claim, until the API forgets it."""
    cluster.rest.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", query={"gracePeriodSeconds": "0"}
    )
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"
    cluster.rest.delete(path)

    def gone() -> bool:
        try:
            cluster.rest.get(path)
        except ApiError as err:
            return err.status == 404
        return False

    wait_until(gone, timeout=TIMEOUT, what=f"claim {name} deallocated and deleted")


def test_shares_of_mixed_sizes_pack_until_a_capacity_runs_out(
    cluster: Cluster, cluster_namespace: str, shared_gpu: tuple[str, str]
) -> None:
    node, uuid = shared_gpu
    ns = cluster_namespace
    sizes = {
        "s30": {"memory": "30Gi"},
        "s20": {"memory": "20Gi", "computeShare": "40"},
        "s25": {"memory": "25Gi"},
    }
    shares = {}
    for name, capacity in sizes.items():
        share(cluster, ns, name, node, uuid, capacity)
        shares[name] = result(cluster, ns, name)
    assert {r["device"] for r in shares.values()} == {"gpu-3"}
    assert len({r["shareID"] for r in shares.values()}) == 3
    assert shares["s30"]["consumedCapacity"] == {"memory": "30Gi", "computeShare": "0"}
    assert shares["s20"]["consumedCapacity"] == {"memory": "20Gi", "computeShare": "40"}
    # 5Gi of 80Gi left: 10Gi does not fit; 5Gi fits by memory but 70 % SMs does not (40 + 70).
    share(cluster, ns, "s10", node, uuid, {"memory": "10Gi"})
    share(cluster, ns, "c70", node, uuid, {"memory": "5Gi", "computeShare": "70"})
    for pending in ("s10", "c70"):
        assert "cannot allocate all claims" in stays_unallocated(cluster, ns, pending)

    delete(cluster, ns, "s20")  # frees exactly 20Gi and 40 %: both now fit, 10Gi is left
    assert result(cluster, ns, "s10")["consumedCapacity"]["memory"] == "10Gi"
    assert result(cluster, ns, "c70")["consumedCapacity"] == {"memory": "5Gi", "computeShare": "70"}
    share(cluster, ns, "over", node, uuid, {"memory": f"{10 * 1024 + 1}Mi"})
    assert "cannot allocate all claims" in stays_unallocated(cluster, ns, "over")
    share(cluster, ns, "exact", node, uuid, {"memory": "10Gi"})
    assert result(cluster, ns, "exact")["device"] == "gpu-3"
    for name in ("s30", "s25", "s10", "c70", "over", "exact"):
        delete(cluster, ns, name)


def test_a_claim_without_capacity_requests_takes_the_whole_gpu_or_waits(
    cluster: Cluster, cluster_namespace: str, shared_gpu: tuple[str, str]
) -> None:
    node, uuid = shared_gpu
    ns = cluster_namespace
    share(cluster, ns, "small", node, uuid, {"memory": "1Gi"})
    assert result(cluster, ns, "small")["consumedCapacity"]["memory"] == "1Gi"
    # Rounded up to the 1Mi step.
    share(cluster, ns, "odd", node, uuid, {"memory": "1500Ki"})
    assert result(cluster, ns, "odd")["consumedCapacity"]["memory"] == "2Mi"

    share(cluster, ns, "whole", node, uuid)  # an "exclusive" claim pinned to the shared GPU
    message = stays_unallocated(cluster, ns, "whole")
    assert "cannot allocate all claims" in message
    share(cluster, ns, "anywhere", node, None)  # not pinned: an exclusive GPU serves it
    other = result(cluster, ns, "anywhere")
    assert other["device"] != "gpu-3" and "shareID" not in other

    delete(cluster, ns, "small")
    delete(cluster, ns, "odd")
    whole = result(cluster, ns, "whole")
    assert whole["device"] == "gpu-3" and whole["shareID"]
    assert whole["consumedCapacity"] == {"memory": "80Gi", "computeShare": "0"}
    share(cluster, ns, "late", node, uuid, {"memory": "1Mi"})
    assert "cannot allocate all claims" in stays_unallocated(cluster, ns, "late")
    for name in ("whole", "anywhere", "late"):
        delete(cluster, ns, name)


def test_only_the_selected_gpus_are_consumable(shared_gpu: tuple[str, str]) -> None:
    inventory = emulated_inventory("dgx-a100")
    uuid = shared_gpu[1]
    by_product = resource_slices(
        inventory,
        driver_name=DRIVER,
        node_name="n",
        consumable=ConsumableGpus(names=frozenset({"NVIDIA A100-SXM4-80GB"})),
    )
    assert all(d.get("allowMultipleAllocations") for d in by_product[0]["spec"]["devices"])
    by_uuid = resource_slices(
        inventory, driver_name=DRIVER, node_name="n", consumable=ConsumableGpus.parse(uuid)
    )
    devices = {d["name"]: d for d in by_uuid[0]["spec"]["devices"]}
    assert [n for n, d in devices.items() if d.get("allowMultipleAllocations")] == ["gpu-3"]
    assert set(devices["gpu-3"]["capacity"]) == {"memory", "computeShare"}
    assert set(devices["gpu-2"]["capacity"]) == {"memory", "multiprocessors"}
    assert "requestPolicy" not in devices["gpu-2"]["capacity"]["memory"]


def test_the_share_example_packs_both_pods_onto_the_consumable_gpu(
    cluster: Cluster, cluster_namespace: str, shared_gpu: tuple[str, str]
) -> None:
    node, _ = shared_gpu
    ns = cluster_namespace
    cluster.apply(pin_to_node(load_examples(EXAMPLES / "gpu-share.yaml", ns), node))
    shares = []
    for pod in ("share-a", "share-b"):
        claim = wait_until(
            lambda pod=pod: claim_of(cluster, ns, pod), timeout=TIMEOUT, what=f"{pod}'s claim"
        )
        shares.append(result(cluster, ns, claim))
    assert [s["device"] for s in shares] == ["gpu-3", "gpu-3"]
    assert [s["consumedCapacity"] for s in shares] == [{"memory": "10Gi", "computeShare": "25"}] * 2
    for pod in ("share-a", "share-b"):
        cluster.rest.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}", query={"gracePeriodSeconds": "0"}
        )


def claim_of(cluster: Cluster, ns: str, pod: str) -> str | None:
    obj = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    return str(statuses[0]["resourceClaimName"]) if statuses else None
