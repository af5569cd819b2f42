"""A claim on a static MIG instance of an emulated dgx-a100-mig node, from
allocation to a runc container that sees the MIG capability nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode
from dra_driver.devcluster import Cluster
from tests.e2e.conftest import short_tmp, start_node
from tests.e2e.scenarios import (
    apply_example,
    claim_name_of,
    device_attributes,
    get_claim,
    gpu_device_nodes,
    results,
)


@pytest.fixture(scope="module")
def mig_node(
    cluster: Cluster,
    driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> Iterator[GpuNode]:
    with short_tmp("e2e-mig") as tmp:
        node = start_node(cluster, kubelet_harness_binary, tmp, "dgx-a100-mig")
        yield node
        node.stop()


def test_static_mig_instance(
    cluster: Cluster, cluster_namespace: str, mig_node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    ns, node = cluster_namespace, mig_node
    apply_example(cluster, node, "mig-1g.yaml", ns)
    run = node.run_pod(ns, "mig-1g", container_runtime)
    claim = get_claim(cluster, ns, claim_name_of(cluster, ns, "mig-1g", "mig"))
    (result,) = results(claim)
    attrs = device_attributes(node, result["device"])
    assert attrs["type"] == "mig"
    assert attrs["profile"] == "1g.10gb"
    assert "-mig-1g10gb-" in result["device"]
    (cdi_id,) = run.prepared.containers["main"].cdi_devices
    assert cdi_id == f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{result['device']}"

    # The spec grants the parent GPU node and the GI/CI capability nodes; the
    # container sees exactly those.
    (spec,) = node.cdi_specs().values()
    (device,) = spec["devices"]
    nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    parent_minor = result["device"].split("-")[1]
    assert f"/dev/nvidia{parent_minor}" in nodes
    caps = sorted(n for n in nodes if n.startswith("/dev/nvidia-caps/"))
    assert len(caps) == 2, nodes
    out = run.containers["main"]
    assert out.returncode == 0, out.stderr
    assert gpu_device_nodes(out.stdout) == [f"/dev/nvidia{parent_minor}"]
    listed_caps = sorted(
        {f"/dev/nvidia-caps/{w}" for w in out.stdout.split() if w.startswith("nvidia-cap")}
    )
    assert listed_caps == caps
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"

    node.delete_pod(ns, "mig-1g")
    assert node.cdi_specs() == {}
