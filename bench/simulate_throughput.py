"""Benchmark: ``simulate`` claims per second on the scheduler_perf DRA shape (not a test).

Shape of scheduler_perf's ``SchedulingWithResourceClaimTemplate/5000pods_500nodes``
with the CEL selector of ``selector_empty_500nodes``: 500 nodes, one
ResourceSlice each with 10 devices (attributes model, family, driverVersion,
numa; capacity memory=1Gi), a DeviceClass selecting the driver, one pod per
claim template asking for one device with one CEL selector. The first
``--init`` pods fill the cluster untimed, the next ``--measured`` are timed
(the Go scheduler's published ~240 pods/s on a 6-core box is for this
measured phase). Every node is tried for every pod (the simulation must know
whether the choice is random); the scheduler stops filtering once it has a
sample of feasible nodes (46 % of 500 by default), so it does less work.
``--distinct`` gives every claim its own selector, which defeats the per-node
memo of identical claims (the worst case).

Run: ``.venv/bin/python -m bench.simulate_throughput [--engine E] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from dra_driver.allocation.inputs import build
from dra_driver.allocation.inventory import Inventory
from dra_driver.allocation.simulation import Simulation
from dra_driver.allocation.state import AllocatedState
from dra_driver.cel import SelectorEvaluator, load_engine

DRIVER = "test-driver.cdi.k8s.io"
SELECTOR = (
    f'device.attributes["{DRIVER}"].driverVersion.major() >= 1 && '
    f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("1Mi"))'
)


def objects(nodes: int, devices: int, pods: int, distinct: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "kind": "DeviceClass",
            "metadata": {"name": "test-class"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        {
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "test-claim-template", "namespace": "default"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "req-1",
                                "exactly": {
                                    "deviceClassName": "test-class",
                                    "selectors": [{"cel": {"expression": SELECTOR}}],
                                },
                            }
                        ]
                    }
                }
            },
        },
    ]
    for n in range(nodes):
        node = f"scheduler-perf-dra-{n:04d}"
        labels = {"kubernetes.io/hostname": node}
        out.append({"kind": "Node", "metadata": {"name": node, "labels": labels}})
        out.append(
            {
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-slice"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": f"device-{d}",
                            "attributes": {
                                "model": {"string": "gpu-model-x"},
                                "family": {"string": "gpu"},
                                "driverVersion": {"version": "1.2.3"},
                                "numa": {"int": d % 2},
                            },
                            "capacity": {"memory": {"value": "1Gi"}},
                        }
                        for d in range(devices)
                    ],
                },
            }
        )
    for p in range(pods):
        if distinct:
            # Worst case for the per-node memo: every claim has its own selector.
            expr = f"{SELECTOR} && {p} >= 0"
            request = {
                "name": "req-1",
                "exactly": {
                    "deviceClassName": "test-class",
                    "selectors": [{"cel": {"expression": expr}}],
                },
            }
            out.append({"kind": "ResourceClaim",
                        "metadata": {"name": f"claim-{p:05d}", "namespace": "default"},
                        "spec": {"devices": {"requests": [request]}}})  # fmt: skip
            ref = {"name": "resource", "resourceClaimName": f"claim-{p:05d}"}
        else:
            ref = {"name": "resource", "resourceClaimTemplateName": "test-claim-template"}
        out.append(
            {
                "kind": "Pod",
                "metadata": {"name": f"pod-{p:05d}", "namespace": "default"},
                "spec": {"resourceClaims": [ref]},
            }
        )
    return out


def one_round(
    engine: str, nodes: int, devices: int, init: int, measured: int, distinct: bool = False
) -> dict[str, float]:
    inputs = build(objects(nodes, devices, init + measured, distinct))
    evaluator = SelectorEvaluator(load_engine(engine))
    inventory = Inventory(inputs.slices, inputs.classes, inputs.implied_nodes(), evaluator)
    sim = Simulation(inventory, AllocatedState.from_claims(inputs.claims))
    t0 = time.perf_counter()
    first = sim.run(inputs.workloads[:init])
    t1 = time.perf_counter()
    second = sim.run(inputs.workloads[init:])
    t2 = time.perf_counter()
    allocated = sum(o.allocated for o in first + second)
    return {
        "init_claims_per_s": init / (t1 - t0),
        "measured_claims_per_s": measured / (t2 - t1),
        "allocated": allocated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", action="append", help="cel-expr-python and/or cel-python")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--devices", type=int, default=10)
    parser.add_argument("--init", type=int, default=2500)
    parser.add_argument("--measured", type=int, default=2490)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--distinct", action="store_true", help="a different selector per claim (no memo hits)"
    )
    args = parser.parse_args()
    report = {}
    for engine in args.engine or ["cel-expr-python", "cel-python"]:
        rounds = [
            one_round(engine, args.nodes, args.devices, args.init, args.measured, args.distinct)
            for _ in range(args.rounds)
        ]
        report[engine] = {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]}
        print(engine, json.dumps(report[engine]), flush=True)


if __name__ == "__main__":
    main()
