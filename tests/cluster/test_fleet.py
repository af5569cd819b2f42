"""The fleet bench at CI scale: 100 kubelet-less nodes on a real control plane, each
publishing the driver's slices through the plugin's publisher, and pods with claims
from ResourceClaimTemplates. Asserts every pod bound to devices its claim allows (on
its node, no exclusive device twice) and every node's slices one complete pool of
what the driver builds; no timing assertion. Each case starts its own control plane
with the client QPS/burst docs/scale.md tells admins to set. ``DRA_FLEET_NODES``
changes the node count for a local run."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from bench.fleet.checks import allocation_problems, published_problems
from bench.fleet.claims import align_attribute, shape
from bench.fleet.pools import DriverFlags, api_devices, node_pool
from bench.fleet.run import CLIENT_BURST, CLIENT_QPS, FleetSettings, run_fleet
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries
from dra_driver.gpu.consumable import ConsumableGpus

NODES = int(os.environ.get("DRA_FLEET_NODES", "100"))


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("profile", "claim"),
    [("dgx-h100", "whole"), ("dgx-a100-mig", "mig:1g.10gb")],
    ids=["whole-gpus-on-dgx-h100", "mig-1g-on-dgx-a100-mig"],
)
def test_every_pod_binds_to_an_allowed_device_and_every_slice_is_valid(
    profile: str, claim: str
) -> None:
    pods = 2 * NODES  # a quarter of either fleet's capacity (8 per node)
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    settings = FleetSettings(profile=profile, nodes=NODES, pods=pods, claim=claim, timeout_s=120)
    with (
        tempfile.TemporaryDirectory(prefix="dra-fleet-test-") as work,
        Cluster(binaries, Path(work), options) as cluster,
    ):
        run = run_fleet(cluster, settings)
        print(json.dumps(run.summary))  # the figures, for docs/scale.md (pytest -s)
        assert run.summary["bound"] == pods, cluster.log_tails()
        assert allocation_problems(cluster, run) == []
        assert published_problems(cluster, run) == []
        cluster.check_running()


def test_shapes_select_what_users_write_and_count_node_capacity() -> None:
    h100 = api_devices(node_pool("dgx-h100", DriverFlags()))
    assert shape("whole", h100).per_node(h100) == 8
    # no NVLink domain and 4+4 NUMA: eight GPUs align only on the product name
    assert align_attribute(h100) == "gpu.nvidia.com/productName"
    assert shape("eight-aligned", h100).per_node(h100) == 1
    mig = api_devices(node_pool("dgx-a100-mig", DriverFlags()))
    assert shape("mig:1g.10gb", mig).spec["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile "
                               "== '1g.10gb'"}}],
    }  # fmt: skip
    shared = api_devices(node_pool("dgx-h100", DriverFlags(consumable=ConsumableGpus(all=True))))
    assert shape("share:10Gi,25", shared).per_node(shared) == 8 * 4
    assert shape("share:10Gi,25", h100).per_node(h100) == 0  # not published for sharing
    with pytest.raises(ValueError, match="want whole, mig:PROFILE"):
        shape("mig", h100)
