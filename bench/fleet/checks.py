"""After a run: every bound pod's claim is allocated to devices its shape allows, on
the pod's node, no exclusive device twice; every node's slices are one complete,
current pool of what was published. Each function returns problems (empty = ok).

An allocated device is checked twice: against the pool as published (its
DeviceClass's and request's CEL selectors, evaluated by :mod:`dra_driver.cel`
on the published device: the minimal one for ``--shape minimal``), and by the
shape's predicate on the driver's device of that name (what the user asked
for; a minimal device is that device with fewer fields)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.fleet.pools import DRIVER, api_devices, slice_problems
from bench.fleet.run import NAMESPACE, RESOURCE, FleetRun
from dra_driver.cel import CelError, SelectorEvaluator, cel_device
from dra_driver.devcluster import Cluster


def request_selectors(
    spec: dict[str, Any], classes: list[dict[str, Any]]
) -> dict[str, tuple[str, ...]]:
    """Result request name (``gpu``, ``gpu/big``) -> the CEL selectors its device must
    pass: its DeviceClass's, then its own."""
    by_class = {
        c["metadata"]["name"]: [s["cel"]["expression"] for s in c["spec"].get("selectors") or ()]
        for c in classes
    }
    out: dict[str, tuple[str, ...]] = {}
    for req in spec["devices"]["requests"]:
        subs = [(req["name"], req["exactly"])] if "exactly" in req else [
            (f"{req['name']}/{sub['name']}", sub) for sub in req["firstAvailable"]
        ]  # fmt: skip
        for name, exactly in subs:
            own = [s["cel"]["expression"] for s in exactly.get("selectors") or ()]
            out[name] = (*by_class[exactly["deviceClassName"]], *own)
    return out


def selector_problem(
    evaluator: SelectorEvaluator, selectors: tuple[str, ...], device: dict[str, Any]
) -> str | None:
    """Why ``device`` (as published) fails ``selectors``; None when it passes them all."""
    try:
        for expression in selectors:
            if not evaluator.matches(
                expression, device["name"], lambda: cel_device(DRIVER, device)
            ):
                return f"fails {expression!r} as published"
    except CelError as err:
        return f"CEL error as published: {err}"
    return None


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
    published = {d["name"]: d for d in api_devices(run.pool)}
    selectors = request_selectors(run.spec, run.classes)
    evaluator = SelectorEvaluator()
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
            if r["driver"] != DRIVER or r["pool"] != node or r["device"] not in published:
                problems.append(f"{name}: on {node} got {r['driver']}/{r['pool']}/{r['device']}")
                continue
            wanted = selectors.get(r["request"])
            why = (
                f"is not a request of {run.shape.name}"
                if wanted is None
                else selector_problem(evaluator, wanted, published[r["device"]])
            )
            if why:
                problems.append(f"{name}: {r['device']} for request {r['request']} {why}")
        if not run.shape.allows(results, devs):
            got = ", ".join(r["device"] for r in results)
            problems.append(f"{name}: {got} on {node} does not satisfy {run.shape.name}")
    # Every allocated claim, with or without a pod: ``--fill-mode allocated`` claims
    # have none, and a timed pod must not get a device one of them holds.
    for claim in claims.values():
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            used[(r["pool"], r["device"])] += 1
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
