"""Benchmark: NodePrepareResources round trip through the real socket (not a test).

Starts the real control plane (dra_driver.devcluster), runs the plugin in a
separate process under the shipped RBAC with a node-bound token and a trivial
in-memory backend, and acts as the kubelet from this process:

- 1 claim: sequential single-claim calls, p50/p99;
- 16 concurrent claims: 16 threads each sending a single-claim call at once;
  p50/p99 of the per-call latency (plus one call carrying all 16 claims);
- idle RSS of the plugin process after it registered and published.

Every call includes the plugin's GET of the claim from the real API server.
Run: ``.venv/bin/python -m bench.plugin_prepare [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DRIVER = "gpu.bench.example.com"


# -- plugin side (runs in the child process) ---------------------------------


class BenchBackend:
    """Instant backend: measures the plugin layer, not a driver."""

    supports_parallel_claims = True

    def __init__(self, devices: int) -> None:
        from dra_driver.plugin.resources import Device, Pool

        self._pool = Pool(devices=tuple(Device(f"gpu-{i}") for i in range(devices)))

    def prepare(self, claim: Any) -> list[Any]:
        from dra_driver.plugin.claims import PreparedDevice

        return [
            PreparedDevice((d.base_request,), d.pool, d.device, (f"{DRIVER}/gpu={claim.uid}",))
            for d in claim.devices
        ]

    def unprepare(self, claim: Any) -> None:
        pass

    def prepared_claims(self) -> list[Any]:
        return []

    def pool(self) -> Any:
        return self._pool


def serve(args: argparse.Namespace) -> int:
    from dra_driver.plugin.app import KubeletPlugin, PluginSettings

    logging.basicConfig(level=logging.WARNING)
    plugin = KubeletPlugin(
        settings=PluginSettings(
            driver_name=DRIVER,
            node_name=args.node,
            registry_dir=Path(args.dir) / "registry",
            plugins_dir=Path(args.dir) / "plugins",
            kubeconfig=Path(args.kubeconfig),
        ),
        backend=BenchBackend(8),
        logger=logging.getLogger("bench.plugin"),
    )
    plugin.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not (plugin.publisher and plugin.publisher.status.in_sync):
        time.sleep(0.05)
    print("READY", flush=True)
    stop.wait()
    plugin.stop(uninstall=True)
    return 0


# -- kubelet side -------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(_pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--node", default="")
    parser.add_argument("--dir", default="")
    parser.add_argument("--kubeconfig", default="")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    if args.serve:
        return serve(args)

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries
    from dra_driver.plugin._proto import dra_v1_pb2, dra_v1_pb2_grpc
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node("bench-node")
        kubeconfig = node_bound_kubeconfig(cluster, node)
        ns = "bench"
        cluster.create_namespace(ns)
        claims = []
        for i in range(17):
            name = f"claim-{i}"
            obj = cluster.apply(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "bench"}}]
                        }
                    },
                }
            )
            obj["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": "bench-node",
                                "device": f"gpu-{i % 8}",
                            }
                        ]
                    }
                }
            }
            cluster.rest.request(
                "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status", obj
            )
            claims.append(dra_v1_pb2.Claim(namespace=ns, name=name, uid=obj["metadata"]["uid"]))

        t0 = time.monotonic()
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.plugin_prepare",
                "--serve",
                "--node=bench-node",
                f"--dir={work}",
                f"--kubeconfig={kubeconfig}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        if child.stdout.readline().strip() != "READY":
            raise SystemExit("plugin did not become ready")
        ready_s = time.monotonic() - t0
        try:
            time.sleep(3)
            idle_rss_kb = _rss_kb(child.pid)
            channel = grpc.insecure_channel(f"unix:{work}/plugins/{DRIVER}/dra.sock")
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)

            def call(batch: list[Any]) -> float:
                start = time.perf_counter()
                resp = stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=batch), timeout=45
                )
                elapsed = (time.perf_counter() - start) * 1000
                errors = [c.error for c in resp.claims.values() if c.error]
                if errors or len(resp.claims) != len(batch):
                    raise SystemExit(f"prepare failed: {errors}")
                return elapsed

            for _ in range(20):  # warm up connections
                call([claims[16]])
            single = [call([claims[16]]) for _ in range(args.rounds)]
            concurrent: list[float] = []
            with ThreadPoolExecutor(16) as pool:
                for _ in range(max(1, args.rounds // 16)):
                    concurrent += list(pool.map(lambda c: call([c]), claims[:16]))
            batch16 = [call(claims[:16]) for _ in range(max(1, args.rounds // 16))]
            rss_after_kb = _rss_kb(child.pid)
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=20)

    report = {
        "cpu_count": os.cpu_count(),
        "plugin_start_to_ready_s": round(ready_s, 2),
        "idle_rss_mb": round(idle_rss_kb / 1024, 1),
        "rss_after_load_mb": round(rss_after_kb / 1024, 1),
        "prepare_1_claim": _summary(single),
        "prepare_16_concurrent_calls": _summary(concurrent),
        "prepare_one_call_16_claims": _summary(batch16),
    }
    print(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
