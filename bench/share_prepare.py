"""Benchmark: fractional GPU shares prepared through the shipped plugin (not a test).

Starts the real control plane and the shipped ``dra-driver kubelet-plugin
--consumable-gpus=all`` on an emulated 2 x H100 node with an r615 driver
(``tests/e2e/data/h100-r615.yaml``; emulated ``nvidia-smi`` and MPS control
daemons as real processes), and acts as the kubelet over the plugin's socket,
each claim's allocation (share ID, consumedCapacity) written as the scheduler
would. Measures, on one GPU:

- the first share's prepare (the GPU to EXCLUSIVE_PROCESS, dirs, tmpfs, its
  MPS daemon, limits) and unprepare (the last share: the GPU back to DEFAULT);
- a later share's prepare/unprepare beside one prepared share;
- shares prepared one after another, all kept: prepare latency against the
  number already prepared, and where it first reaches twice the latency of the
  first later shares (median of shares 2-6; sustained over the next 3);
- the plugin process's RSS idle and with 48 shares prepared.

Run (root, for the tmpfs mounts): ``.venv/bin/python -m bench.share_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "bench-share-node"
PROFILE = Path(__file__).parents[1] / "tests" / "e2e" / "data" / "h100-r615.yaml"


def _summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(p99, 1)}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise SystemExit(f"no VmRSS for {pid}")


def _share(cluster: Any, ns: str, name: str, memory: str) -> str:
    """A claim with one share of gpu-0, allocated as the scheduler records it."""
    obj = cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "capacity": {"requests": {"memory": memory}},
            }}]}},
        }
    )  # fmt: skip
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": memory, "computeShare": "0"},
    }
    obj["status"] = {"allocation": {"devices": {"results": [result]}}}
    cluster.rest.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status", obj
    )
    return str(obj["metadata"]["uid"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shares", type=int, default=64, help="shares kept for the scaling run")
    args = parser.parse_args()

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries
    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-share-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node(NODE)
        kubeconfig = node_bound_kubeconfig(cluster, node)
        ns = "share-bench"
        cluster.create_namespace(ns)
        n = max(args.shares, 48)
        claims = [(f"s{i}", _share(cluster, ns, f"s{i}", "1Gi")) for i in range(n + 2)]
        plugins = work / "plugins"
        child = subprocess.Popen(
            [
                sys.executable, "-m", "dra_driver", "kubelet-plugin",
                f"--node-name={NODE}", f"--driver-name={DRIVER}", f"--emulate={PROFILE}",
                "--consumable-gpus=all",
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
            report: dict[str, Any] = {"node": "emulated 2 x H100, driver 615.20.01"}
            report["plugin_rss_idle_mb"] = _rss_mb(child.pid)
            first, last = [], []
            for _ in range(args.rounds + 2):
                first.append(call("prepare", claims[0]))
                last.append(call("unprepare", claims[0]))
            report["first_share"] = {
                "prepare": _summary(first[2:]),
                "unprepare_last": _summary(last[2:]),
            }
            call("prepare", claims[0])
            later, later_un = [], []
            for _ in range(args.rounds + 2):
                later.append(call("prepare", claims[1]))
                later_un.append(call("unprepare", claims[1]))
            report["later_share"] = {
                "prepare": _summary(later[2:]),
                "unprepare": _summary(later_un[2:]),
            }
            call("unprepare", claims[0])

            scaling = [call("prepare", c) for c in claims[:n]]
            report["plugin_rss_with_shares_mb"] = {
                "shares": n,
                "rss": _rss_mb(child.pid),
            }
            base = statistics.median(scaling[1:6])
            doubled = next(
                (i + 1 for i in range(6, len(scaling) - 3) if min(scaling[i : i + 3]) >= 2 * base),
                None,
            )
            report["scaling"] = {
                "base_ms": round(base, 1),
                "prepare_ms_by_count": {
                    str(i + 1): round(ms, 1)
                    for i, ms in enumerate(scaling)
                    if i + 1 in (1, 2, 8, 16, 24, 32, 40, 48, 56, 64) or i + 1 == n
                },
                "shares_prepared_when_latency_doubled": doubled,
            }
            # RSS at exactly 48 shares: measured on the way back down.
            for c in reversed(claims[48:n]):
                call("unprepare", c)
            report["plugin_rss_48_shares_mb"] = _rss_mb(child.pid)
            unprep = [call("unprepare", c) for c in reversed(claims[:48])]
            report["unprepare_48_shares"] = _summary(unprep)
        finally:
            child.terminate()
            child.wait(timeout=60)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
