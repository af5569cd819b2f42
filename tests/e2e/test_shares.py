"""Fractional GPUs through the whole node path: our plugin (``--consumable-gpus all``) on an
emulated r615 node, the real scheduler, the kubelet's DRA code, the CDI library and runc.
Two pods from two namespaces share one GPU, each container sees its own limits and only
its own MPS daemon; the plugin SIGKILLed in the middle of a share's prepare and of its
unprepare comes back consistent with its checkpoint, the other share untouched."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.kubeletharness import HarnessError
from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.conftest import short_tmp
from tests.e2e.scenarios import (
    container_env,
    device_attributes,
    get_claim,
    pids_alive,
    plugin_records,
    results,
    tool_calls,
)

PROFILE = Path(__file__).parent / "data" / "h100-r615.yaml"
SHOW = "env | grep -E '^CUDA_' | sort; ls /dev/shm /tmp/nvidia-mps"


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], kubelet_harness_binary: Path
) -> Iterator[GpuNode]:
    with short_tmp("e2e-shares") as tmp:
        started = GpuNode(
            cluster=cluster,
            name=f"e2e-shares-{secrets.token_hex(3)}",
            profile=str(PROFILE),
            workdir=tmp,
            harness_binary=kubelet_harness_binary,
            plugin_args=["--consumable-gpus=all"],
            dedicated=True,
        )
        try:
            started.start()
            yield started
        finally:
            started.stop()


def share_pod(
    cluster: Cluster, node: GpuNode, ns: str, name: str, capacity: dict[str, str]
) -> None:
    """A claim for a share of the node's gpu-0 and a pod that prints what it got."""
    uuid = device_attributes(node, "gpu-0")["uuid"]
    cel = f"device.attributes['gpu.nvidia.com'].uuid == '{uuid}'"
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": cel}}],
                "capacity": {"requests": capacity},
            }}]}},
        }
    )  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", SHOW],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    cluster.apply(pin_to_node([pod], node.name)[0])


def daemons(node: GpuNode) -> dict[str, int]:
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


def compute_mode(node: GpuNode, uuid: str) -> str:
    modes = [c["argv"][3] for c in tool_calls(node)
             if c["tool"] == "nvidia-smi" and c["argv"][:3] == ["-i", uuid, "-c"]]  # fmt: skip
    return modes[-1] if modes else "DEFAULT"


def checkpoint(node: GpuNode) -> dict[str, Any]:
    return json.loads((node.state_dir / "checkpoint.json").read_text())  # type: ignore[no-any-return]


def assert_consistent(node: GpuNode, uuid: str) -> dict[str, Any]:
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


