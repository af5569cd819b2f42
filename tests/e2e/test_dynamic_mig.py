"""Dynamic MIG end to end: a dgx-a100-mig-on node (8 A100s in MIG mode, no instances)
publishing every profile x placement, pods whose claims the real scheduler packs onto
partitions, our plugin creating each MIG instance at prepare under the kubelet's own DRA
code, runc containers that see exactly their MIG device, and the instances destroyed
when the pods go (also across a plugin killed and restarted while they run)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.gpu.emulation import load_profile
from dra_driver.gpu.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.emulation.migstate import STATE_FILE, MigState, gi_id_for
from tests.e2e.conftest import short_tmp, start_node
from tests.e2e.scenarios import apply_example, claim_name_of, get_claim, gpu_device_nodes, results

PROFILE = "dgx-a100-mig-on"


@pytest.fixture(scope="module")
def dynamic_node(
    cluster: Cluster, driver_objects: list[str], kubelet_harness_binary: Path
) -> Iterator[GpuNode]:
    with short_tmp("e2e-dynmig") as tmp:
        node = start_node(
            cluster, kubelet_harness_binary, tmp, PROFILE, plugin_args=["--mig-mode=dynamic"]
        )
        yield node
        node.stop()


def instances(node: GpuNode) -> dict[int, list[tuple[int, str, int, list[int]]]]:
    """What the emulated driver holds now (the file every process of the node shares)."""
    state = MigState(load_profile(PROFILE), path=node.host_root / STATE_FILE)
    return {
        g.index: [(gi.gi_id, gi.profile.name, gi.start, sorted(gi.cis)) for gi in gis]
        for g in state.profile.gpus
        if (gis := state.gpu_instances(g.index))
    }


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
                    "command": ["sh", "-c", "ls /dev/nvidia* /dev/nvidia-caps"],
                    "resources": {"claims": [{"name": "mig"}]},
                }],
            },
        },
    ]  # fmt: skip


def caps_seen(stdout: str) -> list[str]:
    return sorted({w for w in stdout.split() if w.startswith("nvidia-cap")})


def test_pods_get_exactly_the_mig_instances_created_for_them(
    cluster: Cluster,
    cluster_namespace: str,
    dynamic_node: GpuNode,
    container_runtime: ContainerRuntime,
) -> None:
    ns, node = cluster_namespace, dynamic_node
    assert len(node.published_devices() or []) == 208
    assert instances(node) == {}
    apply_example(cluster, node, "mig-1g.yaml", ns)  # 1g.10gb, from a template
    cluster.apply(pin_to_node(mig_pod(ns, "mig-3g", "3g.40gb"), node.name))
    runs = {pod: node.run_pod(ns, pod, container_runtime) for pod in ("mig-1g", "mig-3g")}
    devices = {
        pod: results(get_claim(cluster, ns, claim_name_of(cluster, ns, pod, "mig")))[0]["device"]
        for pod in runs
    }
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
        assert out.returncode == 0, out.stderr
        assert gpu_device_nodes(out.stdout) == ["/dev/nvidia0"]
        # Exactly its own GI and CI capabilities: not the other pod's.
        assert caps_seen(out.stdout) == sorted(
            [f"nvidia-cap{gi_cap_minor(0, gi)}", f"nvidia-cap{ci_cap_minor(0, gi, 0)}"]
        ), pod
    # A plugin killed while the pods run comes back and still knows its instances.
    seq = node.harness.last_seq()
    node.kill_plugin()
    node.start_plugin()
    node.harness.wait_registered(node.driver, after_seq=seq, timeout=30)
    assert instances(node) == {0: expected}
    assert len(node.wait_published()) == 208  # its own instances change nothing published
    node.delete_pod(ns, "mig-1g")
    assert instances(node) == {0: [(gis["mig-3g"], "3g.40gb", placed["mig-3g"], [0])]}
    node.delete_pod(ns, "mig-3g")
    assert instances(node) == {}
    assert node.cdi_specs() == {}


def test_an_instance_made_by_someone_else_is_worked_around_in_a_new_generation(
    dynamic_node: GpuNode,
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
    state.destroy_gpu_instance(gpu, 1)
    os.kill(pid, signal.SIGHUP)
    wait_until(
        lambda: len(node.published_devices() or []) == 208, timeout=30, what="GPU 7 whole again"
    )
