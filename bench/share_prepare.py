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
- with k shares kept prepared (1, 2, 4, ... 80), the median prepare of one more
  share (``--probes`` tries on the way up and as many on the way down, each
  unprepared again), the first k at which it is twice the median with one
  share, and the plugin's own CPU time per probe (its tools' excluded);
- the plugin process's RSS idle and with 48 shares prepared.

Run (root, for the tmpfs mounts): ``.venv/bin/python -m bench.share_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def _cpu_ms(pid: int) -> float:
    """User + system CPU time of the process itself (not its children), ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


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
    parser.add_argument("--shares", type=int, default=80, help="most shares kept prepared")
    parser.add_argument("--probes", type=int, default=7, help="probe prepares per level")
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
        claims = [(f"s{i}", _share(cluster, ns, f"s{i}", "512Mi")) for i in range(n + 2)]
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

            # Scaling: with k shares kept prepared, prepare+unprepare a probe share
            # --probes times, on the way up (k growing) and again on the way down, so
            # drift in the machine's load hits every level alike. Wall time (tool
            # processes included) and the plugin's own CPU time per probe.
            levels = [k for k in (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80) if k <= n]
            probe = claims[n]
            wall: dict[int, list[float]] = {k: [] for k in levels}
            cpu: dict[int, list[float]] = {k: [] for k in levels}

            def probes(k: int) -> None:
                for _ in range(args.probes):
                    before = _cpu_ms(child.pid)
                    wall[k].append(call("prepare", probe))
                    call("unprepare", probe)
                    cpu[k].append(_cpu_ms(child.pid) - before)

            kept = 0
            for k in levels:
                while kept < k:
                    call("prepare", claims[kept])
                    kept += 1
                if k == 48:
                    report["plugin_rss_48_shares_mb"] = _rss_mb(child.pid)
                probes(k)
            report["plugin_rss_with_shares_mb"] = {"shares": kept, "rss": _rss_mb(child.pid)}
            unprep = []
            for k in reversed(levels):
                while kept > k:
                    kept -= 1
                    unprep.append(call("unprepare", claims[kept]))
                probes(k)
            base = statistics.median(wall[1])
            report["scaling"] = {
                "probe_prepare_p50_ms_with_k_shares": {
                    str(k): round(statistics.median(v), 1) for k, v in wall.items()
                },
                "ratio_to_one_share": {
                    str(k): round(statistics.median(v) / base, 2) for k, v in wall.items()
                },
                "first_k_at_2x": next(
                    (k for k, v in wall.items() if statistics.median(v) >= 2 * base), None
                ),
                "plugin_cpu_ms_per_probe_p50": {
                    str(k): round(statistics.median(v), 1) for k, v in cpu.items()
                },
            }
            report["unprepare_with_k_shares"] = _summary(unprep)
            call("unprepare", claims[0])
        finally:
            child.terminate()
            child.wait(timeout=60)
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
