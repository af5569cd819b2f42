"""Emulated GPU nodes published into the real API server, and claim/pod builders.

A test node is a hand-made Node (no kubelet) plus the exact ResourceSlices
``dra-driver slices`` emits for an emulated profile, created as the plugin
would. Pods are pinned to their node (or a labelled group of nodes) with a
nodeSelector, so claims from different tests never compete for devices.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_driver.commands.slices import resource_slices
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.gpu.discovery import discover
from dra_driver.gpu.emulation import EmulatedNode
from dra_driver.gpu.inventory import Inventory

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
