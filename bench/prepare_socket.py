"""Benchmark: GPU claim prepare/unprepare on the real socket path (not a test).

Starts the real control plane (dra_driver.devcluster), runs the shipped
``dra-driver kubelet-plugin`` command on an emulated ``dgx-h100`` node (8 GPUs,
emulated nvidia-smi / MPS tools as real processes) under the shipped RBAC with a
node-bound token, and acts as the kubelet: NodePrepareResources then
NodeUnprepareResources over the plugin's unix socket, for

- a claim with one GPU, a claim with all 8 GPUs, and a one-GPU MPS claim
  (config in ``status.allocation.devices.config``, as the scheduler copies it).

Every prepare includes the plugin's GET of the claim from the API server.
Run: ``.venv/bin/python -m bench.prepare_socket [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.plugin_socket import DRIVER, allocated_claim, bench_node, running_plugin, summary

NODE = "bench-gpu-node"
MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}


def _summary(ms: list[float]) -> dict[str, float]:
    return summary(ms, digits=2)


def _claim(cluster: Any, ns: str, name: str, devices: list[str], config: bool) -> str:
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": len(devices),
    }
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    opaque = [
        {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": MPS}}
    ]
    return allocated_claim(cluster, ns, name, exactly, results, opaque if config else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    from dra_driver.devcluster import Cluster, find_binaries

    work = Path(tempfile.mkdtemp(prefix="dra-prep-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        ns = "prep-bench"
        kubeconfig = bench_node(cluster, NODE, ns)
        gpus = [f"gpu-{i}" for i in range(8)]
        claims = {
            "1-gpu": ("one", _claim(cluster, ns, "one", gpus[:1], False)),
            "8-gpu": ("eight", _claim(cluster, ns, "eight", gpus, False)),
            "mps": ("mps", _claim(cluster, ns, "mps", gpus[1:2], True)),
        }
        flags = ["--emulate=dgx-h100"]
        with running_plugin(work, NODE, kubeconfig, flags, ns, stop_s=30) as (_, kubelet):

            def once(name: str, uid: str) -> tuple[float, float]:
                return kubelet.call("prepare", (name, uid)), kubelet.call("unprepare", (name, uid))

            report: dict[str, Any] = {"node": "emulated dgx-h100 via dra-driver kubelet-plugin"}
            for label, (name, uid) in claims.items():
                for _ in range(3):  # warm-up: connections, caches
                    once(name, uid)
                rounds = args.rounds if label != "mps" else max(5, args.rounds // 2)
                samples = [once(name, uid) for _ in range(rounds)]
                report[label] = {
                    "prepare": _summary([p for p, _ in samples]),
                    "unprepare": _summary([u for _, u in samples]),
                }
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
