"""Full-stack scenarios on one emulated dgx-a100 node: a claim shared by two
pods, four GPUs on one NUMA node, time-slicing and MPS configured from the
DeviceClass and the claim, and a claim whose opaque config is invalid."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from dra_driver.demo.kubeletharness import HarnessError
from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.scenarios import (
    apply_example,
    claim_name_of,
    container_env,
    device_attributes,
    get_claim,
    gpu_device_nodes,
    pids_alive,
    plugin_records,
    results,
    tool_calls,
    wait_deallocated,
)

LIST = "ls /dev/nvidia*; env | grep -E '^(NVIDIA|CUDA)_' | sort"


def pod(name: str, claim: dict[str, str], node: str, namespace: str) -> dict[str, Any]:
    return pin_to_node(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "restartPolicy": "Never",
                    "resourceClaims": [{"name": "gpu", **claim}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:1.36",
                            "command": ["sh", "-c", LIST],
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            }
        ],
        node,
    )[0]


def gpu_claim(
    name: str, namespace: str, device_class: str = "gpu.nvidia.com", config: Any = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
    }
    if config is not None:
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": config}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def test_two_pods_share_one_claim_prepared_once_unprepared_after_the_last(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns, node = cluster_namespace, a100_node
    cluster.apply(gpu_claim("shared", ns))
    for name in ("first", "second"):
        cluster.apply(pod(name, {"resourceClaimName": "shared"}, node.name, ns))
    first = node.run_pod(ns, "first", container_runtime)
    second = node.run_pod(ns, "second", container_runtime)

    claim = get_claim(cluster, ns, "shared")
    uid = claim["metadata"]["uid"]
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == {
        first.prepared.pod_uid,
        second.prepared.pod_uid,
    }
    (device,) = (r["device"] for r in results(claim))
    ids = (f"k8s.gpu.nvidia.com/claim={uid}-{device}",)
    assert first.prepared.containers["main"].cdi_devices == ids
    assert second.prepared.containers["main"].cdi_devices == ids
    # The kubelet called NodePrepareResources once: the second pod found it prepared.
    assert len(plugin_records(node, uid, "prepared")) == 1
    for run in (first, second):
        out = run.containers["main"]
        assert out.returncode == 0, out.stderr
        assert gpu_device_nodes(out.stdout) == [f"/dev/nvidia{device.removeprefix('gpu-')}"]

    node.delete_pod(ns, "first")
    assert plugin_records(node, uid, "unprepared") == []
    assert any(uid in name for name in node.cdi_specs())
    node.delete_pod(ns, "second")
    assert len(plugin_records(node, uid, "unprepared")) == 1
    assert node.cdi_specs() == {}
    wait_deallocated(cluster, ns, "shared")


def test_four_gpus_on_one_numa_node(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns, node = cluster_namespace, a100_node
    apply_example(cluster, node, "four-gpus-one-numa.yaml", ns)
    run = node.run_pod(ns, "four-gpus-one-numa", container_runtime)
    claim = get_claim(cluster, ns, "four-gpus-one-numa")
    devices = sorted(r["device"] for r in results(claim))
    assert len(devices) == 4
    numa = {device_attributes(node, d)["numaNode"] for d in devices}
    assert len(numa) == 1, f"devices {devices} span NUMA nodes {numa}"
    out = run.containers["main"]
    assert out.returncode == 0, out.stderr
    assert gpu_device_nodes(out.stdout) == sorted(
        f"/dev/nvidia{d.removeprefix('gpu-')}" for d in devices
    )
    assert len(run.prepared.containers["main"].cdi_devices) == 4
    node.delete_pod(ns, "four-gpus-one-numa")
    assert node.cdi_specs() == {}
    wait_deallocated(cluster, ns, "four-gpus-one-numa")


def sharing_class(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                         "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
            ],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": config}}],
        },
    }  # fmt: skip


def gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}


def test_time_slicing_and_mps_from_class_and_claim(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns, node = cluster_namespace, a100_node
    suffix = secrets.token_hex(3)
    ts_class, mps_class = f"timesliced-{suffix}.e2e", f"mps-{suffix}.e2e"
    cluster.apply(sharing_class(ts_class, gpu_config(
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})))  # fmt: skip
    cluster.apply(sharing_class(mps_class, gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}})))  # fmt: skip
    cases = {
        "ts-class": gpu_claim("ts-class", ns, ts_class),
        "ts-claim": gpu_claim("ts-claim", ns, ts_class, gpu_config(
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})),
        "mps-class": gpu_claim("mps-class", ns, mps_class),
        "mps-claim": gpu_claim("mps-claim", ns, mps_class, gpu_config(
            {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}})),
    }  # fmt: skip
    runs = {}
    for name, claim in cases.items():
        cluster.apply(claim)
        cluster.apply(pod(name, {"resourceClaimName": name}, node.name, ns))
        runs[name] = node.run_pod(ns, name, container_runtime)
    uuid = {
        n: device_attributes(node, results(get_claim(cluster, ns, n))[0]["device"])["uuid"]
        for n in cases
    }
    argvs = [c["argv"] for c in tool_calls(node) if c["tool"] == "nvidia-smi"]
    # The class config applies alone; a claim config replaces it for its device.
    assert ["compute-policy", "-i", uuid["ts-class"], "--set-timeslice", "1"] in argvs
    assert ["compute-policy", "-i", uuid["ts-claim"], "--set-timeslice", "3"] in argvs
    daemons = {
        c["env"]["CUDA_VISIBLE_DEVICES"]: c["pid"]
        for c in tool_calls(node)
        if c["tool"] == "mps-daemon" and c.get("event") == "started"
    }
    assert set(daemons) == {uuid["mps-class"], uuid["mps-claim"]}
    commands = {
        gpu: [c["command"] for c in tool_calls(node) if c.get("pid") == pid and "command" in c]
        for gpu, pid in daemons.items()
    }
    assert commands[uuid["mps-class"]] == ["set_default_active_thread_percentage 30"]
    assert commands[uuid["mps-claim"]] == [
        f"set_default_device_pinned_mem_limit {uuid['mps-claim']} 10240M"
    ]
    for name, run in runs.items():
        out = run.containers["main"]
        assert out.returncode == 0, out.stderr
        env = container_env(out.stdout)
        if name.startswith("mps"):
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        else:
            assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert pids_alive(list(daemons.values())) == list(daemons.values())

    for name in cases:
        node.delete_pod(ns, name)
    argvs = [c["argv"] for c in tool_calls(node) if c["tool"] == "nvidia-smi"]
    for name in ("ts-class", "ts-claim"):
        assert argvs.count(["compute-policy", "-i", uuid[name], "--set-timeslice", "0"]) == 1
    wait_until(lambda: not pids_alive(list(daemons.values())), timeout=10,
               what="MPS control daemons stopped on unprepare")  # fmt: skip
    assert node.cdi_specs() == {}


def test_invalid_opaque_config_pod_does_not_start_and_event_names_the_field(
    cluster: Cluster, cluster_namespace: str, a100_node: GpuNode
) -> None:
    ns, node = cluster_namespace, a100_node
    apply_example(cluster, node, "invalid-config.yaml", ns)
    node.wait_bound(ns, "invalid-config")
    with pytest.raises(HarnessError) as failed:
        node.harness.prepare(ns, "invalid-config")
    assert "intervall" in str(failed.value)

    def event() -> dict[str, Any] | None:
        listed = cluster.rest.get(f"/api/v1/namespaces/{ns}/events")
        for ev in listed["items"]:
            if (
                ev["involvedObject"].get("name") == "invalid-config"
                and ev["reason"] == "FailedPrepareDynamicResources"
            ):
                return ev
        return None

    ev = wait_until(event, timeout=15, what="FailedPrepareDynamicResources event")
    assert ev["type"] == "Warning"
    assert ev["source"]["component"] == "kubelet"
    assert "intervall" in ev["message"]
    assert "timeSlicingConfig" in ev["message"]
    pod_obj = cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/invalid-config")
    assert pod_obj["status"]["phase"] == "Pending"
    assert node.cdi_specs() == {}
    claim = claim_name_of(cluster, ns, "invalid-config", "gpu")
    uid = get_claim(cluster, ns, claim)["metadata"]["uid"]
    assert plugin_records(node, uid, "prepare failed")
    # Deleting the never-started pod still works; nothing to clean on the node.
    node.delete_pod(ns, "invalid-config")
    assert node.cdi_specs() == {}


def test_containers_get_only_the_devices_of_the_requests_they_name(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    """The kubelet filters CDI IDs by request name; our plugin must report each
    device's request so that a container naming one request sees one GPU."""
    ns, node = cluster_namespace, a100_node
    cluster.apply({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "two-requests", "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
        ]}},
    })  # fmt: skip
    spec = pod("split", {"resourceClaimName": "two-requests"}, node.name, ns)
    (main,) = spec["spec"]["containers"]
    only_a = {**main, "name": "only-a", "resources": {"claims": [{"name": "gpu", "request": "a"}]}}
    spec["spec"]["containers"] = [only_a, {**main, "name": "both"}]
    cluster.apply(spec)
    run = node.run_pod(ns, "split", container_runtime)
    claim = get_claim(cluster, ns, "two-requests")
    by_request = {r["request"]: r["device"] for r in results(claim)}
    uid = claim["metadata"]["uid"]
    cdi = {req: f"k8s.gpu.nvidia.com/claim={uid}-{dev}" for req, dev in by_request.items()}
    assert run.prepared.containers["only-a"].cdi_devices == (cdi["a"],)
    assert sorted(run.prepared.containers["both"].cdi_devices) == sorted(cdi.values())
    minor = {req: f"/dev/nvidia{dev.removeprefix('gpu-')}" for req, dev in by_request.items()}
    assert gpu_device_nodes(run.containers["only-a"].stdout) == [minor["a"]]
    assert gpu_device_nodes(run.containers["both"].stdout) == sorted(minor.values())
    node.delete_pod(ns, "split")
    assert node.cdi_specs() == {}


