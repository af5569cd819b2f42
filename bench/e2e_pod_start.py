"""Benchmark: pod creation to container running, through the whole stack (not a test).

One emulated dgx-a100 node: our plugin (subprocess, chart RBAC, node-bound
token), the kubelet's own DRA code (Go kubelet harness), the real scheduler and
controller-manager, the real CDI library and runc. For each of N pods (one
after another, each with a claim template for one GPU):

    ``schedule``: pod POST until spec.nodeName is set (the KCM creates the claim
                  from the template, the scheduler allocates a GPU and binds);
    ``prepare``:  the kubelet's PrepareResources (claim GET and checks,
                  NodePrepareResources, checkpoint), as the harness replies;
    ``in_kubelet_code``: of that, time inside the harness (pod GET, PrepareResources,
                  GetResources), without the stdin/stdout hop;
    ``plugin``:   of that, our plugin's NodePrepareResources round trip, from the
                  kubelet code's own klog lines "Calling/Done calling ... rpc";
    ``runtime``:  CDI injection by the real library + ``runc run`` of the container.

``total`` = creation to container started (runc returned: the process ran).
Then the pod is deleted and unprepared (``unprepare``, outside ``total``) and
the claim deleted before the next pod, so GPUs never run out.

Run (root, runc + busybox installed): ``.venv/bin/python -m bench.e2e_pod_start [--pods 20]``

Measured 2026-11-22 on the shared 2-core dev VM (load average ~1.5-3, other work
running), 20 pods, ms, p50 / p90 / max:

    total (creation -> container started)  150 / 191 / 308
    schedule (KCM claim + scheduler bind)    53 /  69 / 137
    prepare (kubelet PrepareResources)       24 /  43 /  64
      of which our NodePrepareResources      14 /  27 /  43
    runtime (CDI inject 8.5 + runc 59)       69 / 108 / 122
    unprepare (delete, kubelet, final del)   37 /  52 /  90
      of which our NodeUnprepareResources     5 /   9 /  20

Our plugin is ~10 % of pod creation -> container started (median per-pod ratio);
scheduling and runc dominate. (With client-go's default 5 QPS in the harness
instead of the kubelet's 50, prepare was 105 ms and unprepare 320 ms: throttling.)
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from dra_driver.demo.kubeletharness import find_harness
from dra_driver.demo.runtime import ContainerRuntime, find_cdi_harness
from dra_driver.demo.stack import RESOURCE_API, GpuNode, install_driver_objects
from dra_driver.devcluster import Cluster, find_binaries, wait_until

ROOT = Path(__file__).resolve().parents[1]
KLOG = re.compile(r"^I(\d{4}) (\S+) .*\"(Calling|Done calling) Node(Un)?[Pp]repareResources? rpc\"")


def rpc_durations(log: Path, unprepare: bool = False) -> list[float]:
    """Seconds between each "Calling" and the following "Done calling" line."""
    out, start = [], None
    for line in log.read_text(errors="replace").splitlines():
        m = KLOG.match(line)
        if not m or bool(m.group(4)) != unprepare:
            continue
        t = datetime.strptime(m.group(2), "%H:%M:%S.%f")
        if m.group(3) == "Calling":
            start = t
        elif start is not None:
            out.append((t - start).total_seconds())
            start = None
    return out


def pod(name: str, node: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {"name": "main", "image": "busybox", "command": ["/bin/sh", "-c", "true"],
                 "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print raw per-pod figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-e2e-", dir="/tmp"))
    cluster = Cluster(find_binaries(), work / "cluster")
    cluster.start()
    node: GpuNode | None = None
    try:
        install_driver_objects(cluster, ROOT / "deploy" / "manifests" / "dra-driver.yaml")
        node = GpuNode(cluster=cluster, name=f"bench-{secrets.token_hex(3)}", profile="dgx-a100",
                       workdir=work / "node", harness_binary=find_harness(ROOT))  # fmt: skip
        node.start()
        runtime = ContainerRuntime(cdi_harness=find_cdi_harness(ROOT), workdir=work / "runtime")
        ns = "bench"
        cluster.create_namespace(ns)
        cluster.apply({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
        })  # fmt: skip
        rows = []
        claims = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"
        for i in range(args.pods):
            name = f"p{i:02d}"
            t0 = time.monotonic()
            cluster.rest.create(f"/api/v1/namespaces/{ns}/pods", pod(name, node.name, ns))
            path = f"/api/v1/namespaces/{ns}/pods/{name}"
            wait_until(lambda p=path: cluster.rest.get(p)["spec"].get("nodeName"),  # type: ignore[misc]
                       timeout=60, what="bound", interval=0.01)  # fmt: skip
            t1 = time.monotonic()
            prepared = node.harness.prepare(ns, name)
            t2 = time.monotonic()
            ids = prepared.containers["main"].cdi_devices
            run = runtime.run(cdi_dirs=[node.cdi_dir], cdi_ids=ids, argv=["/bin/sh", "-c", "true"])
            t3 = time.monotonic()
            assert run.returncode == 0, run.stderr
            unprepared = node.delete_pod(ns, name)
            t4 = time.monotonic()
            wait_until(lambda: not cluster.rest.get(claims)["items"],
                       timeout=30, what="claim deleted", interval=0.02)  # fmt: skip
            rows.append({"schedule": t1 - t0, "prepare": t2 - t1, "runtime": t3 - t2,
                         "in_kubelet_code": prepared.elapsed_ms / 1000,
                         "unprepare_in_kubelet_code": unprepared["elapsed_ms"] / 1000,
                         "inject": run.inject_s, "runc": run.run_s,
                         "total": t3 - t0, "unprepare": t4 - t3})  # fmt: skip
        log = node.harness.log_path
        for row, rpc, unrpc in zip(
            rows, rpc_durations(log), rpc_durations(log, unprepare=True), strict=True
        ):
            row["plugin"] = rpc
            row["plugin_unprepare"] = unrpc
        if args.json:
            print(json.dumps(rows, indent=1))
        print(f"{args.pods} pods, one GPU each, sequential (ms)        p50      p90      max")
        for key in (
            "total",
            "schedule",
            "prepare",
            "in_kubelet_code",
            "plugin",
            "runtime",
            "inject",
            "runc",
            "unprepare",
            "unprepare_in_kubelet_code",
            "plugin_unprepare",
        ):
            vals = [r[key] * 1000 for r in rows]
            print(
                f"  {key:44} {statistics.median(vals):8.1f} {pct(vals, 0.9):8.1f} {max(vals):8.1f}"
            )
        share = statistics.median(r["plugin"] / r["total"] for r in rows)
        print(f"  our plugin's share of the total (median of per-pod ratios): {share:.1%}")
        return 0
    finally:
        if node is not None:
            node.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
