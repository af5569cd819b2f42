"""Device health on the real control plane: taints from NVML faults steer the real scheduler,
the real device-taint-eviction controller evicts on NoExecute, and recovery brings devices back.

Our plugin runs in-process on an emulated GPU node (the GPU driver with its health monitor,
the plugin layer with its publisher and health stream) under the shipped RBAC. Faults are
injected below pynvml, as a GPU would report them.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.api import ApiError
from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.hardware.devices import NumaAttributeForm
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.monitoring.healthpolicy import HealthPolicy
from dra_driver.gpu.monitoring.metrics import GpuMetrics
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin._proto import health_v1_pb2, health_v1_pb2_grpc
from dra_driver.plugin.healthz import HealthServer
from tests.cluster.test_allocation import (
    GPU,
    allocation,
    apply_deviceclasses,
    claim_and_pod,
    request,
    stays_unallocated,
)
from tests.plugin.clusterkit import (
    PluginOnNode,
    apply_rbac,
    node_bound_kubeconfig,
    our_slices,
    start_plugin_on_node,
    unique,
)

DRIVER = "gpu.nvidia.com"
LOG = logging.getLogger("tests.health")


@dataclass
class HealthNode:
    node: EmulatedNode
    driver: GpuDriver
    on_node: PluginOnNode

    @property
    def name(self) -> str:
        return self.on_node.node_name

    def taints(self, cluster: Cluster) -> dict[str, list[tuple[str, str, str]]]:
        return self.taints_of(cluster, self.name)

    @staticmethod
    def taints_of(cluster: Cluster, node: str) -> dict[str, list[tuple[str, str, str]]]:
        """Device -> (key, value, effect) as stored in the API server."""
        out = {}
        for s in our_slices(cluster, DRIVER, node):
            for d in s["spec"].get("devices") or []:
                if d.get("taints"):
                    out[d["name"]] = [
                        (t["key"], t.get("value", ""), t["effect"]) for t in d["taints"]
                    ]
        return out


@contextmanager
def health_node(
    cluster: Cluster,
    profile: str,
    policy: HealthPolicy,
    registry: CollectorRegistry | None = None,
    numa_attribute_form: NumaAttributeForm = "scalar",
) -> Iterator[HealthNode]:
    """Our plugin in-process on an emulated node; ``registry`` collects all its metrics."""
    apply_deviceclasses(cluster)
    gpu_metrics = GpuMetrics(registry) if registry is not None else None
    tmp = Path(tempfile.mkdtemp(prefix="dra-h-", dir="/tmp"))
    node = EmulatedNode.create(profile, tmp / "host")
    k8s_node = cluster.create_node(unique(f"health-{profile}"))
    try:
        with node.nvml():
            driver = GpuDriver(
                driver_name=DRIVER,
                discover=lambda: discover(node.host, LOG),
                host=node.host,
                cdi_dir=tmp / "cdi",
                state_dir=tmp / "state",
                tools=GpuTools.for_host(node.host),
                logger=LOG,
                pool_name=k8s_node["metadata"]["name"],
                health_policy=policy,
                numa_attribute_form=numa_attribute_form,
                nvml_observer=gpu_metrics.nvml_call if gpu_metrics else None,
                health_events=gpu_metrics,
            )
            on_node = start_plugin_on_node(
                cluster, driver=DRIVER, backend=driver, sockets_dir=tmp, node=k8s_node,
                health_interval_s=1.0, registry=registry,
            )  # fmt: skip
            try:
                yield HealthNode(node, driver, on_node)
            finally:
                on_node.plugin.stop(grace_s=0, uninstall=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _on(h: HealthNode) -> dict[str, str]:
    return {"kubernetes.io/hostname": h.name}


def test_fatal_xid_keeps_new_pods_off_the_gpu_until_it_recovers(
    cluster: Cluster, cluster_namespace: str
) -> None:
    ns = cluster_namespace
    policy = HealthPolicy(healthy_period_s=2.0, check_interval_s=0.5)
    with health_node(cluster, "l4-x4", policy) as h:
        wait_until(lambda: h.on_node.plugin.readiness().publish.in_sync, timeout=30, what="sync")
        h.node.inject_xid(2, 79)  # profile index 2 = minor 0 = gpu-0: fell off the bus
        h.node.set_lost(2)
        taints = wait_until(
            lambda: h.taints(cluster).get("gpu-0"), timeout=30, what="gpu-0 tainted in the API"
        )
        assert (f"{DRIVER}/xid", "79", "NoSchedule") in taints
        for i in range(3):
            claim_and_pod(cluster, ns, f"xid-{i}", [request("gpus", GPU)], _on(h))
        got = {allocation(cluster, ns, f"xid-{i}")[0][2] for i in range(3)}
        assert got == {"gpu-1", "gpu-2", "gpu-3"}  # every healthy GPU, never gpu-0
        claim_and_pod(cluster, ns, "xid-3", [request("gpus", GPU)], _on(h))
        assert "cannot allocate" in stays_unallocated(cluster, ns, "xid-3")

        h.node.reset_gpu(2)  # back on the bus, no recovery action pending
        wait_until(lambda: "gpu-0" not in h.taints(cluster), timeout=30, what="taint cleared")
        assert allocation(cluster, ns, "xid-3") == [("gpus", h.name, "gpu-0")]


def test_noexecute_fault_makes_the_eviction_controller_evict_the_pod(
    cluster: Cluster, cluster_namespace: str
) -> None:
    ns = cluster_namespace
    policy = HealthPolicy(healthy_period_s=60, check_interval_s=0.5, fatal_effect="NoExecute")
    with health_node(cluster, "t4", policy) as h:
        claim_and_pod(cluster, ns, "victim", [request("gpus", GPU)], _on(h))
        assert allocation(cluster, ns, "victim") == [("gpus", h.name, "gpu-0")]
        pod_path = f"/api/v1/namespaces/{ns}/pods/victim"
        wait_until(lambda: cluster.rest.get(pod_path)["spec"].get("nodeName"), timeout=30,
                   what="pod bound")  # fmt: skip
        h.node.inject_double_bit_ecc(0)
        h.node.set_recovery_action(0, "gpu-reset")
        wanted = (f"{DRIVER}/ecc", "double-bit", "NoExecute")
        wait_until(lambda: wanted in h.taints(cluster).get("gpu-0", []), timeout=30,
                   what="NoExecute taint published")  # fmt: skip

        conditions: list[dict[str, Any]] = []

        def evicted() -> bool:
            try:
                pod = cluster.rest.get(pod_path)
            except ApiError as exc:
                return exc.status == 404  # deleted: no kubelet holds it for a grace period
            conditions[:] = pod["status"].get("conditions") or []
            return bool(pod["metadata"].get("deletionTimestamp"))

        wait_until(evicted, timeout=60, what="pod evicted by the device taint manager")
        # The controller marks why before it deletes (seen while the pod still existed).
        for c in conditions:
            if c["type"] == "DisruptionTarget":
                assert "DeviceTaint" in c.get("reason", ""), c


def _stream_health(path: Path, seen: list[dict[str, str]], stop: threading.Event) -> None:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest(), timeout=120
        )
        for msg in stream:
            seen.append(
                {
                    d.device.device_name: health_v1_pb2.HealthStatus.Name(d.health)
                    for d in msg.devices
                }
            )
            if stop.is_set():
                stream.cancel()
                return


def test_health_stream_readyz_and_slices_agree(cluster: Cluster) -> None:
    policy = HealthPolicy(healthy_period_s=2.0, check_interval_s=0.5)
    with health_node(cluster, "l4-x4", policy) as h:
        server = HealthServer(readiness=h.on_node.plugin.readiness, port=0, host="127.0.0.1",
                              logger=LOG)  # fmt: skip
        server.start()
        seen: list[dict[str, str]] = []
        stop = threading.Event()
        reader = threading.Thread(
            target=_stream_health, args=(h.on_node.plugin.paths.dra, seen, stop)
        )
        reader.start()
        try:

            def readyz() -> dict[str, Any]:
                url = f"http://127.0.0.1:{server.port}/readyz"
                try:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        return dict(json.loads(resp.read()))
                except urllib.error.HTTPError as err:
                    return dict(json.loads(err.read()))

            def views() -> tuple[set[str], set[str], set[str]]:
                slices = {
                    d for d, ts in h.taints(cluster).items() if any(t[2] != "None" for t in ts)
                }
                stream = {d for d, v in (seen[-1] if seen else {}).items() if v == "UNHEALTHY"}
                ready = {d["device"] for d in readyz()["devices"]["unhealthy"]}
                return slices, stream, ready

            wait_until(
                lambda: seen and views() == (set(), set(), set()), timeout=30, what="healthy"
            )
            h.node.inject_xid(0, 74)  # NVLink error: unusable until the healthy period passes
            wait_until(
                lambda: views() == ({"gpu-2"}, {"gpu-2"}, {"gpu-2"}), timeout=30,
                what="all three views show gpu-2 unhealthy", describe=lambda: str(views()),
            )  # fmt: skip
            assert readyz()["devices"]["unhealthy"][0]["message"] == "Xid 74 reported by NVML"
            wait_until(
                lambda: views() == (set(), set(), set()), timeout=30,
                what="all three views healthy again", describe=lambda: str(views()),
            )  # fmt: skip
        finally:
            stop.set()
            reader.join(timeout=10)
            server.stop()


def test_the_daemon_taints_a_gpu_on_an_xid_injected_from_another_process(
    cluster: Cluster,
) -> None:
    """``dra-driver kubelet-plugin`` as a process (default health policy): the Xid is
    written to the emulated node's control file by this process and reaches the plugin's
    NVML event wait, as a real Xid reaches a real plugin from the driver."""
    apply_rbac(cluster)
    node = cluster.create_node(unique("health-daemon"))
    name = node["metadata"]["name"]
    tmp = Path(tempfile.mkdtemp(prefix="dra-hd-", dir="/tmp"))
    root = tmp / "host"
    argv = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", name,
        "--emulate", "l4-x4", "--host-root", str(root), "--cdi-dir", str(tmp / "cdi"),
        "--kubelet-registry-dir", str(tmp / "registry"),
        "--kubelet-plugins-dir", str(tmp / "plugins"),
        "--kubeconfig", str(node_bound_kubeconfig(cluster, node)), "--rediscover-interval", "0",
    ]  # fmt: skip
    log = (tmp / "plugin.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        describe = lambda: (tmp / "plugin.log").read_text()[-3000:]  # noqa: E731

        def devices() -> int:
            return sum(
                len(s["spec"].get("devices") or []) for s in our_slices(cluster, DRIVER, name)
            )

        wait_until(lambda: devices() == 4, timeout=30, what="pool published", describe=describe)
        other = EmulatedNode.create("l4-x4", root)  # the same node, seen from this process
        other.inject_xid(3, 119)  # GSP error on minor 1
        got = wait_until(
            lambda: HealthNode.taints_of(cluster, name).get("gpu-1"), timeout=30,
            what="gpu-1 tainted by the daemon", describe=describe,
        )  # fmt: skip
        assert (f"{DRIVER}/xid", "119", "NoSchedule") in got
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, describe()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