def test_one_node_prepare_call_for_all_claims_of_a_pod(
    cluster: Cluster,
    cluster_namespace: str,
    a100_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    """The kubelet batches every claim of a pod into one NodePrepareResources call
    per driver; our plugin answers each claim and the container gets both GPUs."""
    ns, node = cluster_namespace, a100_node
    cluster.apply(gpu_claim("left", ns))
    cluster.apply(gpu_claim("right", ns))
    spec = pod("pair", {"resourceClaimName": "left"}, node.name, ns)
    spec["spec"]["resourceClaims"].append({"name": "other", "resourceClaimName": "right"})
    spec["spec"]["containers"][0]["resources"]["claims"].append({"name": "other"})
    cluster.apply(spec)
    calls_before = harness_calls(node, "Calling NodePrepareResources rpc")
    run = node.run_pod(ns, "pair", container_runtime)
    calls = harness_calls(node, "Calling NodePrepareResources rpc")[len(calls_before) :]
    uids = [get_claim(cluster, ns, n)["metadata"]["uid"] for n in ("left", "right")]
    assert len(calls) == 1, calls
    assert all(uid in calls[0] for uid in uids)
    assert len(run.prepared.containers["main"].cdi_devices) == 2
    assert len(gpu_device_nodes(run.containers["main"].stdout)) == 2
    node.delete_pod(ns, "pair")
    assert node.cdi_specs() == {}
    for name in ("left", "right"):
        wait_deallocated(cluster, ns, name)


def harness_calls(node: GpuNode, text: str) -> list[str]:
    """Lines of the kubelet code's own log (klog -v=4) that contain ``text``."""
    log = node.harness.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if text in line]
