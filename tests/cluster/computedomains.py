"""Helpers for the ComputeDomain tests on the real control plane: the chart's CRDs and
DeviceClasses, the controller's shipped RBAC in a namespace of its own, nodes that
publish what the node side publishes, and a kubelet's part played by hand."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dra_driver.computedomain import names
from dra_driver.devcluster import ApiError, Cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deploy" / "chart" / "crds"
RBAC_DIR = ROOT / "deploy" / "rbac"
CLASS_DIR = ROOT / "deploy" / "deviceclasses"
CD_API = f"/apis/{names.API_GROUP}/{names.API_VERSION}"
RESOURCE_API = "/apis/resource.k8s.io/v1"
T = TypeVar("T")


def install_crds(cluster: Cluster) -> None:
    """The chart's CRDs and the compute-domain DeviceClasses, once they are served."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        cluster.apply(yaml.safe_load(path.read_text()))
    for path in sorted(CLASS_DIR.glob("compute-domain-*.yaml")):
        cluster.apply(yaml.safe_load(path.read_text()))
    for plural in (names.DOMAIN_PLURAL, names.CLIQUE_PLURAL):
        crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{names.API_GROUP}"
        wait_for(lambda crd=crd: _established(cluster, crd), what=f"{crd} established")  # type: ignore[misc]


def _established(cluster: Cluster, path: str) -> bool:
    conditions = cluster.rest.get(path).get("status", {}).get("conditions", [])
    if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
        return False
    try:
        cluster.rest.get(f"{CD_API}/{names.DOMAIN_PLURAL}")
    except ApiError:
        return False
    return True


def controller_rbac(cluster: Cluster) -> tuple[str, str]:
    """deploy/rbac's controller and daemon objects, renamed apart (``dra-driver`` ->
    a fresh release name) so each test module has its own namespace; returns
    (namespace, controller ServiceAccount)."""
    release = f"cdtest-{secrets.token_hex(3)}"
    cluster.create_namespace(release)
    for path in sorted(RBAC_DIR.glob("compute-domain-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text().replace("dra-driver", release)):
            if doc:
                cluster.apply(doc)
    return release, f"{release}-compute-domain-controller"


def wait_for(check: Callable[[], T | None], *, what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def get_or_none(cluster: Cluster, path: str) -> dict[str, Any] | None:
    try:
        return cluster.rest.get(path)
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def domain(name: str, template: str, **channel: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.API_GROUP}/{names.API_VERSION}",
        "kind": names.DOMAIN_KIND,
        "metadata": {"name": name},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": template},
                                            **channel}},
    }  # fmt: skip


def publish_node_devices(cluster: Cluster, node: str, clique: str) -> None:
    """The ResourceSlice the compute-domain kubelet plugin publishes for ``node``."""

    def device(name: str, kind: str) -> dict[str, Any]:
        attributes = {"type": {"string": kind}, "id": {"int": 0},
                      names.CLIQUE_ATTRIBUTE: {"string": clique}}  # fmt: skip
        return {"name": name, "attributes": attributes}

    cluster.rest.create(f"{RESOURCE_API}/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{names.DRIVER_NAME}"},
        "spec": {
            "driver": names.DRIVER_NAME, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(names.CHANNEL_DEVICE, "channel"),
                        device(names.DAEMON_DEVICE, "daemon")],
        },
    })  # fmt: skip


def play_kubelet(cluster: Cluster, pod: dict[str, Any], clique: str, ip: str) -> None:
    """What the daemon (its clique label) and the kubelet (IP, Ready) write for a pod."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    cluster.rest.merge_patch(path, {"metadata": {"labels": {names.CLIQUE_LABEL: clique}}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.rest.merge_patch(f"{path}/status", {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    }})  # fmt: skip


def force_delete_terminating(cluster: Cluster, namespace: str) -> None:
    """The kubelet's part in deleting pods: confirm those being deleted."""
    for pod in cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            try:
                cluster.rest.request(
                    "DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                    {"gracePeriodSeconds": 0},
                )  # fmt: skip
            except ApiError as err:
                if err.status != 404:
                    raise
