"""Benchmark: ``dra-driver explain`` latency for a pending claim on a 500-node cluster (not a test).

A real control plane (dra_driver.devcluster) with the scheduler_perf shape
of bench.simulate_throughput (500 Ready nodes, one ResourceSlice of 10
devices each) and a pod whose claim asks for 11 devices, so the real
scheduler leaves it pending. Measured: ``explain`` in-process, including
reading nodes, classes, slices, claims and pods from the API server (median
of ``--rounds``), and the ``dra-driver explain`` command's wall time in a
fresh interpreter.

Run: ``DRA_K8S_BIN_DIR=$(scripts/build-k8s.sh) .venv/bin/python -m bench.explain_latency``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.simulate_throughput import DRIVER, SELECTOR, objects
from dra_driver.cli import main as cli
from dra_driver.devcluster import Cluster, find_binaries, wait_until

RESOURCE = "/apis/resource.k8s.io/v1"


def populate(cluster: Cluster, nodes: int) -> None:
    for obj in objects(nodes, 10, 0):
        kind = obj.pop("kind")
        if kind == "Node":
            cluster.create_node(obj["metadata"]["name"])
        elif kind == "ResourceSlice":
            cluster.rest.create(
                f"{RESOURCE}/resourceslices", {"apiVersion": "resource.k8s.io/v1", **obj}
            )
        elif kind == "DeviceClass":
            cluster.rest.create(
                f"{RESOURCE}/deviceclasses", {"apiVersion": "resource.k8s.io/v1", **obj}
            )
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": "test-class",
            "count": 11,
            "selectors": [{"cel": {"expression": SELECTOR}}],
        },
    }
    cluster.rest.create(
        f"{RESOURCE}/namespaces/default/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "eleven"},
            "spec": {"devices": {"requests": [request]}},
        },
    )
    cluster.rest.create("/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "eleven"},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "eleven"}],
                 "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                                 "resources": {"claims": [{"name": "gpus"}]}}]}})  # fmt: skip

    def pending() -> str | None:
        pod = cluster.rest.get("/api/v1/namespaces/default/pods/eleven")
        for c in (pod.get("status") or {}).get("conditions") or ():
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message"))
        return None

    print("scheduler:", wait_until(pending, timeout=120, what="pod pending"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dra-explain-bench-") as tmp:
        cluster = Cluster(find_binaries(), Path(tmp))
        with cluster:
            t0 = time.perf_counter()
            populate(cluster, args.nodes)
            print(f"populated {args.nodes} nodes in {time.perf_counter() - t0:.1f} s", flush=True)
            argv = ["explain", "eleven", "--kubeconfig", str(cluster.kubeconfig), "-o", "json"]
            times = []
            for _ in range(args.rounds):
                buf = io.StringIO()
                t0 = time.perf_counter()
                with contextlib.redirect_stdout(buf):
                    assert cli(argv) == 0
                times.append(time.perf_counter() - t0)
            body = json.loads(buf.getvalue())
            assert not body["allocated"] and len(body["nodes"]) == args.nodes
            walls = []
            for _ in range(3):
                t0 = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "dra_driver", *argv], check=True, capture_output=True
                )
                walls.append(time.perf_counter() - t0)
            print(json.dumps({
                "nodes": args.nodes, "devices": args.nodes * 10, "driver": DRIVER,
                "explain_in_process_s_median": round(statistics.median(times), 3),
                "explain_in_process_s_max": round(max(times), 3),
                "explain_command_wall_s_median": round(statistics.median(walls), 3),
                "reported_fits": sum(n["fits"] for n in body["nodes"]),
            }))  # fmt: skip


if __name__ == "__main__":
    main()
