"""The chart's DaemonSet on a real node: its pod runs from the image assembled
locally with the Dockerfile's contents (imported into containerd, no registry),
with the chart's hostPath mounts, in-cluster credentials (a projected token
bound to the pod and its node), downward-API env and probes. The real kubelet
registers it (UID-suffixed sockets), a GPU pod gets its devices, a SIGKILLed
plugin container is restarted by the kubelet, a rolling update surges a new pod
that takes over the claims, and uninstalling removes the pod and its sockets."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.pluginimage import Dockerfile
from dra_driver.demo.realgpu import keep_running
from dra_driver.demo.realgpupod import RealGpuNodePod
from dra_driver.demo.stack import load_examples, pin_to_node
from dra_driver.devcluster import Cluster, wait_until
from dra_driver.devcluster.binaries import NodeBinaries
from tests.e2e.helm import ROOT, chart_pod_node
from tests.e2e.scenarios import EXAMPLES, claim_name_of, get_claim, plugin_records


@pytest.fixture(scope="module")
def chart_node(
    cluster: Cluster,
    driver_objects: list[str],
    node_binaries: NodeBinaries,
    helm_binary: Path,
    plugin_image: tuple[Path, str],
) -> Iterator[RealGpuNodePod]:
    with chart_pod_node(
        cluster, node_binaries, helm_binary, plugin_image, "dgx-a100", prefix="cp"
    ) as gpu:
        yield gpu


def registry(node: RealGpuNodePod) -> list[str]:
    return sorted(p.name for p in (node.node.paths.kubelet_root / "plugins_registry").iterdir())


def test_daemonset_pod_runs_the_image_as_the_chart_says(
    chart_node: RealGpuNodePod, plugin_image: tuple[Path, str]
) -> None:
    node = chart_node
    (pod,) = node.plugin_pods()
    assert node.pod_ready(pod)  # the readiness probe (/readyz) passed
    container, cd_container = pod["spec"]["containers"]
    assert cd_container["name"] == "compute-domain-plugin"
    assert cd_container["image"] == plugin_image[1]
    assert cd_container["args"][0] == "compute-domain-plugin"
    assert container["image"] == plugin_image[1]
    assert container["args"][0] == "kubelet-plugin"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    root = str(node.node.paths.kubelet_root)
    assert mounts["plugins-registry"] == f"{root}/plugins_registry"
    assert mounts["plugins"] == f"{root}/plugins"
    assert mounts["cdi"] == str(node.cdi_dir)
    assert mounts["driver-root"] == "/driver-root"
    assert any(m.startswith("kube-api-access") for m in mounts)  # the projected token
    # Rolling-update mode from the downward API: the socket carries the pod's UID.
    # The compute-domain plugin registers beside the GPU one (its name with the UID is too
    # long for a socket path here: hashed, as sockets.socket_paths does).
    uid = pod["metadata"]["uid"]
    cd_digest = hashlib.sha256(f"compute-domain.nvidia.com/{uid}".encode()).hexdigest()[:16]
    assert registry(node) == [f"{cd_digest}-reg.sock", f"gpu.nvidia.com-{uid}-reg.sock"]
    assert node.registrations() == 1
    # The image runs the Dockerfile's entry point and command.
    dockerfile = Dockerfile.parse((ROOT / "Dockerfile").read_text())
    assert dockerfile.entrypoint == ("dra-driver-entrypoint",)
    assert dockerfile.cmd == ("kubelet-plugin",)
    assert node.published_devices()


def test_gpu_pod_restart_and_rolling_update(
    cluster: Cluster, cluster_namespace: str, chart_node: RealGpuNodePod
) -> None:
    ns, node = cluster_namespace, chart_node
    objs = keep_running(pin_to_node(load_examples(EXAMPLES / "gpu-by-memory.yaml", ns), node.name))
    cluster.apply(objs)
    run = node.run_pod(ns, "gpu-by-memory")
    assert [w for w in run.containers["main"].stdout.split() if w[-1:].isdigit()], run
    old_claim = get_claim(cluster, ns, claim_name_of(cluster, ns, "gpu-by-memory", "gpu"))
    old_uid = old_claim["metadata"]["uid"]
    assert plugin_records(node, old_uid, "prepared")
    (spec,) = node.cdi_specs().values()
    mounts = [m["hostPath"] for e in [spec["containerEdits"]] for m in e.get("mounts", [])]
    # Driver files named where containerd finds them (the host), not /driver-root.
    assert mounts and all(m.startswith(str(node.host_root)) for m in mounts), mounts

    # SIGKILL: the kubelet restarts the container in the same pod; it registers again.
    restarts = node.restart_count()
    node.kill_plugin()
    wait_until(lambda: node.restart_count() > restarts, timeout=60,
               what="the kubelet restarted the plugin container",
               describe=node.describe_plugin)  # fmt: skip
    wait_until(lambda: node.registrations() >= 2, timeout=90, what="re-registration",
               describe=node.describe_plugin)  # fmt: skip
    node.wait_ready()

    # Rolling update: the new pod starts next to the old one (maxSurge 1).
    (old_pod,) = node.plugin_pods()
    node.roll()
    wait_until(lambda: len(node.plugin_pods()) == 2, timeout=60,
               what="a second plugin pod beside the first (surge)",
               describe=node.describe_plugin)  # fmt: skip
    wait_until(
        lambda: [p["metadata"]["uid"] for p in node.plugin_pods()]
        != [old_pod["metadata"]["uid"]] and len(node.plugin_pods()) == 1
        and node.pod_ready(node.plugin_pods()[0]),
        timeout=120, what="the old plugin pod replaced by a Ready new one",
        describe=node.describe_plugin,
    )  # fmt: skip
    (new_pod,) = node.plugin_pods()
    wait_until(lambda: [s for s in registry(node) if s.startswith("gpu.nvidia.com")]
               == [f"gpu.nvidia.com-{new_pod['metadata']['uid']}-reg.sock"],
               timeout=30, what="only the new pod's registration socket")  # fmt: skip

    after = keep_running(objs)[-1]
    after["metadata"]["name"] = "after"
    cluster.apply(after)
    node.run_pod(ns, "after")
    node.delete_pod(ns, "gpu-by-memory")
    node.delete_pod(ns, "after")
    wait_until(lambda: node.cdi_specs() == {}, timeout=30, what="every CDI spec removed")
    # The claim the old pod prepared was unprepared by the new one.
    assert plugin_records(node, old_uid, "unprepared")
