"""SIGKILL in the middle of a fractional share's prepare and of its unprepare, on the Go
kubelet harness (the kubelet's DRA code, the CDI library and runc) with our plugin
(``--consumable-gpus all``) on an emulated r615 node: the restarted plugin alone leaves
the MPS daemons, mounts, specs and compute mode as its checkpoint records, the other
share untouched.

Why the harness and not the real node (where test_shares.py runs the two-namespace
scenario): this test calls NodePrepareResources/NodeUnprepareResources itself, so it
sees the state the restarted plugin leaves *before* any retry and checks that the
interrupted call failed. The real kubelet retries on its own schedule as soon as the
plugin registers again, so there the plugin's own recovery cannot be told apart from
the kubelet's retry finishing the work."""

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
from dra_driver.demo.stack import GpuNode
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.conftest import short_tmp
from tests.e2e.scenarios import (
    container_env,
    device_attributes,
    get_claim,
    plugin_records,
    tool_calls,
)
from tests.e2e.shares import PROFILE, assert_consistent, checkpoint, daemons, share_pod


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
    # The sockets come up before the GPU layer and its start-up recovery (a kubelet call
    # waits for it): look at the state once recovery has settled every interrupted claim.
    wait_until(lambda: all(e["state"] == "Prepared" for e in checkpoint(node)["claims"].values()),
               timeout=30, what="recovery of the interrupted claim at restart")  # fmt: skip


def test_sigkill_during_share_prepare_and_unprepare_leaves_the_daemons_as_recorded(
    cluster: Cluster, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    uuid = device_attributes(node, "gpu-0")["uuid"]
    ns = f"kill-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    cluster.apply(share_pod(cluster, node, ns, "stays", {"memory": "30Gi"}))
    node.run_pod(ns, "stays", container_runtime)
    (bystander,) = daemons(node).values()

    # Killed while the new share's daemon is told its limits: rolled back at restart.
    cluster.apply(share_pod(cluster, node, ns, "new", {"memory": "8Gi", "computeShare": "20"}))
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
