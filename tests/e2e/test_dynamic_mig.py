"""Dynamic MIG end to end: a dgx-a100-mig-on node (8 A100s in MIG mode, no instances)
publishing every profile x placement, pods whose claims the real scheduler packs onto
partitions, our plugin creating each MIG instance at prepare under the kubelet's own DRA
code, runc containers that see exactly their MIG device, and the instances destroyed
when the pods go (also across a plugin killed and restarted while they run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster
from dra_driver.gpu.emulation import load_profile
from dra_driver.gpu.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.emulation.migstate import STATE_FILE, MigState
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
    # First fit packs both onto GPU 0, small profiles from the top placement down.
    assert devices == {"mig-1g": "gpu-0-mig-1g10gb-19-6", "mig-3g": "gpu-0-mig-3g40gb-9-0"}
    assert instances(node) == {0: [(1, "3g.40gb", 0, [0]), (13, "1g.10gb", 6, [0])]}
    for pod, (gi, ci) in {"mig-1g": (13, 0), "mig-3g": (1, 0)}.items():
        out = runs[pod].containers["main"]
        assert out.returncode == 0, out.stderr
        assert gpu_device_nodes(out.stdout) == ["/dev/nvidia0"]
        # Exactly its own GI and CI capabilities: not the other pod's.
        assert caps_seen(out.stdout) == sorted(
            [f"nvidia-cap{gi_cap_minor(0, gi)}", f"nvidia-cap{ci_cap_minor(0, gi, ci)}"]
        ), pod
    # A plugin killed while the pods run comes back and still knows its instances.
    seq = node.harness.last_seq()
    node.kill_plugin()
    node.start_plugin()
    node.harness.wait_registered(node.driver, after_seq=seq, timeout=30)
    assert instances(node) == {0: [(1, "3g.40gb", 0, [0]), (13, "1g.10gb", 6, [0])]}
    assert len(node.wait_published()) == 208  # its own instances change nothing published
    node.delete_pod(ns, "mig-1g")
    assert instances(node) == {0: [(1, "3g.40gb", 0, [0])]}
    node.delete_pod(ns, "mig-3g")
    assert instances(node) == {}
    assert node.cdi_specs() == {}
