"""The emulated NVML library and host tree, exercised through the real pynvml binding."""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation import BUILTIN_PROFILES, EmulatedNode, ProfileError, load_profile
from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor


def test_install_is_scoped_and_restores_pynvml(make_node) -> None:
    node = make_node("t4")
    assert pynvml.nvmlLib is None
    with node.nvml() as lib:
        assert pynvml.nvmlLib is lib
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()
        assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    assert pynvml.nvmlLib is None
    assert "nvmlDeviceGetCount_v2" not in pynvml._nvmlGetFunctionPointer_cache
    # Two nodes cannot be installed at once: the binding holds one library per process.
    other = make_node("t4")
    with node.nvml(), pytest.raises(RuntimeError, match="already installed"), other.nvml():
        pass


def test_calls_before_init_and_unknown_functions_fail_like_real_nvml(make_node) -> None:
    with make_node("l4-x4").nvml():
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                pynvml.nvmlDeviceGetFanSpeed(handle)
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetMigMode(handle)  # L4 has no MIG
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetHandleByIndex(4)
            assert str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"
        finally:
            pynvml.nvmlShutdown()


def test_device_queries_answer_profile_figures(make_node) -> None:
    node = make_node("dgx-h100")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(7)
            assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
            assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 81559 * 2**20
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            assert v2.total == 81559 * 2**20 and v2.reserved > 0
            assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
            assert pynvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
            assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
            assert pynvml.nvmlDeviceGetNumGpuCores(h) == 132 * 128
            assert pynvml.nvmlDeviceGetPciInfo(h).busId == "00000000:DF:00.0"
            assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
            assert pynvml.nvmlDeviceGetIndex(h) == 7
            uuid = pynvml.nvmlDeviceGetUUID(h)
            by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            assert pynvml.nvmlDeviceGetIndex(by_uuid) == 7
            assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
            assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                h, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
            )
            assert (info.id, info.multiprocessorCount, info.memorySizeMB, info.name) == (
                0,
                132,
                81152,
                "MIG 7g.80gb",
            )
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                    h, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE
                )
        finally:
            pynvml.nvmlShutdown()


def test_static_mig_instances_through_every_nvml_route(make_node) -> None:
    node = make_node("dgx-a100-mig")
    with node.nvml():
        pynvml.nvmlInit()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
            # Route 1: MIG device handles.
            assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
            assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
            assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 2g.20gb"
            assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 5
            assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
            assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 2**20
            attrs = pynvml.nvmlDeviceGetAttributes(mig)
            assert (
                attrs.multiprocessorCount,
                attrs.sharedCopyEngineCount,
                attrs.gpuInstanceSliceCount,
            ) == (28, 2, 2)
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(gpu)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 3)
            # Route 2: GPU instances -> compute instances.
            count = ctypes.c_uint(0)
            gis = (pynvml.c_nvmlGpuInstance_t * 2)()
            pynvml.nvmlDeviceGetGpuInstances(gpu, 9, gis, ctypes.byref(count))  # 3g.40gb
            assert count.value == 1
            gi_info = pynvml.nvmlGpuInstanceGetInfo(gis[0])
            assert (
                gi_info.id,
                gi_info.profileId,
                gi_info.placement.start,
                gi_info.placement.size,
            ) == (1, 9, 0, 4)
            cis = (pynvml.c_nvmlComputeInstance_t * 1)()
            pynvml.nvmlGpuInstanceGetComputeInstances(
                gis[0], pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, cis, ctypes.byref(count)
            )
            assert count.value == 1
            ci_info = pynvml.nvmlComputeInstanceGetInfo(cis[0])
            assert ci_info.id == 0
            assert pynvml.nvmlDeviceGetName(ci_info.device) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
            ci_profile = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gis[0], pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0
            )
            assert (
                ci_profile.sliceCount,
                ci_profile.multiprocessorCount,
                ci_profile.instanceCount,
            ) == (1, 14, 3)
            # Placements of a profile, with a too-small array answered like the C library.
            placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
            count = ctypes.c_uint(8)
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                gpu, 15, placements, ctypes.byref(count)
            )
            assert [(placements[i].start, placements[i].size) for i in range(count.value)] == [
                (0, 2),
                (2, 2),
                (4, 2),
                (6, 2),
            ]
            small, count = (pynvml.c_nvmlGpuInstancePlacement_t * 2)(), ctypes.c_uint(2)
            with pytest.raises(pynvml.NVMLError_InsufficientSize):
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                    gpu, 19, small, ctypes.byref(count)
                )
            assert count.value == 7
        finally:
            pynvml.nvmlShutdown()


