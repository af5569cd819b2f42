"""What operators see of a running claim on a real node (real scheduler, kubelet and
containerd; our plugin with the chart's args, health and usage intervals from its values):

- the claim's ``status.devices`` (KEP-4817): our device with its GPU UUID and the Ready and
  Healthy conditions, Healthy turning False on an Xid, the entry removed at unprepare;
- ``/metrics`` on the chart's health port: prepare/unprepare latency, per-claim GPU usage
  labelled by namespace, claim, pod and device, gone after release. The pod's process is
  the container's real one: its ``/proc/<pid>/cgroup`` as the real kubelet and containerd
  laid it out (cgroupfs driver here) is what the plugin maps to the pod;
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

from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.stack import RESOURCE_API
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.emulation import EmulatedNode
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import apply_claimed_pod

VALUES = {
    "health.checkIntervalSeconds": "1",
    "health.healthyPeriodSeconds": "60",
    "metrics.usageIntervalSeconds": "1",
}


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "l4-x4", values=VALUES) as n:
        yield n


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


def container_pid(node: RealGpuNode, ns: str, pod: str) -> int:
    """Host PID of the pod's running container (containerd's task)."""
    (status,) = node.pod(ns, pod)["status"]["containerStatuses"]
    container = status["containerID"].split("//", 1)[1]
    for line in node.node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, state = line.split()[:3]
        if task == container and state == "RUNNING":
            return int(pid)
    raise AssertionError(f"no running task for {ns}/{pod} ({container})")


def test_claim_status_usage_metrics_and_report_follow_a_pod(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    apply_claimed_pod(cluster, node.name, ns, "watched", "worker")
    run = node.run_pod(ns, "worker")
    claim = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/watched")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device, uid = result["device"], claim["metadata"]["uid"]
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
    (spec,) = node.cdi_specs().values()
    assert entry["data"]["cdiDeviceIDs"] == [f"{spec['kind']}={uid}-{device}"]
    conditions = {c["type"]: c for c in entry["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Healthy"]["status"] == "True"

    # Per-claim usage: the container's real process and one in the pod's cgroup, and one
    # of another tenant. The real one's cgroup file is the kernel's, as the kubelet made it.
    pid = container_pid(node, ns, "worker")
    real_cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    assert run.uid.replace("-", "_") in real_cgroup or run.uid in real_cgroup, real_cgroup
    emulated.set_processes(gpu_index, [
        {"pid": pid, "usedMiB": 2048, "smUtil": 7},
        {"pid": 4102, "usedMiB": 1024, "smUtil": 3},
        {"pid": 4200, "usedMiB": 512, "smUtil": 50},
    ], pods={4102: run.uid})  # fmt: skip
    emulated_cgroup = node.host_root / "proc" / str(pid) / "cgroup"
    emulated_cgroup.unlink()
    emulated_cgroup.write_text(real_cgroup)
    port = node.health_port
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
