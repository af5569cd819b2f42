"""Tier 4: the kubelet's own plugin manager and DRA manager drive our plugin.

The Go kubelet harness (tests/go/kubelet) links the real
pkg/kubelet/pluginmanager and pkg/kubelet/cm/dra: it discovers our
registration socket, negotiates the version, checks the claim against the
API server and calls NodePrepareResources/NodeUnprepareResources exactly as a
kubelet does. Only the backend is a test double.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.demo.kubeletharness import KubeletHarness, find_harness
from dra_driver.devcluster import Cluster, wait_until
from tests.plugin.clusterkit import our_slices, start_plugin_on_node, unique
from tests.plugin.fakes import DRIVER as CDI_VENDOR
from tests.plugin.fakes import FakeBackend

DRIVER = "gpu.kubelet.example.com"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def harness_and_plugin(
    cluster: Cluster, short_dir: Path
) -> Iterator[tuple[KubeletHarness, FakeBackend, str]]:
    backend = FakeBackend()
    root = short_dir / "kubelet"
    on_node = start_plugin_on_node(
        cluster,
        driver=DRIVER,
        backend=backend,
        sockets_dir=root,
        node_prefix="kubelet-node",
        registry_dir=root / "plugins_registry",
        plugins_dir=root / "plugins",
    )
    harness = KubeletHarness(
        binary=find_harness(ROOT),
        kubeconfig=cluster.kubeconfig,
        node_name=on_node.node_name,
        root_dir=root,
        log_path=short_dir / "harness.log",
        verbosity=2,
    )
    harness.start()
    try:
        yield harness, backend, on_node.node_name
    finally:
        harness.stop()
        on_node.plugin.stop(grace_s=0, uninstall=True)


def test_real_kubelet_code_registers_and_prepares_through_our_plugin(
    cluster: Cluster,
    cluster_namespace: str,
    harness_and_plugin: tuple[KubeletHarness, FakeBackend, str],
) -> None:
    harness, backend, node = harness_and_plugin
    harness.wait_registered(DRIVER, timeout=30)
    wait_until(lambda: our_slices(cluster, DRIVER, node), timeout=30, what="slices published")

    cls = unique("kubelet-class")
    ns = cluster_namespace
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": cls},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": cls}}]}},
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
    )
    wait_until(
        lambda: cluster.rest.get(f"/api/v1/namespaces/{ns}/pods/p")["spec"].get("nodeName"),
        timeout=30,
        what="pod bound",
    )
    result = harness.prepare(ns, "p")
    claim_uid = backend.seen_claims[0].uid
    assert result.containers["c"].cdi_devices == (f"{CDI_VENDOR}/gpu={claim_uid}-gpu-0",)
    harness.unprepare(ns, "p")
    assert [r.uid for r in backend.unprepared] == [claim_uid]
