"""A kubeconfig's ``tokenFile`` rotated under a running plugin, on the real API server.

The old token is revoked (the pod it was bound to is deleted, as when a pod's token is
replaced after a compromise) and a new one written to the same file: the plugin must
use the new one within its next retry, not 401 on every call until it restarts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.plugin.kubeclient import KubeApiError, KubeClient
from dra_driver.plugin.resources import Capacity, Device
from tests.plugin.clusterkit import (
    apply_rbac,
    our_slices,
    sa_of,
    start_plugin_on_node,
    unique,
)
from tests.plugin.fakes import FakeBackend

DRIVER = "gpu.rotation.example.com"


def _pod_bound_token(cluster: Cluster, node: str) -> tuple[str, str]:
    """(pod name, token) of the plugin's account, bound to a pod pinned to ``node`` (no
    kubelet runs it): it carries the node name the slice policy checks, and dies with
    the pod."""
    namespace, account = sa_of(DRIVER)
    name = unique("holder")
    pod = cluster.rest.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
         "spec": {"nodeName": node, "serviceAccountName": account,
                  "automountServiceAccountToken": False,
                  "containers": [{"name": "c", "image": "registry.example/none:1"}]}},
    )  # fmt: skip
    answer = cluster.rest.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600,
                  "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                     "uid": pod["metadata"]["uid"]}}},
    )  # fmt: skip
    return name, str(answer["status"]["token"])


def _kubeconfig(cluster: Cluster, path: Path, token_file: Path) -> Path:
    cluster_entry = {"server": cluster.server, "certificate-authority": str(cluster.ca_file)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "p",
        "clusters": [{"name": "k", "cluster": cluster_entry}],
        "users": [{"name": "u", "user": {"tokenFile": token_file.name}}],
        "contexts": [{"name": "p", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _refused(cluster: Cluster, token: str, directory: Path) -> bool:
    path = write_kubeconfig(directory / "old.kubeconfig", server=cluster.server,
                            ca_file=cluster.ca_file, user="old", token=token)  # fmt: skip
    client = KubeClient.from_kubeconfig(str(path))
    try:
        client.list_resource_slices("spec.driver=none")
    except KubeApiError as exc:
        return exc.status == 401
    finally:
        client.close()
    return False


def test_a_rotated_token_file_is_used_within_seconds(cluster: Cluster, short_dir: Path) -> None:
    apply_rbac(cluster, DRIVER)
    node = cluster.create_node(unique("rotate"))
    name = node["metadata"]["name"]
    old_pod, old_token = _pod_bound_token(cluster, name)
    token_file = short_dir / "token"
    token_file.write_text(old_token + "\n")
    backend = FakeBackend(devices=(Device("gpu-0", capacity={"memory": Capacity("80Gi")}),))
    on_node = start_plugin_on_node(
        cluster, driver=DRIVER, backend=backend, sockets_dir=short_dir, node=node,
        kubeconfig=_kubeconfig(cluster, short_dir / "kubeconfig", token_file),
        resync_interval_s=60,
    )  # fmt: skip
    try:
        wait_until(lambda: our_slices(cluster, DRIVER, name), timeout=30, what="first slice")
        # Rotate: a new token in the file, the old one revoked (the API server caches a
        # token's validity for up to 10 s).
        _, new_token = _pod_bound_token(cluster, name)
        token_file.write_text(new_token + "\n")
        namespace, _ = sa_of(DRIVER)
        gone_now = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        cluster.rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{old_pod}", gone_now)
        wait_until(
            lambda: _refused(cluster, old_token, short_dir), timeout=30, what="old token refused"
        )
        # Something the plugin must write: its slice deleted behind its back.
        (gone,) = our_slices(cluster, DRIVER, name)
        cluster.rest.delete(f"/apis/resource.k8s.io/v1/resourceslices/{gone['metadata']['name']}")
        start = time.monotonic()
        back: list[dict[str, Any]] = wait_until(
            lambda: our_slices(cluster, DRIVER, name), timeout=20, what="slice republished"
        )
        assert back[0]["metadata"]["uid"] != gone["metadata"]["uid"]
        assert time.monotonic() - start < 20  # well before the 60 s periodic re-read
    finally:
        on_node.plugin.stop(grace_s=0, uninstall=True)
