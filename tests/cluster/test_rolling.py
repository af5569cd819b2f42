"""The rolling-update bench at test scale: three real ``dra-driver kubelet-plugin``
processes on emulated GPUs, under the chart's ServiceAccount with node-bound tokens, on
their own control plane; started, left idle, restarted one at a time. Asserts what a
roll must do when nothing changed: every node published, every restarted plugin ready
again, not one slice written (its resourceVersion and generation as before), and the
requests a start cannot do without. No timing assertion."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from bench.fleet.run import CLIENT_BURST, CLIENT_QPS
from bench.rolling.__main__ import cdi_hook
from bench.rolling.plugins import PluginFlags
from bench.rolling.run import RollSettings, run_rolling
from dra_driver.devcluster import BinariesError, Cluster, ClusterOptions, find_binaries

PLUGINS = 3


@pytest.mark.cluster
def test_a_roll_with_nothing_changed_writes_no_slice_and_every_plugin_is_ready_again() -> None:
    try:
        binaries = find_binaries()
    except BinariesError as err:
        pytest.fail(f"control-plane binaries unavailable: {err}", pytrace=False)
    settings = RollSettings(
        flags=PluginFlags("dgx-h100", cdi_hook(None)), plugins=PLUGINS, idle_s=5, timeout_s=120
    )
    options = ClusterOptions(client_qps=CLIENT_QPS, client_burst=CLIENT_BURST)
    with (
        tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp") as work,  # short socket paths
        Cluster(binaries, Path(work) / "cp", options) as cluster,
    ):
        run = run_rolling(cluster, settings, Path(work) / "n")
        print(json.dumps(run.summary))  # the figures (pytest -s)
        cluster.check_running()
    names = {n.name for n in run.nodes}
    start, roll = run.summary["start"], run.summary["roll"]

    # Started: each node published its one dgx-h100 slice, by its own plugin.
    assert sorted(node for node, _, _ in run.slices_before.values()) == sorted(names)
    assert start["plugin_requests"]["create resourceslices"] == PLUGINS
    assert start["plugin_requests"].get("other", 0) == 0  # nothing outside the RBAC

    # Rolled: every plugin was restarted and answered /readyz 200 again.
    assert set(run.turns) == names
    assert all(n.restarts == 1 for n in run.nodes)

    # Nothing changed, so nothing was written: by the plugins or anyone, and every slice
    # is the very object it was (a rewrite with equal content bumps resourceVersion).
    assert roll["plugin_slice_writes"] == 0, roll["plugin_requests"]
    assert roll["slice_writes_all_users"] == 0
    assert run.slices_after == run.slices_before
    assert roll["slices_rewritten"] == []

    # What each new process must ask: its Node (the slices' owner), its slices (list,
    # then a watch), its MPS daemon pods (adopted or removed at start); and one sync per
    # start, not a second one for slices it failed to recognise as its own.
    asked = roll["plugin_requests"]
    for need in ("get nodes", "list resourceslices", "watch resourceslices", "list pods"):
        assert asked.get(need, 0) >= PLUGINS, (need, asked)
    assert asked["get nodes"] == PLUGINS, asked  # a Node GET opens every sync
    assert asked.get("other", 0) == 0
