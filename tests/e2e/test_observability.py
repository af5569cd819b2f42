"""What operators see of a running claim, through the whole stack (real scheduler, the
kubelet's DRA code, our plugin as a process on an emulated node):

- the claim's ``status.devices`` (KEP-4817): our device with its GPU UUID and the Ready and
  Healthy conditions, Healthy turning False on an Xid, the entry removed at unprepare;
- ``/metrics``: prepare/unprepare latency, per-claim GPU usage labelled by namespace, claim,
  pod and device (processes mapped to the pod through their cgroup), gone after release;
- ``dra-driver report`` reading that endpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.demo.stack import RESOURCE_API, GpuNode, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.gpu.emulation import EmulatedNode
from tests.e2e.conftest import short_tmp, start_node

ARGS = ["--health-port=0", "--usage-interval=0.3", "--health-check-interval=0.3",
        "--healthy-period=60"]  # fmt: skip


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], kubelet_harness_binary: Path
) -> Iterator[GpuNode]:
    with short_tmp("e2e-obs") as tmp:
        n = start_node(
            cluster, kubelet_harness_binary, tmp, "l4-x4", prefix="obs", plugin_args=ARGS
        )
        yield n
        n.stop()


def metrics_port(node: GpuNode) -> int:
    def port() -> int | None:
        for r in node.plugin_log_records():
            if r.get("msg") == "health endpoint listening":
                return int(r["port"])
        return None

    return wait_until(port, timeout=30, what="the plugin's health port in its log")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def claim_status(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    claim = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{name}")
    return list((claim.get("status") or {}).get("devices") or [])


def test_claim_status_usage_metrics_and_report_follow_a_pod(
    cluster: Cluster, cluster_namespace: str, node: GpuNode
) -> None:
    ns = cluster_namespace
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "watched", "namespace": ns},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                       "deviceClassName": "gpu.nvidia.com"}}]}}})  # fmt: skip
    cluster.apply(pin_to_node([{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", "namespace": ns},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "watched"}],
                 "containers": [{"name": "main", "image": "busybox:1.36",
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }], node.name))  # fmt: skip
    run = node.run_pod(ns, "worker", None)
    claim = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/watched")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    emulated = EmulatedNode.create("l4-x4", node.host_root)  # the node's GPUs, seen from here
    gpu_index, gpu = next((i, g) for i, g in enumerate(emulated.profile.gpus)
                          if f"gpu-{g.minor}" == device)  # fmt: skip

    # status.devices: our entry, written at prepare.
    (entry,) = wait_until(lambda: claim_status(cluster, ns, "watched"), timeout=30,
                          what="claim status.devices written")  # fmt: skip
    assert (entry["driver"], entry["pool"], entry["device"]) == (
        "gpu.nvidia.com",
        node.name,
        device,
    )
    assert entry["data"]["uuid"] == gpu.uuid == entry["data"]["cudaVisibleDevices"]
    assert entry["data"]["pciBusID"] == gpu.bus_id
    assert entry["data"]["cdiDeviceIDs"] == list(run.prepared.containers["main"].cdi_devices)
    conditions = {c["type"]: c for c in entry["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Healthy"]["status"] == "True"

    # Per-claim usage: two processes in the pod's cgroup, one of another tenant.
    pod_uid = run.prepared.pod_uid
    emulated.set_processes(gpu_index, [
        {"pid": 4101, "usedMiB": 2048, "smUtil": 7},
        {"pid": 4102, "usedMiB": 1024, "smUtil": 3},
        {"pid": 4200, "usedMiB": 512, "smUtil": 50},
    ], pods={4101: pod_uid, 4102: pod_uid})  # fmt: skip
    port = metrics_port(node)
    labels = {"namespace": ns, "claim": "watched", "pod": "worker", "device": device}
    key = ("dra_driver_claim_gpu_utilization_ratio", tuple(sorted(labels.items())))

    def usage() -> str:
        return str({k: v for k, v in scrape(port).items() if "claim_gpu" in k[0]})

    wait_until(lambda: scrape(port).get(key) == 0.1, timeout=30,
               what="usage of the pod in /metrics", describe=usage)  # fmt: skip
    m = scrape(port)
    assert m[("dra_driver_claim_gpu_memory_used_bytes", key[1])] == 3 * 2**30
    assert m[("dra_driver_claim_gpu_memory_allocated_bytes", key[1])] == 23034 * 2**20
    assert m[("dra_driver_node_operation_duration_seconds_count", (("operation", "prepare"),))] >= 1
    assert m[("dra_driver_prepared_devices", ())] == 1

    report = subprocess.run(
        [sys.executable, "-m", "dra_driver", "report", "--scrape",
         f"http://127.0.0.1:{port}/metrics", "--duration", "0", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    (found,) = json.loads(report.stdout)["claims"]
    assert (found["claim"], found["pod"], found["under_used"]) == ("watched", "worker", True)
    assert found["suggestion"] == "MPS share: 20% threads, 4Gi"  # an L4 has no MIG

    # A fault on the device reaches the claim's status.
    emulated.inject_xid(gpu_index, 74)

    def healthy_condition() -> str:
        (e,) = claim_status(cluster, ns, "watched")
        return next(c["status"] for c in e["conditions"] if c["type"] == "Healthy")

    wait_until(lambda: healthy_condition() == "False", timeout=30, what="Healthy=False in status")

    # Unprepare: the entry and the usage series go.
    node.delete_pod(ns, "worker")
    wait_until(lambda: claim_status(cluster, ns, "watched") == [], timeout=30,
               what="status.devices entry removed at unprepare")  # fmt: skip
    wait_until(lambda: key not in scrape(port), timeout=30, what="usage series gone")
    assert scrape(port)[("dra_driver_node_operation_duration_seconds_count",
                         (("operation", "unprepare"),))] >= 1  # fmt: skip
