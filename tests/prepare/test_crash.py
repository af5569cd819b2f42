"""SIGKILL at every step of prepare and of unprepare; the restarted plugin must finish or
roll back, never report a half-torn claim as prepared, and leave no file, directory,
mount, MPS daemon or GPU setting behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.emulation import gputools
from tests.prepare.crashing import CRASH_REF, CRASH_UID, crash_claim
from tests.prepare.hosttree import Node

REPO = Path(__file__).parents[2]
PREPARE_STEPS = [
    "checkpoint-preparing",
    "compute-mode",  # time-slicing: gpu-0 to DEFAULT
    "timeslice",
    "compute-mode",  # MPS: gpu-1 and gpu-2 to EXCLUSIVE_PROCESS
    "compute-mode",
    "mps-dirs",
    "mps-shm",
    "mps-daemon",
    "mps-limits",
    "checkpoint-prepared",
    "cdi-spec",  # last: Prepared without its spec is an interrupted prepare
]
UNPREPARE_STEPS = [
    "checkpoint-unpreparing",
    "mps-quit",
    "mps-unmount",
    "mps-remove",
    "compute-mode-reset",
    "compute-mode-reset",
    "timeslice-reset",
    "cdi-spec-removed",
    "checkpoint-removed",
]


EXCLUSIVE_STEPS = {
    "prepare": ["checkpoint-prepared", "cdi-spec"],  # nothing to undo but the spec
    "unprepare": ["cdi-spec-removed", "checkpoint-removed"],
}


def run_child(
    node: Node, call: str, kill_at: int, *extra: str, kind: str = "sharing"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DRA_TEST_KILL_AT": str(kill_at), "PYTHONPATH": str(REPO),
           "DRA_TEST_CLAIM": kind}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "tests.prepare.crashing", str(node.root), call, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def gpu_settings(node: Node) -> dict[str, tuple[str, str]]:
    """Each GPU's compute mode and time-slice as the emulated nvidia-smi was last told."""
    state: dict[str, tuple[str, str]] = {}
    for call in gputools.read_record(node.record):
        argv = call.get("argv", [])
        if call["tool"] != "nvidia-smi":
            continue
        if argv[:1] == ["-i"]:
            mode, ts = state.get(argv[1], ("DEFAULT", "0"))
            state[argv[1]] = (argv[3], ts)
        else:
            mode, ts = state.get(argv[2], ("DEFAULT", "0"))
            state[argv[2]] = (mode, argv[4])
    return state


def assert_clean(node: Node) -> None:
    assert node.live_daemons() == []
    assert sorted(node.cdi_dir.iterdir()) == [] if node.cdi_dir.exists() else True
    mps = node.state_dir / "mps"
    assert not mps.exists() or list(mps.iterdir()) == []
    assert json.loads((node.state_dir / "checkpoint.json").read_text())["claims"] == {}
    leftovers = [p.name for p in node.state_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert node.mounts() == []
    assert all(v == ("DEFAULT", "0") for v in gpu_settings(node).values()), gpu_settings(node)


def steps_of(node: Node, call: str, kind: str = "sharing") -> list[str]:
    done = run_child(node, call, 0, kind=kind)
    assert done.returncode == 0, done.stderr
    node.preparer().unprepare(CRASH_REF)
    assert_clean(node)
    return done.stdout.split()


def test_steps_cover_every_side_effect(node: Node) -> None:
    assert [s.split(":")[0] for s in steps_of(node, "prepare")] == PREPARE_STEPS
    assert [s.split(":")[0] for s in steps_of(node, "unprepare")] == UNPREPARE_STEPS
    for call, steps in EXCLUSIVE_STEPS.items():
        assert steps_of(node, call, "exclusive") == steps


def assert_prepared_and_working(node: Node, step: str) -> None:
    """The state a second pod sharing the claim needs: daemon, tmpfs, exclusive GPUs, spec."""
    assert len(node.live_daemons()) == 1, step  # exactly one daemon, the new one
    assert [p.name for p in node.cdi_dir.iterdir()] == [
        f"k8s.gpu.nvidia.com-claim_{CRASH_UID}.json"
    ], step
    spec = json.loads(next(node.cdi_dir.iterdir()).read_text())
    mounts = {
        m["containerPath"]: m["hostPath"] for m in spec["devices"][1]["containerEdits"]["mounts"]
    }
    assert Path(mounts["/tmp/nvidia-mps"]).is_dir(), step
    assert mounts["/dev/shm"] in node.mounts(), step
    gpus = node.inventory.gpus
    settings = gpu_settings(node)
    assert settings[gpus[0].uuid] == ("DEFAULT", "2"), step
    assert settings[gpus[1].uuid][0] == settings[gpus[2].uuid][0] == "EXCLUSIVE_PROCESS", step


@pytest.mark.parametrize("kind", ["sharing", "exclusive"])
@pytest.mark.parametrize("call", ["prepare", "unprepare"])
@pytest.mark.parametrize(
    "then",
    ["prepare", "unprepare", "restart"],
    ids=["then-prepare", "then-unprepare", "then-restart"],
)
def test_sigkill_at_every_step(node: Node, call: str, then: str, kind: str) -> None:
    """D1: a kill mid-unprepare (after MPS stopped, before the spec went) used to leave the
    claim "prepared": the next prepare returned a spec whose MPS dirs were gone."""
    steps = steps_of(node, call, kind)
    for n, step in enumerate(steps, start=1):
        done = run_child(node, call, n, kind=kind)
        assert done.returncode == -signal.SIGKILL, (step, done.stderr)
        restarted = node.preparer()  # a new plugin process: nothing carried over in memory
        if then == "restart":
            restarted.recover()  # what the plugin does at start, before any call
            state = json.loads((node.state_dir / "checkpoint.json").read_text())["claims"]
            assert all(e["state"] == "Prepared" for e in state.values()), step
            spec = node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{CRASH_UID}.json"
            assert bool(state) == spec.exists(), step  # prepared exactly when its spec is there
            if not state:
                assert_clean(node)
        elif then == "prepare":
            result = restarted.prepare(crash_claim(kind))
            if kind == "sharing":
                assert [d.device_name for d in result] == ["gpu-0", "gpu-1", "gpu-2"], step
                assert_prepared_and_working(node, step)
            else:
                assert [d.device_name for d in result] == ["gpu-3", "gpu-4"], step
                spec = node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{CRASH_UID}.json"
                assert len(json.loads(spec.read_text())["devices"]) == 2, step
        restarted.unprepare(CRASH_REF)
        assert_clean(node)
