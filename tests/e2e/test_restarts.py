"""Restarts while pods hold claims: the plugin SIGKILLed (re-registers,
republishes, later unprepare still cleans up everything) and the kubelet
restarted (its startup wipe of the node's slices is repaired by the plugin,
and prepared claims are still unprepared from the kubelet's checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.conftest import short_tmp, start_node
from tests.e2e.scenarios import (
    apply_example,
    claim_name_of,
    get_claim,
    pids_alive,
    plugin_records,
    tool_calls,
    wait_deallocated,
)


@pytest.fixture(scope="module")
def node(
    cluster: Cluster,
    driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> Iterator[GpuNode]:
    with short_tmp("e2e-restarts") as tmp:
        started = start_node(cluster, kubelet_harness_binary, tmp, "dgx-a100")
        yield started
        started.stop()


def slice_uids(node: GpuNode) -> set[str]:
    return {s["metadata"]["uid"] for s in node.slices()}


def mps_daemons(node: GpuNode) -> list[int]:
    return [
        c["pid"]
        for c in tool_calls(node)
        if c["tool"] == "mps-daemon" and c.get("event") == "started"
    ]


def test_plugin_sigkill_then_reregisters_republishes_and_cleans_up(
    cluster: Cluster, cluster_namespace: str, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    ns = cluster_namespace
    apply_example(cluster, node, "mps.yaml", ns)
    apply_example(cluster, node, "time-sliced.yaml", ns)
    for pod in ("mps-a", "mps-b", "time-sliced"):
        assert node.run_pod(ns, pod, container_runtime).containers["main"].returncode == 0
    mps_uid = get_claim(cluster, ns, "gpu-mps")["metadata"]["uid"]
    ts_claim = claim_name_of(cluster, ns, "time-sliced", "gpu")
    ts_uid = get_claim(cluster, ns, ts_claim)["metadata"]["uid"]
    daemons = mps_daemons(node)
    assert len(daemons) == 1 and pids_alive(daemons) == daemons
    assert len(node.cdi_specs()) == 2
    seq = node.harness.last_seq()
    old_pid = node.plugin_pid

    node.kill_plugin()
    # Prepared state outlives the plugin: specs stay for the running containers.
    assert len(node.cdi_specs()) == 2
    new_pid = node.start_plugin()
    assert new_pid != old_pid
    node.harness.wait_registered(node.driver, after_seq=seq, timeout=30)
    assert node.wait_published(timeout=30)
    registrations = [e for e in node.harness.registrations() if e["seq"] > seq]
    assert [e["kind"] for e in registrations if e["kind"] != "validate"][-1] == "register"

    # A new pod can be prepared by the restarted plugin...
    apply_example(cluster, node, "gpu-by-memory.yaml", ns)
    assert node.run_pod(ns, "gpu-by-memory", container_runtime).containers["main"].returncode == 0
    # ...and the claims prepared before the kill are unprepared completely.
    for pod in ("mps-a", "mps-b", "time-sliced", "gpu-by-memory"):
        node.delete_pod(ns, pod)
    assert node.cdi_specs() == {}
    assert plugin_records(node, mps_uid, "unprepared")
    assert plugin_records(node, ts_uid, "unprepared")
    wait_until(lambda: not pids_alive(daemons), timeout=10, what="MPS daemon stopped")
    resets = [
        c["argv"] for c in tool_calls(node) if c.get("argv", [])[-2:] == ["--set-timeslice", "0"]
    ]
    assert len(resets) == 1
    wait_deallocated(cluster, ns, "gpu-mps")
    assert not list(node.state_dir.glob("mps/*")), "MPS state dir left behind"


def test_kubelet_restart_wipes_slices_and_plugin_republishes(
    cluster: Cluster, cluster_namespace: str, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    ns = cluster_namespace
    apply_example(cluster, node, "four-gpus-one-numa.yaml", ns)
    assert (
        node.run_pod(ns, "four-gpus-one-numa", container_runtime).containers["main"].returncode == 0
    )
    before = slice_uids(node)
    devices = node.published_devices()
    assert before and devices

    node.harness.restart(kill=True)

    def republished() -> set[str] | None:
        uids = slice_uids(node)
        complete = node.published_devices()
        return uids if complete and not uids & before else None

    after = wait_until(republished, timeout=60, what="slices deleted by the kubelet republished",
                       describe=node.plugin_log_tail)  # fmt: skip
    assert after.isdisjoint(before)
    assert sorted(node.published_devices() or []) == sorted(devices)
    node.harness.wait_registered(node.driver, timeout=30)

    # The restarted kubelet still knows the prepared claim from its checkpoint.
    uid = get_claim(cluster, ns, "four-gpus-one-numa")["metadata"]["uid"]
    node.delete_pod(ns, "four-gpus-one-numa")
    assert plugin_records(node, uid, "unprepared")
    assert node.cdi_specs() == {}
    wait_deallocated(cluster, ns, "four-gpus-one-numa")
