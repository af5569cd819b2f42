"""A surge upgrade as the chart's DaemonSet does it (rollingUpdate on): the new
plugin pod starts while the old one still serves, the kubelet code registers
both (UID-suffixed sockets), the old one stops, and the new one prepares new
pods and unprepares the claims the old one prepared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.runtime import ContainerRuntime
from dra_driver.demo.stack import GpuNode, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.conftest import short_tmp, start_node
from tests.e2e.scenarios import apply_example, claim_name_of, get_claim


@pytest.fixture(scope="module")
def node(
    cluster: Cluster,
    driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> Iterator[GpuNode]:
    with short_tmp("e2e-upgrade") as tmp:
        started = start_node(
            cluster, kubelet_harness_binary, tmp, "dgx-a100",
            plugin_args=["--rolling-update-uid=0aaaaaaa-old"],
        )  # fmt: skip
        yield started
        started.stop()


def records(log: Path, claim_uid: str, msg: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("claim_uid") == claim_uid and rec.get("msg", "").startswith(msg):
                out.append(rec)
    return out


def test_surge_upgrade_hands_claims_to_the_new_plugin(
    cluster: Cluster, cluster_namespace: str, node: GpuNode, container_runtime: ContainerRuntime
) -> None:
    ns = cluster_namespace
    apply_example(cluster, node, "gpu-by-memory.yaml", ns)
    assert node.run_pod(ns, "gpu-by-memory", container_runtime).containers["main"].returncode == 0
    old_uid = get_claim(cluster, ns, claim_name_of(cluster, ns, "gpu-by-memory", "gpu"))[
        "metadata"
    ]["uid"]
    assert records(node.plugin_log, old_uid, "prepared")
    devices = node.published_devices()

    seq = node.harness.last_seq()
    new_log = node.workdir / "plugin-new.log"
    argv = [a for a in node.plugin_argv() if not a.startswith("--rolling-update-uid=")]
    with new_log.open("ab") as log:
        new = subprocess.Popen(
            [*argv, "--rolling-update-uid=0bbbbbbb-new"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        node.harness.wait_registered(node.driver, after_seq=seq, timeout=30)
        endpoints = {e["endpoint"] for e in node.harness.registrations() if e["kind"] == "register"}
        assert len(endpoints) == 2, endpoints  # both pods' sockets registered at once

        node.stop_plugin()  # the old pod terminates
        wait_until(
            lambda: any(e["kind"] == "deregister" for e in node.harness.registrations()),
            timeout=30, what="the old plugin deregistered",
        )  # fmt: skip
        assert node.published_devices() == devices  # slices untouched by the switch

        objs = pin_to_node(
            [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after", "namespace": ns},
              "spec": {"restartPolicy": "Never",
                       "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}],
                       "containers": [{"name": "main", "image": "busybox",
                                       "command": ["sh", "-c", "ls /dev/nvidia*"],
                                       "resources": {"claims": [{"name": "gpu"}]}}]}}],
            node.name,
        )  # fmt: skip
        cluster.apply(objs)
        run = node.run_pod(ns, "after", container_runtime)
        assert run.containers["main"].returncode == 0
        new_uid = get_claim(cluster, ns, claim_name_of(cluster, ns, "after", "gpu"))["metadata"][
            "uid"
        ]
        assert records(new_log, new_uid, "prepared")

        node.delete_pod(ns, "gpu-by-memory")
        node.delete_pod(ns, "after")
        assert records(new_log, old_uid, "unprepared"), "new plugin must unprepare old claims"
        assert records(new_log, new_uid, "unprepared")
        assert node.cdi_specs() == {}
    finally:
        if new.poll() is None:
            os.kill(new.pid, signal.SIGTERM)
            new.wait(timeout=15)
