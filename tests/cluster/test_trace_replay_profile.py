"""The trace replay with a scheduler profile file (``--scheduler-config``): the real
kube-scheduler runs with the shipped gpu-packing profile (its ``/configz``) and the
replay's pods are scheduled by that profile, not the default one (the Scheduled
events' reporting controller is the profile's name). A stratified 1/40 of the trace."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.trace_replay.replaying import NAMESPACE, ReplaySettings, replay
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries
from dra_driver.devcluster.schedconfig import read_scheduler_config
from dra_driver.workload.drawing import scale_nodes
from dra_driver.workload.trace import NODES_FILE, PODS_FILE, read_nodes, read_pods
from tests.trace_replay.test_trace_files import trace_dir

PROFILE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "gpu-packing.yaml"
pytestmark = pytest.mark.timeout(300)


def _profile(configz: dict[str, Any], name: str) -> dict[str, Any]:
    config = configz["componentconfig"]
    (profile,) = [p for p in config["profiles"] if p["schedulerName"] == name]
    return dict(profile)


def test_replay_runs_its_pods_through_the_configured_profile() -> None:
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    nodes = scale_nodes(read_nodes(trace_dir() / NODES_FILE), 1 / 40)
    pods = read_pods(trace_dir() / PODS_FILE)
    options = ClusterOptions(
        client_qps=CLIENT_QPS,
        client_burst=CLIENT_BURST,
        scheduler_config=read_scheduler_config(PROFILE_FILE),
    )
    settings = ReplaySettings(
        mode="consumable", seed=42, scale=1 / 40, timeout_s=120, settle_s=2,
        scheduler_name="gpu-packing",
    )  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="dra-trace-profile-") as work,
        Cluster(binaries, Path(work), options) as cluster,
    ):
        run = replay(cluster, nodes, pods, settings, Path(work))
        configz = json.loads(cluster.fetch("kube-scheduler", "/configz"))
        events = cluster.rest.get(f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events")
        cluster.check_running()

    config = configz["componentconfig"]
    # The client limits the fleet bench sets reached the scheduler through the file.
    assert (config["clientConnection"]["qps"], config["clientConnection"]["burst"]) == (
        CLIENT_QPS, CLIENT_BURST,
    )  # fmt: skip
    packing = _profile(configz, "gpu-packing")
    (fit,) = [c for c in packing["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    assert fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    scores = {p["name"] for p in packing["plugins"]["multiPoint"]["enabled"]} - {
        p["name"] for p in packing["plugins"]["score"].get("disabled") or []
    }
    assert "NodeResourcesBalancedAllocation" not in scores
    default = _profile(configz, "default-scheduler")
    (fit,) = [c for c in default["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    assert fit["args"]["scoringStrategy"]["type"] == "LeastAllocated"

    scheduled = Counter(
        e.get("reportingController") for e in events["items"] if e.get("reason") == "Scheduled"
    )
    bound = run.summary["pods"] - sum(run.summary["unschedulable"].values())
    assert run.summary["undecided"] == 0 and bound > 0
    assert scheduled == {"gpu-packing": bound}
    assert run.summary["scheduler_name"] == "gpu-packing"
    assert run.summary["scheduler_config"] == str(PROFILE_FILE)
