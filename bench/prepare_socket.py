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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "bench-gpu-node"
MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}


def _summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(p99, 2)}


def _claim(cluster: Any, ns: str, name: str, devices: list[str], config: bool) -> str:
    obj = cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "allocationMode": "ExactCount",
                                "count": len(devices),
                            },
                        }
                    ]
                }
            },
        }
    )
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
            ]
        }
    }
    if config:
        allocation["devices"]["config"] = [
            {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": MPS}}
        ]
    obj["status"] = {"allocation": allocation}
    cluster.rest.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status", obj
    )
    return str(obj["metadata"]["uid"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries
    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-prep-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node(NODE)
        kubeconfig = node_bound_kubeconfig(cluster, node)
        ns = "prep-bench"
        cluster.create_namespace(ns)
        gpus = [f"gpu-{i}" for i in range(8)]
        claims = {
            "1-gpu": ("one", _claim(cluster, ns, "one", gpus[:1], False)),
            "8-gpu": ("eight", _claim(cluster, ns, "eight", gpus, False)),
            "mps": ("mps", _claim(cluster, ns, "mps", gpus[1:2], True)),
        }
        plugins = work / "plugins"
        child = subprocess.Popen(
            [
                sys.executable, "-m", "dra_driver", "kubelet-plugin",
                f"--node-name={NODE}", f"--driver-name={DRIVER}", "--emulate=dgx-h100",
                f"--host-root={work / 'host'}", f"--cdi-dir={work / 'cdi'}",
                f"--state-dir={work / 'state'}", f"--kubelet-registry-dir={work / 'registry'}",
                f"--kubelet-plugins-dir={plugins}", f"--kubeconfig={kubeconfig}",
            ],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            sock = plugins / DRIVER / "dra.sock"
            deadline = time.monotonic() + 60
            while not sock.exists():
                if time.monotonic() > deadline or child.poll() is not None:
                    raise SystemExit("plugin did not start")
                time.sleep(0.1)
            stub = dra_v1_pb2_grpc.DRAPluginStub(grpc.insecure_channel(f"unix:{sock}"))

            def once(name: str, uid: str) -> tuple[float, float]:
                ref = dra_v1_pb2.Claim(namespace=ns, name=name, uid=uid)
                start = time.perf_counter()
                resp = stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=45
                )
                prep = (time.perf_counter() - start) * 1000
                if resp.claims[uid].error:
                    raise SystemExit(f"prepare {name}: {resp.claims[uid].error}")
                start = time.perf_counter()
                resp2 = stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=45
                )
                unprep = (time.perf_counter() - start) * 1000
                if resp2.claims[uid].error:
                    raise SystemExit(f"unprepare {name}: {resp2.claims[uid].error}")
                return prep, unprep

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
        finally:
            child.terminate()
            child.wait(timeout=30)
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
