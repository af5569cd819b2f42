"""Issue 30 item 5 on a real GPU, in its current mode: one slot daemon with N = 4
serving two claims of two namespaces. Each client is held to one slot (one that sets
no ``CUDA_MPS_*`` variable and one that asks for 40 GiB and 100 % alike), an allocation
beyond a slot fails while the other client is unaffected, and nothing is left after the
last unprepare.

Lent hardware keeps every setting: the strategy's compute-mode changes
(``EXCLUSIVE_PROCESS`` with the first slot, the earlier mode after the last) are
recorded here, not run, and asserted as what the plugin would have done. That the
mode keeps a process from bypassing MPS is verified by emulation only. The rest (the
daemon, its default limits, the clients through ``mpslaunch`` with the claims'
``/dev/shm``) is the real driver's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.hardware.consumable import MpsSlots
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.host.hostpaths import HostPaths
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.shares import can_enforce
from dra_driver.gpu.sharing.slots import MEMORY_STEP
from dra_driver.gpu.sharing.tools import GpuCommands, GpuTools
from tests.prepare.hosttree import share_claim
from tests.realgpu.conftest import real_preparer
from tests.realgpu.realhost import (
    Client,
    compute_mode,
    mounts_under,
    mps_mounts,
    mps_processes,
    record,
)

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
GIB = 1024**3


@pytest.fixture
def mode_changes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The compute-mode changes the plugin asks for, recorded instead of run."""
    asked: list[tuple[str, str]] = []

    def keep(_self: GpuCommands, gpu_uuid: str, mode: str) -> None:
        asked.append((gpu_uuid, mode))

    monkeypatch.setattr(GpuCommands, "set_compute_mode", keep)
    return asked


@pytest.fixture
def gpu(inventory: Inventory) -> Gpu:
    plain = [g for g in inventory.gpus if not g.mig_enabled]
    if not plain:
        pytest.skip("every GPU of this machine is in MIG mode")
    if can_enforce(inventory.driver_version):
        pytest.skip(f"driver {inventory.driver_version}: slots are per-claim daemons from r615")
    return min(plain, key=lambda g: g.minor)


@pytest.fixture
def slot_preparer(
    host: HostPaths, tools: GpuTools, tmp_path: Path, state_dir: Path, cdi_hook: Path,
    gpu: Gpu, mode_changes: list[tuple[str, str]],
) -> Iterator[ClaimPreparer]:  # fmt: skip
    slots = MpsSlots.parse(f"{gpu.uuid}=4")
    with real_preparer(host, tools, tmp_path / "cdi", state_dir, cdi_hook, mps_slots=slots) as p:
        yield p


def test_two_namespaces_share_one_slot_daemon_each_held_to_one_slot(
    slot_preparer: ClaimPreparer, gpu: Gpu, tools: GpuTools, tmp_path: Path,
    state_dir: Path, mode_changes: list[tuple[str, str]],
) -> None:  # fmt: skip
    mode_before = compute_mode(tools, gpu.index)
    slot = gpu.memory_bytes // 4 // MEMORY_STEP * MEMORY_STEP
    slot_gib = slot / GIB
    claims = [
        share_claim(
            str(uuid.uuid4()),
            namespace=ns,
            name="slot",
            device=f"gpu-{gpu.minor}",
            memory=f"{slot // MEMORY_STEP}Mi",
            compute="25",
        )
        for ns in ("team-a", "team-b")
    ]
    for c in claims:
        slot_preparer.prepare(c)
    (pipe_a, shm_a), (pipe_b, shm_b) = (mps_mounts(tmp_path / "cdi", c.ref.uid) for c in claims)
    seen: dict[str, Any] = {"slot GiB": round(slot_gib, 2), "mode": mode_before}
    bare = Client("no CUDA_MPS_* variables", pipe_a, shm_a)
    greedy = Client("asks 40G and 100 %", pipe_b, shm_b,
                    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40G",
                    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100")  # fmt: skip
    try:
        seen.update({f"hello {x.label}": x.hello for x in (bare, greedy)})
        most, over, little = round(slot_gib * 0.8, 2), round(slot_gib * 0.35, 2), 0.25
        seen[f"bare alloc {most} GiB"] = bare.alloc(most)
        seen[f"bare alloc {over} GiB more (past its slot)"] = bare.alloc(over)
        seen[f"greedy alloc {most} GiB (after bare's failure)"] = greedy.alloc(most)
        seen[f"greedy alloc {over} GiB more (past its slot)"] = greedy.alloc(over)
        seen[f"bare alloc {little} GiB more (within its slot)"] = bare.alloc(little)
    finally:
        for x in (bare, greedy):
            x.close()
    for c in claims:
        slot_preparer.unprepare(c.ref)
    seen["mps processes after"] = mps_processes()
    seen["mounts after"] = mounts_under(state_dir)
    seen["mode after"] = compute_mode(tools, gpu.index)
    seen["mode changes asked (not run)"] = mode_changes
    record("MPS slots: N = 4, two namespaces, one daemon", json.dumps(seen, indent=1))

    assert pipe_a == pipe_b and shm_a == shm_b, "two slots of one GPU: one daemon"
    assert bare.up and greedy.up, seen
    quarter = gpu.multiprocessors * 0.3
    assert 0 < bare.hello["sms"] <= quarter, seen  # one slot's SMs without any variable
    assert greedy.hello["sms"] == bare.hello["sms"], seen  # asking for 100 % does not loosen
    assert seen[f"bare alloc {most} GiB"] == 0
    assert seen[f"bare alloc {over} GiB more (past its slot)"] == OOM
    assert seen[f"greedy alloc {most} GiB (after bare's failure)"] == 0
    assert seen[f"greedy alloc {over} GiB more (past its slot)"] == OOM
    assert seen[f"bare alloc {little} GiB more (within its slot)"] == 0
    assert seen["mps processes after"] == [] and seen["mounts after"] == []
    assert not Path(pipe_a).exists()
    assert seen["mode after"] == mode_before  # lent hardware as it was
    assert mode_changes[0][1] == "EXCLUSIVE_PROCESS"
    assert {u for u, _ in mode_changes} == {gpu.uuid} and len(mode_changes) == 2
