"""The admission policy on MPS daemon pods (deploy/rbac/mps-daemon-pod-policy.yaml), on
the real API server under the plugin's own node-bound token.

The Role on ``pods`` cannot say which node or what pod, so without the policy node A's
plugin could create a privileged pod with the host's root on node B, give it the
plugin's own ServiceAccount (whose token there is bound to node B), or delete node B's
plugin and MPS daemon pods. Every case here is refused by the policy only: each fails
(the API server accepts it) when the policy is not applied. The runner's own create,
list, get and delete on its own node stay allowed, also with the emulated node's mount
of a chart rendered with ``emulate``. No kubelet backs the nodes: pods stay Pending and
are removed with grace 0 as admin.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.chart import find_helm, render
from dra_driver.devcluster import Cluster
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from dra_driver.plugin.nodepods import HostMount
from tests.cluster.daemonpods import DRIVER, STATE_DIR, force_delete, runner, spec
from tests.plugin.clusterkit import (
    ROOT,
    apply_rbac,
    node_bound_kubeconfig,
    plain_kubeconfig,
    sa_of,
    unique,
)

Pod = dict[str, Any]
NAMESPACE, ACCOUNT = sa_of(DRIVER)
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@dataclass
class Nodes:
    a: str
    b: str
    client: KubeClient
    """The plugin's token bound to node ``a``."""
    plain: KubeClient
    """The plugin's token bound to no node."""


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> Iterator[Nodes]:
    apply_rbac(cluster)
    a, b = (cluster.create_node(unique(p)) for p in ("pol-a", "pol-b"))
    client = KubeClient.from_kubeconfig(str(node_bound_kubeconfig(cluster, a)))
    plain = KubeClient.from_kubeconfig(str(plain_kubeconfig(cluster)))
    found = Nodes(a["metadata"]["name"], b["metadata"]["name"], client, plain)
    _wait_enforced(cluster, found)
    yield found
    client.close()
    plain.close()


def _wait_enforced(cluster: Cluster, nodes: Nodes, timeout: float = 30.0) -> None:
    """The API server loads a new policy asynchronously: wait until a pod on node B is
    refused. Never fails itself (without the policy each test fails on its own)."""
    deadline = time.monotonic() + timeout
    while created(cluster, nodes.client, other_node(nodes)) is None:
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def daemon_pod(nodes: Nodes, node: str = "", daemon_id: str = "0123456789ab") -> Pod:
    """The runner's own manifest for ``node`` (default: node A)."""
    r = runner(nodes.client, node or nodes.a)
    return r.pods.manifest(r.pod(spec(daemon_id)))


def created(cluster: Cluster, client: KubeClient, pod: Pod) -> KubeApiError | None:
    """The refusal of ``client``'s create, or None when created (then removed again)."""
    try:
        client.request("POST", PODS, body=pod)
    except KubeApiError as err:
        return err
    force_delete(cluster, NAMESPACE, pod["metadata"]["name"])
    return None


def other_node(nodes: Nodes) -> Pod:
    return daemon_pod(nodes, nodes.b)


def _main(pod: Pod) -> Pod:
    main: Pod = pod["spec"]["containers"][0]
    return main


def _mount(pod: Pod, name: str, host: str, path: str) -> None:
    pod["spec"]["volumes"].append({"name": name, "hostPath": {"path": host, "type": "Directory"}})
    _main(pod)["volumeMounts"].append({"name": name, "mountPath": path})


def _root_on_host(pod: Pod) -> None:
    _main(pod).update(image="busybox", command=["chroot", "/host", "sh"], args=[])
    _mount(pod, "root", "/", "/host")


def _plugin_account(pod: Pod) -> None:
    pod["spec"].update(serviceAccountName=ACCOUNT, automountServiceAccountToken=True)


def _projected_token(pod: Pod) -> None:
    source = {"serviceAccountToken": {"path": "token", "audience": "https://kubernetes"}}
    pod["spec"]["volumes"].append({"name": "token", "projected": {"sources": [source]}})
    _main(pod)["volumeMounts"].append({"name": "token", "mountPath": "/var/run/token"})


