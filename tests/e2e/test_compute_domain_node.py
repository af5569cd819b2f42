"""The node side of ComputeDomains on a real kubelet + containerd node, with the chart's
DaemonSet (both plugin containers) on an emulated ``hgx-h100-fabric`` node. The test plays
the controller's part (it is built separately): it creates the daemon's claim, pod and
rights and writes the ComputeDomainClique. A workload pod whose channel claim names the
domain stays ContainerCreating (its node labelled for the domain) while the emulated
IMEX daemon withholds READY, then runs and sees its channel as a character device (it
selects its node as NVIDIA's examples do, by the nvidia.com/gpu.clique the plugin sets);
deleting the pods leaves no label, CDI spec or domain directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.names import (
    CHANNEL_CLASS,
    CHANNEL_CONFIG_KIND,
    CLIQUE_LABEL,
    DAEMON_CLASS,
    DAEMON_CONFIG_KIND,
    DOMAIN_LABEL,
    DRIVER_NAME,
    GPU_CLIQUE_LABEL,
)
from dra_driver.demo.realgpu import keep_running
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.demo.stack import pin_to_node
from dra_driver.devcluster import ApiError, Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.computedomain.test_imex_daemon import CLIQUES_PATH, CRD
from tests.e2e.helm import chart_pod_node

DOMAIN = "e2e0c0de-5a5a-4b4b-8c8c-0123456789ab"
CLIQUE = "8f3a2c61-5d0e-4b7a-9c1e-2f6d8b4a0c17.7"
API = "resource.nvidia.com/v1beta1"
RESOURCE = "/apis/resource.k8s.io/v1"
# As NVIDIA's ComputeDomain examples pick nodes: by the clique label GPU Feature Discovery
# sets, which our plugin sets on this GFD-less node.
IN_A_CLIQUE = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": GPU_CLIQUE_LABEL, "operator": "Exists"}]}]}}}  # fmt: skip
SHOW = "test -c /dev/nvidia-caps-imex-channels/channel0 && ls -l /dev/nvidia-caps-imex-channels"


@pytest.fixture(scope="module")
def cd_node(
    cluster: Cluster,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> Iterator[RealGpuNodePod]:
    with chart_pod_node(cluster, node_binaries, helm_binary, plugin_image, "hgx-h100-fabric",
                        prefix="cd") as node:  # fmt: skip
        yield node


def _classes(cluster: Cluster) -> None:
    """What the controller's chart part ships (CEL as in the design)."""
    for name, kind in ((CHANNEL_CLASS, "channel"), (DAEMON_CLASS, "daemon")):
        extra = (
            " && device.attributes['compute-domain.nvidia.com'].id == 0"
            if kind == "channel"
            else ""
        )
        cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                       "metadata": {"name": name},
                       "spec": {"selectors": [{"cel": {"expression":
                           f"device.driver == '{DRIVER_NAME}' && device.attributes"
                           f"['{DRIVER_NAME}'].type == '{kind}'{extra}"}}]}})  # fmt: skip


def _claim(namespace: str, name: str, cls: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": cls}}],
                "config": [{"requests": ["r"], "opaque": {"driver": DRIVER_NAME, "parameters": {
                    "apiVersion": API, "kind": kind, "domainID": DOMAIN}}}]}}}  # fmt: skip


def _daemon_objects(namespace: str, image: str) -> list[dict[str, Any]]:
    env = [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}} for n, f in
           (("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"), ("POD_IP", "status.podIP"))]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "cd-daemon", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "cd-daemon", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
                   {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomaincliques"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "cd-daemon", "namespace": namespace},
         "subjects": [{"kind": "ServiceAccount", "name": "cd-daemon", "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cd-daemon"}},
        _claim(namespace, "imex-daemon", DAEMON_CLASS, DAEMON_CONFIG_KIND),
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "imex-daemon", "namespace": namespace,
                      "labels": {DOMAIN_LABEL: DOMAIN}},
         "spec": {"serviceAccountName": "cd-daemon",
                  "terminationGracePeriodSeconds": 5,
                  "resourceClaims": [{"name": "daemon", "resourceClaimName": "imex-daemon"}],
                  "containers": [{
                      "name": "imex", "image": image, "args": ["compute-domain-daemon"],
                      "env": [*env, {"name": "DOMAIN_UID", "value": DOMAIN}],
                      "resources": {"claims": [{"name": "daemon"}]},
                      "readinessProbe": {"exec": {"command": [
                          "dra-driver", "compute-domain-daemon", "check"]}, "periodSeconds": 1}}]}},
    ]  # fmt: skip


def _label(cluster: Cluster, node: str) -> str | None:
    return (cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}).get(
        DOMAIN_LABEL
    )


