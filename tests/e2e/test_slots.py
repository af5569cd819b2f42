"""MPS slots on a real node: our plugin with the chart's ``mpsSlots`` splitting one L4 of
an emulated 580-driver node into four slots, the real scheduler handing out slots to
claims from two namespaces (no capacity requested), the real kubelet preparing them
through our plugin, containerd starting busybox containers that act as CUDA clients of
the emulated MPS daemon (:mod:`dra_driver.emulation.mpsclients`). Both containers
see the pipe dir and ``/dev/shm`` of the GPU's one daemon and one slot's limits; one
that asks for 40G and 100 % and one that unsets its ``CUDA_MPS_*`` variables both get
one slot, and an allocation beyond it fails. The daemon outlives the first pod and not
the last; the GPU is back to its mode after."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.realgpu import RealGpuNode, keep_running
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import container_env, device_attributes, get_claim, pids_alive, results
from tests.e2e.shares import (
    SHOW,
    assert_consistent,
    checkpoint,
    claim_and_pod,
    compute_mode,
    daemon_limits,
    gpu_request,
)
from tests.e2e.shares import daemons as live_daemons
from tests.e2e.test_shares import seen_daemon

PROFILE = Path(__file__).parent / "data" / "l4-r580.yaml"
SLOT_MIB = 5758  # 23034 MiB / 4, rounded down
CLIENT = r"""
P=$CUDA_MPS_PIPE_DIRECTORY; ID=$(hostname); F=$P/clients/$ID
ask() {
  prev=$(cat $F 2>/dev/null); echo "$1" > $P/control; i=0
  while [ "$(cat $F 2>/dev/null)" = "$prev" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
  echo "== $1"; cat $F
}
"""
"""A CUDA client in busybox ``sh``: ``ask <request>`` sends one line of the emulated
daemon's client protocol and prints the daemon's answer once it changed."""
HOW = {
    "greedy": "export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40G CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
    "unset": "unset CUDA_MPS_PINNED_DEVICE_MEM_LIMIT CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
}


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    values = {"mpsSlots": "NVIDIA L4=4"}
    with real_gpu_node(cluster, node_binaries, helm_binary, str(PROFILE), values=values) as n:
        yield n


def slot_pod(node: RealGpuNode, ns: str, name: str) -> list[dict[str, Any]]:
    """A claim for one slot of gpu-0 (no capacity requested: the policy's one slot) and a
    pod that prints what it got and then acts as a client asking for more than a slot."""
    uuid = device_attributes(node, "gpu-0")["uuid"]
    attrs = "device.attributes['gpu.nvidia.com']"
    cel = f"{attrs}.uuid == '{uuid}' && 'mpsSlots' in {attrs} && {attrs}.mpsSlots == 4"
    exactly = {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": cel}}]}
    script = (
        f"{SHOW}; {CLIENT}\n{HOW[name]}\n"
        'ask "client $ID ${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:--} '
        '${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:--}"\n'
        f'ask "alloc $ID {SLOT_MIB}"; ask "alloc $ID 1"'
    )
    return claim_and_pod(node.name, ns, name, {"requests": [gpu_request(exactly)]}, script)


def answers(stdout: str) -> list[dict[str, str]]:
    """The daemon's answers the client printed, in order."""
    out: list[dict[str, str]] = []
    for line in stdout.splitlines():
        if line.startswith("== "):
            out.append({"request": line[3:]})
        elif out and "=" in line:
            key, value = line.split("=", 1)
            out[-1][key] = value
    return out


def test_slots_of_two_namespaces_share_the_gpus_daemon_and_hold_one_slot(
    cluster: Cluster, node: RealGpuNode
) -> None:
    uuid = device_attributes(node, "gpu-0")["uuid"]
    pods = {"greedy": f"team-a-{secrets.token_hex(3)}", "unset": f"team-b-{secrets.token_hex(3)}"}
    for name, ns in pods.items():
        cluster.create_namespace(ns)
        cluster.apply(keep_running(slot_pod(node, ns, name)))
    runs = {name: node.run_pod(ns, name) for name, ns in pods.items()}
    slots = {name: results(get_claim(cluster, ns, name))[0] for name, ns in pods.items()}
    assert {r["device"] for r in slots.values()} == {"gpu-0"}
    assert slots["greedy"]["shareID"] != slots["unset"]["shareID"]
    assert all(r["consumedCapacity"] == {"memory": f"{SLOT_MIB}Mi", "computeShare": "25"}
               for r in slots.values())  # fmt: skip

    # One daemon for both, its defaults one slot; each container has its pipe and /dev/shm.
    running = live_daemons(node)
    assert len(running) == 1, running
    ((directory, pid),) = running.items()
    assert [c for c in daemon_limits(node, {pid}) if c.startswith("set_default")] == sorted(
        [
            "set_default_active_thread_percentage 25",
            f"set_default_device_pinned_mem_limit {uuid} {SLOT_MIB}M",
        ]
    )
    for name, run in runs.items():
        out = run.containers["main"]
        assert out.returncode is None, out.stdout  # running, its slot prepared
        shown = out.stdout.split("== ", 1)[0]
        assert container_env(shown) == {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={SLOT_MIB}M",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        }, name
        assert seen_daemon(node, run) == (pid, f"{directory}/pipe"), name
        # Asked for 40G and 100 %, or nothing at all: one slot either way.
        connected, fits, over = answers(out.stdout)
        assert connected["daemon"] == str(pid), connected
        assert connected["memory_limit_mib"] == str(SLOT_MIB), (name, connected)
        assert connected["active_thread_percentage"] == "25", (name, connected)
        assert fits["last"] == f"allocated {SLOT_MIB}", (name, fits)
        assert over["last"].startswith("out of memory"), (name, over)
        assert over["allocated_mib"] == str(SLOT_MIB)
    assert compute_mode(node, uuid) == "EXCLUSIVE_PROCESS"
    assert_consistent(node, uuid)

    # The first pod goes: the daemon stays (same process); the last: nothing is left.
    node.delete_pod(pods["greedy"], "greedy")
    wait_until(lambda: len(checkpoint(node)["claims"]) == 1, timeout=30,
               what="the greedy slot unprepared")  # fmt: skip
    assert live_daemons(node) == {directory: pid}
    assert compute_mode(node, uuid) == "EXCLUSIVE_PROCESS"
    node.delete_pod(pods["unset"], "unset")
    wait_until(lambda: checkpoint(node)["claims"] == {}, timeout=30, what="every slot gone")
    assert live_daemons(node) == {} and pids_alive([pid]) == []
    assert compute_mode(node, uuid) == "DEFAULT" and node.cdi_specs() == {}
    assert_consistent(node, uuid)