def _arg(index: int, value: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        _main(pod)["args"][index] = value

    return change


def _set(where: Callable[[Pod], Pod], **fields: Any) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        where(pod).update(fields)

    return change


def _spec(pod: Pod) -> Pod:
    spec: Pod = pod["spec"]
    return spec


def _init_container(pod: Pod) -> None:
    _spec(pod)["initContainers"] = [dict(_main(pod), name="init")]


def _driver_root_writable(pod: Pod) -> None:
    for mount in _main(pod)["volumeMounts"]:
        if mount["mountPath"] == "/driver-root":
            mount["readOnly"] = False


def _plugin_labels(pod: Pod) -> None:
    pod["metadata"]["labels"]["app.kubernetes.io/component"] = "kubelet-plugin"


ARGS = "an MPS daemon pod's args are"
CONTAINER = "an MPS daemon pod has one container"
SPEC = "an MPS daemon pod's spec has only the runner's fields"
VOLUMES = "an MPS daemon pod's volumes are hostPath directories"
SHAPES: dict[str, tuple[Callable[[Pod], None], str]] = {
    "privileged-host-root-other-image": (_root_on_host, CONTAINER),
    "extra-host-path": (lambda p: _mount(p, "etc", "/etc", "/etc"), VOLUMES),
    "whole-state-dir": (lambda p: _mount(p, "state", str(STATE_DIR), "/state"), VOLUMES),
    "plugin-service-account": (_plugin_account, SPEC),
    "projected-token-volume": (_projected_token, VOLUMES),
    "command": (_set(_main, command=["/bin/sh", "-c", "id"]), CONTAINER),
    "env": (_set(_main, env=[{"name": "LD_PRELOAD", "value": "/x.so"}]), CONTAINER),
    "post-start-hook": (
        _set(_main, lifecycle={"postStart": {"exec": {"command": ["/bin/sh", "-c", "id"]}}}),
        CONTAINER,
    ),
    "init-container": (_init_container, SPEC),
    "host-ipc": (_set(_spec, hostIPC=True), SPEC),
    "not-the-daemon": (_arg(0, "kubelet-plugin"), ARGS),
    "mps-control-elsewhere": (_arg(3, "--mps-control=/var/lib/kubelet/plugins/x"), ARGS),
    "foreign-setup": (_arg(6, "--setup=start_server -uid 0"), ARGS),
    "rw-driver-root": (_driver_root_writable, "an MPS daemon pod mounts only"),
    "not-a-daemon-pod": (_plugin_labels, "may only create or delete MPS daemon pods"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_pod_of_another_shape_is_refused(cluster: Cluster, nodes: Nodes, shape: str) -> None:
    change, message = SHAPES[shape]
    pod = copy.deepcopy(daemon_pod(nodes))
    change(pod)
    error = created(cluster, nodes.client, pod)
    assert error is not None, "admitted"
    assert error.status in (403, 422), error
    assert message in error.message, error.message


def test_a_pod_on_another_node_is_refused(cluster: Cluster, nodes: Nodes) -> None:
    error = created(cluster, nodes.client, other_node(nodes))
    assert error is not None, "admitted"
    expected = f"of that node (spec.nodeName), not of node '{nodes.b}'"
    assert expected in error.message, error.message


def test_a_token_bound_to_no_node_creates_nothing(cluster: Cluster, nodes: Nodes) -> None:
    error = created(cluster, nodes.plain, daemon_pod(nodes))
    assert error is not None, "admitted"
    assert "token is not bound to a node" in error.message


def _plugin_pod(node: str) -> Pod:
    labels = {"app.kubernetes.io/name": "dra-driver", "app.kubernetes.io/instance": "dra-driver",
              "app.kubernetes.io/component": "kubelet-plugin"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": unique("dra-driver-kubelet-plugin"), "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "x"}]},
    }


