"""Benchmark: pod creation to container Running on a real node (not a test).

A real kubelet v1.37.1 and containerd v2.4.2 (built from Go modules, runc from
Debian), our plugin on an emulated dgx-a100, the real scheduler and
controller-manager. For each of N pods, one after another, each with a claim
template for one GPU:

    ``total``:  pod POST until the pod's container is ``running`` in the pod
                status (polled every 20 ms): claim from the template (KCM),
                allocation and binding (scheduler), the kubelet's sync (claim
                prepare through our plugin, sandbox, CNI, CDI injection, runc);
    ``plugin``: our plugin's own ``duration_ms`` for that claim (the claim GET
                plus device preparation, the time the kubelet waits on our
                NodePrepareResources).

Then the pod is deleted (the kubelet unprepares) before the next one.

    .venv/bin/python -m bench.real_pod_start [--pods 20] [--mode pod|host]

``--mode pod`` (default) runs the chart's DaemonSet from the locally built image
(its API calls go through the node's forwarder to the host's apiserver);
``host`` runs the same container command as a host process.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_driver.demo.chart import find_helm
from dra_driver.demo.pluginimage import build as build_image
from dra_driver.demo.pluginimage import image_cache
from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.demo.stack import RESOURCE_API, install_driver_objects
from dra_driver.devcluster import Cluster, find_binaries, wait_until
from dra_driver.devcluster.api import ApiError
from dra_driver.devcluster.binaries import find_node_binaries
from dra_driver.devcluster.node import NodeImage, RealNode, RealNodeOptions

ROOT = Path(__file__).resolve().parents[1]
NS = "bench"


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "main", "image": "busybox:1.36",
                            "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def running(cluster: Cluster, name: str) -> bool:
    obj = cluster.rest.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    statuses = obj.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0].get("state", {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--mode", choices=("pod", "host"), default="pod")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    cluster = Cluster(find_binaries(), work / "cluster")
    cluster.start()
    real = RealNode(cluster, find_node_binaries(), work / "n", RealNodeOptions())
    node: RealGpuNode | None = None
    ok = False
    try:
        t0 = time.monotonic()
        real.start()
        up_to_ready = time.monotonic() - t0
        install_driver_objects(cluster, ROOT / "deploy" / "manifests" / "dra-driver.yaml")
        common: dict[str, Any] = dict(
            cluster=cluster, node=real, profile="dgx-a100", workdir=real.paths.workdir / "gpu",
            helm=find_helm(ROOT), chart_dir=ROOT / "deploy" / "chart",
        )  # fmt: skip
        if args.mode == "pod":
            archive, ref = build_image(ROOT, image_cache())
            real.import_image(NodeImage(archive, ref))
            node = RealGpuNodePod(image=ref, **common)
        else:
            node = RealGpuNode(**common)
        node.start()
        cluster.create_namespace(NS)
        cluster.apply({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
        })  # fmt: skip
        totals, plugin = [], []
        for i in range(args.pods):
            name = f"p{i}"
            start = time.monotonic()
            cluster.rest.create(f"/api/v1/namespaces/{NS}/pods", pod(name, real.name))
            wait_until(lambda n=name: running(cluster, n), timeout=120, interval=0.02,  # type: ignore[misc]
                       what=f"pod {name} running")  # fmt: skip
            totals.append((time.monotonic() - start) * 1000)
            obj = cluster.rest.get(f"/api/v1/namespaces/{NS}/pods/{name}")
            claim_name = obj["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            uid = cluster.rest.get(f"{RESOURCE_API}/namespaces/{NS}/resourceclaims/{claim_name}")[
                "metadata"
            ]["uid"]
            records = [
                r for r in node.plugin_log_records()
                if r.get("claim_uid") == uid and r.get("msg", "").startswith("prepared")
            ]  # fmt: skip
            plugin.append(float(records[-1]["duration_ms"]))
            node.delete_pod(NS, name)
        ratios = sorted(p / t for p, t in zip(plugin, totals, strict=True))
        print(f"mode {args.mode}: node up to Ready {up_to_ready:.1f} s "
              f"(containerd, image import, kubelet)")  # fmt: skip
        q = statistics.quantiles(totals, n=10)
        print(
            f"pod creation -> container running, {args.pods} pods: p50 "
            f"{statistics.median(totals):.0f} ms, p90 {q[8]:.0f} ms, max {max(totals):.0f} ms"
        )
        print(f"our plugin's prepare: p50 {statistics.median(plugin):.1f} ms, "
              f"max {max(plugin):.1f} ms; share of the total (median per-pod ratio) "
              f"{statistics.median(ratios) * 100:.1f} %")  # fmt: skip
        ok = True
        return 0
    finally:
        if node is not None:
            try:
                node.stop()
            except ApiError:
                pass
        real.stop()
        cluster.stop()
        real.remove_workdir()
        if ok:  # a failed run keeps the cluster's dir: its logs
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
