"""Full-stack scenarios on a real node (kubelet + containerd, emulated dgx-a100
served by our plugin as the chart runs it): a claim shared by two pods, four
GPUs on one NUMA node, time-slicing and MPS configured from the DeviceClass and
the claim, a claim whose opaque config is invalid, and containers that name
only some of a claim's requests. Container output comes from the CRI logs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.scenarios import (
    EXAMPLES,
    claim_name_of,
    container_env,
    device_attributes,
    get_claim,
    gpu_claim,
    gpu_config,
    gpu_device_nodes,
    pids_alive,
    plugin_records,
    pod,
    results,
    sharing_class,
    tool_calls,
    wait_deallocated,
)


@pytest.fixture(autouse=True)
def no_pods_left(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> Iterator[None]:
    """A failed scenario must not leave prepared claims to the next one."""
    yield
    for item in cluster.rest.get(f"/api/v1/namespaces/{cluster_namespace}/pods")["items"]:
        real_a100.delete_pod(cluster_namespace, item["metadata"]["name"])


def apply(cluster: Cluster, objs: list[dict[str, Any]]) -> None:
    cluster.apply(keep_running(objs))


def apply_example(cluster: Cluster, node: RealGpuNode, name: str, ns: str) -> None:
    apply(cluster, pin_to_node(load_examples(EXAMPLES / name, ns), node.name))


def wait_no_specs(node: RealGpuNode) -> None:
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed",
               describe=lambda: str(list(node.cdi_specs())))  # fmt: skip


def test_two_pods_share_one_claim_prepared_once_unprepared_after_the_last(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    ns, node = cluster_namespace, real_a100
    cluster.apply(gpu_claim("shared", ns))
    # One after the other: pods started together may both reach NodePrepareResources
    # before the kubelet has recorded the claim as prepared (our plugin answers the
    # second call from its checkpoint).
    apply(cluster, [pod("first", {"resourceClaimName": "shared"}, node.name, ns)])
    first = node.run_pod(ns, "first")
    apply(cluster, [pod("second", {"resourceClaimName": "shared"}, node.name, ns)])
    second = node.run_pod(ns, "second")

    claim = get_claim(cluster, ns, "shared")
    uid = claim["metadata"]["uid"]
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == {first.uid, second.uid}
    (device,) = (r["device"] for r in results(claim))
    # The real kubelet called NodePrepareResources once: the second pod found it prepared.
    assert len(plugin_records(node, uid, "prepared")) == 1
    for run in (first, second):
        assert gpu_device_nodes(run.containers["main"].stdout) == [
            f"/dev/nvidia{device.removeprefix('gpu-')}"
        ]

    node.delete_pod(ns, "first")
    assert plugin_records(node, uid, "unprepared") == []
    assert any(uid in name for name in node.cdi_specs())
    node.delete_pod(ns, "second")
    wait_no_specs(node)
    assert len(plugin_records(node, uid, "unprepared")) == 1
    wait_deallocated(cluster, ns, "shared")


def test_four_gpus_on_one_numa_node(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    ns, node = cluster_namespace, real_a100
    apply_example(cluster, node, "four-gpus-one-numa.yaml", ns)
    run = node.run_pod(ns, "four-gpus-one-numa")
    devices = sorted(r["device"] for r in results(get_claim(cluster, ns, "four-gpus-one-numa")))
    assert len(devices) == 4
    numa = {device_attributes(node, d)["numaNode"] for d in devices}
    assert len(numa) == 1, f"devices {devices} span NUMA nodes {numa}"
    assert gpu_device_nodes(run.containers["main"].stdout) == sorted(
        f"/dev/nvidia{d.removeprefix('gpu-')}" for d in devices
    )
    node.delete_pod(ns, "four-gpus-one-numa")
    wait_no_specs(node)
    wait_deallocated(cluster, ns, "four-gpus-one-numa")


def test_time_slicing_and_mps_from_class_and_claim(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    ns, node = cluster_namespace, real_a100
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
    for name, claim in cases.items():
        cluster.apply(claim)
        apply(cluster, [pod(name, {"resourceClaimName": name}, node.name, ns)])
    runs = {name: node.run_pod(ns, name) for name in cases}
    uuid = {
        n: device_attributes(node, results(get_claim(cluster, ns, n))[0]["device"])["uuid"]
        for n in cases
    }
    argvs = [c["argv"] for c in tool_calls(node) if c["tool"] == "nvidia-smi"]
    assert ["compute-policy", "-i", uuid["ts-class"], "--set-timeslice", "1"] in argvs
    assert ["compute-policy", "-i", uuid["ts-claim"], "--set-timeslice", "3"] in argvs
    daemons = {
        c["env"]["CUDA_VISIBLE_DEVICES"]: c["pid"]
        for c in tool_calls(node)
        if c["tool"] == "mps-daemon" and c.get("event") == "started"
    }
    assert set(daemons) == {uuid["mps-class"], uuid["mps-claim"]}
    for name, run in runs.items():
        env = container_env(run.containers["main"].stdout)
        if name.startswith("mps"):
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        else:
            assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert pids_alive(list(daemons.values())) == list(daemons.values())

    for name in cases:
        node.delete_pod(ns, name)
    wait_no_specs(node)
    argvs = [c["argv"] for c in tool_calls(node) if c["tool"] == "nvidia-smi"]
    for name in ("ts-class", "ts-claim"):
        assert argvs.count(["compute-policy", "-i", uuid[name], "--set-timeslice", "0"]) == 1
    wait_until(lambda: not pids_alive(list(daemons.values())), timeout=10,
               what="MPS control daemons stopped on unprepare")  # fmt: skip


def test_invalid_opaque_config_pod_does_not_start_and_event_names_the_field(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    ns, node = cluster_namespace, real_a100
    apply_example(cluster, node, "invalid-config.yaml", ns)
    events = wait_until(
        lambda: node.events(ns, "invalid-config", "FailedPrepareDynamicResources"),
        timeout=60, what="the kubelet's FailedPrepareDynamicResources event",
        describe=lambda: node.describe_pod(ns, "invalid-config"),
    )  # fmt: skip
    ev = events[0]
    assert ev["type"] == "Warning"
    assert ev["source"]["component"] == "kubelet"
    assert "intervall" in ev["message"]
    assert "timeSlicingConfig" in ev["message"]
    pod_obj = node.pod(ns, "invalid-config")
    assert pod_obj["status"]["phase"] == "Pending"
    assert not pod_obj["status"].get("containerStatuses", [{}])[0].get("state", {}).get("running")
    assert node.cdi_specs() == {}
    uid = get_claim(cluster, ns, claim_name_of(cluster, ns, "invalid-config", "gpu"))["metadata"][
        "uid"
    ]
    assert plugin_records(node, uid, "prepare failed")
    node.delete_pod(ns, "invalid-config")
    assert node.cdi_specs() == {}


def test_containers_get_only_the_devices_of_the_requests_they_name(
    cluster: Cluster, cluster_namespace: str, real_a100: RealGpuNode
) -> None:
    """The kubelet filters CDI IDs by request name; our plugin reports each device's
    request, so the container naming request ``a`` sees one GPU, the other both."""
    ns, node = cluster_namespace, real_a100
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
    apply(cluster, [spec])
    run = node.run_pod(ns, "split")
    by_request = {
        r["request"]: r["device"] for r in results(get_claim(cluster, ns, "two-requests"))
    }
    minor = {req: f"/dev/nvidia{dev.removeprefix('gpu-')}" for req, dev in by_request.items()}
    assert gpu_device_nodes(run.containers["only-a"].stdout) == [minor["a"]]
    assert gpu_device_nodes(run.containers["both"].stdout) == sorted(minor.values())
    node.delete_pod(ns, "split")
    wait_no_specs(node)
