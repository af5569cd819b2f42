"""Read the DRA objects of a live cluster (tooling only; the daemon reads through
:mod:`dra_driver.plugin.kubeclient`).

Uses the ``kubernetes`` package's kubeconfig loader, so contexts, exec
credential plugins and in-cluster config work as kubectl users expect; bodies
stay plain JSON, never the generated models.
"""

from __future__ import annotations

import json
from typing import Any

RESOURCE = "/apis/resource.k8s.io/v1"
LISTS = {
    "ResourceSlice": f"{RESOURCE}/resourceslices",
    "DeviceClass": f"{RESOURCE}/deviceclasses",
    "ResourceClaim": f"{RESOURCE}/resourceclaims",
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
}


class ClusterError(RuntimeError):
    """The cluster could not be read (which request, what the server said)."""


class LiveCluster:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        try:
            import kubernetes.client
            import kubernetes.config
        except ImportError as err:
            raise ClusterError(
                "reading a live cluster needs the 'kubernetes' package (pip install kubernetes)"
            ) from err
        try:
            if kubeconfig is None and _in_cluster():
                kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
                self._api = kubernetes.client.ApiClient()
            else:
                self._api = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, context=context
                )
        except Exception as err:
            raise ClusterError(
                f"cannot load kubeconfig {kubeconfig or '(default)'}: {err}"
            ) from err

    def get(self, path: str) -> dict[str, Any]:
        try:
            method, url, headers, body, _ = self._api.param_serialize(
                "GET",
                path,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(method, url, headers, body)
            raw: bytes = response.read()  # type: ignore[no-untyped-call]
        except Exception as err:
            raise ClusterError(f"GET {path}: {err}") from err
        if response.status != 200:
            raise ClusterError(f"GET {path}: HTTP {response.status} {_message(raw)}")
        data: dict[str, Any] = json.loads(raw)
        return data

    def items(self, kind: str) -> list[dict[str, Any]]:
        items = self.get(LISTS[kind]).get("items") or []
        return [{"kind": kind, **item} for item in items]

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "kind": "ResourceClaim",
            **self.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"),
        }

    def objects(self) -> list[dict[str, Any]]:
        """Everything allocation depends on: nodes, classes, slices, claims (for what is in use)."""
        return [
            obj
            for kind in ("Node", "DeviceClass", "ResourceSlice", "ResourceClaim")
            for obj in self.items(kind)
        ]


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")


def _message(raw: bytes | None) -> str:
    try:
        return str(json.loads(raw or b"{}").get("message", ""))
    except ValueError:
        return (raw or b"")[:200].decode(errors="replace")
