"""A surge upgrade as the chart's DaemonSet does it (rollingUpdate: maxSurge 1),
on a real node: the new plugin starts while the old one still serves, the real
kubelet registers both (UID-suffixed sockets), the old one stops, and the new
one prepares new pods and unprepares the claims the old one prepared."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.realgpu import RealGpuNode, free_port, keep_running
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.conftest import real_gpu_node
from tests.e2e.scenarios import EXAMPLES, claim_name_of, get_claim, plugin_records


@pytest.fixture(scope="module")
def node(
    cluster: Cluster, driver_objects: list[str], node_binaries: NodeBinaries, helm_binary: Path
) -> Iterator[RealGpuNode]:
    with real_gpu_node(cluster, node_binaries, helm_binary, "dgx-a100") as started:
        yield started


def claim_uid(cluster: Cluster, ns: str, pod: str) -> str:
    return str(get_claim(cluster, ns, claim_name_of(cluster, ns, pod, "gpu"))["metadata"]["uid"])


def test_surge_upgrade_hands_claims_to_the_new_plugin(
    cluster: Cluster, cluster_namespace: str, node: RealGpuNode
) -> None:
    ns = cluster_namespace
    objs = keep_running(pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), node.name))
    cluster.apply(objs)
    node.run_pod(ns, "gpu-by-memory")
    old_uid = claim_uid(cluster, ns, "gpu-by-memory")
    assert plugin_records(node, old_uid, "prepared")
    devices = node.published_devices()
    sockets = node.node.paths.kubelet_root / "plugins_registry"
    assert [p.name for p in sockets.iterdir()] == [f"gpu.nvidia.com-{node.pod_uid}-reg.sock"]

    # The new pod: same container, its own pod UID (and, being its own pod, its
    # own network namespace: here its own health port).
    new_pod_uid = str(uuid.uuid4())
    new_log = node.workdir / "plugin-new.log"
    env = {**node.plugin_env(new_pod_uid), "DRA_HEALTH_PORT": str(free_port())}
    with new_log.open("ab") as log:
        new = subprocess.Popen(node.plugin_argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: node.registrations(new_log) >= 1, timeout=60,
                   what="the real kubelet registered the new plugin beside the old")  # fmt: skip
        assert sorted(p.name for p in sockets.iterdir()) == sorted(
            f"gpu.nvidia.com-{uid}-reg.sock" for uid in (node.pod_uid, new_pod_uid)
        )
        node.stop_plugin()  # the old pod terminates
        wait_until(lambda: len(list(sockets.iterdir())) == 1, timeout=30,
                   what="the old plugin's registration socket removed")  # fmt: skip
        assert node.published_devices() == devices  # slices untouched by the switch

        after = keep_running(objs)[-1]
        after["metadata"]["name"] = "after"
        cluster.apply(after)
        node.run_pod(ns, "after")
        new_uid = claim_uid(cluster, ns, "after")
        assert plugin_records(node, new_uid, "prepared") == []
        assert [r for r in node.plugin_log_records(new_log)
                if r.get("claim_uid") == new_uid and r["msg"].startswith("prepared")]  # fmt: skip

        node.delete_pod(ns, "gpu-by-memory")
        node.delete_pod(ns, "after")
        wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed")
        unprepared = {r.get("claim_uid") for r in node.plugin_log_records(new_log)
                      if r.get("msg", "").startswith("unprepared")}  # fmt: skip
        assert {old_uid, new_uid} <= unprepared, "the new plugin must unprepare the old claims"
    finally:
        if new.poll() is None:
            os.kill(new.pid, signal.SIGTERM)
            new.wait(timeout=15)