@pytest.mark.parametrize(
    ("victim", "token", "message"),
    [
        pytest.param("b-daemon", "a", "pods of that node", id="another-node-s-daemon"),
        pytest.param("b-plugin", "a", "pods of that node", id="another-node-s-plugin"),
        pytest.param("a-plugin", "a", "only create or delete MPS daemon pods", id="own-plugin"),
        pytest.param("a-daemon", "plain", "token is not bound to a node", id="unbound-token"),
    ],
)
def test_deleting_pods_not_its_own_daemons_is_refused(
    cluster: Cluster, nodes: Nodes, victim: str, token: str, message: str
) -> None:
    """Another node's daemon or plugin pod (an outage there), its own node's plugin pod,
    or anything with a token bound to no node."""
    node = nodes.a if victim.startswith("a-") else nodes.b
    pod = daemon_pod(nodes, node) if victim.endswith("daemon") else _plugin_pod(node)
    name = cluster.rest.create(PODS, pod)["metadata"]["name"]  # as admin
    client = nodes.client if token == "a" else nodes.plain
    try:
        with pytest.raises(KubeApiError) as refused:
            client.request("DELETE", f"{PODS}/{name}")
        assert message in refused.value.message
        assert not cluster.rest.get(f"{PODS}/{name}")["metadata"].get("deletionTimestamp")
    finally:
        force_delete(cluster, NAMESPACE, name)


@pytest.mark.parametrize(
    ("shm", "library_path"), [(True, "/driver-root/usr/lib64"), (False, "")], ids=["full", "bare"]
)
def test_the_runner_s_own_pods_are_admitted(
    cluster: Cluster, nodes: Nodes, shm: bool, library_path: str
) -> None:
    r = runner(nodes.client, nodes.a, library_path=library_path)
    job = "a1b2c3d4e5f6"
    pod = r.pods.create(r.pod(spec(job, shm=shm)))
    try:
        assert r.present() == {job}
        assert r.pods.get(job) is not None
        assert r.pods.delete(job, uid=pod["metadata"]["uid"])
    finally:
        force_delete(cluster, NAMESPACE, pod["metadata"]["name"])


def test_the_chart_s_values_shape_the_policy(cluster: Cluster, nodes: Nodes) -> None:
    """A release with another kubelet root, driver root and ``emulate``: its plugin's
    daemon pods (state dir, driver root, emulated host root) are admitted, a pod shaped
    for the default values is not."""
    driver = "emu.tier2.example.com"
    namespace, account = sa_of(driver)
    emulated = "/var/lib/dra-emu"
    values = {"driverName": driver, "kubeletRootDir": "/data/kubelet/", "emulate": "t4",
              "emulatedHostRoot": f"{emulated}/", "driverRoot": f"{emulated}/run/nvidia/driver",
              "serviceAccount.name": account}  # fmt: skip
    objs = render(find_helm(ROOT), ROOT / "deploy" / "chart", values, namespace, namespace)
    cluster.create_namespace(namespace)
    cluster.apply([o for o in objs if o["kind"] in {"ServiceAccount", "Role", "RoleBinding"}
                   or "mps-daemon-pods" in o["metadata"]["name"]])  # fmt: skip
    node = cluster.create_node(unique("pol-emu"))
    client = KubeClient.from_kubeconfig(str(node_bound_kubeconfig(cluster, node, driver)))
    mounts = (HostMount(f"{emulated}/run/nvidia/driver", "/driver-root", read_only=True),
              HostMount(emulated))  # fmt: skip
    r = runner(client, node["metadata"]["name"], driver=driver, mounts=mounts)
    default_shaped = r.pods.manifest(r.pod(spec("bbbbbbbbbbbb")))
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def refused() -> KubeApiError | None:
        try:
            client.request("POST", pods, body=default_shaped)
        except KubeApiError as err:
            return err
        force_delete(cluster, namespace, default_shaped["metadata"]["name"])
        return None

    deadline = time.monotonic() + 30
    while (error := refused()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert error is not None and "mps-daemon" in error.message, error
    state_dir = Path(f"/data/kubelet/plugins/{driver}")
    own = r.pods.create(r.pod(spec("cccccccccccc", state_dir=state_dir)))
    force_delete(cluster, namespace, own["metadata"]["name"])
    client.close()
