"""The real-node tier: a kubelet v1.37 and containerd v2.4 built from Go modules
join the dev control plane as a Node, run a pod with Debian's runc, give it a
projected ServiceAccount token, and leave nothing behind on the machine when a
node is torn down, even while another node runs beside it."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devcluster import Cluster, hostclean, wait_until
from dra_driver.devcluster.binaries import BinariesError, NodeBinaries
from dra_driver.devcluster.node import RealNode
from tests.conftest import start_real_node

TOLERATE_ALL = [{"operator": "Exists"}]


def plain_pod(name: str, namespace: str, node: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": TOLERATE_ALL,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}
            ],
        },
    }


def phase(cluster: Cluster, namespace: str, pod: str) -> str:
    obj = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    return str(obj.get("status", {}).get("phase", ""))


def test_node_registers_with_the_built_components(cluster: Cluster, real_node: RealNode) -> None:
    node = real_node.node_object()
    assert node is not None
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.1"
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    assert real_node.is_ready()
    # Only pods that tolerate it land there: other tests' pods never run on it.
    taints = node["spec"]["taints"]
    assert {"key": "dra-driver.test/dedicated", "value": real_node.name,
            "effect": "NoSchedule"} in taints  # fmt: skip


def test_pod_runs_with_its_service_account_token(
    cluster: Cluster, cluster_namespace: str, real_node: RealNode
) -> None:
    ns = cluster_namespace
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    script = f"echo hello; cat {sa}/namespace; echo; test -s {sa}/token && echo token-ok; id -u"
    cluster.apply(plain_pod("plain", ns, real_node.name, script))
    wait_until(lambda: phase(cluster, ns, "plain") == "Succeeded", timeout=90,
               what="pod plain Succeeded",
               describe=lambda: json.dumps(cluster.rest.get(
                   f"/api/v1/namespaces/{ns}/pods/plain").get("status")))  # fmt: skip
    out = real_node.pod_log(ns, "plain", "main").splitlines()
    assert out == ["hello", ns, "token-ok", "0"]
    pod = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/plain")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert any(v.get("projected") for v in pod["spec"]["volumes"])


def test_second_node_beside_the_first_and_teardown_leaves_nothing(
    cluster: Cluster, cluster_namespace: str, real_node: RealNode, node_binaries: NodeBinaries
) -> None:
    """Two nodes at once share no directory, port, cgroup or namespace; the second
    one's teardown removes its mounts, cgroups, processes and namespace."""
    ns = cluster_namespace
    second = start_real_node(cluster, node_binaries, prefix="rn2")
    try:
        assert second.name != real_node.name
        assert second.cgroup_root != real_node.cgroup_root
        assert second.network.inode() != real_node.network.inode()
        name = f"p-{secrets.token_hex(2)}"
        cluster.apply(plain_pod(name, ns, second.name, "echo on-second; sleep 300"))
        wait_until(lambda: phase(cluster, ns, name) == "Running", timeout=90,
                   what=f"pod {name} Running on {second.name}")  # fmt: skip
        wait_until(lambda: second.pod_log(ns, name, "main") == "on-second\n", timeout=30,
                   what="the pod's output in its CRI log")  # fmt: skip
        inode = second.network.inode()
        assert hostclean.mounts_under(second.paths.workdir)
    finally:
        second.stop()
    assert hostclean.mounts_under(second.paths.workdir) == []
    assert hostclean.processes_in_netns(inode) == []
    for hierarchy in hostclean.cgroup_hierarchies():
        assert not (hierarchy / second.cgroup_root).exists()
    links = (
        [p for p in Path("/var/log/containers").glob("*.log")]
        if Path("/var/log/containers").is_dir()
        else []
    )
    assert not [p for p in links if str(second.paths.workdir) in str(p.readlink())]
    # The first node is untouched and still Ready.
    assert real_node.is_ready()
    real_node.check_running()
    second.remove_workdir()
    assert not second.paths.workdir.exists()


def test_missing_node_components_fail_with_the_build_command(tmp_path: Path) -> None:
    """The tier fails, never skips: an incomplete node dir names what is missing."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubelet").write_text("")
    with pytest.raises(BinariesError) as err:
        NodeBinaries.from_dir(tmp_path)
    message = str(err.value)
    assert "bin/containerd" in message and "images/pause.tar" in message
    assert "bin/kubelet," not in message
    assert "scripts/build-node.sh" in message
