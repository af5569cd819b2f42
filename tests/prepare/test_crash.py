"""SIGKILL at every step of prepare; the restarted plugin must prepare and unprepare cleanly
and leave no file, directory or MPS daemon behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.plugin.claims import ClaimRef
from tests.prepare.crashing import CRASH_UID, crash_claim
from tests.prepare.hosttree import Node

REPO = Path(__file__).parents[2]


def run_child(node: Node, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DRA_TEST_KILL_AT": str(kill_at), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tests.prepare.crashing", str(node.root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def assert_clean(node: Node) -> None:
    assert node.live_daemons() == []
    assert sorted(node.cdi_dir.iterdir()) == [] if node.cdi_dir.exists() else True
    mps = node.state_dir / "mps"
    assert not mps.exists() or list(mps.iterdir()) == []
    assert json.loads((node.state_dir / "checkpoint.json").read_text())["claims"] == {}
    leftovers = [p.name for p in node.state_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert node.mounts() == []


def all_steps(node: Node) -> list[str]:
    done = run_child(node, 0)
    assert done.returncode == 0, done.stderr
    node.preparer().unprepare(ClaimRef("ns", "c1", CRASH_UID))
    assert_clean(node)
    return done.stdout.split()


def test_steps_cover_every_side_effect(node: Node) -> None:
    steps = all_steps(node)
    kinds = [s.split(":")[0] for s in steps]
    assert kinds == [
        "checkpoint-started",
        "compute-mode",
        "timeslice",
        "compute-mode",
        "compute-mode",
        "mps-dirs",
        "mps-shm",
        "mps-daemon",
        "mps-limits",
        "cdi-spec",
        "checkpoint-completed",
    ]


@pytest.mark.parametrize(
    "then_prepare", [True, False], ids=["restart-prepare", "restart-unprepare"]
)
def test_sigkill_at_every_step_then_restart(node: Node, then_prepare: bool) -> None:
    steps = all_steps(node)
    for n, step in enumerate(steps, start=1):
        done = run_child(node, n)
        assert done.returncode == -signal.SIGKILL, (step, done.stderr)
        restarted = node.preparer()  # a new plugin process: nothing carried over in memory
        ref = ClaimRef("ns", "c1", CRASH_UID)
        if then_prepare:
            result = restarted.prepare(crash_claim())
            assert [d.device_name for d in result] == ["gpu-0", "gpu-1", "gpu-2"], step
            assert len(node.live_daemons()) == 1, step  # exactly one daemon, the new one
            assert [p.name for p in node.cdi_dir.iterdir()] == [
                f"k8s.gpu.nvidia.com-claim_{CRASH_UID}.json"
            ], step
        restarted.unprepare(ref)
        assert_clean(node)
