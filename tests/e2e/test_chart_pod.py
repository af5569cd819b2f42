"""The chart's DaemonSet container, run as-is: its args and env (DRA_NODE_NAME and
DRA_ROLLING_UPDATE_UID from the downward API, rolling-update sockets,
DRA_HOST_DRIVER_ROOT, DRA_HEALTH_PORT) start a plugin that the kubelet's own code
registers, that answers the chart's probes, and that prepares a pod's claim with
CDI paths the node's runtime can open. No kubelet runs pods here, so the container's command runs as
a local process with the ServiceAccount token the pod would get (bound to the
node); only the driver root's mount point (/driver-root in the pod) is moved
into the test's emulated tree."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dra_driver.demo.kubeletharness import HarnessError, KubeletHarness
from dra_driver.demo.stack import load_examples, node_bound_kubeconfig, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.gpu.emulation.hosttree import DRIVER_ROOT
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """What the kubelet's httpGet probe sees."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_chart_container_registers_and_prepares(
    cluster: Cluster, cluster_namespace: str, driver_objects: list[str],
    kubelet_harness_binary: Path,
) -> None:  # fmt: skip
    # Short: the UID-suffixed socket paths below must stay under 108 bytes.
    work = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))
    name = f"chart-{secrets.token_hex(3)}"
    node = cluster.create_node(name)
    kubeconfig = node_bound_kubeconfig(cluster, node, work)
    port = free_port()
    objs = render(
        build_helm(),
        "--set", f"kubeletRootDir={work}/kubelet",
        "--set", f"cdiDir={work}/cdi",
        "--set", "emulate=dgx-a100",
        "--set", "driverRoot=/run/nvidia/driver",
        "--set", f"healthPort={port}",
    )  # fmt: skip
    (ds,) = (o for o in objs if o["kind"] == "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    pod_uid = "0c0ffee0-0000-4000-8000-000000000001"
    env = {
        **os.environ,
        **container_env(container, name, pod_uid),
        "DRA_KUBECONFIG": str(kubeconfig),
        "DRA_HOST_ROOT": str(work / "host"),  # the emulated node's tree, to find its driver
    }
    assert env["DRA_HOST_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["DRA_HEALTH_PORT"] == str(port)
    # The pod mounts the host's driver root at /driver-root; here it is the emulated one.
    assert "--driver-root=/driver-root" in container["args"]
    args = [
        f"--driver-root={work / 'host' / DRIVER_ROOT}" if a == "--driver-root=/driver-root" else a
        for a in container["args"]
    ]
    harness = KubeletHarness(
        binary=kubelet_harness_binary, kubeconfig=cluster.kubeconfig, node_name=name,
        root_dir=work / "kubelet", log_path=work / "kubelet-harness.log",
    )  # fmt: skip
    harness.start()
    log = (work / "plugin.log").open("wb")
    # The image entry point execs `dra-driver` with the arguments the chart gives.
    plugin = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", *args],
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
        # Rolling-update mode from DRA_ROLLING_UPDATE_UID: the kubelet dials that socket.
        assert event["endpoint"] == f"{work}/kubelet/plugins/gpu.nvidia.com/dra-{pod_uid}.sock"
        assert (
            work / "kubelet" / "plugins_registry" / f"gpu.nvidia.com-{pod_uid}-reg.sock"
        ).exists()
        # The chart's probes: live at once, ready once registered and published.
        assert probe(port, "/healthz") == (200, {"ok": True, "problems": []})
        wait_until(lambda: probe(port, "/readyz")[0] == 200, timeout=30, what="/readyz 200")

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
        (spec_file,) = (work / "cdi").iterdir()
        assert spec_file.name == (
            f"k8s.gpu.nvidia.com-claim_{cdi_id.split('=')[1].rsplit('-gpu-', 1)[0]}.json"
        )
        # Driver files are named where the node's runtime finds them (DRA_HOST_DRIVER_ROOT),
        # not where the plugin read them.
        spec = json.loads(spec_file.read_text())
        edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
        mounts = [m["hostPath"] for e in edits for m in e.get("mounts", [])]
        hooks = [h["path"] for e in edits for h in e.get("hooks", [])]
        assert any(m.startswith("/run/nvidia/driver/") and "libcuda" in m for m in mounts), mounts
        assert not [p for p in mounts + hooks if str(work) in p], (mounts, hooks)
        cluster.rest.delete(f"/api/v1/namespaces/{ns}/pods/gpu-by-memory")
        harness.unprepare(ns, "gpu-by-memory")
        assert list((work / "cdi").iterdir()) == []
        os.kill(plugin.pid, signal.SIGTERM)
        assert plugin.wait(timeout=15) == 0
        with pytest.raises(OSError):  # the health endpoint went with the plugin
            probe(port, "/healthz")
    finally:
        if plugin.poll() is None:
            os.kill(plugin.pid, signal.SIGTERM)
            plugin.wait(timeout=15)
        log.close()
        harness.stop()
        shutil.rmtree(work, ignore_errors=True)
