"""The ComputeDomain controller (``dra-driver compute-domain-controller``, run under the
shipped RBAC's ServiceAccount) against the real kube-apiserver, scheduler and controller
manager, on hand-made nodes that publish the node side's devices. The kubelets' and
daemons' writes (pod IP, Ready, clique label, confirming deletions) are made here.

A domain gets its workload template, daemon template and DaemonSet; labelling two nodes
makes the DaemonSet controller create daemon pods that the scheduler places with their
daemon claims; once they are Ready in one clique the clique object lists both with
distinct indices and the domain is Ready; deleting it leaves nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain import names
from dra_driver.computedomain.controller import objects
from dra_driver.devcluster import Cluster
from tests.cluster.computedomains import (
    CD_API,
    RESOURCE_API,
    ROOT,
    controller_rbac,
    domain,
    force_delete_terminating,
    get_or_none,
    install_crds,
    play_kubelet,
    publish_node_devices,
    wait_for,
)
from tests.plugin.clusterkit import unique

CLIQUE = "5b4f6e2a-0000-4000-8000-000000000001.7"
IMAGE = "registry.example/dra-driver:test"


class ControllerProcess:
    """``dra-driver compute-domain-controller`` as the Deployment runs it, with the
    ServiceAccount's token in a kubeconfig instead of the pod's."""

    def __init__(
        self, kubeconfig: Path, namespace: str, log: Path, extra: Sequence[str] = ()
    ) -> None:
        # A short lease: the next test's controller takes over from a killed one soon.
        self._argv = [sys.executable, "-m", "dra_driver", "--log-format=json",
                      "compute-domain-controller", f"--kubeconfig={kubeconfig}",
                      f"--namespace={namespace}", f"--image={IMAGE}",
                      f"--daemon-service-account={namespace}-compute-domain-daemon",
                      "--resync-interval=5", "--lease-duration=3", *extra]  # fmt: skip
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(self._argv, stdout=log, stderr=log, env=env)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


@pytest.fixture(scope="module")
def driver_namespace(cluster: Cluster) -> str:
    install_crds(cluster)
    namespace, _ = controller_rbac(cluster)
    return namespace


@pytest.fixture()
def controller(
    cluster: Cluster, driver_namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    kubeconfig = cluster.service_account_kubeconfig(
        driver_namespace, f"{driver_namespace}-compute-domain-controller"
    )
    process = ControllerProcess(kubeconfig, driver_namespace, tmp_path / "controller.log")
    process.start()
    try:
        yield process
    finally:
        try:
            process.kill()
        finally:
            print((tmp_path / "controller.log").read_text()[-6000:])


def _domain_path(namespace: str, name: str) -> str:
    return f"{CD_API}/namespaces/{namespace}/{names.DOMAIN_PLURAL}/{name}"


def _pods(cluster: Cluster, namespace: str, uid: str) -> list[dict[str, Any]]:
    listing = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods",
                               {"labelSelector": f"{names.DOMAIN_LABEL}={uid}"})  # fmt: skip
    return list(listing["items"])


def _left(cluster: Cluster, namespace: str, user_ns: str, uid: str) -> list[str]:
    """Everything that still carries the domain's UID."""
    selector = {"labelSelector": f"{names.DOMAIN_LABEL}={uid}"}
    found = []
    for what, path in [
        ("daemonsets", f"/apis/apps/v1/namespaces/{namespace}/daemonsets"),
        ("pods", f"/api/v1/namespaces/{namespace}/pods"),
        ("daemon templates", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"),
        ("workload templates", f"{RESOURCE_API}/namespaces/{user_ns}/resourceclaimtemplates"),
        ("cliques", f"{CD_API}/namespaces/{namespace}/{names.CLIQUE_PLURAL}"),
        ("nodes", "/api/v1/nodes"),
    ]:
        found += [
            f"{what}/{o['metadata']['name']}" for o in cluster.rest.get(path, selector)["items"]
        ]
    return found


def test_a_domain_from_creation_to_ready_and_back_to_nothing(
    cluster: Cluster, cluster_namespace: str, driver_namespace: str,
    controller: ControllerProcess,
) -> None:  # fmt: skip
    ns, user_ns = driver_namespace, cluster_namespace
    cluster.rest.create(f"{CD_API}/namespaces/{user_ns}/{names.DOMAIN_PLURAL}",
                        domain("job", "job-channel"))  # fmt: skip
    path = _domain_path(user_ns, "job")
    uid = cluster.rest.get(path)["metadata"]["uid"]

    # The workload template in the domain's namespace, owned by the domain.
    template = wait_for(lambda: get_or_none(
        cluster, f"{RESOURCE_API}/namespaces/{user_ns}/resourceclaimtemplates/job-channel"),
        what="workload template")  # fmt: skip
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == names.CHANNEL_CLASS
    (config,) = template["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["driver"] == names.DRIVER_NAME
    assert config["opaque"]["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": names.CHANNEL_CONFIG_KIND,
        "domainID": uid, "allocationMode": "Single"}  # fmt: skip
    assert template["metadata"]["ownerReferences"][0]["uid"] == uid
    ds = wait_for(lambda: get_or_none(
        cluster, f"/apis/apps/v1/namespaces/{ns}/daemonsets/{objects.daemonset_name(uid)}"),
        what="DaemonSet")  # fmt: skip
    pod_spec = ds["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {names.DOMAIN_LABEL: uid}
    (container,) = pod_spec["containers"]
    assert container["image"] == IMAGE and container["args"] == ["compute-domain-daemon"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DOMAIN_UID"]["value"] == uid
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert wait_for(lambda: get_or_none(cluster, f"{RESOURCE_API}/namespaces/{ns}/"
                    f"resourceclaimtemplates/{objects.daemon_template_name(uid)}"),
                    what="daemon template")  # fmt: skip
    stored = wait_for(lambda: (d := cluster.rest.get(path)).get("status") and d,
                      what="first status")  # fmt: skip
    assert stored["metadata"]["finalizers"] == [names.FINALIZER]
    assert stored["status"] == {"status": "NotReady", "nodes": []}

    # Two nodes publish the node side's devices; a workload's prepare labels them.
    nodes = [unique("cd-node") for _ in range(2)]
    for node in nodes:
        cluster.create_node(node)
        publish_node_devices(cluster, node, CLIQUE)
        cluster.rest.merge_patch(f"/api/v1/nodes/{node}",
                                 {"metadata": {"labels": {names.DOMAIN_LABEL: uid}}})  # fmt: skip

    def scheduled() -> dict[str, dict[str, Any]]:
        """One live daemon pod per node (the DaemonSet controller may briefly make a
        surplus pod from a stale cache, and then deletes it: confirmed here)."""
        force_delete_terminating(cluster, ns)
        live = [p for p in _pods(cluster, ns, uid) if not p["metadata"].get("deletionTimestamp")]
        on = {p["spec"].get("nodeName"): p for p in live}
        return on if len(live) == 2 and set(on) == set(nodes) else {}

    pods = wait_for(scheduled, what="a daemon pod scheduled on each node", timeout=90)
    for i, node in enumerate(nodes):
        play_kubelet(cluster, pods[node], CLIQUE, f"10.44.0.{i + 1}")

    clique_path = f"{CD_API}/namespaces/{ns}/{names.CLIQUE_PLURAL}/{uid}.{CLIQUE}"
    ready = wait_for(lambda: (d := cluster.rest.get(path))["status"]["status"] == "Ready" and d,
                     what="domain Ready")  # fmt: skip
    clique = cluster.rest.get(clique_path)
    daemons = {e["nodeName"]: e for e in clique["daemons"]}
    assert set(daemons) == set(nodes)
    assert sorted(e["index"] for e in daemons.values()) == [0, 1]
    assert {e["ipAddress"] for e in daemons.values()} == {"10.44.0.1", "10.44.0.2"}
    assert all(e["status"] == "Ready" and e["cliqueID"] == CLIQUE for e in daemons.values())
    assert {n["name"] for n in ready["status"]["nodes"]} == set(nodes)
    events_path = f"/apis/events.k8s.io/v1/namespaces/{user_ns}/events"
    ready_events = wait_for(lambda: [
        e for e in cluster.rest.get(events_path)["items"]
        if e["regarding"].get("uid") == uid and e["reason"] == "Ready"],
        what="a Ready event")  # fmt: skip
    assert ready_events[0]["type"] == "Normal"
    assert "2 nodes in 1 cliques" in ready_events[0]["note"]

    # Deleting: the DaemonSet goes, its pods (confirmed here as a kubelet would), then
    # the templates, the clique and the nodes' labels, then the finalizer.
    cluster.rest.delete(path)

    def gone() -> bool:
        force_delete_terminating(cluster, ns)
        return get_or_none(cluster, path) is None

    wait_for(gone, what="domain deleted", timeout=90)
    assert _left(cluster, ns, user_ns, uid) == []
    assert controller.stop() == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/api/v1/namespaces/{ns}/secrets", id="secrets"),
        pytest.param("GET", "/api/v1/pods", id="pods-cluster-wide"),
        pytest.param("GET", "/api/v1/namespaces/{user}/pods", id="pods-elsewhere"),
        pytest.param("POST", "/api/v1/namespaces/{ns}/pods", id="create-pod"),
        pytest.param("PATCH", "/api/v1/namespaces/{ns}/pods/x", id="patch-pod"),
        pytest.param("POST", "/apis/apps/v1/namespaces/{user}/daemonsets", id="ds-elsewhere"),
        pytest.param("PATCH", "/apis/apps/v1/namespaces/{ns}/daemonsets/x", id="patch-ds"),
        pytest.param("DELETE", "/api/v1/nodes/x", id="delete-node"),
        pytest.param("PUT", "/api/v1/nodes/x", id="update-node"),
        pytest.param("DELETE", f"{CD_API}/namespaces/{{user}}/computedomains/x", id="delete-cd"),
        pytest.param("POST", f"{CD_API}/namespaces/{{user}}/computedomaincliques", id="clique-out"),
        pytest.param("GET", f"{RESOURCE_API}/resourceclaims", id="claims"),
    ],
)
def test_what_the_controller_does_not_need_is_denied(
    cluster: Cluster, cluster_namespace: str, driver_namespace: str, method: str, path: str
) -> None:
    from dra_driver.plugin.kubeclient import KubeApiError, KubeClient

    kubeconfig = cluster.service_account_kubeconfig(
        driver_namespace, f"{driver_namespace}-compute-domain-controller"
    )
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    where = path.format(ns=driver_namespace, user=cluster_namespace)
    body = None if method in ("GET", "DELETE") else {}
    kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
    with pytest.raises(KubeApiError) as err:
        client.request(method, where, body=body, content_type=kind)
    assert err.value.status == 403, err.value


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        pytest.param({"metadata": {"labels": {"team": "b"}}}, "only remove", id="other-label"),
        pytest.param({"metadata": {"labels": {names.DOMAIN_LABEL: "0badc0de"}}}, "only remove",
                     id="relabel"),
        pytest.param({"spec": {"unschedulable": True}}, "change nothing", id="cordon"),
        pytest.param({"metadata": {"annotations": {"a": "b"}}}, "change nothing",
                     id="annotation"),
    ],
)  # fmt: skip
def test_on_nodes_the_controller_may_only_remove_a_domain_label(
    cluster: Cluster, driver_namespace: str, patch: dict[str, Any], says: str
) -> None:
    from dra_driver.plugin.kubeclient import KubeApiError, KubeClient

    node = cluster.create_node(unique("cd-policy"), labels={"team": "a"})["metadata"]["name"]
    cluster.rest.merge_patch(f"/api/v1/nodes/{node}",
                             {"metadata": {"labels": {names.DOMAIN_LABEL: "0ddba11"}}})  # fmt: skip
    kubeconfig = cluster.service_account_kubeconfig(
        driver_namespace, f"{driver_namespace}-compute-domain-controller"
    )
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    merge = "application/merge-patch+json"

    def in_force() -> bool:
        """The API server enforces a new policy about a second after it is created."""
        probe = {"metadata": {"annotations": {"probe": unique("p")}}}  # a change each time
        try:
            client.request("PATCH", f"/api/v1/nodes/{scratch}", body=probe, content_type=merge)
        except KubeApiError:
            return True
        return False

    scratch = cluster.create_node(unique("cd-probe"))["metadata"]["name"]
    wait_for(in_force, what="the node policy in force", timeout=30)
    with pytest.raises(KubeApiError) as err:
        client.request("PATCH", f"/api/v1/nodes/{node}", body=patch, content_type=merge)
    assert err.value.status in (403, 422) and says in str(err.value), err.value
    removal = {"metadata": {"labels": {names.DOMAIN_LABEL: None}}}
    client.request("PATCH", f"/api/v1/nodes/{node}", body=removal, content_type=merge)
    labels = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]
    assert names.DOMAIN_LABEL not in labels and labels["team"] == "a"