def test_two_namespaces_share_one_gpu_each_with_its_own_limits(
    cluster: Cluster, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    uuid = device_attributes(node, "gpu-0")["uuid"]
    namespaces = [f"team-a-{secrets.token_hex(3)}", f"team-b-{secrets.token_hex(3)}"]
    for ns in namespaces:
        cluster.create_namespace(ns)
    share_pod(cluster, node, namespaces[0], "train", {"memory": "20Gi", "computeShare": "30"})
    share_pod(cluster, node, namespaces[1], "serve", {"memory": "10Gi"})
    pods = list(zip(namespaces, ("train", "serve"), strict=True))
    runs = {ns: node.run_pod(ns, name, container_runtime) for ns, name in pods}
    shared = [results(get_claim(cluster, ns, name))[0] for ns, name in pods]
    assert [r["device"] for r in shared] == ["gpu-0", "gpu-0"]
    assert shared[0]["shareID"] != shared[1]["shareID"]

    envs = {}
    for ns, run in runs.items():
        out = run.containers["main"]
        assert out.returncode == 0, out.stderr
        envs[ns] = container_env(out.stdout)
    assert envs[namespaces[0]]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert envs[namespaces[0]]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert envs[namespaces[1]]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "13"  # 10Gi of 79.6Gi
    assert envs[namespaces[1]]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    # Each container's /dev/shm holds the marker of its own daemon, and only that one.
    running = daemons(node)
    assert len(running) == 2
    seen = {ns: {w.rsplit(".", 1)[1] for w in run.containers["main"].stdout.split()
                 if w.startswith("nvidia-mps-emulated.")} for ns, run in runs.items()}  # fmt: skip
    assert all(len(pids) == 1 for pids in seen.values()), seen
    assert {int(next(iter(p))) for p in seen.values()} == set(running.values())
    # Each daemon got its claim's limits.
    pids = set(running.values())
    limits = sorted(c["command"] for c in tool_calls(node) if "command" in c and c["pid"] in pids)
    assert limits == sorted(
        f"set_default_{what}"
        for pct, mib in (("30", "20480"), ("13", "10240"))
        for what in (f"active_thread_percentage {pct}", f"device_pinned_mem_limit {uuid} {mib}M")
    )
    cp = assert_consistent(node, uuid)
    recorded = {d["shareID"] for e in cp["claims"].values() for d in e["devices"]}
    assert recorded == {r["shareID"] for r in shared}

    node.delete_pod(namespaces[0], "train")
    left = daemons(node)
    assert len(left) == 1 and set(left.values()) <= set(running.values())
    assert_consistent(node, uuid)
    node.delete_pod(namespaces[1], "serve")
    assert_consistent(node, uuid)
    assert daemons(node) == {} and node.cdi_specs() == {}


def hold(node: GpuNode, pattern: str | None) -> None:
    """Make the emulated tool calls containing ``pattern`` wait (None: release them)."""
    path = node.host_root / "emulation" / "tools.jsonl.hold"
    if pattern is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(pattern + "\n")


def kill_while(node: GpuNode, call: Any, pattern: str) -> None:
    """Run ``call`` (a harness call) until a tool call with ``pattern`` is in flight, then
    SIGKILL the plugin with its tools and start it again."""
    seq = node.harness.last_seq()  # now: the harness answers one call at a time
    seen = sum(pattern in json.dumps(c) for c in tool_calls(node))
    hold(node, pattern)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:  # reported below
            failed.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: sum(pattern in json.dumps(c) for c in tool_calls(node)) > seen,
               timeout=30, what=f"a tool call with {pattern!r} in flight")  # fmt: skip
    node.kill_plugin(with_tools=True)
    thread.join(timeout=60)
    assert not thread.is_alive() and failed, "the call should fail with the plugin gone"
    assert isinstance(failed[0], HarnessError), failed
    hold(node, None)
    node.start_plugin()
    node.harness.wait_registered(node.driver, after_seq=seq, timeout=30)


def test_sigkill_during_share_prepare_and_unprepare_leaves_the_daemons_as_recorded(
    cluster: Cluster, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    uuid = device_attributes(node, "gpu-0")["uuid"]
    ns = f"kill-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    share_pod(cluster, node, ns, "stays", {"memory": "30Gi"})
    node.run_pod(ns, "stays", container_runtime)
    (bystander,) = daemons(node).values()

    # Killed while the new share's daemon is told its limits: rolled back at restart.
    share_pod(cluster, node, ns, "new", {"memory": "8Gi", "computeShare": "20"})
    node.wait_bound(ns, "new")
    limits = "set_default_active_thread_percentage 20"
    kill_while(node, lambda: node.harness.prepare(ns, "new"), limits)
    cp = assert_consistent(node, uuid)
    assert len(cp["claims"]) == 1 and list(daemons(node).values()) == [bystander]
    uid = get_claim(cluster, ns, "new")["metadata"]["uid"]
    assert [r["msg"] for r in plugin_records(node, uid, "finishing")] == [
        "finishing an interrupted preparing"
    ]

    run = node.run_pod(ns, "new", container_runtime)  # the kubelet tries again: it works
    assert container_env(run.containers["main"].stdout)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert len(assert_consistent(node, uuid)["claims"]) == 2

    # Killed while its daemon is asked to quit: the teardown finishes at restart.
    cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/new")
    kill_while(node, lambda: node.harness.unprepare(ns, "new"), "quit")
    cp = assert_consistent(node, uuid)
    assert len(cp["claims"]) == 1 and list(daemons(node).values()) == [bystander]
    assert [r["msg"] for r in plugin_records(node, uid, "finishing")][-1] == (
        "finishing an interrupted unpreparing"
    )
    node.harness.unprepare(ns, "new")  # the kubelet's retry: nothing left to do
    assert list(daemons(node).values()) == [bystander]

    node.delete_pod(ns, "stays")
    assert assert_consistent(node, uuid)["claims"] == {}
    assert daemons(node) == {} and node.cdi_specs() == {}
