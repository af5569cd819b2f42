"""The simplest full path: a pod with a claim template for one GPU chosen by
memory is allocated by the real scheduler, prepared through the kubelet's own
DRA manager, its container runs under runc with exactly one GPU, and deleting
the pod unprepares, removes the CDI spec and deallocates the claim."""

from __future__ import annotations

import json

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import RESOURCE_API, GpuNode, load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.helm import ROOT

EXAMPLES = ROOT / "deploy" / "examples"


def claim_of(cluster: Cluster, namespace: str, pod: str) -> dict:
    obj = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    (status,) = obj["status"]["resourceClaimStatuses"]
    return cluster.rest.get(
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
    )


def test_one_gpu_by_memory_from_template_to_runc_and_back(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns = cluster_namespace
    objs = pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), a100_node.name)
    cluster.apply(objs)

    run = a100_node.run_pod(ns, "gpu-by-memory", container_runtime)

    claim = claim_of(cluster, ns, "gpu-by-memory")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == "gpu.nvidia.com"
    assert result["pool"] == a100_node.name
    assert result["request"] == "gpu"
    device = result["device"]
    assert device.startswith("gpu-")
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [run.prepared.pod_uid]

    # What the kubelet's GetResources returned for the container: one CDI ID,
    # of our claim kind, naming the claim UID and the allocated device.
    ids = run.prepared.containers["main"].cdi_devices
    assert ids == (f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-{device}",)

    # The spec on disk is the one that resolved in the real CDI library.
    specs = a100_node.cdi_specs()
    assert list(specs) == [f"k8s.gpu.nvidia.com-claim_{claim['metadata']['uid']}.json"]

    container = run.containers["main"]
    assert container.returncode == 0, container.stderr
    listed = [line for line in container.stdout.split() if line.startswith("/dev/nvidia")]
    gpu_nodes = [n for n in listed if n[len("/dev/nvidia") :].isdigit()]
    minor = device.removeprefix("gpu-")
    assert gpu_nodes == [f"/dev/nvidia{minor}"], container.stdout
    assert "/dev/nvidiactl" in listed
    env = dict(line.split("=", 1) for line in container.stdout.splitlines() if "=" in line)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void"

    pod = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/gpu-by-memory")
    assert pod["status"]["phase"] == "Running"
    # Device health from our plugin's health stream, through the kubelet's code.
    # (Unknown unless our plugin's DRAResourceHealth stream reported the device.)
    (status,) = pod["status"]["containerStatuses"]
    assert status["allocatedResourcesStatus"] == [
        {"name": "claim:gpu", "resources": [{"resourceID": ids[0], "health": "Healthy"}]}
    ]

    # Delete: the harness unprepares via the kubelet code, then finalizes.
    answer = a100_node.delete_pod(ns, "gpu-by-memory")
    assert answer["finalized"] is True
    assert a100_node.cdi_specs() == {}
    claim_name = claim["metadata"]["name"]

    def claim_gone() -> bool:
        listed = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")
        return all(c["metadata"]["name"] != claim_name for c in listed["items"])

    wait_until(claim_gone, timeout=30, what="the template's claim deleted with its pod",
               describe=lambda: json.dumps(claim_of_any(cluster, ns)))  # fmt: skip
    unprepared = [
        r for r in a100_node.plugin_log_records()
        if r.get("claim_uid") == claim["metadata"]["uid"] and "unprepare" in r.get("msg", "")
    ]  # fmt: skip
    assert unprepared, "plugin never logged the unprepare of the claim"


def claim_of_any(cluster: Cluster, ns: str) -> list:
    return cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
