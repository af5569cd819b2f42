"""Helpers for the plugin's tier-2 tests against the real kube-apiserver."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devcluster import Cluster
from dra_driver.devcluster.kubeconfig import write_kubeconfig
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_driver.plugin.backend import DeviceBackend

ROOT = Path(__file__).resolve().parents[2]
RBAC_DIR = ROOT / "deploy" / "rbac"
SHIPPED_DRIVER = "gpu.nvidia.com"
SA_NAMESPACE = "dra-driver"
SA_NAME = "dra-driver-kubelet-plugin"


def _release(driver: str) -> str:
    """``dra-driver`` for the shipped driver; another driver's objects are named apart,
    as a second Helm release with that ``driverName`` would name them."""
    return "dra-driver" if driver == SHIPPED_DRIVER else "dra-" + driver.replace(".", "-")[:40]


def sa_of(driver: str) -> tuple[str, str]:
    """(namespace, ServiceAccount name) of ``driver``'s plugin."""
    release = _release(driver)
    return release, f"{release}-kubelet-plugin"


def apply_rbac(cluster: Cluster, driver: str = SHIPPED_DRIVER) -> None:
    """Our deploy/rbac manifests as shipped (for ``gpu.nvidia.com``); for another
    driver name the same objects with that name and their own namespace, account and
    object names, so the admission policy pins each plugin to its own driver."""
    namespace, _ = sa_of(driver)
    cluster.create_namespace(namespace)
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        text = path.read_text().replace(SHIPPED_DRIVER, driver)
        text = text.replace("dra-driver", _release(driver))
        for doc in yaml.safe_load_all(text):
            if doc:
                cluster.apply(doc)


def node_bound_kubeconfig(
    cluster: Cluster, node: dict[str, Any], driver: str = SHIPPED_DRIVER
) -> Path:
    """The plugin's ServiceAccount token, bound to a Node object as a pod's token would be
    bound to a pod on that node: it carries the ``authentication.kubernetes.io/node-name``
    extra the ValidatingAdmissionPolicy checks."""
    name = node["metadata"]["name"]
    bound = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
    return _token_kubeconfig(cluster, f"plugin-{name}", driver, bound)


def plain_kubeconfig(cluster: Cluster, driver: str = SHIPPED_DRIVER) -> Path:
    """The plugin's ServiceAccount token bound to no object (as a token Secret or a
    stolen token's holder would use it): no node-name extra."""
    return _token_kubeconfig(cluster, "plugin-unbound", driver, None)


def _token_kubeconfig(
    cluster: Cluster, file: str, driver: str, bound: dict[str, Any] | None
) -> Path:
    namespace, account = sa_of(driver)
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound is not None:
        spec["boundObjectRef"] = bound
    answer = cluster.rest.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    directory = cluster.workdir / "kubeconfigs"
    directory.mkdir(exist_ok=True)
    return write_kubeconfig(
        directory / f"{file}.kubeconfig",
        server=cluster.server,
        ca_file=cluster.ca_file,
        user=f"system:serviceaccount:{namespace}:{account}",
        token=answer["status"]["token"],
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@dataclass
class PluginOnNode:
    plugin: KubeletPlugin
    node: dict[str, Any]
    kubeconfig: Path

    @property
    def node_name(self) -> str:
        return str(self.node["metadata"]["name"])


def start_plugin_on_node(
    cluster: Cluster,
    *,
    driver: str,
    backend: DeviceBackend,
    sockets_dir: Path,
    node_prefix: str = "plugin-node",
    registry: Any = None,
    node: dict[str, Any] | None = None,
    kubeconfig: Path | None = None,
    **settings: Any,
) -> PluginOnNode:
    """``node``: an existing Node object (else one is created); ``kubeconfig``: the
    plugin's (else one with a token bound to the node)."""
    apply_rbac(cluster, driver)
    node = node or cluster.create_node(unique(node_prefix))
    kubeconfig = kubeconfig or node_bound_kubeconfig(cluster, node, driver)
    plugin = KubeletPlugin(
        settings=PluginSettings(
            driver_name=driver,
            node_name=node["metadata"]["name"],
            registry_dir=settings.pop("registry_dir", sockets_dir / "registry"),
            plugins_dir=settings.pop("plugins_dir", sockets_dir / "plugins"),
            kubeconfig=kubeconfig,
            resync_interval_s=settings.pop("resync_interval_s", 30.0),
            **settings,
        ),
        backend=backend,
        logger=logging.getLogger(f"test.{driver}"),
        registry=registry,
    )
    plugin.start()
    return PluginOnNode(plugin, node, kubeconfig)


def our_slices(cluster: Cluster, driver: str, node: str) -> list[dict[str, Any]]:
    listed = cluster.rest.get(
        "/apis/resource.k8s.io/v1/resourceslices",
        {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"},
    )
    return sorted(listed.get("items") or [], key=lambda s: s["metadata"]["name"])
