"""Benchmark: ``/metrics`` with 64 prepared claims, plugin RSS, and the CPU cost of per-claim
GPU usage sampling (not a test).

Starts the real control plane and the shipped ``dra-driver kubelet-plugin`` on an emulated
node of 64 L4 GPUs (health monitor, metrics and usage sampling on, as the chart runs it),
then, as the kubelet, prepares 64 claims (one GPU each, each reserved for its own pod) over
the plugin's socket and puts two CUDA processes of each pod on its GPU (their cgroups name
the pod). Measures:

- plugin RSS idle (registered, published, nothing prepared) and with 64 prepared claims
  whose usage is being sampled;
- ``/metrics`` scrape latency (p50/p99 of ``--scrapes``) and body size;
- usage sampling cost: the plugin's own ``dra_driver_claim_usage_sampling_cpu_seconds``
  counter over a window, as CPU seconds per minute at the default 10 s interval, and the
  whole process's CPU per minute over the same window.

Run: ``.venv/bin/python -m bench.claims_metrics [--claims 64] [--window 60]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "bench-metrics"
COST = "dra_driver_claim_usage_sampling_cpu_seconds_total"
ROUNDS = "dra_driver_claim_usage_samples_total"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _profile(path: Path, gpus: int) -> None:
    lines = ["name: bench-64", "driverVersion: 580.95.05", "cudaDriverVersion: 13000", "gpus:"]
    for i in range(gpus):
        bus = 0x10 + i
        lines.append(f"  - {{model: L4, busId: '0000:{bus:02x}:00.0', pcieRoot: pci0000:{bus:02x},"
                     f" numaNode: {i % 2}}}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def _scrape(port: int) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - t0, body


def _value(body: bytes, name: str) -> float:
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=64)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries, wait_until
    from dra_driver.emulation import EmulatedNode
    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-bench-m-", dir="/tmp"))
    profile = work / "bench-64.yaml"
    _profile(profile, args.claims)
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node(NODE)
        kubeconfig = node_bound_kubeconfig(cluster, node)
        root = work / "host"
        argv = [
            sys.executable, "-m", "dra_driver", "--log-format=json", "kubelet-plugin",
            "--node-name", NODE, "--emulate", str(profile), "--host-root", str(root),
            "--cdi-dir", str(work / "cdi"), "--kubelet-registry-dir", str(work / "registry"),
            "--kubelet-plugins-dir", str(work / "plugins"), "--state-dir", str(work / "state"),
            "--kubeconfig", str(kubeconfig), "--rediscover-interval", "0", "--health-port", "0",
        ]  # fmt: skip
        log_path = work / "plugin.log"
        log = log_path.open("w")
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:

            def port() -> int | None:
                for line in log_path.read_text().splitlines():
                    if '"health endpoint listening"' in line:
                        return int(json.loads(line)["port"])
                return None

            health_port = wait_until(port, timeout=60, what="health port")

            def published() -> bool:
                items = cluster.rest.get(
                    "/apis/resource.k8s.io/v1/resourceslices",
                    {"fieldSelector": f"spec.nodeName={NODE}"},
                )["items"]
                return sum(len(s["spec"].get("devices") or []) for s in items) == args.claims

            wait_until(published, timeout=120, what="pool published")
            time.sleep(3)
            idle_rss = _rss_mb(child.pid)

            ns = "bench"
            cluster.create_namespace(ns)
            cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                           "metadata": {"name": "bench-gpu"}, "spec": {}})  # fmt: skip
            refs, pods = [], {}
            emulated = EmulatedNode.create(str(profile), root)
            for i in range(args.claims):
                name = f"claim-{i}"
                obj = cluster.apply({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "bench-gpu"}}]}},
                })  # fmt: skip
                # A real pod object (bound, never run: no kubelet here) that uses the claim,
                # or the resourceclaim controller drops it from reservedFor.
                pod = cluster.apply({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"pod-{i}", "namespace": ns},
                    "spec": {"nodeName": NODE,
                             "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                             "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                                             "resources": {"claims": [{"name": "gpu"}]}}]},
                })  # fmt: skip
                pod_uid = pod["metadata"]["uid"]
                minor = emulated.profile.gpus[i].minor
                obj["status"] = {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{minor}"}
                    ]}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
                    "reservedFor": [{"resource": "pods", "name": f"pod-{i}", "uid": pod_uid}],
                }  # fmt: skip
                cluster.rest.request(
                    "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                    obj,
                )  # fmt: skip
                refs.append(dra_v1_pb2.Claim(namespace=ns, name=name, uid=obj["metadata"]["uid"]))
                pods[i] = pod_uid
            channel = grpc.insecure_channel(f"unix:{work}/plugins/{DRIVER}/dra.sock")
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            t0 = time.perf_counter()
            resp = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=refs),
                                             timeout=120)  # fmt: skip
            prepare_s = time.perf_counter() - t0
            errors = [c.error for c in resp.claims.values() if c.error]
            if errors:
                raise SystemExit(f"prepare failed: {errors[:3]}")
            for i in range(args.claims):
                pid = 10000 + 2 * i
                emulated.set_processes(i, [
                    {"pid": pid, "usedMiB": 1024 + i, "smUtil": 5 + i % 50},
                    {"pid": pid + 1, "usedMiB": 512, "smUtil": 3},
                ], pods={pid: pods[i], pid + 1: pods[i]})  # fmt: skip

            def all_series() -> bool:
                body = _scrape(health_port)[1].decode()
                return body.count("dra_driver_claim_gpu_utilization_ratio{") == args.claims

            wait_until(all_series, timeout=120, what="usage series for every claim",
                       describe=lambda: "\n".join(
                           ln for ln in _scrape(health_port)[1].decode().splitlines()
                           if "claim" in ln)[-3000:])  # fmt: skip
            rss_64 = _rss_mb(child.pid)
            times, size = [], 0
            for _ in range(args.scrapes):
                took, body = _scrape(health_port)
                times.append(took * 1000)
                size = len(body)
            _, body = _scrape(health_port)
            cpu0, proc0, samples0 = _value(body, COST), _cpu_s(child.pid), _value(body, ROUNDS)
            time.sleep(args.window)
            _, body = _scrape(health_port)
            cpu1, proc1, samples1 = _value(body, COST), _cpu_s(child.pid), _value(body, ROUNDS)
            per_sample = (cpu1 - cpu0) / max(1.0, samples1 - samples0)
            result: dict[str, Any] = {
                "claims": args.claims,
                "prepare_64_in_one_call_s": round(prepare_s, 3),
                "rss_idle_mb": round(idle_rss, 1),
                "rss_64_claims_sampling_mb": round(rss_64, 1),
                "scrape_ms": {
                    "p50": round(statistics.median(times), 2),
                    "p99": round(_pct(times, 0.99), 2),
                },
                "scrape_bytes": size,
                "usage_sample_cpu_ms": round(per_sample * 1000, 2),
                "usage_sampling_cpu_s_per_min_at_10s": round(per_sample * 6, 4),
                "process_cpu_s_per_min": round((proc1 - proc0) * 60 / args.window, 3),
                "window_s": args.window,
                "loadavg": os.getloadavg()[0],
            }
            print(json.dumps(result, indent=2))
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            log.close()
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