def test_injected_faults_hit_one_gpu_only(make_node) -> None:
    node = make_node("dgx-a100")
    node.library.inject_fault(2, "nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN)
    node.library.inject_fault(5, "*", pynvml.NVML_ERROR_GPU_IS_LOST)
    with node.nvml():
        pynvml.nvmlInit()
        try:
            with pytest.raises(pynvml.NVMLError_Unknown):
                pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(2))
            assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(2))
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                pynvml.nvmlDeviceGetHandleByIndex(5)
            assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(4)).startswith("GPU-")
            node.library.clear_faults()
            assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(5)).startswith("GPU-")
        finally:
            pynvml.nvmlShutdown()


def test_unplugged_gpu_vanishes_from_nvml_and_host_and_other_processes_see_it(make_node) -> None:
    node = make_node("l4-x4")
    gone = node.profile.gpus[1]
    with node.nvml():
        pynvml.nvmlInit()
        try:
            old = pynvml.nvmlDeviceGetHandleByIndex(1)
            node.remove_gpu(1)
            assert pynvml.nvmlDeviceGetCount() == 3
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                pynvml.nvmlDeviceGetUUID(old)
            assert gone.uuid not in {
                pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)
            }
        finally:
            pynvml.nvmlShutdown()
    assert not node.host.sys("bus", "pci", "devices", gone.bus_id).exists()
    assert not node.host.dev(f"nvidia{gone.minor}").exists()
    # A second process emulating the same root (the plugin under test) applies it on sync().
    twin = EmulatedNode(
        profile=node.profile, host=node.host, library=type(node.library)(node.profile)
    )
    assert len(twin.library.present_gpus) == 4
    twin.sync()
    assert [g.bus_id for g in twin.library.present_gpus] == [
        "0000:38:00.0",
        "0000:b8:00.0",
        "0000:ba:00.0",
    ]


def test_host_tree_looks_like_a_gpu_node(make_node) -> None:
    node = make_node("dgx-a100-mig")
    host = node.host
    link = host.sys("bus", "pci", "devices", "0000:4e:00.0")
    assert link.is_symlink() and not os.readlink(link).startswith("/")
    assert (
        link.resolve()
        == host.sys("devices", "pci0000:40", "0000:40:01.0", "0000:4e:00.0").resolve()
    )
    assert (link / "numa_node").read_text() == "0\n"
    assert (host.sys("bus", "pci", "devices", "0000:87:00.0") / "numa_node").read_text() == "1\n"
    devices = host.proc("devices").read_text()
    assert "195 nvidia\n" in devices and " nvidia-uvm\n" in devices and " nvidia-caps\n" in devices
    info = host.proc("driver", "nvidia", "gpus", "0000:0f:00.0", "information").read_text()
    assert "Device Minor: \t 1\n" in info
    # GPU 0's 2g.20gb instance is GI 5, CI 0: access files and the mig-minors listing agree.
    gi_access = host.proc(
        "driver", "nvidia", "capabilities", "gpu0", "mig", "gi5", "access"
    ).read_text()
    assert f"DeviceFileMinor: {gi_cap_minor(0, 5)}\n" in gi_access
    minors = dict(
        line.split()
        for line in host.proc("driver", "nvidia-caps", "mig-minors").read_text().splitlines()
    )
    assert minors["config"] == "1" and minors["monitor"] == "2"
    assert minors["gpu0/gi0/access"] == "3" and minors["gpu0/gi0/ci0/access"] == "4"
    assert minors["gpu0/gi5/access"] == str(gi_cap_minor(0, 5))
    assert minors["gpu1/gi13/ci0/access"] == str(ci_cap_minor(1, 13, 0))
    for name in (
        "nvidia0",
        "nvidia7",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        f"nvidia-caps/nvidia-cap{gi_cap_minor(0, 5)}",
    ):
        assert host.dev(name).exists(), name
    if os.geteuid() == 0:  # real character devices when we may create them
        st = host.dev("nvidia7").stat()
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 7)
    lib = host.driver("usr", "lib", "x86_64-linux-gnu")
    assert (lib / "libcuda.so.580.95.05").is_file()
    assert os.readlink(lib / "libnvidia-ml.so.1") == "libnvidia-ml.so.580.95.05"
    assert node.bin_dir == host.driver("usr", "bin") and os.access(
        node.bin_dir / "nvidia-smi", os.X_OK
    )
    assert node.profile_file.read_text() == node.profile.source


