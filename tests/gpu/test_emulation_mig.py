"""Emulated MIG changes: GPU and compute instances created and destroyed through NVML,
with the hardware's placement rules, errors, UUIDs, capability minors and host files."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation import EmulatedNode
from dra_driver.emulation.hardware import REALISTIC_CALL_DELAYS, ProfileError
from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.emulation.profile import call_delays
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.nvml import Nvml, NvmlError

A100_PROFILES = {"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9,
                 "4g.40gb": 5, "7g.80gb": 0}  # fmt: skip
SIZES = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}
"""Memory slices per A100 GI profile ID."""
CI_1_SLICE, CI_3_SLICE = 0, 2


def _placement(start: int, size: int) -> pynvml.c_nvmlGpuInstancePlacement_t:
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, size
    return placement


def _caps(node: EmulatedNode, minor: int, gi: int, ci: int | None = None) -> list[Path]:
    access = node.host.proc("driver", "nvidia", "capabilities", f"gpu{minor}", "mig", f"gi{gi}")
    if ci is None:
        return [
            access / "access",
            node.host.dev("nvidia-caps", f"nvidia-cap{gi_cap_minor(minor, gi)}"),
        ]
    return [
        access / f"ci{ci}" / "access",
        node.host.dev("nvidia-caps", f"nvidia-cap{ci_cap_minor(minor, gi, ci)}"),
    ]


def test_created_instances_are_mig_devices_with_fresh_uuids_and_capabilities(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(3)
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 2
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(4, 4))
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
            # GI IDs follow the placement: 3g.40gb at 4 is the second half of the GPU.
            assert (info.id, info.profileId, info.placement.start, info.placement.size) == (
                2, 9, 4, 4
            )  # fmt: skip
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 1
            assert all(p.exists() for p in _caps(node, 3, 2))
            # A GI without a CI is no MIG device yet.
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_3_SLICE)
            ci_info = pynvml.nvmlComputeInstanceGetInfo(ci)
            assert ci_info.id == 0 and ci_info.profileId == CI_3_SLICE
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
            uuid = pynvml.nvmlDeviceGetUUID(mig)
            assert uuid.startswith("MIG-") and uuid == pynvml.nvmlDeviceGetUUID(ci_info.device)
            assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
            assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 40192 * 2**20
            assert (
                pynvml.nvmlDeviceGetGpuInstanceId(mig),
                pynvml.nvmlDeviceGetComputeInstanceId(mig),
            ) == (2, 0)
            by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            assert pynvml.nvmlDeviceGetGpuInstanceId(by_uuid) == 2
            assert all(p.exists() for p in _caps(node, 3, 2, 0))
            access = _caps(node, 3, 2, 0)[0].read_text()
            assert f"DeviceFileMinor: {ci_cap_minor(3, 2, 0)}\n" in access
            # Destroying: the CI first (a GI in use refuses), then the GI; handles go stale.
            with pytest.raises(pynvml.NVMLError_InUse):
                pynvml.nvmlGpuInstanceDestroy(gi)
            pynvml.nvmlComputeInstanceDestroy(ci)
            assert not any(p.exists() for p in _caps(node, 3, 2, 0))
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetUUID(mig)
            pynvml.nvmlGpuInstanceDestroy(gi)
            assert not any(p.exists() for p in _caps(node, 3, 2))
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlGpuInstanceGetInfo(gi)
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 2
            # The same placement again is a different device.
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(4, 4))
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_3_SLICE)
            again = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0))
            assert again.startswith("MIG-") and again != uuid
        finally:
            pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("existing", "profile", "start", "size", "error"),
    [
        ([("3g.40gb", 0)], "2g.20gb", 2, 2, pynvml.NVMLError_InsufficientResources),  # overlap
        ([("1g.20gb", 6)], "1g.10gb", 6, 1, pynvml.NVMLError_InsufficientResources),
        ([("1g.10gb+me", 0)], "1g.10gb+me", 3, 1, pynvml.NVMLError_InsufficientResources),
        ([("4g.40gb", 0)], "7g.80gb", 0, 8, pynvml.NVMLError_InsufficientResources),
        ([], "3g.40gb", 2, 4, pynvml.NVMLError_InvalidArgument),  # not a placement of 3g
        ([], "1g.10gb", 7, 1, pynvml.NVMLError_InvalidArgument),  # 1g.10gb never at slice 7
        ([], "2g.20gb", 0, 4, pynvml.NVMLError_InvalidArgument),  # wrong size
    ],
)
def test_placement_rules_answer_like_nvml(make_node, existing, profile, start, size, error) -> None:
    node = make_node("dgx-a100-mig-on")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
            for name, at in existing:
                p = A100_PROFILES[name]
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, p, _placement(at, SIZES[p]))
            with pytest.raises(error):
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    gpu, A100_PROFILES[profile], _placement(start, size)
                )
        finally:
            pynvml.nvmlShutdown()


def test_mig_disabled_gpu_refuses_and_first_free_placement_is_nvmls_choice(make_node) -> None:
    node = make_node("dgx-a100-mig")  # GPU 2 has MIG off; GPU 0 holds 3g@0, 2g@4, 1g@6
    with node.nvml():
        pynvml.nvmlInit()
        try:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceCreateGpuInstance(pynvml.nvmlDeviceGetHandleByIndex(2), 19)
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 0
            assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 15) == 0
            five = pynvml.nvmlDeviceGetHandleByIndex(5)  # MIG on, empty
            gi = pynvml.nvmlDeviceCreateGpuInstance(five, 14)  # no placement: the first free
            assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.start == 0
            gi = pynvml.nvmlDeviceCreateGpuInstance(five, 14)
            assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.start == 2
        finally:
            pynvml.nvmlShutdown()


def test_smaller_compute_instances_share_their_gpu_instance(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, _placement(0, 4))
            assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI_1_SLICE) == 3
            for _ in range(3):
                pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_1_SLICE)
            with pytest.raises(pynvml.NVMLError_InsufficientResources):
                pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_1_SLICE)
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
            assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb"
            assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 2
            assert pynvml.nvmlDeviceGetAttributes(mig).multiprocessorCount == 14
        finally:
            pynvml.nvmlShutdown()


def test_the_nvml_adapter_creates_and_destroys(make_node) -> None:
    node = make_node("h100-l4-mixed")
    with node.nvml():
        nvml = Nvml()
        nvml.init()
        try:
            gpu = nvml.handle_by_index(1)
            gi = nvml.create_gpu_instance(gpu, 20, 3, 1)  # 1g.10gb+me at slice 3
            assert nvml.gpu_instance_info(gi)[1:] == (20, 3, 1)
            with pytest.raises(NvmlError) as err:
                nvml.create_gpu_instance(gpu, 20, 5, 1)  # only one +me per GPU
            assert err.value.insufficient_resources
            ci_profile = nvml.ci_profile_id(gi, CI_1_SLICE)
            ci = nvml.create_compute_instance(gi, ci_profile)
            ci_id, profile_id, mig = nvml.compute_instance_info(ci)
            assert (ci_id, profile_id) == (0, ci_profile)
            assert nvml.uuid(mig).startswith("MIG-")
            (listed,) = nvml.gpu_instances(gpu, 20)
            assert nvml.gpu_instance_info(listed) == nvml.gpu_instance_info(gi)
            assert len(nvml.compute_instances(listed, ci_profile)) == 1
            with pytest.raises(NvmlError) as err:
                nvml.destroy_gpu_instance(gi)
            assert err.value.code == pynvml.NVML_ERROR_IN_USE
            nvml.destroy_compute_instance(nvml.compute_instance_by_id(gi, ci_id))
            nvml.destroy_gpu_instance(gi)
            assert nvml.gpu_instances(gpu, 20) == []
            with pytest.raises(NvmlError) as err:  # an L4 has no MIG
                nvml.create_gpu_instance(nvml.handle_by_index(3), 19, 0, 1)
            assert err.value.not_supported
        finally:
            nvml.shutdown()


def test_instances_are_node_state_shared_by_processes_and_gone_after_reboot(
    tmp_path: Path,
) -> None:
    root = tmp_path / "node"
    node = EmulatedNode.create("dgx-a100-mig", root)
    script = (
        "import pynvml, sys\n"
        "from dra_driver.emulation import EmulatedNode\n"
        "node = EmulatedNode.create('dgx-a100-mig', sys.argv[1])\n"
        "with node.nvml():\n"
        "    pynvml.nvmlInit()\n"
        "    gpu = pynvml.nvmlDeviceGetHandleByIndex(5)\n"
        "    p = pynvml.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 4\n"
        "    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 5, p)\n"
        "    pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 3)\n"
    )
    # Another process (a plugin) creates a 4g.40gb instance and exits (or is killed).
    subprocess.run([sys.executable, "-c", script, str(root)], check=True, timeout=60)
    with node.nvml():
        inventory = discover(node.host, logging.getLogger("t"))
    (mig,) = inventory.gpus[5].mig_instances
    assert (mig.profile.name, mig.gi_id, mig.placement.start) == ("4g.40gb", 1, 0)
    assert mig.gi_cap_minor == gi_cap_minor(5, 1) and mig.ci_cap_minor == ci_cap_minor(5, 1, 0)
    assert [g.gi_id for g in inventory.gpus[5].mig_gpu_instances] == [1]
    # A restarted plugin re-creates the node over the same root: instances persist.
    again = EmulatedNode.create("dgx-a100-mig", root)
    assert [gi.gi_id for gi in again.mig.gpu_instances(5)] == [1]
    assert all(p.exists() for p in _caps(again, 5, 1, 0))
    again.reboot()
    assert again.mig.gpu_instances(5) == []
    assert not any(p.exists() for p in _caps(again, 5, 1, 0))
    # The administrator's static instances are back (their tooling re-applies them).
    assert [gi.gi_id for gi in again.mig.gpu_instances(0)] == [1, 5, 13]


def test_call_delays_and_late_device_nodes(tmp_path: Path) -> None:
    profile = tmp_path / "slow.yaml"
    profile.write_text(
        'name: slow\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\n'
        "callDelays: {nvmlDeviceCreateGpuInstanceWithPlacement: 0.3}\n"
        "deviceNodeDelay: 0.3\n"
        "gpus:\n  - {model: H100-SXM5-80GB, busId: '0000:1b:00.0', pcieRoot: pci0000:16,"
        " migEnabled: true}\n"
    )
    node = EmulatedNode.create(profile, tmp_path / "root")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
            started = time.monotonic()
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 19, _placement(2, 1))
            assert time.monotonic() - started >= 0.3
            access, dev_node = _caps(node, 0, pynvml.nvmlGpuInstanceGetInfo(gi).id)
            assert access.exists() and not dev_node.exists()  # the node comes a bit later
            deadline = time.monotonic() + 10
            while not dev_node.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert dev_node.exists()
        finally:
            pynvml.nvmlShutdown()
    assert call_delays("realistic") == REALISTIC_CALL_DELAYS
    assert call_delays("none") == {}
    with pytest.raises(ProfileError, match=r"callDelays\.nvmlX: expected seconds >= 0"):
        call_delays({"nvmlX": -1})
    with pytest.raises(ProfileError, match="not an NVML C function name"):
        call_delays({"cudaMalloc": 1})


def test_capability_nodes_carry_the_minor_from_mig_minors(make_node) -> None:
    node = make_node("dgx-a100-mig-on")
    gpu = node.profile.gpus[0]
    profile = gpu.model.mig_profile("2g.20gb")
    assert profile is not None
    gi = node.mig.create_gpu_instance(gpu, profile, 2, 2)
    node.mig.create_compute_instance(gpu, gi.gi_id, 1)
    minors = dict(
        line.split()
        for line in node.host.proc("driver", "nvidia-caps", "mig-minors").read_text().splitlines()
    )
    dev_node = _caps(node, 0, gi.gi_id, 0)[1]
    assert dev_node.name == f"nvidia-cap{minors[f'gpu0/gi{gi.gi_id}/ci0/access']}"
    if os.geteuid() == 0:  # real character devices when we may create them
        st = dev_node.stat()
        assert os.major(st.st_rdev) == 511
        assert os.minor(st.st_rdev) == ci_cap_minor(0, gi.gi_id, 0)
