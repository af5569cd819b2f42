"""The test control plane itself: versions, hand-made nodes, ServiceAccount
identities with RBAC, the DRA controllers of kube-controller-manager, teardown."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devcluster import (
    ApiError,
    Cluster,
    ToolClient,
    api_client,
    find_binaries,
    wait_until,
)

DRIVER = "controlplane.dra.test"
REPO = Path(__file__).resolve().parents[2]


def _pinned_k8s_version() -> str:
    for line in (REPO / "tests" / "go" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "k8s.io/kubernetes" and parts[1].startswith("v1."):
            return parts[1]
    raise AssertionError("k8s.io/kubernetes not required in tests/go/go.mod")


def test_apiserver_reports_the_pinned_version(cluster: Cluster) -> None:
    version = cluster.rest.get("/version")
    assert version["gitVersion"] == _pinned_k8s_version()
    # DRA's GA API group is served.
    groups = cluster.rest.get("/apis/resource.k8s.io")
    assert "v1" in [v["version"] for v in groups["versions"]]


def test_hand_made_node_is_ready_and_untainted(cluster: Cluster) -> None:
    name = f"cp-node-{secrets.token_hex(3)}"
    cluster.create_node(name, labels={"example.com/pool": "a"})
    node = cluster.rest.get(f"/api/v1/nodes/{name}")
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": name, "example.com/pool": "a"}
    assert not node["spec"].get("taints")
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert [c["status"] for c in ready] == ["True"]
    assert node["status"]["allocatable"]["pods"] == "110"


def _token(kubeconfig: Path) -> str:
    config = yaml.safe_load(kubeconfig.read_text())
    return str(config["users"][0]["user"]["token"])


def test_service_account_kubeconfig_is_subject_to_rbac(
    cluster: Cluster, cluster_namespace: str
) -> None:
    path = cluster.service_account_kubeconfig(cluster_namespace, "limited")
    assert path.stat().st_mode & 0o777 == 0o600
    as_sa = ToolClient(api_client(cluster.server, cluster.ca_file, token=_token(path)))
    review = as_sa.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert (
        review["status"]["userInfo"]["username"]
        == f"system:serviceaccount:{cluster_namespace}:limited"
    )
    with pytest.raises(ApiError) as denied:
        as_sa.get("/apis/resource.k8s.io/v1/resourceslices")
    assert denied.value.status == 403

    role = f"read-slices-{cluster_namespace}"
    cluster.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceslices"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "limited", "namespace": cluster_namespace}
                ],
            },
        ]
    )
    # RBAC changes reach the authorizer's cache asynchronously.
    wait_until(
        lambda: _can_list_slices(as_sa), timeout=15, what="RBAC to allow listing resourceslices"
    )
    # The same identity through the typed kubernetes client and the kubeconfig file.
    from kubernetes.client import ResourceV1Api

    with cluster.api_client(path) as api:
        assert ResourceV1Api(api).list_resource_slice().kind == "ResourceSliceList"


def _can_list_slices(client: ToolClient) -> bool:
    try:
        client.get("/apis/resource.k8s.io/v1/resourceslices")
    except ApiError as err:
        if err.status == 403:
            return False
        raise
    return True


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


def test_controller_manager_creates_and_collects_template_claims(
    cluster: Cluster, cluster_namespace: str
) -> None:
    """resourceclaim-controller makes the pod's claim; garbage-collector removes it."""
    ns = cluster_namespace
    node = f"cp-tmpl-node-{secrets.token_hex(3)}"
    cluster.create_node(node)
    cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
            _slice(node),
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-dev", "namespace": ns},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "dev", "exactly": {"deviceClassName": DRIVER}}]
                        }
                    }
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "tmpl-pod", "namespace": ns},
                "spec": {
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-dev"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/pause:1",
                            "resources": {"claims": [{"name": "dev"}]},
                        }
                    ],
                },
            },
        ]
    )
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"

    def pod_state() -> dict[str, Any]:
        return cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/tmpl-pod")

    statuses = wait_until(
        lambda: pod_state().get("status", {}).get("resourceClaimStatuses"),
        timeout=30,
        what="resourceclaim-controller to record the generated claim on the pod",
    )
    claim_name = statuses[0]["resourceClaimName"]
    claim = cluster.rest.get(f"{claims_path}/{claim_name}")
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", "tmpl-pod")

    bound = wait_until(
        lambda: pod_state()["spec"].get("nodeName"), timeout=30, what="tmpl-pod to be bound"
    )
    assert bound == node
    results = cluster.rest.get(f"{claims_path}/{claim_name}")["status"]["allocation"]["devices"]
    assert [(r["pool"], r["device"]) for r in results["results"]] == [(node, "dev-0")]

    # No kubelet will confirm termination: force-delete, as the node would be gone.
    cluster.rest.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/tmpl-pod", query={"gracePeriodSeconds": "0"}
    )

    def claim_gone() -> bool:
        try:
            cluster.rest.get(f"{claims_path}/{claim_name}")
        except ApiError as err:
            return err.status == 404
        return False

    wait_until(claim_gone, timeout=30, what="garbage collector to delete the pod's claim")


def test_stop_ends_every_component_by_pid(tmp_path: Path) -> None:
    """Teardown leaves no process behind and keeps the logs for post-mortems."""
    second = Cluster(find_binaries(), tmp_path / "second")
    with second:
        pids = [c.pid for c in second.components]
        assert len(pids) == 4 and all(pids)
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (tmp_path / "second" / "etcd-data").exists()
    assert (tmp_path / "second" / "logs" / "kube-apiserver.log").stat().st_size > 0