def test_a_sigkilled_controller_process_is_replaced_and_converges(
    cluster: Cluster, cluster_namespace: str, driver_namespace: str,
    controller: ControllerProcess,
) -> None:  # fmt: skip
    """SIGKILL as soon as its first object exists; a new process sets the rest up, and
    tears the domain down once deleted."""
    ns, user_ns = driver_namespace, cluster_namespace
    cluster.rest.create(f"{CD_API}/namespaces/{user_ns}/{names.DOMAIN_PLURAL}",
                        domain("killed", "killed-channel"))  # fmt: skip
    path = _domain_path(user_ns, "killed")
    uid = cluster.rest.get(path)["metadata"]["uid"]
    workload = f"{RESOURCE_API}/namespaces/{user_ns}/resourceclaimtemplates/killed-channel"
    wait_for(lambda: get_or_none(cluster, workload), what="the first object")
    controller.kill()
    controller.start()
    ds = f"/apis/apps/v1/namespaces/{ns}/daemonsets/{objects.daemonset_name(uid)}"
    wait_for(lambda: get_or_none(cluster, ds), what="the DaemonSet from the new process")
    wait_for(lambda: (cluster.rest.get(path).get("status") or {}).get("status") == "NotReady",
             what="the status from the new process")  # fmt: skip
    cluster.rest.delete(path)
    wait_for(lambda: get_or_none(cluster, path) is None, what="domain deleted", timeout=90)
    assert _left(cluster, ns, user_ns, uid) == []
    assert controller.stop() == 0
