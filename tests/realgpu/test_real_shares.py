"""Issue 13 item 5 on a real GPU: MPS clients with different limits on one GPU, an
allocation beyond one client's limit failing while the other is unaffected, and
nothing left after the last unprepare.

Every client is ``cudaclient.py`` (CUDA driver API, no toolkit) started the way a
container of the claim would be: through ``mpslaunch`` with the claim's ``/dev/shm``
and ``CUDA_MPS_PIPE_DIRECTORY`` set to the claim's pipe, plus the ``CUDA_MPS_*``
variables the CDI spec gives (or a container's own edits of them). What each saw
goes to the record (``DRA_GPU_RECORD``) for the README's "Fractional GPUs" table.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.shares import can_enforce
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import ClaimRef, PrepareError
from tests.prepare.hosttree import share_claim
from tests.realgpu.realhost import (
    Client,
    assert_nothing_left,
    compute_mode,
    mps_mounts,
    real_claim,
    record,
)

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.changes_gpu_settings
def test_two_mps_clients_with_different_limits_on_one_gpu(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools, tmp_path: Path,
    state_dir: Path,
) -> None:  # fmt: skip
    """A whole-GPU MPS claim (daemon limit 8 GiB, 50 % SMs) and two of its containers:
    one held to the daemon's limits, one that tightened its own (2 GiB, 25 %)."""
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = real_claim(f"gpu-{gpu.minor}", {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"}})  # fmt: skip
    preparer.prepare(c)
    pipe, shm = mps_mounts(tmp_path / "cdi", c.ref.uid)
    seen: dict[str, Any] = {"compute mode while prepared": compute_mode(tools, gpu.index)}
    a = Client("a", pipe, shm)
    b = Client("b", pipe, shm, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G",
               CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")  # fmt: skip
    loosen = Client("loosen", pipe, shm, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40G",
                    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100")  # fmt: skip
    bypass = Client("bypass", None, None)  # drops the pipe: opens the GPU directly
    try:
        seen.update({f"hello {x.label}": x.hello for x in (a, b, loosen, bypass)})
        seen["a alloc 5 GiB"] = a.alloc(5)
        seen["b alloc 1 GiB"] = b.alloc(1)
        seen["b alloc 2 GiB more (over its 2 GiB)"] = b.alloc(2)
        seen["a alloc 1 GiB more (6 of 8)"] = a.alloc(1)
        seen["a alloc 3 GiB more (over 8)"] = a.alloc(3)
        seen["loosen alloc 12 GiB (over the daemon's 8)"] = loosen.alloc(12) if loosen.up else None
    finally:
        for x in (a, b, loosen, bypass):
            x.close()
    record("MPS: two clients with different limits on one GPU", json.dumps(seen, indent=1))
    preparer.unprepare(c.ref)
    assert seen["compute mode while prepared"] == "Exclusive_Process"
    assert a.up and b.up and loosen.up, seen
    assert b.hello["sms"] < a.hello["sms"] < gpu.multiprocessors, seen
    assert loosen.hello["sms"] == a.hello["sms"], seen  # cannot loosen the SM limit
    assert seen["a alloc 5 GiB"] == 0 and seen["b alloc 1 GiB"] == 0
    assert seen["b alloc 2 GiB more (over its 2 GiB)"] == OOM
    assert seen["a alloc 1 GiB more (6 of 8)"] == 0  # unaffected by b's failure
    assert seen["a alloc 3 GiB more (over 8)"] == OOM
    assert seen["loosen alloc 12 GiB (over the daemon's 8)"] == OOM
    assert not bypass.up, seen  # EXCLUSIVE_PROCESS: only the MPS server holds the GPU
    assert_nothing_left(tools, gpu.index, state_dir, [pipe])


@pytest.mark.changes_gpu_settings
def test_fractional_share_on_this_driver(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools, state_dir: Path
) -> None:
    """Drivers before r615 refuse a fractional share at prepare, naming the advisory
    option; r615+ prepares it. Either way nothing is left after."""
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    c = share_claim(str(uuid.uuid4()), device=f"gpu-{gpu.minor}", memory="8Gi", compute="50")
    if can_enforce(inventory.driver_version):
        preparer.prepare(c)
        preparer.unprepare(c.ref)
    else:
        with pytest.raises(PrepareError, match=r"sharing\.strategy: TimeSlicing"):
            preparer.prepare(c)
    assert preparer.prepared_claims() == []
    assert_nothing_left(tools, gpu.index, state_dir, [])


@pytest.mark.changes_gpu_settings
def test_share_daemons_side_by_side(
    preparer: ClaimPreparer, inventory: Inventory, tools: GpuTools, tmp_path: Path,
    state_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The enforced-share design run on this driver whatever its branch: two claims'
    shares (8 GiB / 50 %, 4 GiB / 25 %), each with its own control daemon, on one
    EXCLUSIVE_PROCESS GPU. r615+ must hold each to its limits side by side; before
    r615 the second server cannot run, which is why those drivers refuse shares
    (if it ran, ``ENFORCING_DRIVER`` is too high: this test says so)."""
    monkeypatch.setattr("dra_driver.gpu.sharing.strategies.mpsshares.can_enforce", lambda _v: True)
    gpu = min(inventory.gpus, key=lambda g: g.minor)
    claims = [
        share_claim(
            str(uuid.uuid4()),
            namespace=f"team-{i}",
            device=f"gpu-{gpu.minor}",
            memory=mem,
            compute=pct,
        )
        for i, (mem, pct) in enumerate([("8Gi", "50"), ("4Gi", "25")])
    ]
    for c in claims:
        preparer.prepare(c)
    (pipe_a, shm_a), (pipe_b, shm_b) = (mps_mounts(tmp_path / "cdi", c.ref.uid) for c in claims)
    seen: dict[str, Any] = {"driver": inventory.driver_version,
                            "compute mode": compute_mode(tools, gpu.index)}  # fmt: skip
    a = Client("a", pipe_a, shm_a)
    b = Client("b", pipe_b, shm_b)
    clients = [a, b]
    try:
        seen["hello a"], seen["hello b (while a runs)"] = a.hello, b.hello
        if a.up:
            seen["a alloc 6 GiB"] = a.alloc(6)
        if b.up:
            seen["b alloc 3 GiB"] = b.alloc(3)
            seen["b alloc 2 GiB more (over 4)"] = b.alloc(2)
        if a.up:
            seen["a alloc 1 GiB more (7 of 8)"] = a.alloc(1)
            seen["a alloc 2 GiB more (over 8)"] = a.alloc(2)
        a.close()
        if not b.up:  # one server at a time? try b again once a's client is gone
            b.close()
            b2 = Client("b2", pipe_b, shm_b)
            clients.append(b2)
            seen["hello b after a quit"] = b2.hello
    finally:
        for x in clients:
            x.close()
    record("MPS shares: two control daemons on one GPU", json.dumps(seen, indent=1))
    for c in claims:
        preparer.unprepare(ClaimRef(c.ref.namespace, c.ref.name, c.ref.uid))
    assert_nothing_left(tools, gpu.index, state_dir, [pipe_a, pipe_b])
    assert seen["compute mode"] == "Exclusive_Process"
    assert a.up, seen
    if can_enforce(inventory.driver_version):
        assert b.up, seen
        assert seen["a alloc 6 GiB"] == 0 and seen["b alloc 3 GiB"] == 0
        assert seen["b alloc 2 GiB more (over 4)"] == OOM
        assert seen["a alloc 1 GiB more (7 of 8)"] == 0
        assert seen["a alloc 2 GiB more (over 8)"] == OOM
        assert b.hello["sms"] < a.hello["sms"], seen
    else:
        assert not b.up, (
            f"driver {inventory.driver_version} ran two MPS servers side by side on an "
            f"EXCLUSIVE_PROCESS GPU: lower ENFORCING_DRIVER and check the limits: {seen}"
        )
