"""End-to-end smoke test of the scheduling tier, with no driver yet.

A hand-written v1 ResourceSlice for a hand-made Node offers three devices; a
ResourceClaim selects by CEL on a quantity capacity (memory) and a semver
attribute (driverVersion). Only ``gpu-big-new`` satisfies both, so the real
kube-scheduler must allocate exactly that one and bind the pod to the node.
A claim whose selector matches nothing must stay unallocated, with the
scheduler's reason visible on the pod.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from dra_driver.devcluster import Cluster, wait_until

DRIVER = "smoke.dra.test"
# The device the selector must pick: big enough AND new enough.
BIG_NEW_MEMORY = "80Gi"
MIN_MEMORY = "40Gi"
MIN_VERSION = "2.0.0"
SELECTOR = (
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{MIN_MEMORY}")) >= 0 && '
    f'device.attributes["{DRIVER}"].driverVersion.compareTo(semver("{MIN_VERSION}")) >= 0'
)
TIMEOUT = 30.0


def _device(name: str, memory: str, version: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"driverVersion": {"version": version}, "model": {"string": name}},
        "capacity": {"memory": {"value": memory}},
    }


def _claim(name: str, namespace: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def _pod(name: str, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    # Never pulled: no kubelet runs this pod.
                    "image": "registry.invalid/pause:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> str:
    """A Node with a ResourceSlice of three devices and a DeviceClass for the driver."""
    name = f"smoke-node-{secrets.token_hex(3)}"
    cluster.create_node(name)
    cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{name}-{DRIVER}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        _device("gpu-small-new", "16Gi", "2.1.0"),  # too small
                        _device("gpu-big-old", "80Gi", "1.9.9"),  # too old
                        _device("gpu-big-new", BIG_NEW_MEMORY, "2.1.0"),  # the match
                    ],
                },
            },
        ]
    )
    return name


def _pod_state(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def _claim_state(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.rest.get(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    )


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in pod.get("status", {}).get("conditions", []):
        if cond.get("type") == kind:
            return dict(cond)
    return None


def test_scheduler_allocates_matching_device_and_binds_pod(
    cluster: Cluster, cluster_namespace: str, node: str
) -> None:
    ns = cluster_namespace
    cluster.apply(_claim("big-gpu", ns, SELECTOR))
    pod = cluster.apply(_pod("uses-big-gpu", ns, "big-gpu"))

    def bound_pod() -> dict[str, Any] | None:
        state = _pod_state(cluster, ns, "uses-big-gpu")
        return state if state["spec"].get("nodeName") else None

    bound = wait_until(
        bound_pod,
        timeout=TIMEOUT,
        what="pod uses-big-gpu to be bound",
        describe=lambda: f"pod status: {_pod_state(cluster, ns, 'uses-big-gpu').get('status')}",
    )
    assert bound["spec"]["nodeName"] == node
    scheduled = _condition(bound, "PodScheduled")
    assert scheduled is not None and scheduled["status"] == "True"

    claim = _claim_state(cluster, ns, "big-gpu")
    allocation = claim["status"]["allocation"]
    results = allocation["devices"]["results"]
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in results] == [
        ("gpu", DRIVER, node, "gpu-big-new")
    ]
    # The allocation pins the claim to the node the device lives on.
    terms = allocation["nodeSelector"]["nodeSelectorTerms"]
    assert any(
        f.get("key") == "metadata.name" and f.get("values") == [node]
        for term in terms
        for f in term.get("matchFields", [])
    ), terms
    reserved = claim["status"]["reservedFor"]
    assert [(r["resource"], r["name"], r["uid"]) for r in reserved] == [
        ("pods", "uses-big-gpu", pod["metadata"]["uid"])
    ]


def test_unsatisfiable_claim_stays_unallocated_with_reason(
    cluster: Cluster, cluster_namespace: str, node: str
) -> None:
    ns = cluster_namespace
    impossible = SELECTOR.replace(f'quantity("{MIN_MEMORY}")', 'quantity("1Ti")')
    cluster.apply(_claim("huge-gpu", ns, impossible))
    cluster.apply(_pod("uses-huge-gpu", ns, "huge-gpu"))

    def unschedulable() -> dict[str, Any] | None:
        cond = _condition(_pod_state(cluster, ns, "uses-huge-gpu"), "PodScheduled")
        return cond if cond and cond.get("status") == "False" else None

    cond = wait_until(
        unschedulable, timeout=TIMEOUT, what="PodScheduled=False on pod uses-huge-gpu"
    )
    assert cond["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in cond["message"], cond["message"]

    def events() -> list[tuple[str, str]]:
        items = cluster.rest.get(
            f"/api/v1/namespaces/{ns}/events",
            query={"fieldSelector": "involvedObject.name=uses-huge-gpu"},
        )["items"]
        return [(e["reason"], e["message"]) for e in items]

    # Events are recorded asynchronously, shortly after the condition.
    wait_until(
        lambda: any(
            r == "FailedScheduling" and "cannot allocate all claims" in m for r, m in events()
        ),
        timeout=TIMEOUT,
        what="a FailedScheduling event naming the claims",
        describe=lambda: f"events: {events()}",
    )

    pod = _pod_state(cluster, ns, "uses-huge-gpu")
    assert not pod["spec"].get("nodeName")
    claim = _claim_state(cluster, ns, "huge-gpu")
    assert "allocation" not in claim.get("status", {})
    assert not claim.get("status", {}).get("reservedFor")
    # The node itself is fine: this is about the claim, not capacity or taints.
    assert node in {n["metadata"]["name"] for n in cluster.rest.get("/api/v1/nodes")["items"]}
