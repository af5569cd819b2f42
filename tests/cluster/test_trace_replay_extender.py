"""The trace replay with the scoring extender (``bench.trace_replay --extender``): the
real kube-scheduler calls ``dra-driver scoring-extender`` (a host process watching the
dev control plane) through the shipped ``deploy/scheduler/scoring-extender.yaml``
entry. A stratified 1/20 of the trace, seed 42, consumable shares: with the extender
the replay allocates at least as much GPU capacity as the stock scheduler alone, and
when the extender is killed mid-replay scheduling goes on (``ignorable``)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.trace_replay.extending import ExtenderProcess, with_extender
from bench.trace_replay.replaying import NAMESPACE, Replay, ReplaySettings, replay
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries
from dra_driver.devcluster.processes import free_loopback_ports
from dra_driver.workload.drawing import scale_nodes
from dra_driver.workload.trace import NODES_FILE, PODS_FILE, read_nodes, read_pods
from tests.trace_replay.test_trace_files import trace_dir

SUBSET = 20
KILL_AFTER = 150
"""Bound pods before the extender is killed (of ~550)."""
pytestmark = pytest.mark.timeout(600)


def _bound(cluster: Cluster) -> int:
    pods = cluster.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    return sum(1 for p in pods if p["spec"].get("nodeName"))


def _replay(extender: bool, during: Callable[[Cluster, ExtenderProcess], None] | None = None
            ) -> tuple[Replay, int]:  # fmt: skip
    """A replay (with the extender or without), and the pods bound when ``during``
    returned (it runs in a thread beside the replay)."""
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    nodes = scale_nodes(read_nodes(trace_dir() / NODES_FILE), 1 / SUBSET)
    pods = read_pods(trace_dir() / PODS_FILE)
    port = free_loopback_ports(1)[0]
    sched = with_extender(None, port) if extender else None
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST,
                             scheduler_config=sched)  # fmt: skip
    settings = ReplaySettings(mode="consumable", seed=42, scale=1 / SUBSET, timeout_s=150,
                              settle_s=2)  # fmt: skip
    seen = [-1]
    with (
        tempfile.TemporaryDirectory(prefix="dra-trace-ext-") as work,
        Cluster(binaries, Path(work), options) as cluster,
    ):
        process = ExtenderProcess(port, cluster.kubeconfig, Path(work) / "extender.log")
        thread = None
        try:
            if extender:
                process.start()
            if during is not None:

                def watch() -> None:
                    during(cluster, process)
                    seen[0] = _bound(cluster)

                thread = threading.Thread(target=watch, daemon=True)
                thread.start()
            run = replay(cluster, nodes, pods, settings, Path(work))
            print(run.summary)  # the figures (pytest -s)
            cluster.check_running()
        finally:
            process.stop()
            if thread is not None:
                thread.join(timeout=60)
    return run, seen[0]


def test_the_extender_packs_at_least_as_well_and_scheduling_survives_its_death() -> None:
    stock, _ = _replay(extender=False)
    scored, _ = _replay(extender=True)
    for run in (stock, scored):
        assert run.summary["undecided"] == 0
    assert scored.summary["allocation_rate_100"] >= stock.summary["allocation_rate_100"]
    assert scored.summary["allocation_rate_130"] >= stock.summary["allocation_rate_130"]

    def kill_midway(cluster: Cluster, process: ExtenderProcess) -> None:
        while _bound(cluster) < KILL_AFTER:
            threading.Event().wait(0.2)
        process.kill()

    killed, at_kill = _replay(extender=True, during=kill_midway)
    placed = killed.summary["pods"] - sum(killed.summary["unschedulable"].values())
    assert KILL_AFTER <= at_kill < placed  # the scheduler went on binding without it
    assert killed.summary["undecided"] == 0
    # Without scores for the rest, the replay still places about what the stock one does.
    assert killed.summary["allocation_rate_130"] >= stock.summary["allocation_rate_130"] - 2
