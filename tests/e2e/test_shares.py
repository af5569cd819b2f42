"""Fractional GPUs on a real node: our plugin with the chart's ``consumableGpus: all`` on
an emulated r615 node (two H100s), the real scheduler handing out capacity of one GPU
to claims from two namespaces, the real kubelet preparing them through our plugin, and
containerd starting their containers. Each container's environment (from the CRI
logs) carries its own MPS limits, its /dev/shm and pipe dir are its own daemon's;
deleting one pod stops exactly its daemon and leaves the other share running;
nothing outlives the last share. The SIGKILL-in-the-middle checks stay on the Go
harness (test_shares_sigkill.py says why)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.realgpu import RealGpuNode, RealPodRun, keep_running
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import (
    container_env,
    device_attributes,
    get_claim,
    pids_alive,
    plugin_records,
    results,
    wait_deallocated,
)
from tests.e2e.shares import (
    PROFILE,
    assert_consistent,
    checkpoint,
    daemon_limits,
    daemons,
    share_pod,
)


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    values = {"consumableGpus": "all"}
    with real_gpu_node(cluster, node_binaries, helm_binary, str(PROFILE), values=values) as n:
        yield n


def seen_daemon(node: RealGpuNode, run: RealPodRun) -> tuple[int, str]:
    """The one MPS daemon a container saw: its PID (the marker in the container's
    /dev/shm) and the host dir its /tmp/nvidia-mps is mounted from (mountinfo)."""
    out = run.containers["main"].stdout
    markers = {w.rsplit(".", 1)[1] for w in out.split() if w.startswith("nvidia-mps-emulated.")}
    assert len(markers) == 1, out
    (mount,) = [line.split() for line in out.splitlines() if " /tmp/nvidia-mps " in line]
    return int(markers.pop()), mount[3]


def test_two_namespaces_share_one_gpu_each_with_its_own_limits(
    cluster: Cluster, node: RealGpuNode
) -> None:
    uuid = device_attributes(node, "gpu-0")["uuid"]
    namespaces = [f"team-a-{secrets.token_hex(3)}", f"team-b-{secrets.token_hex(3)}"]
    for ns in namespaces:
        cluster.create_namespace(ns)
    pods = list(zip(namespaces, ("train", "serve"), strict=True))
    capacity = {"train": {"memory": "20Gi", "computeShare": "30"}, "serve": {"memory": "10Gi"}}
    for ns, name in pods:
        cluster.apply(keep_running(share_pod(cluster, node, ns, name, capacity[name])))
    runs = {ns: node.run_pod(ns, name) for ns, name in pods}
    shared = [results(get_claim(cluster, ns, name))[0] for ns, name in pods]
    assert [r["device"] for r in shared] == ["gpu-0", "gpu-0"]
    assert shared[0]["shareID"] != shared[1]["shareID"]

    envs = {}
    for ns, run in runs.items():
        out = run.containers["main"]
        assert out.returncode is None, out.stdout  # running, its share prepared
        envs[ns] = container_env(out.stdout)
    # Exactly the share's limits, and the pipe dir the spec mounts (nothing else CUDA_).
    assert envs[namespaces[0]] == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    }
    assert envs[namespaces[1]] == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "13",  # 10Gi of 79.6Gi
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    }
    # Two daemons; each container's /dev/shm and pipe dir are its own daemon's only.
    running = daemons(node)
    assert len(running) == 2
    by_pid = {pid: directory for directory, pid in running.items()}
    seen = {ns: seen_daemon(node, run) for ns, run in runs.items()}
    assert {pid for pid, _ in seen.values()} == set(by_pid)
    for pid, mounted in seen.values():
        assert mounted == f"{by_pid[pid]}/pipe", (pid, mounted, by_pid)
    # Each daemon got its claim's limits.
    assert daemon_limits(node, set(by_pid)) == sorted(
        f"set_default_{what}"
        for pct, mib in (("30", "20480"), ("13", "10240"))
        for what in (f"active_thread_percentage {pct}", f"device_pinned_mem_limit {uuid} {mib}M")
    )
    cp = assert_consistent(node, uuid)
    assert {d["shareID"] for e in cp["claims"].values() for d in e["devices"]} == {
        r["shareID"] for r in shared
    }

    # Deleting one share stops exactly its daemon; the other keeps running as it was.
    train_uid = get_claim(cluster, namespaces[0], "train")["metadata"]["uid"]
    node.delete_pod(namespaces[0], "train")
    train_pid, serve_pid = seen[namespaces[0]][0], seen[namespaces[1]][0]
    wait_until(lambda: list(daemons(node).values()) == [serve_pid], timeout=30,
               what="the train share's daemon stopped, serve's kept",
               describe=lambda: f"{daemons(node)}\n{node.plugin_log_tail()}")  # fmt: skip
    assert pids_alive([train_pid]) == []
    wait_until(lambda: len(checkpoint(node)["claims"]) == 1, timeout=30,
               what="the train share unprepared")  # fmt: skip
    assert plugin_records(node, train_uid, "unprepared")
    assert node.pod(namespaces[1], "serve")["status"]["phase"] == "Running"
    assert_consistent(node, uuid)
    wait_deallocated(cluster, namespaces[0], "train")

    # Nothing outlives the last share: no daemon, spec, state dir; compute mode back.
    node.delete_pod(namespaces[1], "serve")
    wait_until(lambda: checkpoint(node)["claims"] == {}, timeout=30, what="every share gone")
    assert_consistent(node, uuid)
    assert daemons(node) == {} and node.cdi_specs() == {}
    assert pids_alive(list(by_pid)) == []
