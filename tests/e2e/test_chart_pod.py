"""The chart's DaemonSet container, run as-is: its args and env (NODE_NAME and
POD_UID from the downward API, rolling-update sockets) start a plugin that the
kubelet's own code registers and that prepares a pod's claim. No kubelet runs
pods here, so the container's command runs as a local process with the
ServiceAccount token the pod would get (bound to the node)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_driver.demo.kubeletharness import HarnessError, KubeletHarness
from dra_driver.demo.stack import load_examples, node_bound_kubeconfig, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from tests.e2e.helm import build_helm, render
from tests.e2e.scenarios import EXAMPLES


def container_env(container: dict[str, Any], node: str, pod_uid: str) -> dict[str, str]:
    """The env the kubelet would give the container (downward API resolved)."""
    fields = {"spec.nodeName": node, "metadata.uid": pod_uid}
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def test_chart_container_registers_and_prepares(
    cluster: Cluster, cluster_namespace: str, driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> None:  # fmt: skip
    # Short: the UID-suffixed socket paths below must stay under 108 bytes.
    work = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))
    name = f"chart-{secrets.token_hex(3)}"
    node = cluster.create_node(name)
    kubeconfig = node_bound_kubeconfig(cluster, node, work)
    objs = render(
        build_helm(),
        "--set", f"kubeletRootDir={work}/kubelet",
        "--set", f"cdiDir={work}/cdi",
        "--set", "emulate=dgx-a100",
    )  # fmt: skip
    (ds,) = (o for o in objs if o["kind"] == "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    pod_uid = "0c0ffee0-0000-4000-8000-000000000001"
    env = {**os.environ, **container_env(container, name, pod_uid), "KUBECONFIG": str(kubeconfig)}
    harness = KubeletHarness(
        binary=kubelet_harness_binary, kubeconfig=cluster.kubeconfig, node_name=name,
        root_dir=work / "kubelet", log_path=work / "kubelet-harness.log",
    )  # fmt: skip
    harness.start()
    log = (work / "plugin.log").open("wb")
    # The image entry point execs `dra-driver` with the arguments the chart gives.
    plugin = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", *container["args"]],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert plugin.poll() is None, (work / "plugin.log").read_text()[-3000:]
            try:
                harness.wait_registered("gpu.nvidia.com", timeout=1)
                break
            except HarnessError:
                assert time.monotonic() < deadline, (work / "plugin.log").read_text()[-3000:]
        (event,) = [e for e in harness.registrations() if e["kind"] == "register"]
        # Rolling-update mode from POD_UID: the kubelet dials the UID-suffixed socket.
        assert event["endpoint"] == f"{work}/kubelet/plugins/gpu.nvidia.com/dra-{pod_uid}.sock"
        assert (
            work / "kubelet" / "plugins_registry" / f"gpu.nvidia.com-{pod_uid}-reg.sock"
        ).exists()

        ns = cluster_namespace
        cluster.apply(pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), name))
        wait_until(
            lambda: cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/gpu-by-memory")["spec"].get(
                "nodeName"
            ),
            timeout=60, what="pod bound",
        )  # fmt: skip
        prepared = harness.prepare(ns, "gpu-by-memory")
        (cdi_id,) = prepared.containers["main"].cdi_devices
        assert cdi_id.startswith("k8s.gpu.nvidia.com/claim=")
        assert [p.name for p in (work / "cdi").iterdir()] == [
            f"k8s.gpu.nvidia.com-claim_{cdi_id.split('=')[1].rsplit('-gpu-', 1)[0]}.json"
        ]
        cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/gpu-by-memory")
        harness.unprepare(ns, "gpu-by-memory")
        assert list((work / "cdi").iterdir()) == []
    finally:
        if plugin.poll() is None:
            os.kill(plugin.pid, signal.SIGTERM)
            plugin.wait(timeout=15)
        log.close()
        harness.stop()
        shutil.rmtree(work, ignore_errors=True)
