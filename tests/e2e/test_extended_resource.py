"""A plain pod asking for ``nvidia.com/gpu: 1`` (no claim) gets one GPU through our driver:
the real scheduler allocates it through the DeviceClass's extendedResourceName (KEP-5004)
and creates the pod's claim, the kubelet's DRA code prepares it through our plugin, and the
container runs under runc with exactly that GPU; deleting the pod releases everything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import RESOURCE_API, GpuNode
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.conftest import short_tmp, start_node
from tests.e2e.scenarios import apply_example, gpu_device_nodes


@pytest.fixture(scope="module")
def l4_node(
    cluster: Cluster, driver_objects: list[str], kubelet_harness_binary: Path
) -> Iterator[GpuNode]:
    with short_tmp("e2e-ext") as tmp:
        node = start_node(cluster, kubelet_harness_binary, tmp, "l4-x4", prefix="ext")
        yield node
        node.stop()


def test_plain_pod_asking_for_nvidia_com_gpu_gets_one_gpu(
    cluster: Cluster,
    cluster_namespace: str,
    l4_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns = cluster_namespace
    assert "DeviceClass/gpu.nvidia.com" in l4_node_objects(cluster)
    apply_example(cluster, l4_node, "extended-resource.yaml", ns)
    run = l4_node.run_pod(ns, "plain-gpu-pod", container_runtime)

    pod = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/plain-gpu-pod")
    ext = pod["status"]["extendedResourceClaimStatus"]
    ((mapping),) = ext["requestMappings"]
    assert (mapping["containerName"], mapping["resourceName"]) == ("main", "nvidia.com/gpu")
    claim = cluster.rest.get(
        f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{ext['resourceClaimName']}"
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", l4_node.name)
    assert result["request"] == mapping["requestName"]
    device = result["device"]

    ids = run.prepared.containers["main"].cdi_devices
    assert ids == (f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{device}",)
    container = run.containers["main"]
    assert container.returncode == 0, container.stderr
    assert gpu_device_nodes(container.stdout) == [f"/dev/nvidia{device.removeprefix('gpu-')}"]

    answer = l4_node.delete_pod(ns, "plain-gpu-pod")
    assert answer["finalized"] is True
    assert l4_node.cdi_specs() == {}

    def claim_gone() -> bool:
        listed = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
        return all(c["metadata"]["uid"] != claim["metadata"]["uid"] for c in listed)

    wait_until(claim_gone, timeout=30, what="the pod's extended-resource claim deleted")


def l4_node_objects(cluster: Cluster) -> set[str]:
    classes = cluster.rest.get(f"{RESOURCE_API}/deviceclasses")["items"]
    return {
        f"DeviceClass/{c['metadata']['name']}"
        for c in classes
        if c["spec"].get("extendedResourceName") == "nvidia.com/gpu"
    }
