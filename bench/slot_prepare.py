"""Benchmark: MPS slots prepared through the shipped plugin (not a test).

Starts the real control plane and the shipped ``dra-driver kubelet-plugin
--mps-slots="NVIDIA A100-SXM4-80GB=4"`` on an emulated DGX A100 (8 GPUs, driver
580: one MPS daemon per GPU serves its 4 slots; emulated ``nvidia-smi`` and
daemons as real processes), and acts as the kubelet over the plugin's socket,
each claim's allocation (share ID, one slot's consumedCapacity) written as the
scheduler would. Measures:

- the first slot of a GPU (its earlier compute mode read, the GPU to
  EXCLUSIVE_PROCESS, dirs, tmpfs, the GPU's daemon, its one-slot defaults) and
  the unprepare of its last slot (daemon quit, tmpfs, dirs, mode restored);
- a later slot's prepare/unprepare beside one prepared slot (nothing but
  records, a daemon check and the CDI spec);
- the plugin's RSS idle and with all 32 slots (8 GPUs x 4) prepared.

Run (root, for the tmpfs mounts): ``.venv/bin/python -m bench.slot_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.share_prepare import _rss_mb, _summary

DRIVER = "gpu.nvidia.com"
NODE = "bench-slot-node"
SLOTS = "NVIDIA A100-SXM4-80GB=4"
SLOT = {"memory": "20Gi", "computeShare": "25"}


def _slot(cluster: Any, ns: str, name: str, device: str) -> str:
    """A claim with one slot of ``device``, allocated as the scheduler records it."""
    obj = cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
            }}]}},
        }
    )  # fmt: skip
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
              "shareID": str(uuid.uuid4()), "consumedCapacity": SLOT}  # fmt: skip
    obj["status"] = {"allocation": {"devices": {"results": [result]}}}
    cluster.rest.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status", obj
    )
    return str(obj["metadata"]["uid"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries
    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-slot-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node(NODE)
        kubeconfig = node_bound_kubeconfig(cluster, node)
        ns = "slot-bench"
        cluster.create_namespace(ns)
        gpus = [f"gpu-{m}" for m in range(8)]
        claims = {
            (g, i): (f"{g}-s{i}", _slot(cluster, ns, f"{g}-s{i}", g))
            for g in gpus
            for i in range(4)
        }
        plugins = work / "plugins"
        child = subprocess.Popen(
            [
                sys.executable, "-m", "dra_driver", "kubelet-plugin",
                f"--node-name={NODE}", f"--driver-name={DRIVER}", "--emulate=dgx-a100",
                f"--mps-slots={SLOTS}",
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

            def call(kind: str, claim: tuple[str, str]) -> float:
                ref = dra_v1_pb2.Claim(namespace=ns, name=claim[0], uid=claim[1])
                start = time.perf_counter()
                if kind == "prepare":
                    resp: Any = stub.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=45
                    )
                else:
                    resp = stub.NodeUnprepareResources(
                        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=45
                    )
                elapsed = (time.perf_counter() - start) * 1000
                if resp.claims[claim[1]].error:
                    raise SystemExit(f"{kind} {claim[0]}: {resp.claims[claim[1]].error}")
                return elapsed

            time.sleep(1)
            report: dict[str, Any] = {"node": "emulated DGX A100 (8 x 80GB), driver 580.95.05"}
            report["plugin_rss_idle_mb"] = _rss_mb(child.pid)
            first, last = [], []
            for _ in range(args.rounds + 2):
                first.append(call("prepare", claims[("gpu-0", 0)]))
                last.append(call("unprepare", claims[("gpu-0", 0)]))
            report["first_slot"] = {
                "prepare": _summary(first[2:]),
                "unprepare_last": _summary(last[2:]),
            }
            call("prepare", claims[("gpu-0", 0)])
            later, later_un = [], []
            for _ in range(args.rounds + 2):
                later.append(call("prepare", claims[("gpu-0", 1)]))
                later_un.append(call("unprepare", claims[("gpu-0", 1)]))
            report["later_slot"] = {
                "prepare": _summary(later[2:]),
                "unprepare": _summary(later_un[2:]),
            }
            fill_first, fill_later = [], []
            for (g, i), claim in sorted(claims.items()):
                if (g, i) == ("gpu-0", 0):
                    continue
                (fill_later if i else fill_first).append(call("prepare", claim))
            report["filling_32_slots"] = {
                "first_of_a_gpu": _summary(fill_first),
                "later": _summary(fill_later),
            }
            daemons = len(list((work / "state" / "mps").iterdir()))
            report["plugin_rss_32_slots_mb"] = _rss_mb(child.pid)
            report["daemons_with_32_slots"] = daemons
            for claim in claims.values():
                call("unprepare", claim)
        finally:
            child.terminate()
            child.wait(timeout=60)
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