def test_refreshing_a_tree_keeps_the_boot_id_but_reboot_changes_it(
    make_node, tmp_path: Path
) -> None:
    node = EmulatedNode.create("t4", tmp_path / "root")
    boot_id = node.host.proc("sys", "kernel", "random", "boot_id").read_text()
    again = EmulatedNode.create("t4", tmp_path / "root")
    assert again.host.proc("sys", "kernel", "random", "boot_id").read_text() == boot_id
    assert again.reboot() + "\n" != boot_id


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_load_with_unique_identities(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name and profile.gpus
    assert len({g.uuid for g in profile.gpus}) == len(profile.gpus)
    assert len({g.bus_id for g in profile.gpus}) == len(profile.gpus)
    assert all(g.uuid.startswith("GPU-") for g in profile.gpus)
    assert "Sources" in profile.source  # every profile cites where its figures come from


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


MIG_GPU = (
    "gpus:\n  - model: A100-SXM4-80GB\n    busId: '0000:01:00.0'\n    pcieRoot: pci0000:00\n"
    "    migEnabled: true\n"
)
BASE = 'name: x\ndriverVersion: "580.95.05"\ncudaDriverVersion: 13000\n'


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (
            "gpus:\n  - {model: B300, busId: '0000:01:00.0', pcieRoot: pci0000:00}",
            r"gpus\[0\]\.model: 'B300' unknown",
        ),
        (
            "gpus:\n  - {model: T4, busId: 'zz:1', pcieRoot: pci0000:00}",
            r"gpus\[0\]\.busId: expected 'dddd:bb:dd.f'",
        ),
        (
            "gpus:\n  - {model: T4, busId: '0000:01:00.0', pcieRoot: pci0000:00, colour: red}",
            r"gpus\[0\]: unknown field\(s\) \['colour'\]",
        ),
        (
            "gpus:\n  - {model: T4, busId: '0000:01:00.0', pcieRoot: pci0000:00, migEnabled: true}",
            r"migEnabled: model T4 is not MIG capable",
        ),
        (
            MIG_GPU + "    migInstances: [{profile: 3g.40gb, start: 2, giId: 1}]",
            r"start: 2 not a placement of 3g.40gb: \(0, 4\)",
        ),
        (
            MIG_GPU + "    migInstances: [{profile: 4g.40gb, start: 0, giId: 1},\n"
            "                   {profile: 2g.20gb, start: 2, giId: 4}]",
            r"2g.20gb@2 overlaps",
        ),
        (
            "gpus:\n  - {model: T4, busId: '0000:01:00.0', pcieRoot: pci0000:00, numaNode: zero}",
            r"numaNode: expected int",
        ),
    ],
    ids=[
        "unknown-model",
        "bad-bus-id",
        "unknown-field",
        "mig-on-non-mig-gpu",
        "bad-placement",
        "overlap",
        "bad-type",
    ],
)
def test_bad_profiles_name_the_field(tmp_path: Path, gpus: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile(_write(tmp_path, BASE + gpus))


def test_unknown_profile_name_lists_builtins() -> None:
    with pytest.raises(ProfileError, match=r"neither a built-in profile \(dgx-a100, "):
        load_profile("dgx-b200")


def test_profile_file_with_its_own_model(make_node, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        BASE + "models:\n  RTX-A6000:\n    productName: NVIDIA RTX A6000\n    brand: NVIDIA_RTX\n"
        "    architecture: AMPERE\n    computeCapability: '8.6'\n    memoryMiB: 49140\n"
        "    multiprocessors: 84\n    coresPerMultiprocessor: 128\n    pciDeviceId: 0x223010DE\n"
        "    pcieGeneration: 4\n    pcieLinkWidth: 16\n"
        "gpus:\n  - {model: RTX-A6000, busId: '0000:41:00.0', pcieRoot: pci0000:40, numaNode: 0}\n",
    )
    node = make_node(path)
    with node.nvml():
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetName(h) == "NVIDIA RTX A6000"
            assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA_RTX
        finally:
            pynvml.nvmlShutdown()


def test_never_writes_over_a_real_looking_host_root(tmp_path: Path) -> None:
    (tmp_path / "sys" / "bus").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="refusing to write an emulated node"):
        EmulatedNode.create("t4", tmp_path)
    assert list((tmp_path / "sys").iterdir()) == [tmp_path / "sys" / "bus"]


KILLED_WHILE_WRITING = """
import os, signal, sys
from pathlib import Path
from dra_driver.emulation import node

def killed(profile, root, **kw):
    (root / "sys" / "bus" / "pci").mkdir(parents=True)  # the first files of the tree
    os.kill(os.getpid(), signal.SIGKILL)

node.write_host_tree = killed
node.EmulatedNode.create("l4-x4", Path(sys.argv[1]))
"""


def test_a_first_start_killed_while_writing_the_tree_is_refreshed_by_the_next(
    tmp_path: Path,
) -> None:
    """Issue 40 item 5: the marker was written last, so every later start refused a tree
    a SIGKILL had left half written."""
    import signal
    import subprocess
    import sys

    root = tmp_path / "host"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(root)],
                          env={**os.environ, "PYTHONPATH": str(repo)}, check=False)  # fmt: skip
    assert done.returncode == -signal.SIGKILL and (root / "sys").is_dir()
    node = EmulatedNode.create("l4-x4", root)
    with node.nvml():
        pynvml.nvmlInit()
        try:
            assert pynvml.nvmlDeviceGetCount() == 4
        finally:
            pynvml.nvmlShutdown()
