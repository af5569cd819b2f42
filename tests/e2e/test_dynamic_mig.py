"""Dynamic MIG on a real node: a dgx-a100-mig-on node (8 A100s in MIG mode, no
instances) whose plugin runs with the chart's ``migMode: dynamic`` and publishes
every profile x placement; pods whose claims the real scheduler packs onto
partitions; the real kubelet preparing them through our plugin, which creates each
MIG instance at prepare; containerd starting containers that see exactly their new
MIG device (parent node, the GI and CI capability nodes, the spec's env); the
instances destroyed and the specs removed when the pods go (also across a plugin
SIGKILLed and restarted while they run)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from dra_driver.emulation import load_profile
from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.emulation.migrules import gi_id_for
from dra_driver.emulation.migstate import STATE_FILE, MigState
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import (
    EXAMPLES,
    claim_name_of,
    container_env,
    get_claim,
    gpu_device_nodes,
    plugin_records,
    results,
)

PROFILE = "dgx-a100-mig-on"
SHOW = "ls /dev/nvidia* /dev/nvidia-caps; env | grep -E '^(NVIDIA|CUDA)_' | sort"

Instances = dict[int, list[tuple[int, str, int, list[int]]]]


@pytest.fixture(scope="module")
def dynamic_node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(
        cluster, node_binaries, helm_binary, PROFILE, values={"migMode": "dynamic"}
    ) as node:
        yield node


def instances(node: RealGpuNode) -> Instances:
    """What the emulated driver holds now (the file every process of the node shares)."""
    state = MigState(load_profile(PROFILE), path=node.host_root / STATE_FILE, host=None)
    return {
        g.index: [(gi.gi_id, gi.profile.name, gi.start, sorted(gi.cis)) for gi in gis]
        for g in state.profile.gpus
        if (gis := state.gpu_instances(g.index))
    }


def wait_instances(node: RealGpuNode, expected: Instances) -> None:
    wait_until(lambda: instances(node) == expected, timeout=30,
               what=f"MIG instances {expected}",
               describe=lambda: f"now: {instances(node)}\n{node.plugin_log_tail()}")  # fmt: skip


def mig_pod(namespace: str, name: str, profile: str) -> list[dict[str, Any]]:
    selector = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": [{"cel": {"expression": selector}}]}}]}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                "containers": [{
                    "name": "main", "image": "busybox:1.36",
                    "command": ["sh", "-c", SHOW],
                    "resources": {"claims": [{"name": "mig"}]},
                }],
            },
        },
    ]  # fmt: skip


def example_1g(namespace: str) -> list[dict[str, Any]]:
    """deploy/examples/mig-1g.yaml (a 1g.10gb from a template), listing caps too."""
    objs = load_examples(EXAMPLES / "mig-1g.yaml", namespace)
    for obj in objs:
        if obj["kind"] == "Pod":
            obj["spec"]["containers"][0]["command"] = ["sh", "-c", SHOW]
    return objs


def caps_seen(stdout: str) -> list[str]:
    return sorted({w for w in stdout.split() if w.startswith("nvidia-cap")})


def spec_of(node: RealGpuNode, claim_uid: str) -> dict[str, Any]:
    return node.cdi_specs()[f"k8s.gpu.nvidia.com-claim_{claim_uid}.json"]


def test_pods_get_exactly_the_mig_instances_created_for_them(
    cluster: Cluster, cluster_namespace: str, dynamic_node: RealGpuNode
) -> None:
    ns, node = cluster_namespace, dynamic_node
    assert len(node.published_devices() or []) == 208
    assert instances(node) == {}
    cluster.apply(keep_running(pin_to_node(example_1g(ns), node.name)))
    cluster.apply(keep_running(pin_to_node(mig_pod(ns, "mig-3g", "3g.40gb"), node.name)))
    runs = {pod: node.run_pod(ns, pod) for pod in ("mig-1g", "mig-3g")}
    claims = {pod: get_claim(cluster, ns, claim_name_of(cluster, ns, pod, "mig")) for pod in runs}
    devices = {pod: results(claim)[0]["device"] for pod, claim in claims.items()}
    # First fit packs both onto GPU 0 (which pod the scheduler takes first varies).
    placed = {pod: int(device.rsplit("-", 1)[1]) for pod, device in devices.items()}
    assert devices["mig-1g"].startswith("gpu-0-mig-1g10gb-19-")
    assert devices["mig-3g"].startswith("gpu-0-mig-3g40gb-9-")
    gis = {"mig-1g": gi_id_for(placed["mig-1g"], 1), "mig-3g": gi_id_for(placed["mig-3g"], 4)}
    expected = sorted(
        [
            (gis["mig-1g"], "1g.10gb", placed["mig-1g"], [0]),
            (gis["mig-3g"], "3g.40gb", placed["mig-3g"], [0]),
        ]
    )
    assert instances(node) == {0: expected}
    for pod, gi in gis.items():
        out = runs[pod].containers["main"]
        assert out.returncode is None, out.stdout  # still running, claim prepared
        assert gpu_device_nodes(out.stdout) == ["/dev/nvidia0"]
        # Exactly its own GI and CI capabilities (created at prepare), not the other pod's.
        caps = [f"nvidia-cap{gi_cap_minor(0, gi)}", f"nvidia-cap{ci_cap_minor(0, gi, 0)}"]
        assert caps_seen(out.stdout) == sorted(caps), pod
        # ... as the spec says, which containerd injected: nodes and env.
        spec = spec_of(node, claims[pod]["metadata"]["uid"])
        (device,) = spec["devices"]
        spec_caps = sorted(
            n["path"].rsplit("/", 1)[1]
            for n in device["containerEdits"]["deviceNodes"]
            if n["path"].startswith("/dev/nvidia-caps/")
        )
        assert spec_caps == sorted(caps)
        env = container_env(out.stdout)
        want_env = dict(
            e.split("=", 1)
            for edits in (spec.get("containerEdits", {}), device["containerEdits"])
            for e in edits.get("env") or []
        )
        assert env == want_env and env["NVIDIA_VISIBLE_DEVICES"] == "void", env

    # A plugin SIGKILLed while the pods run comes back and still knows its instances.
    registered = node.registrations()
    node.kill_plugin()
    node.start_plugin(pod_uid=node.pod_uid)
    wait_until(lambda: node.registrations() > registered, timeout=60,
               what="the real kubelet registered the restarted plugin",
               describe=node.plugin_log_tail)  # fmt: skip
    node.wait_ready()
    assert instances(node) == {0: expected}
    assert len(node.wait_published()) == 208  # its own instances change nothing published

    uid_1g = claims["mig-1g"]["metadata"]["uid"]
    node.delete_pod(ns, "mig-1g")
    wait_instances(node, {0: [(gis["mig-3g"], "3g.40gb", placed["mig-3g"], [0])]})
    wait_until(lambda: f"k8s.gpu.nvidia.com-claim_{uid_1g}.json" not in node.cdi_specs(),
               timeout=30, what="the 1g claim's CDI spec removed")  # fmt: skip
    assert plugin_records(node, uid_1g, "unprepared")
    node.delete_pod(ns, "mig-3g")
    wait_instances(node, {})
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed")
    # The freed placements are allocatable again: a new 3g lands where the last one was.
    cluster.apply(keep_running(pin_to_node(mig_pod(ns, "mig-3g-again", "3g.40gb"), node.name)))
    node.run_pod(ns, "mig-3g-again")
    again = results(get_claim(cluster, ns, "mig-3g-again"))[0]["device"]
    assert again.startswith("gpu-0-mig-3g40gb-9-"), again
    node.delete_pod(ns, "mig-3g-again")
    wait_instances(node, {})


def test_an_instance_made_by_someone_else_is_worked_around_in_a_new_generation(
    dynamic_node: RealGpuNode,
) -> None:
    node = dynamic_node
    before = node.slices()
    generation = before[0]["spec"]["pool"]["generation"]
    state = MigState(load_profile(PROFILE), path=node.host_root / STATE_FILE, host=None)
    gpu = state.profile.gpus[7]
    profile = gpu.model.mig_profile("4g.40gb")
    assert profile is not None
    state.create_gpu_instance(gpu, profile, 0, 4)  # an admin, with nvidia-smi mig -cgi
    pid = node.plugin_pid
    assert pid is not None
    os.kill(pid, signal.SIGHUP)  # rediscover now

    def regenerated() -> list[dict[str, Any]] | None:
        slices = node.slices()
        gens = {s["spec"]["pool"]["generation"] for s in slices}
        return slices if gens == {generation + 1} else None

    after = wait_until(regenerated, timeout=30, what="a new pool generation")
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(after) for s in after)
    names = {d["name"] for s in after for d in s["spec"].get("devices") or []}
    gpu7 = sorted(n for n in names if n.startswith("gpu-7"))
    # No whole GPU, nothing on memory slices 0-3; the rest of GPU 7 is still offered.
    assert "gpu-7" not in gpu7 and "gpu-7-mig-4g40gb-5-0" not in gpu7
    assert not any(n.endswith(("-0", "-1", "-2", "-3")) for n in gpu7), gpu7
    assert "gpu-7-mig-3g40gb-9-4" in gpu7 and len(gpu7) == 10  # 3+3 1g, 2 1g.20gb, 2g, 3g
    counters = {
        c["name"]: c["counters"] for s in after for c in s["spec"].get("sharedCounters", [])
    }
    assert "memory-slice-0" not in counters["gpu-7-counter-set"]
    assert len(names) == 208 - 26 + 10
    # The admin's instance is never touched by us.
    assert [(gi.gi_id, gi.profile.name) for gi in state.gpu_instances(7)] == [(1, "4g.40gb")]
    state.destroy_gpu_instance(gpu, 1)
    os.kill(pid, signal.SIGHUP)
    wait_until(
        lambda: len(node.published_devices() or []) == 208, timeout=30, what="GPU 7 whole again"
    )


def gpu_pod(namespace: str, name: str, cel: str) -> list[dict[str, Any]]:
    objs = mig_pod(namespace, name, "")
    objs[0]["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": cel}}]
    }  # fmt: skip
    return objs


def test_a_mixed_node_runs_mig_and_whole_gpu_pods_side_by_side(
    cluster: Cluster,
    cluster_namespace: str,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
) -> None:
    """h100-l4-mixed (two MIG-mode H100s, one whole H100, two L4s: the shape NVIDIA's
    driver is reported to break on): one dynamic instance and one L4 run at once."""
    ns = cluster_namespace
    with real_gpu_node(
        cluster, node_binaries, helm_binary, "h100-l4-mixed", values={"migMode": "dynamic"}
    ) as node:
        assert len(node.published_devices() or []) == 2 * 26 + 3
        state = MigState(load_profile("h100-l4-mixed"), path=node.host_root / STATE_FILE, host=None)
        l4 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'"
        objs = mig_pod(ns, "h100-1g", "1g.10gb") + gpu_pod(ns, "l4", l4)
        cluster.apply(keep_running(pin_to_node(objs, node.name)))
        runs = {pod: node.run_pod(ns, pod) for pod in ("h100-1g", "l4")}
        (mig,) = results(get_claim(cluster, ns, "h100-1g"))
        (whole,) = results(get_claim(cluster, ns, "l4"))
        assert mig["device"].startswith("gpu-0-mig-1g10gb-19-"), mig
        assert whole["device"] in {"gpu-3", "gpu-4"}, whole
        start = int(mig["device"].rsplit("-", 1)[1])
        gi = gi_id_for(start, 1)
        assert [(g.gi_id, g.profile.name, g.start) for g in state.gpu_instances(0)] == [
            (gi, "1g.10gb", start)
        ]
        assert all(not state.gpu_instances(i) for i in range(1, 5))
        mig_out = runs["h100-1g"].containers["main"].stdout
        assert gpu_device_nodes(mig_out) == ["/dev/nvidia0"]
        assert caps_seen(mig_out) == sorted(
            [f"nvidia-cap{gi_cap_minor(0, gi)}", f"nvidia-cap{ci_cap_minor(0, gi, 0)}"]
        )
        l4_out = runs["l4"].containers["main"].stdout
        assert gpu_device_nodes(l4_out) == [f"/dev/nvidia{whole['device'].removeprefix('gpu-')}"]
        assert caps_seen(l4_out) == []
        for pod in runs:
            node.delete_pod(ns, pod)
        wait_until(lambda: not state.gpu_instances(0), timeout=30, what="the H100 instance gone")
        wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed")


def test_a_whole_gpu_pod_gets_the_full_gpu_instance(
    cluster: Cluster, cluster_namespace: str, dynamic_node: RealGpuNode
) -> None:
    """The whole A100 of a MIG-mode GPU, asked for by memory and profile: the real kubelet's
    prepare creates the full-GPU instance (7g.80gb at 0), the container sees the GPU's node
    and exactly that instance's two capabilities, and deleting the pod destroys it."""
    ns, node = cluster_namespace, dynamic_node
    cel = (
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('79Gi')) >= 0 && "
        "device.attributes['gpu.nvidia.com'].profile == '7g.80gb'"
    )
    cluster.apply(keep_running(pin_to_node(gpu_pod(ns, "whole", cel), node.name)))
    run = node.run_pod(ns, "whole")
    (got,) = results(get_claim(cluster, ns, "whole"))
    minor = int(got["device"].removeprefix("gpu-"))  # the whole GPU, not a partition
    assert list(instances(node).values()) == [[(0, "7g.80gb", 0, [0])]]
    out = run.containers["main"]
    assert out.returncode is None, out.stdout  # still running, claim prepared
    assert gpu_device_nodes(out.stdout) == [f"/dev/nvidia{minor}"]
    assert caps_seen(out.stdout) == sorted(
        [f"nvidia-cap{gi_cap_minor(minor, 0)}", f"nvidia-cap{ci_cap_minor(minor, 0, 0)}"]
    )
    node.delete_pod(ns, "whole")
    wait_instances(node, {})
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="the whole GPU's spec removed")
