"""MPS daemon pods under the plugin's own ServiceAccount, on the real API server with the
shipped RBAC (deploy/rbac, a Role in the plugin's namespace) and a Node-bound token.

The runner's calls (create a pinned pod, list this node's daemon pods, read one, delete
them) are allowed and the API server accepts the pod as the runner builds it; what it
does not need is denied: pods in another namespace, cluster-wide listing, patching a
pod, exec into it, secrets. No kubelet backs the nodes: pods stay Pending, and a
deleted pod keeps its object (terminating) until removed with grace 0 here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dra_driver.devcluster import Cluster
from dra_driver.gpu.sharing.mpsrunners import DaemonSpec
from dra_driver.mpspods import PodRunner
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from dra_driver.plugin.nodepods import HostMount
from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig, sa_of, unique

DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def plugin(cluster: Cluster) -> tuple[KubeClient, str]:
    apply_rbac(cluster)
    node = cluster.create_node(unique("mps-a"))
    return KubeClient.from_kubeconfig(str(node_bound_kubeconfig(cluster, node))), node["metadata"][
        "name"
    ]


def runner(client: KubeClient, node: str) -> PodRunner:
    namespace, _ = sa_of(DRIVER)
    return PodRunner(
        client=client, namespace=namespace, node_name=node, driver_name=DRIVER,
        image="registry.example/dra-driver:0.1.0", mps_control=Path("/driver-root/usr/bin/m"),
        library_path="/driver-root/usr/lib64", priority_class="system-node-critical",
        mounts=[HostMount("/", "/driver-root", read_only=True)],
        logger=logging.getLogger("test"),
    )  # fmt: skip


def spec(daemon_id: str) -> DaemonSpec:
    base = Path(f"/var/lib/kubelet/plugins/{DRIVER}/mps/{daemon_id}")
    return DaemonSpec(daemon_id=daemon_id, base=base, pipe_dir=base / "pipe",
                      log_dir=base / "log", shm_dir=base / "shm",
                      env={"CUDA_VISIBLE_DEVICES": "GPU-a"},
                      setup=("set_default_active_thread_percentage 25",))  # fmt: skip


def force_delete(cluster: Cluster, namespace: str, name: str) -> None:
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    cluster.rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", options)


def test_the_runner_creates_lists_and_deletes_its_node_s_daemon_pods(
    cluster: Cluster, plugin: tuple[KubeClient, str]
) -> None:
    client, node = plugin
    r = runner(client, node)
    namespace = r.pods.namespace
    created = r.pods.create(r.pod(spec("0123456789ab")))  # as the ServiceAccount
    name = created["metadata"]["name"]
    stored = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    pod = stored["spec"]
    assert (pod["nodeName"], pod["hostPID"], pod["priorityClassName"]) == (
        node, True, "system-node-critical"
    )  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    assert "--setup=set_default_active_thread_percentage 25" in container["args"]
    paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert paths == {"/", f"/var/lib/kubelet/plugins/{DRIVER}/mps/0123456789ab",
                     f"/var/lib/kubelet/plugins/{DRIVER}/mps/0123456789ab/shm"}  # fmt: skip
    # Another node's daemon pod, same labels: not this node's to adopt or remove.
    other_node = cluster.create_node(unique("mps-b"))["metadata"]["name"]
    other = r.pod(spec("ba9876543210"))
    other_manifest = runner(client, other_node).pods.manifest(other)
    cluster.rest.create(f"/api/v1/namespaces/{namespace}/pods", other_manifest)
    try:
        assert r.present() == {"0123456789ab"}
        assert r.pods.get("0123456789ab") is not None
        r.stop_all()  # delete, as after a reboot
        after = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert after["metadata"].get("deletionTimestamp")  # deleting: no kubelet confirms
        assert runner(client, other_node).present() == {"ba9876543210"}
    finally:
        force_delete(cluster, namespace, name)
        force_delete(cluster, namespace, other_manifest["metadata"]["name"])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", "/api/v1/namespaces/{other}/pods", "pod", id="create-elsewhere"),
        pytest.param("GET", "/api/v1/pods", None, id="list-cluster-wide"),
        pytest.param("GET", "/api/v1/namespaces/{other}/pods", None, id="list-elsewhere"),
        pytest.param("PATCH", "/api/v1/namespaces/{ns}/pods/{name}", {}, id="patch"),
        pytest.param("POST", "/api/v1/namespaces/{ns}/pods/{name}/exec", None, id="exec"),
        pytest.param("GET", "/api/v1/namespaces/{ns}/secrets", None, id="secrets"),
        pytest.param("DELETE", "/api/v1/namespaces/{ns}/pods", None, id="delete-collection"),
    ],
)
def test_what_the_runner_does_not_need_is_denied(
    cluster: Cluster,
    cluster_namespace: str,
    plugin: tuple[KubeClient, str],
    method: str,
    path: str,
    body: object,
) -> None:
    client, node = plugin
    r = runner(client, node)
    manifest = r.pods.manifest(r.pod(spec("fedcba987654")))
    name = manifest["metadata"]["name"]
    where = path.format(other=cluster_namespace, ns=r.pods.namespace, name=name)
    payload = {**manifest, "metadata": {**manifest["metadata"], "namespace": cluster_namespace}}
    with pytest.raises(KubeApiError) as err:
        client.request(method, where, body=payload if body == "pod" else body,  # type: ignore[arg-type]
                       content_type="application/merge-patch+json" if method == "PATCH"
                       else "application/json")  # fmt: skip
    assert err.value.status == 403, err.value
