"""API requests and CPU, as the control plane itself counts them.

``apiserver_request_total`` has no user label, and the quiet control plane is not
quiet: kube-scheduler's and kube-controller-manager's ~50 informers renew their watches
(on nodes, slices, pods, claims: the plugins' resources) every 5-10 min at random, and
the API server's own loopback client renews leases and reads discovery. A baseline
measured over another period would subtract a different random sample. So the plugins'
requests are counted where the API server does know the user: API Priority and
Fairness. :func:`flow_schemas` gives the plugin's ServiceAccount one FlowSchema per
verb and resource its RBAC allows (plus one for anything else), all in the priority
level it gets anyway (``workload-low``, as the default ``service-accounts`` schema
gives it), and ``apiserver_flowcontrol_dispatched_requests_total{flow_schema}`` counts
each one. ``apiserver_request_total`` still gives the slice writes of *anyone* (the
zero a roll must show) and the API server's total.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "dra-bench-"
OTHER = "other"
"""Key of the plugins' requests outside their RBAC (would be refused: none expected)."""
SLICE_WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
"""``apiserver_request_total`` verbs that change a ResourceSlice."""


@dataclass(frozen=True)
class Rule:
    verb: str
    group: str
    resource: str
    """With its subresource, as RBAC and FlowSchemas write it (``resourceclaims/status``)."""
    namespaced: bool

    @property
    def key(self) -> str:
        return f"{self.verb} {self.resource}"

    @property
    def schema(self) -> str:
        return f"{PREFIX}{self.verb}-{self.resource.replace('/', '-')}"


def plugin_rules(rbac_dir: Path) -> list[Rule]:
    """Every (verb, resource) the shipped ClusterRole and Role grant the plugin; custom
    verbs (``associated-node:patch``) are authorization checks, not requests."""
    rules: list[Rule] = []
    for path in sorted(rbac_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("ClusterRole", "Role"):
                continue
            for rule in doc.get("rules") or []:
                for group in rule.get("apiGroups") or []:
                    for resource in rule.get("resources") or []:
                        rules += [
                            Rule(verb, group, resource, doc["kind"] == "Role")
                            for verb in rule.get("verbs") or []
                            if ":" not in verb
                        ]
    return rules


def flow_schemas(
    rules: Iterable[Rule], namespace: str, account: str, precedence: int = 1000
) -> list[dict[str, Any]]:
    """FlowSchemas that sort the ServiceAccount's requests by verb and resource, ahead of
    the default ``service-accounts`` schema (9000) and into the same priority level."""
    subject = {
        "kind": "ServiceAccount",
        "serviceAccount": {"namespace": namespace, "name": account},
    }

    def schema(name: str, order: int, **rule: Any) -> dict[str, Any]:
        return {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {
                "priorityLevelConfiguration": {"name": "workload-low"},
                "matchingPrecedence": order,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{"subjects": [subject], **rule}],
            },
        }

    out = []
    for i, r in enumerate(rules):
        scope = {"namespaces": ["*"]} if r.namespaced else {"clusterScope": True}
        resource = {"verbs": [r.verb], "apiGroups": [r.group], "resources": [r.resource]}
        out.append(schema(r.schema, precedence + i, resourceRules=[resource | scope]))
    everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
    out.append(
        schema(
            f"{PREFIX}{OTHER}",
            precedence + len(out),
            resourceRules=[everything | {"clusterScope": True, "namespaces": ["*"]}],
            nonResourceRules=[{"verbs": ["*"], "nonResourceURLs": ["*"]}],
        )
    )
    return out


def cpu_seconds(pid: int | None, proc: Path = Path("/proc")) -> float:
    """utime + stime of ``pid``; 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    """The counters at one moment."""

    at: float
    plugin: Mapping[str, float]
    """Dispatched requests by our FlowSchema, keyed ``"verb resource"`` or ``other``."""
    requests: Mapping[tuple[str, str], float]
    """``apiserver_request_total`` by (verb, resource[/subresource]), every user."""
    cpu_s: Mapping[str, float]


@dataclass(frozen=True)
class Window:
    """What happened between two snapshots."""

    seconds: float
    plugin: Mapping[str, int]
    requests: int
    """All requests the API server served, every user."""
    slice_writes: int
    """Writes to resourceslices by anyone."""
    cpu_s: Mapping[str, float]

    @property
    def plugin_total(self) -> int:
        return sum(self.plugin.values())


class ApiServerMetrics:
    """kube-apiserver's ``/metrics`` (``fetch`` returns its body), read as snapshots."""

    def __init__(
        self, fetch: Callable[[], bytes], rules: Iterable[Rule], pids: Mapping[str, int]
    ) -> None:
        self._fetch = fetch
        self._keys = {r.schema: r.key for r in rules} | {f"{PREFIX}{OTHER}": OTHER}
        self._pids = dict(pids)

    def snapshot(self) -> Snapshot:
        text = self._fetch().decode()
        cpu = {name: cpu_seconds(pid) for name, pid in self._pids.items()}
        plugin: defaultdict[str, float] = defaultdict(float)
        requests: defaultdict[tuple[str, str], float] = defaultdict(float)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "apiserver_flowcontrol_dispatched_requests_total":
                    key = self._keys.get(s.labels.get("flow_schema", ""))
                    if key is not None:
                        plugin[key] += s.value
                elif s.name == "apiserver_request_total":
                    sub = s.labels.get("subresource", "")
                    resource = s.labels.get("resource", "") + (f"/{sub}" if sub else "")
                    requests[(s.labels.get("verb", ""), resource)] += s.value
        return Snapshot(time.monotonic(), plugin, requests, cpu)


def window(before: Snapshot, after: Snapshot) -> Window:
    requests = {k: v - before.requests.get(k, 0.0) for k, v in after.requests.items()}
    return Window(
        seconds=after.at - before.at,
        plugin={
            k: round(v - before.plugin.get(k, 0.0))
            for k, v in sorted(after.plugin.items())
            if v - before.plugin.get(k, 0.0)
        },
        requests=round(sum(requests.values())),
        slice_writes=round(
            sum(
                v
                for (verb, res), v in requests.items()
                if res == "resourceslices" and verb in SLICE_WRITES
            )
        ),
        cpu_s={k: round(v - before.cpu_s.get(k, 0.0), 2) for k, v in after.cpu_s.items()},
    )
