"""SIGKILL at every step of a share's prepare and unprepare (a real child process, real
emulated MPS daemons). After the restarted plugin's recovery, what runs is what the
checkpoint says: one daemon per prepared share claim and no other, the GPU exclusive to
MPS exactly while a share is recorded, and another claim's share untouched throughout."""

from __future__ import annotations

import dataclasses
import json
import signal

import pytest

from dra_driver.plugin.claims import ClaimRef
from tests.prepare.crash_shares import daemons_by_dir, gpu_modes
from tests.prepare.crashing import SHARE_CLAIM
from tests.prepare.hosttree import ENFORCING_VERSION, Node, share_claim
from tests.prepare.test_crash import run_child

BYSTANDER = share_claim(
    "0a1b2c3d-0000-4000-8000-0000000000b5", namespace="team-b", name="b", memory="40Gi"
)
FIRST_SHARE_PREPARE = [
    "checkpoint-preparing",
    "shared-acquiring",
    "compute-mode",  # gpu-2 to EXCLUSIVE_PROCESS: the first share only
    "shared-ready",
    "mps-dirs",
    "mps-shm",
    "mps-daemon",
    "mps-limits",
    "checkpoint-prepared",
    "cdi-spec",  # last: Prepared without its spec is an interrupted prepare
]
LAST_SHARE_UNPREPARE = [
    "checkpoint-unpreparing",
    "mps-quit",
    "mps-unmount",
    "mps-remove",
    "compute-mode-reset",  # the last share only
    "shared-released",
    "cdi-spec-removed",
    "checkpoint-removed",
]


def with_r615(node: Node) -> Node:
    node.inventory = dataclasses.replace(node.inventory, driver_version=ENFORCING_VERSION)
    return node


def assert_consistent(node: Node, step: str) -> None:
    """Live daemons, their directories, mounts and the GPU's mode match the checkpoint."""
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert all(e["state"] == "Prepared" for e in cp["claims"].values()), step
    recorded = {
        str(node.state_dir / "mps" / u["record"]["daemonId"])
        for e in cp["claims"].values()
        for u in e["units"]
    }
    assert set(daemons_by_dir(node)) == recorded, step
    assert len(node.live_daemons()) == len(recorded), step
    mps = node.state_dir / "mps"
    on_disk = {str(p) for p in mps.iterdir()} if mps.exists() else set()
    assert on_disk == recorded, step
    assert sorted(node.mounts()) == sorted(f"{d}/shm" for d in recorded), step
    specs = {p.name for p in node.cdi_dir.iterdir()} if node.cdi_dir.exists() else set()
    assert specs == {f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in cp["claims"]}, step
    mode = gpu_modes(node).get(node.inventory.gpus[2].uuid, "DEFAULT")
    if cp["claims"]:
        assert cp["shared"]["gpu-2/shares"]["state"] == "Ready", step
        assert mode == "EXCLUSIVE_PROCESS", step
    else:
        assert cp["shared"] == {} and mode == "DEFAULT", step


def steps(node: Node, call: str) -> list[str]:
    done = run_child(node, call, 0, "share")
    assert done.returncode == 0, done.stderr
    node.preparer().unprepare(SHARE_CLAIM.ref)
    return [s.split(":")[0] for s in done.stdout.split()]


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
@pytest.mark.parametrize("bystander", [False, True], ids=["only-share", "beside-another"])
def test_sigkill_at_every_step_of_a_share(node: Node, call: str, bystander: bool) -> None:
    with_r615(node)
    other: int | None = None
    if bystander:
        node.preparer().prepare(BYSTANDER)
        (other,) = daemons_by_dir(node).values()
    names = steps(node, call)
    if not bystander:  # the first share acquires the GPU, the last releases it
        assert names == (FIRST_SHARE_PREPARE if call == "prepare" else LAST_SHARE_UNPREPARE)
    else:  # beside another share the GPU is neither acquired nor released
        assert "compute-mode" not in names and "compute-mode-reset" not in names
    for n, step in enumerate(names, start=1):
        done = run_child(node, call, n, "share")
        assert done.returncode == -signal.SIGKILL, (step, done.stderr)
        restarted = node.preparer()
        restarted.recover()
        assert_consistent(node, f"{call} killed after {step}")
        if other is not None:
            assert other in daemons_by_dir(node).values(), step  # never restarted or touched
        restarted.prepare(SHARE_CLAIM)  # the kubelet retries: it works, then goes
        assert_consistent(node, f"{call} killed after {step}, prepared again")
        restarted.unprepare(SHARE_CLAIM.ref)
        assert_consistent(node, f"{call} killed after {step}, unprepared")
    if bystander:
        node.preparer().unprepare(ClaimRef("team-b", "b", BYSTANDER.uid))
    assert_consistent(node, "all gone")
    assert node.live_daemons() == [] and node.mounts() == []
