"""Pods the plugin runs on its own node, in its own namespace: helpers whose lifetime is
the kubelet's, not the plugin container's (an MPS daemon, :mod:`dra_driver.mpspods`).

Knows nothing about GPUs. A :class:`NodePod` is pinned with ``spec.nodeName`` (no
scheduler: it must run here, and a node that is full or cordoned still runs it),
tolerates every taint, restarts always, runs one privileged container of the plugin's
own image with the host's PID namespace, mounts only the host paths it names, and
gets no API credentials. It uses the host's network namespace: it needs no network,
and a pod network would only add the CNI plugins' setup to its start. Its name is
unique per node and job (pod names are namespace-wide and one namespace holds the pods
of every node): ``<prefix>-<10 hex of the node name's hash>-<job>``.

:class:`NodePods` creates, lists (label selector and ``spec.nodeName`` of this node),
reads and deletes them through the plugin's :class:`~dra_driver.plugin.kubeclient.
KubeClient`. RBAC: ``pods`` ``create``, ``get``, ``list``, ``delete`` in the plugin's
namespace (a Role, deploy/rbac/role.yaml).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.plugin.kubeclient import KubeClient, NotFoundError, Obj

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class HostMount:
    """A host path mounted into the pod (``path`` inside; the same as ``host`` if empty)."""

    host: str
    path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class NodePod:
    """One helper pod on this node."""

    job: str
    """What it runs, unique on the node (lower-case letters, digits, '-'); in its name."""
    image: str
    args: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[HostMount] = ()
    priority_class: str = ""
    pull_policy: str = "IfNotPresent"
    grace_s: int = 30
    """terminationGracePeriodSeconds: SIGTERM to SIGKILL."""


def node_hash(node_name: str) -> str:
    return hashlib.sha256(node_name.encode()).hexdigest()[:10]


class NodePods:
    """This node's helper pods of one kind (``prefix``) in ``namespace``."""

    def __init__(
        self, *, client: KubeClient, namespace: str, node_name: str, prefix: str, labels: Obj
    ) -> None:
        """``labels``: what every pod of this kind carries and is listed by."""
        if not _NAME.match(prefix) or len(prefix) > 20:
            raise ValueError(f"prefix: {prefix!r}; want lower-case letters, digits, '-', <= 20")
        self._client = client
        self._namespace = namespace
        self._node = node_name
        self._prefix = prefix
        self._labels = dict(labels)

    @property
    def namespace(self) -> str:
        return self._namespace

    def name(self, job: str) -> str:
        """``<prefix>-<node hash>-<job>``; at most 63 characters, a valid pod name."""
        name = f"{self._prefix}-{node_hash(self._node)}-{job}"
        if len(name) > 63 or not _NAME.match(name):
            raise ValueError(f"job: {job!r} makes pod name {name!r}; want <= 63 of [a-z0-9-]")
        return name

    def manifest(self, pod: NodePod) -> Obj:
        volumes, mounts = [], []
        for i, m in enumerate(pod.mounts):
            volumes.append({"name": f"host-{i}", "hostPath": {"path": m.host, "type": "Directory"}})
            mounts.append(
                {"name": f"host-{i}", "mountPath": m.path or m.host, "readOnly": m.read_only}
            )
        spec: Obj = {
            "nodeName": self._node,
            "restartPolicy": "Always",
            "hostPID": True,
            "hostNetwork": True,  # no network needed: no CNI setup delays its start
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": pod.grace_s,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": pod.image,
                    "imagePullPolicy": pod.pull_policy,
                    "args": list(pod.args),
                    "env": [{"name": k, "value": v} for k, v in pod.env.items()],
                    "securityContext": {"privileged": True},
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        if pod.priority_class:
            spec["priorityClassName"] = pod.priority_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name(pod.job),
                "namespace": self._namespace,
                "labels": {**self._labels, **pod.labels},
            },
            "spec": spec,
        }

    def _path(self, name: str = "") -> str:
        base = f"/api/v1/namespaces/{self._namespace}/pods"
        return f"{base}/{name}" if name else base

    def create(self, pod: NodePod) -> Obj:
        return self._client.request("POST", self._path(), body=self.manifest(pod))

    def get(self, job: str) -> Obj | None:
        try:
            return self._client.request("GET", self._path(self.name(job)))
        except NotFoundError:
            return None

    def list(self) -> list[Obj]:
        """This node's pods of this kind (label selector and ``spec.nodeName``)."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(self._labels.items()))
        listed = self._client.request(
            "GET",
            self._path(),
            params={"labelSelector": selector, "fieldSelector": f"spec.nodeName={self._node}"},
        )
        return [dict(p) for p in listed.get("items") or []]

    def delete(self, job: str, *, uid: str | None = None) -> bool:
        """Delete (the kubelet stops it within its grace period); False when it was gone.
        With ``uid``, only that pod (not one created since under the same name)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._client.request("DELETE", self._path(self.name(job)), body=body)
        except NotFoundError:
            return False
        return True


def describe(pod: Obj | None) -> str:
    """A pod's phase and its container's state, for errors: why it does not serve."""
    if pod is None:
        return "pod not found"
    status = pod.get("status") or {}
    parts = [f"phase {status.get('phase', 'unknown')}"]
    for c in status.get("containerStatuses") or []:
        for state, detail in (c.get("state") or {}).items():
            said = " ".join(str(detail.get(k)) for k in ("reason", "message") if detail.get(k))
            parts.append(f"container {state}" + (f" ({said})" if said else ""))
        if c.get("restartCount"):
            parts.append(f"{c['restartCount']} restarts")
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" and cond.get("message"):
            parts.append(f"{cond['type']}: {cond['message']}")
    return ", ".join(parts)
