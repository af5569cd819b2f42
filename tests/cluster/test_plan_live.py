"""``dra-driver plan --from-cluster`` on a real control plane: two hand-made nodes whose
slices the plugin's publisher wrote, pods holding allocated claims, and a usage window
as ``dra-driver report --record`` saves it. Idle whole GPUs, cut to what they used,
need fewer GPUs with consumable shares than whole."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fleet.fill import allocation
from bench.fleet.pools import DriverFlags, node_pool, publish
from dra_driver.allocation.model import AllocatedDevice, DeviceId
from dra_driver.cli import main
from dra_driver.devcluster import BinariesError, Cluster, find_binaries
from dra_driver.plugin.kubeclient import KubeClient

pytestmark = pytest.mark.cluster
NODES = ("gpu-a", "gpu-b")
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def live() -> Iterator[Cluster]:
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    with (
        tempfile.TemporaryDirectory(prefix="dra-plan-live-") as work,
        Cluster(binaries, Path(work)) as cluster,
    ):
        for node in NODES:
            cluster.create_node(node, capacity={"cpu": "64", "memory": "512Gi", "pods": "110"})
        client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            assert all(s.in_sync for s in publish(client, list(NODES), node_pool(
                "dgx-h100", DriverFlags())))  # fmt: skip
        finally:
            client.close()
        cluster.create_namespace("ml")
        # 16 pods, one whole GPU each, on all 16 GPUs
        for i in range(16):
            _pod_with_gpu(cluster, i, NODES[i // 8], f"gpu-{i % 8}")
        yield cluster


def _pod_with_gpu(cluster: Cluster, i: int, node: str, gpu: str) -> None:
    claims = f"{RESOURCE}/namespaces/ml/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    cluster.rest.create(claims, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": "ml"},
        "spec": {"devices": {"requests": [request]}}})  # fmt: skip
    held = [AllocatedDevice("gpu", DeviceId("gpu.nvidia.com", node, gpu))]
    status = {"status": {"allocation": allocation(node, held)}}
    cluster.rest.merge_patch(f"{claims}/c{i}/status", status)
    resources = {"requests": {"cpu": "2", "memory": "8Gi"}, "claims": [{"name": "gpu"}]}
    cluster.rest.create("/api/v1/namespaces/ml/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "ml"},
        "spec": {"nodeName": node,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}],
                 "containers": [{"name": "m", "image": "registry.invalid/x:1",
                                 "resources": resources}]}})  # fmt: skip


def _recorded(path: Path, idle: range) -> Path:
    """Utilization 0.1 and 6 of 80 GiB on the claims in ``idle``, busy on the rest."""
    lines = []
    for i in range(16):
        labels = {"namespace": "ml", "claim": f"c{i}", "pod": f"p{i}", "device": "gpu-0"}
        util, used = (0.1, 6 * 2**30) if i in idle else (0.9, 70 * 2**30)
        for ts in (0.0, 15.0, 30.0):
            lines += [
                {"ts": ts, "metric": "dra_driver_claim_gpu_utilization_ratio", "labels": labels,
                 "value": util},
                {"ts": ts, "metric": "dra_driver_claim_gpu_memory_used_bytes", "labels": labels,
                 "value": used},
                {"ts": ts, "metric": "dra_driver_claim_gpu_memory_allocated_bytes",
                 "labels": labels, "value": 80 * 2**30},
                {"ts": ts, "metric": "dra_driver_claim_device_info",
                 "labels": {**labels, "product": "NVIDIA H100 80GB HBM3"}, "value": 1},
            ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_plan_from_cluster_counts_live_pods_and_cuts_idle_gpus_to_their_use(
    live: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    usage = _recorded(tmp_path / "usage.jsonl", idle=range(12))
    argv = ["plan", "--from-cluster", "--kubeconfig", str(live.kubeconfig), "--recorded",
            str(usage), "--modes", "whole,consumable", "--precision", "0.05",
            "-o", "json"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    whole, consumable = json.loads(capsys.readouterr().out)
    assert whole["source"] == consumable["source"]
    source = whole["source"]
    assert (source["nodes"], source["gpus"], source["pods"]) == (2, 16, 16)
    assert (source["claims"], source["rightsized"]) == (16, 12)  # 0.1 x 1.2 and 6/80 x 1.2
    assert whole["gpus"] == 16
    # whole: every pod takes a GPU, as now; consumable: 12 pods of 0.12 GPU share
    assert whole["gpus_needed"] >= 16 > consumable["gpus_needed"]
    assert consumable["gpus_needed"] <= 8
    assert consumable["settings"]["flags"] == ["--consumable-gpus=all"]


def test_plan_from_cluster_refuses_an_unreadable_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.kubeconfig"
    assert main(["plan", "--from-cluster", "--kubeconfig", str(missing)]) == 2
    assert f"cannot load kubeconfig {missing}" in capsys.readouterr().err
