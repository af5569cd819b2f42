"""The fleet bench at CI scale: 100 kubelet-less nodes on a real control plane, each
publishing the driver's slices through the plugin's publisher, and pods with claims
from ResourceClaimTemplates. Asserts every pod bound to devices its claim allows (on
its node, no exclusive device twice) and every node's slices one complete pool of
what the driver builds; no timing assertion. Each case starts its own control plane
with the client QPS/burst docs/scale.md tells admins to set. ``DRA_FLEET_NODES``
changes the node count for a local run."""

from __future__ import annotations

import copy
import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest

from bench.fleet.__main__ import main
from bench.fleet.capacity import node_capacity
from bench.fleet.checks import allocation_problems, published_problems
from bench.fleet.claims import align_attribute, shape
from bench.fleet.measure import latencies, rss_bytes
from bench.fleet.pools import DriverFlags, api_devices, node_pool, slice_problems
from bench.fleet.run import (
    CLIENT_BURST,
    CLIENT_QPS,
    NAMESPACE,
    TEMPLATE,
    FleetSettings,
    deviceclasses,
    pod_manifest,
    run_fleet,
)
from dra_driver.devcluster import (
    BinariesError,
    Cluster,
    ClusterOptions,
    find_binaries,
    wait_until,
)
from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.plugin.slices import slice_object, split_pool

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


@pytest.mark.cluster
def test_minimal_shape_binds_a_full_fleet_of_shared_counter_placements(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--shape minimal --check`` from the command line, on dynamic MIG with a claim
    whose placements share one media-engine set per GPU: 75 % of the capacity (one per
    GPU, not the seven published) as ``--fill``, then the last quarter timed. The heap
    profiles it writes are the components' own, holding the published slices; the CPU
    profile is kube-scheduler's."""
    argv = ["--nodes", "5", "--pods", "10", "--profile", "dgx-a100-mig-on", "--mig-mode",
            "dynamic", "--claim", "mig:1g.10gb+me", "--fill", "0.75", "--shape", "minimal",
            "--check", "--timeout", "60", "--heap-profiles", str(tmp_path / "heap"),
            "--cpu-profile", str(tmp_path / "cpu.pb.gz"), "--cpu-profile-seconds", "1",
            "-o", "json"]  # fmt: skip
    rc = main(argv)
    summary = json.loads(capsys.readouterr().out)
    assert (rc, summary["problems"]) == (0, [])
    assert len(summary["heap_profiles"]) == 3
    for written in summary["heap_profiles"]:
        profile = gzip.decompress(Path(written).read_bytes())  # pprof: gzipped protobuf
        assert b"k8s.io/api/resource/v1.(*Device).Unmarshal" in profile, written
    cpu = gzip.decompress((tmp_path / "cpu.pb.gz").read_bytes())
    assert b"kube-scheduler" in cpu  # the scheduler's own binary, sampled while timing
    assert summary["shape"] == "minimal"
    assert (summary["capacity_claims"], summary["fill_pods"], summary["bound"]) == (40, 30, 10)
    assert summary["slice_bytes_per_node"] < 100_000  # the driver's: about 240 kB


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["allocated", "scheduled"])
def test_fill_leaves_exactly_the_rest_of_the_capacity_to_the_timed_pods(mode: str) -> None:
    """Consumable shares, 3 nodes of 32 shares each, 86 filled: the 10 timed pods bind and
    one pod more is unschedulable. With ``allocated`` the fill is claims whose allocation
    the bench wrote (no pods); the scheduler honours their devices and consumed capacity
    as its own, and ``--check``'s problems count the fill claims' devices too."""
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    flags = DriverFlags(consumable=ConsumableGpus(all=True))
    settings = FleetSettings(profile="dgx-h100", nodes=3, pods=10, claim="share:10Gi,25",
                             fill=0.9, fill_mode=mode, flags=flags, timeout_s=60)  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="dra-fleet-fill-") as work,
        Cluster(binaries, Path(work), options) as cluster,
    ):
        run = run_fleet(cluster, settings)
        summary = run.summary
        assert (summary["capacity_claims"], summary["fill_pods"], summary["bound"]) == (96, 86, 10)
        assert summary["fill_mode"] == mode
        assert allocation_problems(cluster, run) == []
        extra = pod_manifest("pod-extra", TEMPLATE, template=True)
        cluster.rest.create(f"/api/v1/namespaces/{NAMESPACE}/pods", extra)

        def unschedulable() -> bool:
            pod = cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods/pod-extra")
            assert not pod["spec"].get("nodeName"), "a pod beyond the capacity was bound"
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in (pod.get("status") or {}).get("conditions") or ())  # fmt: skip

        wait_until(unschedulable, timeout=60, what="the extra pod reported Unschedulable")


@pytest.mark.cluster
def test_more_timed_pods_than_the_fill_leaves_are_refused_before_any_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Else the run would wait ``--timeout`` for pods that can never bind."""
    rc = main(["--nodes", "2", "--pods", "3", "--fill", "0.9", "-o", "json"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--pods 3 exceeds the 2 claims left after --fill 0.9 (14 of the fleet's 16)" in err


def test_shapes_select_what_users_write_and_count_node_capacity() -> None:
    h100_pool = node_pool("dgx-h100", DriverFlags())
    h100 = api_devices(h100_pool)
    classes = deviceclasses()
    assert node_capacity(h100_pool, shape("whole", h100).spec, classes) == 8
    # no NVLink domain and 4+4 NUMA: eight GPUs align only on the product name
    assert align_attribute(h100) == "gpu.nvidia.com/productName"
    assert node_capacity(h100_pool, shape("eight-aligned", h100).spec, classes) == 1
    mig = api_devices(node_pool("dgx-a100-mig", DriverFlags()))
    assert shape("mig:1g.10gb", mig).spec["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile "
                               "== '1g.10gb'"}}],
    }  # fmt: skip
    shared = node_pool("dgx-h100", DriverFlags(consumable=ConsumableGpus(all=True)))
    assert node_capacity(shared, shape("share:10Gi,25", h100).spec, classes) == 8 * 4
    with pytest.raises(ValueError, match="want whole, mig:PROFILE"):
        shape("mig", h100)


def test_latencies_span_first_creation_to_last_bind_and_ignore_unbound_pods() -> None:
    created = {"a": 10.0, "b": 10.5, "c": 11.0}
    bound = {"a": 10.2, "b": 11.5}
    assert latencies(created, bound) == {
        "bound": 2, "pods_per_s": round(2 / 1.5, 2), "p50_s": 0.6, "p99_s": 1.0,
    }  # fmt: skip


def test_rss_comes_from_the_pid_status_file(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("Name:\tetcd\nVmRSS:\t  2048 kB\n")
    assert rss_bytes(42, tmp_path) == 2048 * 1024
    assert rss_bytes(43, tmp_path) is None


def test_a_half_written_or_foreign_pool_is_reported() -> None:
    pool = node_pool("dgx-h100", DriverFlags())
    content = split_pool(pool)[0]
    good = slice_object(
        driver="gpu.nvidia.com", node_name="n1", node_uid="u", index=0, generation=2,
        count=1, content=content,
    )  # fmt: skip
    assert slice_problems([good], "n1", pool) == []
    two = copy.deepcopy(good)
    two["spec"]["pool"]["resourceSliceCount"] = 2
    assert slice_problems([two], "n1", pool) == ["n1: 1 slices, resourceSliceCount [2]"]
    fewer = copy.deepcopy(good)
    fewer["spec"]["devices"].pop()
    assert slice_problems([fewer], "n1", pool) == [
        "n1: stored devices differ from the driver's pool"
    ]
