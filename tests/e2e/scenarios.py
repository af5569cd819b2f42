"""Helpers the full-stack scenarios share: claims of pods, plugin log lookups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.demo.realgpu import keep_running
from dra_driver.demo.stack import RESOURCE_API, GpuNode, load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.helm import ROOT

EXAMPLES = ROOT / "deploy" / "examples"


def apply_example(cluster: Cluster, node: GpuNode, name: str, namespace: str) -> None:
    cluster.apply(pin_to_node(load_examples(EXAMPLES / name, namespace), node.name))


def apply_claimed_pod(
    cluster: Cluster, node_name: str, namespace: str, claim: str, pod: str
) -> None:
    """A claim for one ``gpu.nvidia.com`` GPU and a pod on that node using it, which keeps
    running (and its claim prepared) until deleted."""
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": claim, "namespace": namespace},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                       "deviceClassName": "gpu.nvidia.com"}}]}}})  # fmt: skip
    cluster.apply(keep_running(pin_to_node([{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": namespace},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                 "containers": [{"name": "main", "image": "busybox:1.36",
                                 "command": ["sh", "-c", "true"],
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }], node_name)))  # fmt: skip


def claim_name_of(cluster: Cluster, namespace: str, pod: str, pod_claim: str) -> str:
    obj = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    for entry in obj["spec"]["resourceClaims"]:
        if entry["name"] == pod_claim and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    for status in obj["status"].get("resourceClaimStatuses") or []:
        if status["name"] == pod_claim:
            return str(status["resourceClaimName"])
    raise AssertionError(f"pod {namespace}/{pod} has no claim {pod_claim}")


def get_claim(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.rest.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def wait_deallocated(cluster: Cluster, namespace: str, name: str) -> None:
    """A standalone claim: reservation removed and allocation cleared by the controller."""

    def done() -> bool:
        status = get_claim(cluster, namespace, name).get("status") or {}
        return not status.get("reservedFor") and not status.get("allocation")

    wait_until(
        done, timeout=30, what=f"claim {namespace}/{name} deallocated",
        describe=lambda: json.dumps(get_claim(cluster, namespace, name).get("status")),
    )  # fmt: skip


def plugin_records(node: GpuNode, claim_uid: str, msg: str) -> list[dict[str, Any]]:
    return [
        r for r in node.plugin_log_records()
        if r.get("claim_uid") == claim_uid and r.get("msg", "").startswith(msg)
    ]  # fmt: skip


def device_attributes(node: GpuNode, device: str) -> dict[str, Any]:
    for s in node.slices():
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
    raise AssertionError(f"device {device} not published on {node.name}")


def gpu_device_nodes(stdout: str) -> list[str]:
    """``/dev/nvidiaN`` entries a container listed (not the control nodes)."""
    return sorted(
        w
        for w in stdout.split()
        if w.startswith("/dev/nvidia") and w[len("/dev/nvidia") :].isdigit()
    )


def container_env(stdout: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in stdout.splitlines() if "=" in line and " " not in line
    )


def tool_calls(node: GpuNode) -> list[dict[str, Any]]:
    """Invocations of the emulated nvidia-smi / nvidia-cuda-mps-control on the node."""
    record = node.host_root / "emulation" / "tools.jsonl"
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def pids_alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


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
