"""Helpers of the fractional-GPU scenarios (``--consumable-gpus``): share claims and
pods, the node's emulated MPS daemons, and the check that what runs is what the
plugin's checkpoint records. For the real node and the Go harness alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.demo.realgpu import RealGpuNode
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster
from tests.e2e.scenarios import device_attributes, pids_alive, tool_calls

PROFILE = Path(__file__).parent / "data" / "h100-r615.yaml"
"""Two H100s on an r615 driver: a driver on which the plugin enforces shares with MPS."""

SHOW = (
    "env | grep -E '^CUDA_' | sort; ls /dev/shm /tmp/nvidia-mps; "
    "cat /dev/shm/nvidia-mps-emulated.*; grep ' /tmp/nvidia-mps ' /proc/self/mountinfo"
)
"""What a share's container prints: its CUDA_ env, its /dev/shm (where the emulated
daemon leaves ``nvidia-mps-emulated.<pid>`` holding its host pipe dir), its pipe dir,
and where that pipe dir is mounted from."""

Node = GpuNode | RealGpuNode


def share_pod(
    cluster: Cluster, node: Node, ns: str, name: str, capacity: dict[str, str]
) -> list[dict[str, Any]]:
    """A claim for a share of the node's gpu-0 and a pod that prints what it got."""
    uuid = device_attributes(node, "gpu-0")["uuid"]
    cel = f"device.attributes['gpu.nvidia.com'].uuid == '{uuid}'"
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": cel}}],
        "capacity": {"requests": capacity},
    }
    return claim_and_pod(node.name, ns, name, {"requests": [gpu_request(exactly)]}, SHOW)


def gpu_request(exactly: dict[str, Any]) -> dict[str, Any]:
    """The request ``gpu`` that :func:`claim_and_pod`'s container uses."""
    return {"name": "gpu", "exactly": exactly}


def claim_and_pod(
    node_name: str,
    ns: str,
    name: str,
    devices: dict[str, Any],
    script: str,
    *,
    env: dict[str, str] | None = None,
    grace_s: int | None = None,
) -> list[dict[str, Any]]:
    """A claim ``name`` (``spec.devices``: ``devices``) and a pod ``name`` on
    ``node_name`` whose busybox container runs ``script`` with the claim's request
    ``gpu`` (and ``env``; ``grace_s``: its termination grace period)."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": devices},
    }
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", script],
        "resources": {"claims": [{"name": "gpu"}]},
    }
    if env is not None:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [container],
    }
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": spec}  # fmt: skip
    return [claim, *pin_to_node([pod], node_name)]


def daemons(node: Node) -> dict[str, int]:
    """Live MPS control daemons of the node: daemon dir -> PID."""
    started = [
        c for c in tool_calls(node) if c["tool"] == "mps-daemon" and c.get("event") == "started"
    ]
    alive = set(pids_alive([c["pid"] for c in started]))
    return {
        str(Path(c["env"]["CUDA_MPS_PIPE_DIRECTORY"]).parent): c["pid"]
        for c in started
        if c["pid"] in alive
    }


def daemon_limits(node: Node, pids: set[int]) -> list[str]:
    """The commands the given daemons were sent (``set_default_*``), sorted."""
    return sorted(c["command"] for c in tool_calls(node) if "command" in c and c["pid"] in pids)


def compute_mode(node: Node, uuid: str) -> str:
    modes = [c["argv"][3] for c in tool_calls(node)
             if c["tool"] == "nvidia-smi" and c["argv"][:3] == ["-i", uuid, "-c"]]  # fmt: skip
    return modes[-1] if modes else "DEFAULT"


def checkpoint(node: Node) -> dict[str, Any]:
    return json.loads((node.state_dir / "checkpoint.json").read_text())  # type: ignore[no-any-return]


def assert_consistent(node: Node, uuid: str) -> dict[str, Any]:
    """What runs is what the checkpoint records; returns the checkpoint."""
    cp = checkpoint(node)
    assert all(e["state"] == "Prepared" for e in cp["claims"].values()), cp["claims"]
    recorded = {str(node.state_dir / "mps" / u["record"]["daemonId"])
                for e in cp["claims"].values() for u in e["units"]}  # fmt: skip
    assert set(daemons(node)) == recorded
    assert {str(p) for p in (node.state_dir / "mps").glob("*")} == recorded
    assert set(node.cdi_specs()) == {f"k8s.gpu.nvidia.com-claim_{u}.json" for u in cp["claims"]}
    expected = "EXCLUSIVE_PROCESS" if cp["claims"] else "DEFAULT"
    assert compute_mode(node, uuid) == expected
    return cp
