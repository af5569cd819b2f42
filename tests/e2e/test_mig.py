"""A claim on a static MIG instance of an emulated dgx-a100-mig node, on a real
node: allocated by the scheduler, prepared by the kubelet through our plugin,
and the container started by containerd sees the parent GPU and exactly the
MIG capability nodes of our CDI spec."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import (
    EXAMPLES,
    claim_name_of,
    device_attributes,
    get_claim,
    gpu_device_nodes,
    results,
)


@pytest.fixture(scope="module")
def mig_node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "dgx-a100-mig") as node:
        yield node


def test_static_mig_instance(
    cluster: Cluster, cluster_namespace: str, mig_node: RealGpuNode
) -> None:
    ns, node = cluster_namespace, mig_node
    objs = pin_to_node(load_examples(EXAMPLES / "mig-1g.yaml", ns), node.name)
    for obj in objs:
        if obj["kind"] == "Pod":
            obj["spec"]["containers"][0]["command"] = [
                "sh", "-c", "ls /dev/nvidia* /dev/nvidia-caps; env | grep ^NVIDIA_"
            ]  # fmt: skip
    cluster.apply(keep_running(objs))
    run = node.run_pod(ns, "mig-1g")
    claim = get_claim(cluster, ns, claim_name_of(cluster, ns, "mig-1g", "mig"))
    (result,) = results(claim)
    attrs = device_attributes(node, result["device"])
    assert attrs["type"] == "mig"
    assert attrs["profile"] == "1g.10gb"
    assert "-mig-1g10gb-" in result["device"]

    (spec,) = node.cdi_specs().values()
    (device,) = spec["devices"]
    assert device["name"] == f"{claim['metadata']['uid']}-{result['device']}"
    nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    parent_minor = result["device"].split("-")[1]
    assert f"/dev/nvidia{parent_minor}" in nodes
    caps = sorted(n for n in nodes if n.startswith("/dev/nvidia-caps/"))
    assert len(caps) == 2, nodes
    out = run.containers["main"].stdout
    assert gpu_device_nodes(out) == [f"/dev/nvidia{parent_minor}"]
    listed_caps = sorted(
        {f"/dev/nvidia-caps/{w}" for w in out.split() if w.startswith("nvidia-cap")}
    )
    assert listed_caps == caps
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"

    node.delete_pod(ns, "mig-1g")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="CDI spec removed")
