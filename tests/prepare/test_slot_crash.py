"""SIGKILL at every step of an MPS slot's prepare and unprepare (a real child process, real
emulated daemons), first slot alone and beside another slot. After the restarted plugin's
recovery, what runs is what the checkpoint says: the GPU's one slot daemon exactly while a
slot is recorded, the GPU EXCLUSIVE_PROCESS exactly then, and back to DEFAULT after; the
other claim's slot, and its daemon process, untouched throughout."""

from __future__ import annotations

import json
import signal

import pytest

from dra_driver.gpu.sharing.strategies.mpsslots import slot_daemon_id
from dra_driver.plugin.claims import ClaimRef
from tests.prepare.crash_shares import daemons_by_dir, gpu_modes
from tests.prepare.crashing import SLOT_CLAIM
from tests.prepare.hosttree import SLOT_GPU, SLOTS, Node, slot_claim
from tests.prepare.test_crash import run_child

BYSTANDER = slot_claim("0a1b2c3d-0000-4000-8000-0000000000b5", namespace="team-b", name="b")
FIRST_SLOT_PREPARE = [
    "checkpoint-preparing",
    "shared-acquiring",
    "compute-mode",  # gpu-2 to EXCLUSIVE_PROCESS (its earlier mode read first)
    "mps-dirs",  # the GPU's one daemon, with one slot's defaults
    "mps-shm",
    "mps-daemon",
    "mps-limits",
    "shared-ready",
    "checkpoint-prepared",
    "cdi-spec",
]
LAST_SLOT_UNPREPARE = [
    "checkpoint-unpreparing",
    "mps-quit",
    "mps-unmount",
    "mps-remove",
    "compute-mode-reset",
    "shared-released",
    "cdi-spec-removed",
    "checkpoint-removed",
]


def assert_consistent(node: Node, step: str) -> None:
    cp = json.loads((node.state_dir / "checkpoint.json").read_text())
    assert all(e["state"] == "Prepared" for e in cp["claims"].values()), step
    daemon = str(node.state_dir / "mps" / slot_daemon_id(SLOT_GPU))
    mps = node.state_dir / "mps"
    on_disk = {str(p) for p in mps.iterdir()} if mps.exists() else set()
    specs = {p.name for p in node.cdi_dir.iterdir()} if node.cdi_dir.exists() else set()
    assert specs == {f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in cp["claims"]}, step
    mode = gpu_modes(node).get(SLOT_GPU, "DEFAULT")
    if cp["claims"]:
        assert cp["shared"]["gpu-2/shares"]["state"] == "Ready", step
        assert cp["shared"]["gpu-2/shares"]["record"]["previousMode"] == "DEFAULT", step
        assert list(daemons_by_dir(node)) == [daemon], step
        assert len(node.live_daemons()) == 1 and on_disk == {daemon}, step
        assert node.mounts() == [f"{daemon}/shm"], step
        assert mode == "EXCLUSIVE_PROCESS", step
    else:
        assert cp["shared"] == {} and mode == "DEFAULT", step
        assert node.live_daemons() == [] and on_disk == set() and node.mounts() == [], step


def steps(node: Node, call: str) -> list[str]:
    done = run_child(node, call, 0, "slot")
    assert done.returncode == 0, done.stderr
    node.preparer(mps_slots=SLOTS).unprepare(SLOT_CLAIM.ref)
    return [s.split(":")[0] for s in done.stdout.split()]


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
@pytest.mark.parametrize("bystander", [False, True], ids=["only-slot", "beside-another"])
def test_sigkill_at_every_step_of_a_slot(node: Node, call: str, bystander: bool) -> None:
    other: int | None = None
    if bystander:
        node.preparer(mps_slots=SLOTS).prepare(BYSTANDER)
        (other,) = daemons_by_dir(node).values()
    names = steps(node, call)
    if not bystander:  # the first slot acquires the GPU and its daemon, the last releases
        assert names == (FIRST_SLOT_PREPARE if call == "prepare" else LAST_SLOT_UNPREPARE)
    else:  # beside another slot: nothing but the claim's own records and spec
        assert not {"compute-mode", "mps-daemon", "mps-quit", "compute-mode-reset"} & set(names)
    for n, step in enumerate(names, start=1):
        done = run_child(node, call, n, "slot")
        assert done.returncode == -signal.SIGKILL, (step, done.stderr)
        restarted = node.preparer(mps_slots=SLOTS)
        restarted.recover()
        assert_consistent(node, f"{call} killed after {step}")
        if other is not None:
            assert daemons_by_dir(node) and other in daemons_by_dir(node).values(), step
        restarted.prepare(SLOT_CLAIM)  # the kubelet retries: it works, then goes
        assert_consistent(node, f"{call} killed after {step}, prepared again")
        restarted.unprepare(SLOT_CLAIM.ref)
        assert_consistent(node, f"{call} killed after {step}, unprepared")
    if bystander:
        node.preparer(mps_slots=SLOTS).unprepare(ClaimRef("team-b", "b", BYSTANDER.uid))
    assert_consistent(node, "all gone")
    assert node.live_daemons() == [] and node.mounts() == []
