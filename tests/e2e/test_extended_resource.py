"""A plain pod asking for ``nvidia.com/gpu: 1`` (no claim) gets one GPU through our driver on
a real node: the real scheduler allocates it through the DeviceClass's extendedResourceName
(KEP-5004) and creates the pod's claim, the real kubelet admits the pod and prepares that
claim through our plugin (run with the chart's args), and containerd starts the container
with exactly that GPU; deleting the pod unprepares it and the claim goes with the pod."""

from __future__ import annotations

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import RESOURCE_API, load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.scenarios import EXAMPLES, container_env, gpu_device_nodes, plugin_records
from tests.images import MULTIARCH


def test_plain_pod_asking_for_nvidia_com_gpu_gets_one_gpu(
    cluster: Cluster, cluster_namespace: str, l4_node: RealGpuNode
) -> None:
    ns, node = cluster_namespace, l4_node
    assert "DeviceClass/gpu.nvidia.com" in extended_resource_classes(cluster)
    objs = load_examples(EXAMPLES / "extended-resource.yaml", ns)
    assert objs[0]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    cluster.apply(keep_running(pin_to_node(objs, node.name)))
    run = node.run_pod(ns, "plain-gpu-pod")

    pod = node.pod(ns, "plain-gpu-pod")
    assert pod["status"]["phase"] == "Running"
    ext = pod["status"]["extendedResourceClaimStatus"]
    (mapping,) = ext["requestMappings"]
    assert (mapping["containerName"], mapping["resourceName"]) == ("main", "nvidia.com/gpu")
    claim = cluster.rest.get(
        f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{ext['resourceClaimName']}"
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", node.name)
    assert result["request"] == mapping["requestName"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [run.uid]
    uid, device = claim["metadata"]["uid"], result["device"]

    # The claim's spec, and a container that got exactly its one GPU.
    spec = node.cdi_specs()[f"k8s.gpu.nvidia.com-claim_{uid}.json"]
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{device}"]
    out = run.containers["main"]
    assert out.returncode is None, out.stdout
    assert gpu_device_nodes(out.stdout) == [f"/dev/nvidia{device.removeprefix('gpu-')}"]
    assert container_env(out.stdout) == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "NVIDIA_CTK_LIBCUDA_DIR": f"/usr/lib/{MULTIARCH}",  # as NVIDIA's specs set it
    }

    node.delete_pod(ns, "plain-gpu-pod")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="CDI spec removed")
    assert plugin_records(node, uid, "unprepared")

    def claim_gone() -> bool:
        listed = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
        return all(c["metadata"]["uid"] != uid for c in listed)

    wait_until(claim_gone, timeout=30, what="the pod's extended-resource claim deleted")


def extended_resource_classes(cluster: Cluster) -> set[str]:
    classes = cluster.rest.get(f"{RESOURCE_API}/deviceclasses")["items"]
    return {
        f"DeviceClass/{c['metadata']['name']}"
        for c in classes
        if c["spec"].get("extendedResourceName") == "nvidia.com/gpu"
    }
