"""Tier 2: a field the API server silently drops (feature gate off) is reported.

Runs its own small control plane with DRAConsumableCapacity disabled, so
``allowMultipleAllocations`` is accepted on write but not stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.devcluster import (
    BinariesError,
    Cluster,
    ClusterOptions,
    ComponentError,
    find_binaries,
    wait_until,
)
from dra_driver.plugin.resources import Device
from tests.plugin.clusterkit import our_slices, start_plugin_on_node
from tests.plugin.fakes import FakeBackend

DRIVER = "gpu.gates.example.com"


@pytest.fixture(scope="module")
def gated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    cluster = Cluster(
        binaries,
        tmp_path_factory.mktemp("gated"),
        ClusterOptions(feature_gates={"DRAConsumableCapacity": False}, controllers=()),
    )
    try:
        cluster.start()
    except ComponentError as err:
        pytest.fail(f"gated control plane failed to start: {err}", pytrace=False)
    yield cluster
    cluster.stop()


def test_dropped_field_is_detected_and_blocks_readiness(
    gated_cluster: Cluster, short_dir: Path
) -> None:
    backend = FakeBackend(
        devices=(Device("gpu-0", allow_multiple_allocations=True), Device("gpu-1"))
    )
    on_node = start_plugin_on_node(
        gated_cluster, driver=DRIVER, backend=backend, sockets_dir=short_dir
    )
    try:
        pub = on_node.plugin.publisher
        assert pub is not None
        status = wait_until(
            lambda: pub.status if pub.status.in_sync else None,
            timeout=30,
            what="slices written",
            describe=lambda: str(pub.status),
        )
        assert status.dropped_fields == ("spec.devices[].allowMultipleAllocations",)
        (stored,) = our_slices(gated_cluster, DRIVER, on_node.node_name)
        assert "allowMultipleAllocations" not in stored["spec"]["devices"][0]
        readiness = on_node.plugin.readiness()
        assert not readiness.ready
        assert any("allowMultipleAllocations" in p for p in readiness.problems)
    finally:
        on_node.plugin.stop(grace_s=0, uninstall=True)
