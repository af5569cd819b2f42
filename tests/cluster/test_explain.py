"""``dra-driver explain`` and ``kubectl dra explain`` against the real control plane.

Nodes carry the exact slices ``dra-driver slices`` emits for emulated GPUs;
pods are created and the real scheduler either allocates their claims or
leaves them pending; explain then reads everything back from the API server
and must say what the scheduler did and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.devcluster import Cluster
from tests.cluster.test_allocation import (
    allocation,
    apply_deviceclasses,
    attr,
    claim_and_pod,
    publish_node,
    request,
    stays_unallocated,
)

GPU = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def h100(cluster: Cluster) -> str:
    apply_deviceclasses(cluster)
    return publish_node(cluster, "dgx-h100", group="explain").name


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def explain_json(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], ns: str, name: str
) -> dict[str, Any]:
    assert (
        main(["explain", name, "-n", ns, "--kubeconfig", str(cluster.kubeconfig), "-o", "json"])
        == 0
    )
    return json.loads(capsys.readouterr().out)


def node_report(body: dict[str, Any], node: str) -> dict[str, Any]:
    return next(n for n in body["nodes"] if n["node"] == node)


def test_unguarded_selector_names_the_cel_error_and_the_fix(
    cluster: Cluster, cluster_namespace: str, h100: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = cluster_namespace
    selector = f"{attr('profile')} == '1g.10gb'"
    claim_and_pod(cluster, ns, "unguarded", [request("gpu", GPU, selector)], on(h100))
    message = stays_unallocated(cluster, ns, "unguarded")
    body = explain_json(cluster, capsys, ns, "unguarded")
    assert body["allocated"] is False and body["pod"] == "unguarded"
    assert body["schedulerMessage"] == message and "CEL runtime error" in message
    assert body["nodesExcludedByPod"] >= 0
    report = node_report(body, h100)
    assert (
        report["fits"] is False and "CEL runtime error: no such key: profile" in report["summary"]
    )
    first = report["requests"][0]["devices"][0]
    assert first["device"] == "gpu-0" and not first["qualifies"]
    assert 'has(device.attributes["gpu.nvidia.com"].profile)' in first["fix"]


def test_too_many_devices_says_how_many_qualify(
    cluster: Cluster, cluster_namespace: str, h100: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = cluster_namespace
    claim_and_pod(
        cluster, ns, "nine", [request("gpus", GPU, count=9)], {"kubernetes.io/hostname": h100}
    )
    stays_unallocated(cluster, ns, "nine")
    report = node_report(explain_json(cluster, capsys, ns, "nine"), h100)
    assert report["fits"] is False
    assert report["requests"][0]["qualifying"] <= 8
    assert any("9 needed" in h for h in report["hints"])


def test_allocated_claim_matches_the_scheduler_and_kubectl_plugin_runs(
    cluster: Cluster, cluster_namespace: str, h100: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = cluster_namespace
    claim_and_pod(
        cluster, ns, "two", [request("gpus", GPU, count=2)], {"kubernetes.io/hostname": h100}
    )
    got = allocation(cluster, ns, "two")
    body = explain_json(cluster, capsys, ns, "two")
    assert body["allocated"] is True and body["node"] == h100
    assert sorted(body["devices"]["gpus"]) == sorted(d for _, _, d in got)
    # kubectl runs `kubectl-dra explain ...` from PATH for `kubectl dra explain ...`.
    plugin = Path(sys.executable).with_name("kubectl-dra")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run([str(plugin), "explain", f"{ns}/two"], capture_output=True, text=True,
                          env=env, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"ResourceClaim {ns}/two: allocated on node {h100}" in done.stdout


def test_pending_claim_of_a_pod_that_cannot_fit_anywhere_text_output(
    cluster: Cluster, cluster_namespace: str, h100: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = cluster_namespace
    selector = f"{attr('productName')}.contains('H200')"
    claim_and_pod(cluster, ns, "h200", [request("gpu", GPU, selector)], on(h100))
    stays_unallocated(cluster, ns, "h200")
    assert (
        main(["explain", "h200", "-n", ns, "--kubeconfig", str(cluster.kubeconfig), "--node", h100])
        == 0
    )
    text = capsys.readouterr().out
    assert f"Node {h100}: does not fit" in text
    assert "claim selector #0 is false" in text
    assert "productName on this node: NVIDIA H100 80GB HBM3 (8)" in text


def test_unknown_claim_is_a_clear_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", "nope", "-n", "default", "--kubeconfig", str(cluster.kubeconfig)]) == 1
    assert "ResourceClaim default/nope not found" in capsys.readouterr().err


def test_simulate_reads_the_live_cluster(
    cluster: Cluster,
    cluster_namespace: str,
    h100: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Existing allocations on the node count: only the free GPUs are offered."""
    ns = cluster_namespace
    claim_and_pod(cluster, ns, "held", [request("gpus", GPU, count=3)], on(h100))
    allocation(cluster, ns, "held")
    claims = cluster.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
    in_use = sum(
        len(c["status"]["allocation"]["devices"]["results"])
        for c in claims
        if (c.get("status") or {}).get("allocation")
        and c["status"]["allocation"]["devices"]["results"][0]["pool"] == h100
    )
    free = 8 - in_use
    wanted = tmp_path / "claims.yaml"
    wanted.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": f"sim-{n}", "namespace": ns},
         "spec": {"devices": {"requests": [{"name": "g", "exactly": {
             "deviceClassName": GPU, "count": n}}]}}}
        for n in (free + 1, free)
    ]}))  # fmt: skip
    args = ["simulate", "--kubeconfig", str(cluster.kubeconfig), "-f", str(wanted), "--node", h100]
    assert main([*args, "-o", "json"]) == 0
    result = {c["name"]: c for c in json.loads(capsys.readouterr().out)["claims"]}
    assert result[f"sim-{free + 1}"]["allocated"] is False
    assert (
        result[f"sim-{free}"]["allocated"] is True
        and len(result[f"sim-{free}"]["devices"]["g"]) == free
    )
