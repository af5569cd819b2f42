"""Benchmark: NVML event to taint in the API server, and to the kubelet's health stream.

Starts the real control plane, runs the shipped ``dra-driver kubelet-plugin
--emulate l4-x4`` as a process under the chart's RBAC with a node-bound token,
and from this process (as the GPU driver and the kubelet would):

- opens the plugin's ``v1.DRAResourceHealth`` stream over its socket, as the
  kubelet does, and watches the node's ResourceSlices in the API server;
- ``--rounds`` times writes an Xid for one of the 4 GPUs to the emulated node's
  control file (each round a new Xid number, so every round is a change: the
  taint's value and the stream's message name it) and timestamps when the taint
  with that value appears in a watched slice, and when the stream carries the
  device's new message.

What is measured is the whole path: the emulated driver's event wait (it polls
the control file every 20 ms, which a real driver's event does not need), the
monitor, the republish (GET node, LIST and PUT of the slice), the API server's
watch fan-out; and the health hub's push. Run: ``.venv/bin/python -m
bench.health_events [--rounds N]``.
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
import threading
import time
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(_pct(ms, 0.99), 1), "max_ms": round(max(ms), 1)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()

    import grpc

    from dra_driver.devcluster import Cluster, find_binaries, wait_until
    from dra_driver.emulation import EmulatedNode
    from dra_driver.plugin._proto import health_v1_pb2, health_v1_pb2_grpc
    from dra_driver.plugin.kubeclient import KubeClient, KubeError
    from tests.plugin.clusterkit import apply_rbac, node_bound_kubeconfig

    work = Path(tempfile.mkdtemp(prefix="dra-bench-h-", dir="/tmp"))
    with Cluster(find_binaries(), work / "cluster") as cluster:
        apply_rbac(cluster)
        node = cluster.create_node("bench-health")
        kubeconfig = node_bound_kubeconfig(cluster, node)
        root = work / "host"
        argv = [
            sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", "bench-health",
            "--emulate", "l4-x4", "--host-root", str(root), "--cdi-dir", str(work / "cdi"),
            "--kubelet-registry-dir", str(work / "registry"),
            "--kubelet-plugins-dir", str(work / "plugins"), "--kubeconfig", str(kubeconfig),
            "--rediscover-interval", "0",
        ]  # fmt: skip
        log = (work / "plugin.log").open("w")
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "DRA_LOG_LEVEL": "warning"})  # fmt: skip
        try:
            client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
            selector = f"spec.nodeName=bench-health,spec.driver={DRIVER}"

            def devices() -> int:
                items = client.list_resource_slices(selector).get("items") or []
                return sum(len(s["spec"].get("devices") or []) for s in items)

            wait_until(lambda: devices() == 4, timeout=60, what="pool published")
            emulated = EmulatedNode.create("l4-x4", root)  # the node as the GPU driver sees it

            taints: dict[tuple[str, str], float] = {}  # (device, xid) -> first seen
            messages: dict[tuple[str, str], float] = {}
            stop = threading.Event()
            watches: list[Any] = []

            def watch_slices() -> None:
                rv = str(client.list_resource_slices(selector)["metadata"]["resourceVersion"])
                watch = client.watch_resource_slices(selector, rv, timeout_s=600)
                watches.append(watch)
                try:
                    for _kind, obj in watch:
                        now = time.perf_counter()
                        for d in obj["spec"].get("devices") or []:
                            for t in d.get("taints") or []:
                                taints.setdefault((d["name"], t.get("value", "")), now)
                        if stop.is_set():
                            return
                except KubeError:
                    if not stop.is_set():
                        raise

            def watch_stream() -> None:
                channel = grpc.insecure_channel(f"unix:{work}/plugins/{DRIVER}/dra.sock")
                stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    health_v1_pb2.NodeWatchResourcesRequest(), timeout=3600
                )
                for msg in stream:
                    now = time.perf_counter()
                    for d in msg.devices:
                        if d.message.startswith("Xid "):
                            xid = d.message.split()[1]
                            messages.setdefault((d.device.device_name, xid), now)
                    if stop.is_set():
                        stream.cancel()
                        return

            threads = [
                threading.Thread(target=f, daemon=True) for f in (watch_slices, watch_stream)
            ]
            for t in threads:
                t.start()
            time.sleep(1.0)
            minors = {g.index: g.minor for g in emulated.profile.gpus}
            to_taint, to_stream = [], []
            for i in range(args.rounds):
                gpu = i % 4
                xid = str(1000 + i)  # not a known Xid: makes the device unusable (NoSchedule)
                key = (f"gpu-{minors[gpu]}", xid)
                t0 = time.perf_counter()
                emulated.inject_xid(gpu, int(xid))
                wait_until(lambda k=key: k in taints and k in messages, timeout=30,
                           what=f"round {i}")  # fmt: skip
                to_taint.append((taints[key] - t0) * 1000)
                to_stream.append((messages[key] - t0) * 1000)
                time.sleep(0.1)
            stop.set()
            for w in watches:  # an open watch kept the API server from stopping for 10 s
                w.close()
            client.close()
            result: dict[str, Any] = {
                "rounds": args.rounds,
                "event_to_taint_in_api_server": _summary(to_taint),
                "event_to_health_stream": _summary(to_stream),
                "loadavg": os.getloadavg()[0],
            }
            print(json.dumps(result, indent=2))
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
            log.close()
    shutil.rmtree(work, ignore_errors=True)  # a failed run keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
