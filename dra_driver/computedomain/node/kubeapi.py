"""The compute-domain plugin's API calls: its own Node's domain and clique labels, and
its node's daemon pods. Through the plugin's :class:`~dra_driver.plugin.kubeclient.KubeClient`.

RBAC (deploy/chart): ``nodes`` ``get`` and ``patch`` (a ValidatingAdmissionPolicy lets a
plugin's service account change only the :data:`~dra_driver.computedomain.names.
DOMAIN_LABEL` and :data:`~dra_driver.computedomain.names.GPU_CLIQUE_LABEL` of the node
its token was issued for), ``pods`` ``list`` in the driver's
namespace.

Label changes are merge patches that carry the ``resourceVersion`` the decision was
made on: a node changed meanwhile (another writer set or removed the label) answers
409 and the caller decides again on fresh data.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.computedomain.names import DOMAIN_LABEL
from dra_driver.plugin.kubeclient import ConflictError, KubeClient, Obj

_MERGE = "application/merge-patch+json"
_ATTEMPTS = 5


@dataclass(frozen=True)
class DaemonState:
    ready: bool
    detail: str
    """Which pod, and why it is not ready (for the prepare's retryable error)."""


class NodeLabel:
    """One label of this node: :data:`DOMAIN_LABEL` unless ``key`` says otherwise."""

    def __init__(self, client: KubeClient, node_name: str, key: str = DOMAIN_LABEL) -> None:
        self._client = client
        self._node = node_name
        self._key = key

    def _get(self) -> tuple[str | None, str]:
        node = self._client.get_node(self._node)
        meta = node.get("metadata") or {}
        return (meta.get("labels") or {}).get(self._key), str(meta.get("resourceVersion", ""))

    def current(self) -> str | None:
        return self._get()[0]

    def _patch(self, value: str | None, resource_version: str) -> None:
        body: Obj = {"metadata": {"labels": {self._key: value},
                                  "resourceVersion": resource_version}}  # fmt: skip
        self._client.request("PATCH", f"/api/v1/nodes/{self._node}", body=body,
                             content_type=_MERGE)  # fmt: skip

    def claim(self, domain_id: str, busy: set[str]) -> str | None:
        """Set the label to ``domain_id``, replacing a domain that is not in ``busy`` (one
        whose claims here are all gone: its label was left behind). Returns the busy
        domain the label names instead (then nothing changed), else None."""
        for _ in range(_ATTEMPTS):
            value, rv = self._get()
            if value == domain_id:
                return None
            if value is not None and value in busy:
                return value
            try:
                self._patch(domain_id, rv)
                return None
            except ConflictError:
                continue
        raise ConflictError(409, "Conflict", f"node {self._node}: label kept changing")

    def release(self, domain_id: str) -> None:
        """Remove the label if it is ``domain_id``; another value stays."""
        for _ in range(_ATTEMPTS):
            value, rv = self._get()
            if value != domain_id:
                return
            try:
                self._patch(None, rv)
                return
            except ConflictError:
                continue
        raise ConflictError(409, "Conflict", f"node {self._node}: label kept changing")


class DaemonPods:
    """This node's daemon pods of a domain: driver namespace, ``DOMAIN_LABEL=<uid>``."""

    def __init__(self, client: KubeClient, namespace: str, node_name: str) -> None:
        self._client = client
        self._namespace = namespace
        self._node = node_name

    def state(self, domain_id: str) -> DaemonState:
        pods = self._client.request(
            "GET", f"/api/v1/namespaces/{self._namespace}/pods",
            params={"labelSelector": f"{DOMAIN_LABEL}={domain_id}",
                    "fieldSelector": f"spec.nodeName={self._node}"},
        ).get("items") or []  # fmt: skip
        if not pods:
            return DaemonState(False, f"no daemon pod of domain {domain_id} on node {self._node} "
                                      f"yet (namespace {self._namespace})")  # fmt: skip
        details = []
        for pod in pods:
            name = (pod.get("metadata") or {}).get("name", "?")
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                details.append(f"{name} is terminating")
                continue
            status = pod.get("status") or {}
            ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
            if ready and ready[0].get("status") == "True":
                return DaemonState(True, f"daemon pod {name} is Ready")
            reason = (ready[0].get("reason") or ready[0].get("message")) if ready else None
            details.append(f"{name} is {status.get('phase', 'Pending')}, not Ready"
                           + (f" ({reason})" if reason else ""))  # fmt: skip
        return DaemonState(False, "daemon pod " + "; ".join(details))
