"""After a run: every bound pod's claim is allocated to devices its shape allows, on
the pod's node, no exclusive device twice; every node's slices are one complete,
current pool of what the driver builds. Each function returns problems (empty = ok)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.fleet.pools import DRIVER, slice_problems
from bench.fleet.run import NAMESPACE, RESOURCE, FleetRun
from dra_driver.devcluster import Cluster


def _claim_name(pod: dict[str, Any]) -> str | None:
    ref = pod["spec"]["resourceClaims"][0]
    if ref.get("resourceClaimName"):
        return str(ref["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == ref["name"]:
            return str(status.get("resourceClaimName") or "") or None
    return None


def allocation_problems(cluster: Cluster, run: FleetRun) -> list[str]:
    pods = cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    claims = {
        c["metadata"]["name"]: c
        for c in cluster.rest.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")["items"]
    }
    by_name = {d["name"]: d for d in run.devices}
    problems: list[str] = []
    used: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        if not node:
            continue
        claim = claims.get(_claim_name(pod) or "")
        allocation = (claim or {}).get("status", {}).get("allocation")
        if not allocation:
            problems.append(f"{name}: bound to {node} but its claim is not allocated")
            continue
        results = allocation["devices"]["results"]
        devs = [by_name.get(r["device"], {}) for r in results]
        for r in results:
            if r["driver"] != DRIVER or r["pool"] != node or r["device"] not in by_name:
                problems.append(f"{name}: on {node} got {r['driver']}/{r['pool']}/{r['device']}")
            used[(r["pool"], r["device"])] += 1
        if not run.shape.allows(results, devs):
            got = ", ".join(r["device"] for r in results)
            problems.append(f"{name}: {got} on {node} does not satisfy {run.shape.name}")
    shared = {n for n, d in by_name.items() if d.get("allowMultipleAllocations")}
    problems += [
        f"{pool}/{dev} allocated {n} times"
        for (pool, dev), n in used.items()
        if n > 1 and dev not in shared
    ]
    return problems


def published_problems(cluster: Cluster, run: FleetRun) -> list[str]:
    items = cluster.rest.get(f"{RESOURCE}/resourceslices")["items"]
    per_node: dict[str, list[dict[str, Any]]] = {n: [] for n in run.node_names}
    for s in items:
        if s["spec"]["driver"] == DRIVER:
            per_node.setdefault(str(s["spec"].get("nodeName")), []).append(s)
    problems: list[str] = []
    for node, slices in per_node.items():
        if node not in run.node_names:
            problems.append(f"slices of unknown node {node}")
        elif not slices:
            problems.append(f"{node}: no slices")
        else:
            problems += slice_problems(slices, node, run.pool)
    return problems
