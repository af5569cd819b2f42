"""What the controller creates for one domain, as plain manifests (pure functions).

Per domain (all labelled ``DOMAIN_LABEL=<uid>``): the workload ResourceClaimTemplate in
the domain's namespace (owned by the domain, so the garbage collector also removes
it), and in the driver's namespace the daemon ResourceClaimTemplate and the DaemonSet
whose pods run ``dra-driver compute-domain-daemon`` on the nodes labelled for the
domain. Objects in the driver's namespace cannot be owned across namespaces: the
domain's finalizer is what removes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain import names

Obj = dict[str, Any]
DOMAIN_API = f"{names.API_GROUP}/{names.API_VERSION}"
RESOURCE_API = "resource.k8s.io/v1"
COMPONENT_LABEL = "app.kubernetes.io/component"
DAEMON_COMPONENT = "compute-domain-daemon"
DAEMON_CONTAINER = "imex-daemon"
PROBE_TIMEOUT_S = 15
"""The daemon's readiness probe's limit: above the check's own for ``nvidia-imex-ctl``."""
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class DaemonSettings:
    """How the daemon pods run (the chart passes its own image and names)."""

    namespace: str
    """The driver's namespace: DaemonSets, daemon templates and cliques live here."""
    image: str
    pull_policy: str = "IfNotPresent"
    service_account: str = "default"
    """The daemons' ServiceAccount: patches its own pod, reads its clique."""
    priority_class: str = ""


@dataclass(frozen=True)
class Domain:
    """What the controller reads from a ComputeDomain (validated by the CRD's schema)."""

    namespace: str
    name: str
    uid: str
    template_name: str
    allocation_mode: names.AllocationMode

    @classmethod
    def from_object(cls, obj: Obj) -> Domain:
        meta = obj["metadata"]
        uid = str(meta.get("uid", ""))
        if not _UID.match(uid):
            raise ValueError(f"ComputeDomain {meta.get('name')}: metadata.uid {uid!r} is no UID")
        channel = obj.get("spec", {}).get("channel", {})
        given = channel.get("allocationMode") or "Single"
        mode: names.AllocationMode = "All" if given == "All" else "Single"
        if given != mode:
            raise ValueError(f"spec.channel.allocationMode: {given!r}; want Single or All")
        return cls(
            namespace=str(meta["namespace"]), name=str(meta["name"]), uid=uid,
            template_name=str(channel["resourceClaimTemplate"]["name"]), allocation_mode=mode,
        )  # fmt: skip


def daemonset_name(uid: str) -> str:
    return f"computedomain-{uid}"


def daemon_template_name(uid: str) -> str:
    return f"computedomain-daemon-{uid}"


def clique_name(uid: str, clique_id: str) -> str:
    return f"{uid}.{clique_id}"


def _labels(uid: str) -> dict[str, str]:
    return {names.DOMAIN_LABEL: uid}


def _claim_spec(request: str, device_class: str, kind: str, params: Obj) -> Obj:
    return {
        "devices": {
            "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
            "config": [{
                "requests": [request],
                "opaque": {
                    "driver": names.DRIVER_NAME,
                    "parameters": {"apiVersion": DOMAIN_API, "kind": kind, **params},
                },
            }],
        }
    }  # fmt: skip


def workload_template(domain: Domain) -> Obj:
    """The template workload pods name; each claim asks for the node's channel 0."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": domain.template_name,
            "namespace": domain.namespace,
            "labels": _labels(domain.uid),
            "ownerReferences": [
                {
                    "apiVersion": DOMAIN_API,
                    "kind": names.DOMAIN_KIND,
                    "name": domain.name,
                    "uid": domain.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "metadata": {"labels": _labels(domain.uid)},
            "spec": _claim_spec(
                "channel",
                names.CHANNEL_CLASS,
                names.CHANNEL_CONFIG_KIND,
                {"domainID": domain.uid, "allocationMode": domain.allocation_mode},
            ),
        },
    }


def daemon_template(domain: Domain, settings: DaemonSettings) -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": daemon_template_name(domain.uid),
            "namespace": settings.namespace,
            "labels": _labels(domain.uid),
        },
        "spec": {
            "metadata": {"labels": _labels(domain.uid)},
            "spec": _claim_spec(
                "daemon", names.DAEMON_CLASS, names.DAEMON_CONFIG_KIND, {"domainID": domain.uid}
            ),
        },
    }


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def daemonset(domain: Domain, settings: DaemonSettings) -> Obj:
    """One IMEX daemon pod on every node labelled for the domain (the node side labels a
    node when a workload's channel is prepared there)."""
    pod_labels = {**_labels(domain.uid), COMPONENT_LABEL: DAEMON_COMPONENT}
    pod: Obj = {
        "nodeSelector": _labels(domain.uid),
        # A node agent: wherever the domain's workload runs, whatever the node's taints.
        "tolerations": [{"operator": "Exists"}],
        "serviceAccountName": settings.service_account,
        "resourceClaims": [
            {"name": "daemon", "resourceClaimTemplateName": daemon_template_name(domain.uid)}
        ],
        "containers": [{
            "name": DAEMON_CONTAINER,
            "image": settings.image,
            "imagePullPolicy": settings.pull_policy,
            "args": ["compute-domain-daemon"],
            "env": [
                _field_env("NODE_NAME", "spec.nodeName"),
                _field_env("POD_NAME", "metadata.name"),
                _field_env("POD_NAMESPACE", "metadata.namespace"),
                _field_env("POD_IP", "status.podIP"),
                {"name": "DOMAIN_UID", "value": domain.uid},
            ],
            "resources": {"claims": [{"name": "daemon"}]},
            "readinessProbe": {
                "exec": {"command": ["dra-driver", "compute-domain-daemon", "check"]},
                "periodSeconds": 2,
                "failureThreshold": 1,
                # Two Python starts (the check, nvidia-imex-ctl -q with its own 10 s
                # limit): past the 1 s default on a busy node, where every probe timed
                # out and workloads waited for minutes (two-node e2e test).
                "timeoutSeconds": PROBE_TIMEOUT_S,
            },
        }],
    }  # fmt: skip
    if settings.priority_class:
        pod["priorityClassName"] = settings.priority_class
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemonset_name(domain.uid),
            "namespace": settings.namespace,
            "labels": _labels(domain.uid),
        },
        "spec": {
            "selector": {"matchLabels": pod_labels},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def clique(uid: str, clique_id: str, namespace: str, daemons: list[Obj]) -> Obj:
    return {
        "apiVersion": DOMAIN_API,
        "kind": names.CLIQUE_KIND,
        "metadata": {
            "name": clique_name(uid, clique_id),
            "namespace": namespace,
            "labels": _labels(uid),
        },
        "daemons": daemons,
    }
