"""``dra-driver simulate``: allocate claims offline exactly as the kube-scheduler would.

Reads ResourceSlices (e.g. from ``dra-driver slices --emulate``), Nodes,
DeviceClasses, ResourceClaims, ResourceClaimTemplates and Pods from files
(YAML streams, JSON, Lists; ``-`` is stdin; a directory means its *.yaml,
*.yml and *.json files) and/or a live cluster, and prints per claim whether it
is allocated, on which node, which devices, or why not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="FILE",
        help="objects to read (repeatable; '-' = stdin; a directory = its yaml/json files)",
    )
    parser.add_argument("--node", help="only consider this node")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "--kubeconfig",
        help="also read nodes, classes, slices and allocated claims (what is in use) "
        "from this cluster; only the claims from -f are simulated",
    )
    parser.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument(
        "--engine",
        choices=("cel-expr-python", "cel-python"),
        help="CEL engine (default: cel-expr-python when installed)",
    )
    parser.add_argument(
        "-n", "--namespace", default="default", help="namespace for objects without one"
    )


def read_files(paths: list[str]) -> list[Any]:
    import yaml

    objects: list[Any] = []
    for name in paths:
        if name == "-":
            objects.extend(yaml.safe_load_all(sys.stdin.read()))
            continue
        path = Path(name)
        files = (
            sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
            if path.is_dir()
            else [path]
        )
        for f in files:
            try:
                objects.extend(yaml.safe_load_all(f.read_text()))
            except OSError as err:
                raise SystemExit(f"dra-driver simulate: cannot read {f}: {err.strerror}") from None
            except yaml.YAMLError as err:
                raise SystemExit(f"dra-driver simulate: {f} is not YAML/JSON: {err}") from None
    return objects


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [("CLAIM", "ALLOCATED", "NODE", "DEVICES / REASON")]
    for r in rows:
        name = f"{r['namespace']}/{r['name']}"
        if r["allocated"]:
            devices = "; ".join(f"{k}: {', '.join(v)}" for k, v in r["devices"].items())
            if "nodeChoice" in r:
                devices += "  (node chosen at random among equals)"
            lines.append((name, "yes", r["node"], devices))
        else:
            lines.append((name, "no", "-", r["reason"]))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:3])) + "  " + line[3]
        for line in lines
    )


def run(args: argparse.Namespace) -> int:
    from dra_driver.allocation.inputs import build
    from dra_driver.allocation.inventory import Inventory
    from dra_driver.allocation.model import ModelError
    from dra_driver.allocation.simulation import Simulation
    from dra_driver.allocation.state import AllocatedState
    from dra_driver.cel import EngineUnavailable, SelectorEvaluator, load_engine

    if not args.filename and not args.kubeconfig:
        print("dra-driver simulate: give objects with -f FILE (or --kubeconfig)", file=sys.stderr)
        return 2
    objects: list[Any] = []
    if args.kubeconfig:
        from dra_driver.allocation.live import ClusterError, LiveCluster

        try:
            # The cluster's allocated claims hold devices; its pending ones are the
            # scheduler's business, not part of this simulation.
            objects.extend(
                obj
                for obj in LiveCluster(args.kubeconfig, args.context).objects()
                if obj["kind"] != "ResourceClaim" or (obj.get("status") or {}).get("allocation")
            )
        except ClusterError as err:
            print(f"dra-driver simulate: {err}", file=sys.stderr)
            return 1
    objects.extend(read_files(args.filename))
    try:
        evaluator = SelectorEvaluator(load_engine(args.engine))
        inputs = build(objects, args.namespace)
    except (EngineUnavailable, ModelError) as err:
        print(f"dra-driver simulate: {err}", file=sys.stderr)
        return 2
    nodes = inputs.implied_nodes()
    if args.node and all(n.name != args.node for n in nodes):
        print(f"dra-driver simulate: no node {args.node!r} in the input", file=sys.stderr)
        return 2
    inventory = Inventory(inputs.slices, inputs.classes, nodes, evaluator)
    simulation = Simulation(inventory, AllocatedState.from_claims(inputs.claims))
    start = time.perf_counter()
    outcomes = simulation.run(inputs.workloads, args.node)
    elapsed = time.perf_counter() - start
    rows = [o.as_json() for o in outcomes]
    if args.output == "json":
        body = {
            "engine": evaluator.engine_name,
            "nodes": len(nodes),
            "seconds": round(elapsed, 4),
            "claims": rows,
        }
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(rows) + "\n")
    return 0
