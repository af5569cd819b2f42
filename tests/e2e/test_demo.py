"""``dra-driver demo`` runs end to end on two real nodes (kubelet + containerd)
and tells the story it promises."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from dra_driver.cli import main
from dra_driver.demo.walkthrough import DemoOptions, run_demo
from tests.e2e.helm import ROOT


def test_demo_walks_through_every_example() -> None:
    lines: list[str] = []
    # A short path: unix socket paths below it must stay under 108 bytes.
    tmp_path = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp"))
    try:
        rc = run_demo(DemoOptions(repo=ROOT, workdir=tmp_path), lines.append)
        leftover = list(tmp_path.glob("*/cdi/*.json"))
        mounts = [m for m in Path("/proc/self/mountinfo").read_text().splitlines()
                  if str(tmp_path) in m]  # fmt: skip
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
    text = "\n".join(lines)
    assert rc == 0, text
    for pod in ("gpu-by-memory", "four-gpus-one-numa", "mig-1g", "time-sliced", "mps-a", "mps-b"):
        assert f"  pod {pod} (" in text
    assert text.count("ran under containerd + runc") == 6
    assert text.count("Ready in") == 2
    assert "--set-timeslice 3" in text
    assert "Healthy (from our plugin's health stream)" in text
    assert "set_default_active_thread_percentage 50" in text
    assert "claim gpu-mps was already prepared for pod mps-a" in text
    assert "sharing.timeSlicingConfig.intervall: unknown field" in text
    assert "Warning FailedPrepareDynamicResources" in text
    assert "All CDI specs are gone" in text
    assert "CDI spec written by our plugin:" in text
    # Every spec the demo reported was removed again, and the nodes' mounts.
    assert leftover == []
    assert mounts == []


def test_demo_command_is_registered(capsys) -> None:
    try:
        main(["demo", "--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    assert "--cdi-json" in capsys.readouterr().out
