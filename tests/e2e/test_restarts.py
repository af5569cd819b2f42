"""Restarts on a real node while pods hold claims: our plugin SIGKILLed (the
kubelet re-registers the restarted container, it republishes, and a later
unprepare still cleans up MPS daemons and time-slice settings), and the kubelet
itself SIGKILLed and restarted (its startup wipe of the node's slices is
repaired by the plugin, and claims prepared before are unprepared from the
kubelet's own checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import (
    EXAMPLES,
    claim_name_of,
    get_claim,
    pids_alive,
    plugin_records,
    tool_calls,
    wait_deallocated,
)


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "dgx-a100") as started:
        yield started


def apply_example(cluster: Cluster, node: RealGpuNode, name: str, ns: str) -> None:
    cluster.apply(keep_running(pin_to_node(load_examples(EXAMPLES / name, ns), node.name)))


def slice_uids(node: RealGpuNode) -> set[str]:
    return {s["metadata"]["uid"] for s in node.slices()}


def mps_daemons(node: RealGpuNode) -> list[int]:
    return [c["pid"] for c in tool_calls(node)
            if c["tool"] == "mps-daemon" and c.get("event") == "started"]  # fmt: skip


def test_plugin_sigkill_then_reregisters_republishes_and_cleans_up(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    apply_example(cluster, node, "mps.yaml", ns)
    apply_example(cluster, node, "time-sliced.yaml", ns)
    for pod in ("mps-a", "mps-b", "time-sliced"):
        node.run_pod(ns, pod)
    mps_uid = get_claim(cluster, ns, "gpu-mps")["metadata"]["uid"]
    ts_uid = get_claim(cluster, ns, claim_name_of(cluster, ns, "time-sliced", "gpu"))["metadata"][
        "uid"
    ]
    daemons = mps_daemons(node)
    assert len(daemons) == 1 and pids_alive(daemons) == daemons
    assert len(node.cdi_specs()) == 2
    registered = node.registrations()
    old_pid = node.plugin_pid

    node.kill_plugin()
    # Prepared state outlives the plugin: the specs stay for the running containers.
    assert len(node.cdi_specs()) == 2
    # The container restarts in the same pod: same pod UID, same socket names.
    assert node.start_plugin(pod_uid=node.pod_uid) != old_pid
    wait_until(lambda: node.registrations() > registered, timeout=60,
               what="the real kubelet registered the restarted plugin",
               describe=node.plugin_log_tail)  # fmt: skip
    node.wait_ready()
    assert node.wait_published(timeout=30)

    apply_example(cluster, node, "gpu-by-memory.yaml", ns)
    node.run_pod(ns, "gpu-by-memory")
    for pod in ("mps-a", "mps-b", "time-sliced", "gpu-by-memory"):
        node.delete_pod(ns, pod)
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed")
    assert plugin_records(node, mps_uid, "unprepared")
    assert plugin_records(node, ts_uid, "unprepared")
    wait_until(lambda: not pids_alive(daemons), timeout=10, what="MPS daemon stopped")
    resets = [c["argv"] for c in tool_calls(node)
              if c.get("argv", [])[-2:] == ["--set-timeslice", "0"]]  # fmt: skip
    assert len(resets) == 1
    wait_deallocated(cluster, ns, "gpu-mps")
    assert not list(node.state_dir.glob("mps/*")), "MPS state dir left behind"


def test_kubelet_restart_wipes_slices_and_plugin_republishes(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    apply_example(cluster, node, "four-gpus-one-numa.yaml", ns)
    node.run_pod(ns, "four-gpus-one-numa")
    before = slice_uids(node)
    devices = node.published_devices()
    assert before and devices
    registered = node.registrations()

    node.node.restart_kubelet(kill=True)

    def republished() -> set[str] | None:
        uids = slice_uids(node)
        return uids if node.published_devices() and not uids & before else None

    after = wait_until(republished, timeout=90, what="slices deleted by the kubelet republished",
                       describe=node.plugin_log_tail)  # fmt: skip
    assert after.isdisjoint(before)
    assert sorted(node.published_devices() or []) == sorted(devices)
    wait_until(lambda: node.registrations() > registered, timeout=60,
               what="the restarted kubelet registered the plugin again")  # fmt: skip
    node.node.wait_ready()
    # The pod kept running, and the restarted kubelet still knows its claim.
    assert node.pod(ns, "four-gpus-one-numa")["status"]["phase"] == "Running"
    uid = get_claim(cluster, ns, "four-gpus-one-numa")["metadata"]["uid"]
    node.delete_pod(ns, "four-gpus-one-numa")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="CDI spec removed")
    assert plugin_records(node, uid, "unprepared")
    wait_deallocated(cluster, ns, "four-gpus-one-numa")