def test_workload_waits_for_the_imex_daemon_then_gets_its_channel(
    cluster: Cluster,
    cluster_namespace: str,
    cd_node: RealGpuNodePod,
    plugin_image: tuple[Path, str],
) -> None:
    node, ns = cd_node, cluster_namespace
    try:
        cluster.apply(CRD)
    except ApiError as err:
        if err.status != 409:
            raise
    _classes(cluster)
    wait_until(lambda: (cluster.rest.get(f"/api/v1/nodes/{node.name}")["metadata"]
                        .get("labels") or {}).get(GPU_CLIQUE_LABEL) == CLIQUE,
               timeout=60, what="the plugin's nvidia.com/gpu.clique on its node")  # fmt: skip
    record = node.host_root / "emulation" / "imex.jsonl"
    hold = Path(f"{record}.imex.hold")
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.touch()  # the IMEX domain has no quorum yet
    driver_ns = node.namespace
    cluster.apply(_claim(ns, "channel", CHANNEL_CLASS, CHANNEL_CONFIG_KIND))
    cluster.apply(
        keep_running(
            pin_to_node(
                [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": "worker", "namespace": ns},
                        "spec": {
                            "restartPolicy": "Never",
                            "affinity": IN_A_CLIQUE,
                            "resourceClaims": [{"name": "channel", "resourceClaimName": "channel"}],
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "busybox:1.36",
                                    "command": ["sh", "-c", SHOW],
                                    "resources": {"claims": [{"name": "channel"}]},
                                }
                            ],
                        },
                    }
                ],
                node.name,
            )
        )
    )
    try:
        wait_until(lambda: _label(cluster, node.name) == DOMAIN, timeout=90,
                   what="the node labelled for the domain by the workload's prepare",
                   describe=lambda: node.describe_pod(ns, "worker"))  # fmt: skip
        worker = node.pod(ns, "worker")
        assert not any("running" in s.get("state", {})
                       for s in worker["status"].get("containerStatuses") or [])  # fmt: skip

        # Scheduled (its claim allocated on this node), as the domain's DaemonSet's pod is.
        cluster.apply(pin_to_node(_daemon_objects(driver_ns, plugin_image[1]), node.name))
        daemon_path = f"/api/v1/namespaces/{driver_ns}/pods/imex-daemon"
        ip = wait_until(lambda: cluster.rest.get(daemon_path)["status"].get("podIP"),
                        timeout=90, what="the daemon pod's IP",
                        describe=lambda: node.describe_pod(driver_ns, "imex-daemon"))  # fmt: skip
        cluster.rest.create(CLIQUES_PATH.format(namespace=driver_ns), {
            "apiVersion": API, "kind": "ComputeDomainClique",
            "metadata": {"name": f"{DOMAIN}.{CLIQUE}"},
            "daemons": [{"nodeName": node.name, "ipAddress": ip, "cliqueID": CLIQUE,
                         "index": 0, "status": "NotReady"}]})  # fmt: skip
        wait_until(lambda: (cluster.rest.get(daemon_path)["metadata"].get("labels") or {})
                   .get(CLIQUE_LABEL) == CLIQUE, timeout=60, what="the daemon's clique label",
                   describe=lambda: node.describe_pod(driver_ns, "imex-daemon"))  # fmt: skip

        def started() -> list[dict[str, Any]]:
            if not record.exists():
                return []
            events = [json.loads(line) for line in record.read_text().splitlines()]
            return [e for e in events if e.get("event") == "started"]

        wait_until(started, timeout=60, what="nvidia-imex started by the daemon",
                   describe=lambda: node.describe_pod(driver_ns, "imex-daemon"))  # fmt: skip
        assert [p["host"] for p in started()[-1]["peers"]] == [ip]
        assert not node.pod_ready(cluster.rest.get(daemon_path))  # READY withheld
        worker = node.pod(ns, "worker")
        assert not any("running" in s.get("state", {})
                       for s in worker["status"].get("containerStatuses") or [])  # fmt: skip

        hold.unlink()  # quorum: nvidia-imex-ctl -q answers READY, the probe passes
        run = node.run_pod(ns, "worker", timeout=120)
        out = run.containers["main"].stdout
        (line,) = [w for w in out.splitlines() if w.endswith(" channel0")]
        assert line.startswith("crw") and "509,   0" in line, out  # char device 509:0
    finally:
        node.delete_pod(ns, "worker")
        wait_until(
            lambda: _label(cluster, node.name) is None,
            timeout=60,
            what="the domain label removed with the last channel claim",
        )
        node.delete_pod(driver_ns, "imex-daemon")
    specs = [p.name for p in node.cdi_dir.glob(f"k8s.{DRIVER_NAME}-*.json")]
    assert specs == []
    domains = node.node.paths.kubelet_root / "plugins" / DRIVER_NAME / "domains"
    assert not (domains / DOMAIN).exists()
