"""The simplest full path on a real node: a pod with a claim template for one
GPU chosen by memory is allocated by the real scheduler, prepared by the real
kubelet's DRA manager through our plugin (run as the chart runs it), started
by containerd with our CDI spec and runc; the container sees exactly the
spec's device nodes, env and mounts; deleting the pod unprepares it, removes
the spec and the claim."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import RESOURCE_API, load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.node import NodeImage
from dra_driver.devcluster.ociimage import ImageConfig, LayerBuilder, write_archive
from tests.conftest import cdi_hook
from tests.e2e.scenarios import EXAMPLES
from tests.images import MULTIARCH, PROBE, build_probe, debian_rootfs

SHOW = (
    "ls /dev/nvidia* /dev/nvidia-caps 2>/dev/null; env | grep -E '^(NVIDIA|CUDA)_' | sort; "
    "echo mounts: $(grep -c /run/nvidia/driver /proc/self/mountinfo)"
)


def spec_edits(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]


def test_one_gpu_by_memory_from_template_to_containerd_and_back(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    ns, node = cluster_namespace, real_a100
    objs = pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), node.name)
    for obj in objs:
        if obj["kind"] == "Pod":
            obj["spec"]["containers"][0]["command"] = ["sh", "-c", SHOW]
    cluster.apply(keep_running(objs))

    run = node.run_pod(ns, "gpu-by-memory")

    pod = node.pod(ns, "gpu-by-memory")
    assert pod["status"]["phase"] == "Running"
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = cluster.rest.get(
        f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{status['resourceClaimName']}"
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (
        "gpu.nvidia.com", node.name, "gpu",
    )  # fmt: skip
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [run.uid]
    uid = claim["metadata"]["uid"]
    specs = node.cdi_specs()
    assert list(specs) == [f"k8s.gpu.nvidia.com-claim_{uid}.json"]
    spec = specs[f"k8s.gpu.nvidia.com-claim_{uid}.json"]
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{result['device']}"]

    # What containerd injected is exactly what our spec says: device nodes, env, mounts.
    out = run.containers["main"].stdout.splitlines()
    edits = spec_edits(spec)
    want_nodes = sorted(n["path"] for e in edits for n in e.get("deviceNodes") or [])
    got_nodes = sorted(line for line in out if line.startswith("/dev/nvidia"))
    assert got_nodes == want_nodes
    assert f"/dev/nvidia{result['device'].removeprefix('gpu-')}" in got_nodes
    assert len([n for n in got_nodes if n[len("/dev/nvidia") :].isdigit()]) == 1
    want_env = sorted(v for e in edits for v in e.get("env") or [])
    assert sorted(line for line in out if line.startswith(("NVIDIA_", "CUDA_"))) == want_env
    want_mounts = sum(len(e.get("mounts") or []) for e in edits)
    assert want_mounts > 0
    assert f"mounts: {want_mounts}" in out

    # Device health from our plugin's health stream, as the real kubelet reports it.
    cdi_id = f"k8s.gpu.nvidia.com/claim={uid}-{result['device']}"
    wait_until(
        lambda: node.pod(ns, "gpu-by-memory")["status"]["containerStatuses"][0].get(
            "allocatedResourcesStatus"
        ),
        timeout=30, what="allocatedResourcesStatus in the pod status",
    )  # fmt: skip
    (cstatus,) = node.pod(ns, "gpu-by-memory")["status"]["containerStatuses"]
    assert cstatus["allocatedResourcesStatus"] == [
        {"name": "claim:gpu", "resources": [{"resourceID": cdi_id, "health": "Healthy"}]}
    ]

    # Delete: the kubelet unprepares through our plugin; the spec and the claim go.
    node.delete_pod(ns, "gpu-by-memory")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="CDI spec removed")
    records = [r for r in node.plugin_log_records() if r.get("claim_uid") == uid]
    assert any(r["msg"].startswith("prepared") for r in records)
    assert any(r["msg"].startswith("unprepared") for r in records)

    def claim_gone() -> bool:
        listed = cluster.rest.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")
        return all(c["metadata"]["uid"] != uid for c in listed["items"])

    wait_until(claim_gone, timeout=30, what="the template's claim deleted with its pod")


def test_a_stock_debian_image_finds_libcuda_through_containerd(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode, tmp_path: Path
) -> None:
    """The same as NVIDIA's toolkit gives it, through the real kubelet and containerd: the
    spec's hooks (NVIDIA's nvidia-cdi-hook, which our plugin put on the node) run for
    the pod's container; its own ``ldconfig -p`` lists ``libcuda.so.1`` and
    ``libcuda.so``, and a program that ``dlopen``s them by name gets the driver's."""
    ns, node = cluster_namespace, real_a100
    hook = node.state_dir / "nvidia-cdi-hook"
    assert hook.read_bytes() == cdi_hook().read_bytes()  # installed by the plugin at start
    rootfs = debian_rootfs(tmp_path / "rootfs", build_probe(tmp_path / "probe"))
    layer = LayerBuilder()
    layer.tree(rootfs)
    ref = "localhost/cuda-probe:debian"
    debian_path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    write_archive(tmp_path / "image.tar", ref, [layer.tar()], ImageConfig(env=(debian_path,)))
    node.node.import_image(NodeImage(tmp_path / "image.tar", ref))
    objs = pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), node.name)
    for obj in objs:
        if obj["kind"] == "Pod":
            obj["metadata"]["name"] = "cuda-probe"
            (container,) = obj["spec"]["containers"]
            container["image"] = ref
            container["command"] = ["sh", "-c", f"ldconfig -p | grep libcuda; {PROBE}"]
    cluster.apply(keep_running(objs))

    run = node.run_pod(ns, "cuda-probe")

    out = run.containers["main"].stdout
    lib = f"/lib/{MULTIARCH}"  # merged /usr: the first system dir ldconfig scans
    assert re.search(rf"^\s+libcuda\.so\.1 \(.*\) => {lib}/libcuda\.so\.1$", out, re.M), out
    assert re.search(rf"^\s+libcuda\.so \(.*\) => {lib}/libcuda\.so$", out, re.M), out
    assert f"DLOPEN libcuda.so.1 {lib}/libcuda.so.1 13000" in out.splitlines(), out
    assert f"DLOPEN libcuda.so {lib}/libcuda.so 13000" in out.splitlines(), out
    (spec,) = node.cdi_specs().values()
    hooks = [h["args"][1] for h in spec["containerEdits"]["hooks"]]
    assert hooks == ["create-symlinks", "enable-cuda-compat", "update-ldcache",
                     "disable-device-node-modification"]  # fmt: skip
    assert {h["path"] for h in spec["containerEdits"]["hooks"]} == {str(hook)}
    node.delete_pod(ns, "cuda-probe")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="CDI spec removed")
