"""``dra-driver explain CLAIM`` (also ``kubectl dra explain``): why these devices, or why pending.

Reads the claim, the pod using it, nodes, DeviceClasses, ResourceSlices and
every other claim (what is in use) from the cluster, or from files with
``-f``, and explains per node, per request and per device what rules each
device out, in plain language, with the CEL error and a fix where one exists.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("claim", metavar="CLAIM", help="ResourceClaim name (or NAMESPACE/NAME)")
    parser.add_argument("-n", "--namespace", default=None, help="namespace (default: default)")
    parser.add_argument("--node", help="explain only this node")
    parser.add_argument(
        "-f", "--filename", action="append", default=[], metavar="FILE",
        help="read objects from files instead of (or, with --kubeconfig, on top of) the cluster",
    )  # fmt: skip
    parser.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--engine", choices=("cel-expr-python", "cel-python"))
    parser.add_argument(
        "--all-devices", action="store_true", help="list every device (default: 12 per request)"
    )


def _pod_using(
    pods: list[Mapping[str, Any]], namespace: str, claim: str
) -> Mapping[str, Any] | None:
    for pod in pods:
        if (pod.get("metadata") or {}).get("namespace", namespace) != namespace:
            continue
        spec_refs = [
            r.get("resourceClaimName") for r in (pod.get("spec") or {}).get("resourceClaims") or ()
        ]
        status_refs = [
            r.get("resourceClaimName")
            for r in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        ]
        if claim in spec_refs or claim in status_refs:
            return pod
    return None


def _pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    names = [
        r.get("resourceClaimName") for r in (pod.get("spec") or {}).get("resourceClaims") or ()
    ]
    names += [
        r.get("resourceClaimName")
        for r in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    ]
    return [n for n in names if n]


def _scheduler_message(pod: Mapping[str, Any] | None) -> str:
    for cond in ((pod or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return ""


def explain(
    objects: list[Any],
    namespace: str,
    name: str,
    only_node: str | None,
    engine: str | None,
    replay: bool = False,
) -> dict[str, Any]:
    """The whole explanation as JSON-able data (the text output renders this).

    ``replay`` (objects from files only): the claims and pods before the target
    are first allocated in order, as ``simulate`` does, so the explanation sees
    what they took.
    """
    from dra_driver.allocation.inputs import build, flatten
    from dra_driver.allocation.simulation import Simulation, Workload
    from dra_driver.allocation.state import AllocatedState

    items = flatten(objects)
    pods = [o for o in items if o.get("kind") == "Pod"]
    inputs = build(items if replay else [o for o in items if o.get("kind") != "Pod"], namespace)
    claims = {c.key: c for c in inputs.claims}
    target = claims.get(f"{namespace}/{name}")
    if target is None:
        raise LookupError(f"ResourceClaim {namespace}/{name} not found")
    ctx = _Context(inputs, engine)
    if replay:
        sim = Simulation(ctx.inventory, AllocatedState.from_claims(inputs.claims))
        workload = Workload(claims=[target])
        for w in inputs.workloads:
            if target in w.claims:
                workload = w
                break
            sim.allocate(w)
        pod = next((p for p in pods if p.get("metadata", {}).get("name") == workload.pod), None)
        together = [
            target,
            *(c for c in workload.claims if c.allocated is None and c is not target),
        ]
        return _explain(ctx, target, together, workload, sim.state, pod, only_node)
    pod = _pod_using(pods, namespace, name)
    together = [target]
    workload = Workload(claims=together)
    if pod is not None:
        spec = pod.get("spec") or {}
        workload = Workload(
            claims=together,
            node_name=str(spec.get("nodeName") or ""),
            node_selector=dict(spec.get("nodeSelector") or {}),
            node_affinity=(spec.get("affinity") or {}).get("nodeAffinity"),
        )
        for other in _pod_claim_names(pod):
            c = claims.get(f"{namespace}/{other}")
            if c is None or c is target:
                continue
            if c.allocated is None:
                together.append(c)
            elif c.allocated_node:
                workload.pinned_node = c.allocated_node
    if target.allocated is not None and target.allocated_node:
        workload.pinned_node = target.allocated_node
    keys = {c.key for c in together}
    state = AllocatedState.from_claims(c for c in inputs.claims if c.key not in keys)
    return _explain(ctx, target, together, workload, state, pod, only_node)


class _Context:
    def __init__(self, inputs: Any, engine: str | None) -> None:
        from dra_driver.allocation.inventory import Inventory
        from dra_driver.cel import SelectorEvaluator, load_engine

        self.evaluator = SelectorEvaluator(load_engine(engine))
        self.inventory = Inventory(
            inputs.slices, inputs.classes, inputs.implied_nodes(), self.evaluator
        )


def _explain(
    ctx: _Context,
    target: Any,
    together: list[Any],
    workload: Any,
    state: Any,
    pod: Mapping[str, Any] | None,
    only_node: str | None,
) -> dict[str, Any]:
    from dra_driver.allocation.explain import Explainer
    from dra_driver.allocation.simulation import node_allowed

    body: dict[str, Any] = {
        "claim": target.key,
        "pod": (pod or {}).get("metadata", {}).get("name"),
        "schedulerMessage": _scheduler_message(pod),
    }
    if target.allocated is not None:
        devices: dict[str, list[str]] = {}
        for r in target.allocated:
            devices.setdefault(r.request, []).append(r.device.device)
        body.update(allocated=True, node=target.allocated_node, devices=devices)
    else:
        body["allocated"] = False
    explainer = Explainer(ctx.inventory, state)
    fresh = [c if c.allocated is None else _unallocated(c) for c in together]
    reports = []
    skipped = 0
    for node in ctx.inventory.nodes:
        if only_node and node.name != only_node:
            continue
        if not node_allowed(workload, node):
            skipped += 1
            continue
        reports.append(explainer.node(node, fresh, fresh[0]).as_json())
    body["engine"] = ctx.evaluator.engine_name
    body["otherClaimsAllocatedTogether"] = [c.key for c in together[1:]]
    body["nodesExcludedByPod"] = skipped
    body["nodes"] = reports
    return body


def _unallocated(claim: Any) -> Any:
    from dataclasses import replace

    return replace(claim, allocated=None, allocated_node="")


def render(body: dict[str, Any], all_devices: bool) -> str:
    out = []
    status = (
        f"allocated on node {body['node']}: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in body["devices"].items())
        if body["allocated"]
        else "pending (not allocated)"
    )
    out.append(f"ResourceClaim {body['claim']}: {status}")
    if body.get("pod"):
        out.append(f"Used by pod {body['pod']}.")
    if body.get("schedulerMessage"):
        out.append(f"The scheduler says: {body['schedulerMessage']}")
    if body["otherClaimsAllocatedTogether"]:
        out.append(
            "Allocated together with the pod's other claims: "
            + ", ".join(body["otherClaimsAllocatedTogether"])
        )
    if body["nodesExcludedByPod"]:
        out.append(f"{body['nodesExcludedByPod']} node(s) excluded by the pod's node selection.")
    fits = [n["node"] for n in body["nodes"] if n["fits"]]
    if not body["allocated"]:
        out.append(
            f"{len(fits)} of {len(body['nodes'])} node(s) fit now"
            + (f": {', '.join(fits[:10])}" if fits else "")
            + "."
        )
    for node in body["nodes"]:
        out.append("")
        line = f"Node {node['node']}: {node['summary']}"
        if node["fits"]:
            line += " with " + "; ".join(f"{k}: {', '.join(v)}" for k, v in node["devices"].items())
        out.append(line)
        for p in node["pools"]:
            if not p.endswith(": ok"):
                out.append(f"  pool {p}")
        for req in node["requests"]:
            out.append(f"  request {req['name']} ({req['wanted']}): {req['qualifying']} qualify")
            groups: list[tuple[str, str, list[str]]] = []
            for d in req["devices"]:
                if groups and groups[-1][:2] == (d["reason"], d["fix"]):
                    groups[-1][2].append(d["device"])
                else:
                    groups.append((d["reason"], d["fix"], [d["device"]]))
            for reason, fix, names in groups:
                listed = names if all_devices or len(names) <= 6 else [*names[:5], "..."]
                count = f" ({len(names)})" if len(names) > 1 else ""
                out.append(f"    {', '.join(listed)}{count}: {reason}")
                if fix:
                    out.append(f"      fix: {fix}")
            for h in req["hints"]:
                out.append(f"    note: {h}")
        for h in node["hints"]:
            out.append(f"  why: {h}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from dra_driver.allocation.model import ModelError
    from dra_driver.cel import EngineUnavailable
    from dra_driver.commands.simulate import read_files

    namespace, _, name = args.claim.rpartition("/")
    namespace = namespace or args.namespace or "default"
    objects: list[Any] = []
    start = time.perf_counter()
    if args.kubeconfig or not args.filename:
        from dra_driver.allocation.live import ClusterError, LiveCluster

        try:
            cluster = LiveCluster(args.kubeconfig, args.context)
            objects += cluster.objects()
            objects += [
                {"kind": "Pod", **p}
                for p in cluster.get(f"/api/v1/namespaces/{namespace}/pods").get("items") or []
            ]
        except ClusterError as err:
            print(f"dra-driver explain: {err}", file=sys.stderr)
            return 1
    objects += read_files(args.filename)
    try:
        replay = bool(args.filename) and not args.kubeconfig
        body = explain(objects, namespace, name, args.node, args.engine, replay)
    except (LookupError, ModelError, EngineUnavailable) as err:
        print(f"dra-driver explain: {err}", file=sys.stderr)
        return 1
    body["seconds"] = round(time.perf_counter() - start, 3)
    if args.output == "json":
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(render(body, args.all_devices) + "\n")
    return 0
