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
SA_NAMESPACE = "dra-driver"
SA_NAME = "dra-driver-kubelet-plugin"


def apply_rbac(cluster: Cluster) -> None:
    """Our deploy/rbac manifests, exactly as shipped."""
    cluster.create_namespace(SA_NAMESPACE)
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                cluster.apply(doc)


def node_bound_kubeconfig(cluster: Cluster, node: dict[str, Any]) -> Path:
    """The plugin's ServiceAccount token, bound to a Node object as a pod's token would be
    bound to a pod on that node: it carries the ``authentication.kubernetes.io/node-name``
    extra the ValidatingAdmissionPolicy checks."""
    name = node["metadata"]["name"]
    answer = cluster.rest.create(
        f"/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts/{SA_NAME}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node["metadata"]["uid"],
                },
            },
        },
    )
    directory = cluster.workdir / "kubeconfigs"
    directory.mkdir(exist_ok=True)
    return write_kubeconfig(
        directory / f"plugin-{name}.kubeconfig",
        server=cluster.server,
        ca_file=cluster.ca_file,
        user=f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}",
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
    **settings: Any,
) -> PluginOnNode:
    """``node``: an existing Node object (else one is created)."""
    apply_rbac(cluster)
    node = node or cluster.create_node(unique(node_prefix))
    kubeconfig = node_bound_kubeconfig(cluster, node)
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
