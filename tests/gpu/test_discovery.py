"""Discovery against every emulated profile, and against faults on one GPU.

Expected figures are written out from NVIDIA's published specifications (not
read back from the profile files), so a wrong profile or a discovery bug both
fail here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

from dra_driver.emulation.hosttree import ci_cap_minor, gi_cap_minor
from dra_driver.gpu.hardware.discovery import DiscoveryError, discover
from dra_driver.gpu.host.hostpaths import HostPaths

GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class Expected:
    count: int
    product: str
    brand: str
    architecture: str
    cc: tuple[int, int]
    memory: int
    sms: int
    link: tuple[int, int]
    numa: tuple[int | None, ...]
    roots: tuple[str, ...]
    minors: tuple[int, ...]
    mig_profiles: tuple[str, ...] = ()


A100_MIG = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb")
H100_MIG = A100_MIG
H200_MIG = ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me", "1g.35gb")
DGX_A100_ROOTS = (
    ("pci0000:00",) * 2 + ("pci0000:40",) * 2 + ("pci0000:80",) * 2 + ("pci0000:a0",) * 2
)
A100 = ("NVIDIA A100-SXM4-80GB", "Nvidia", "Ampere", (8, 0), 80 * GiB, 108, (4, 16))
H100 = ("NVIDIA H100 80GB HBM3", "Nvidia", "Hopper", (9, 0), 81559 * MiB, 132, (5, 16))
TWO_SOCKETS = (0, 0, 0, 0, 1, 1, 1, 1)
H100_ROOTS = ("pci0000:16", "pci0000:3f", "pci0000:4e", "pci0000:5d", "pci0000:97", "pci0000:bf",
              "pci0000:cd", "pci0000:db")  # fmt: skip
EXPECTED = {
    "dgx-a100": Expected(8, *A100, TWO_SOCKETS, DGX_A100_ROOTS, tuple(range(8)), A100_MIG),
    "dgx-a100-mig": Expected(8, *A100, TWO_SOCKETS, DGX_A100_ROOTS, tuple(range(8)), A100_MIG),
    "dgx-h100": Expected(8, *H100, TWO_SOCKETS, H100_ROOTS, tuple(range(8)), H100_MIG),
    "h200": Expected(1, "NVIDIA H200", "Nvidia", "Hopper", (9, 0), 143771 * MiB, 132, (5, 16),
                     (0,), ("pci0000:17",), (0,), H200_MIG),
    "l4-x4": Expected(4, "NVIDIA L4", "Nvidia", "Ada Lovelace", (8, 9), 23034 * MiB, 58, (4, 16),
                      (0, 0, 1, 1), ("pci0000:37",) * 2 + ("pci0000:b7",) * 2, (2, 3, 0, 1)),
    "t4": Expected(1, "Tesla T4", "Tesla", "Turing", (7, 5), 15360 * MiB, 40, (3, 16), (None,),
                   ("pci0000:00",), (0,)),
}  # fmt: skip


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_every_profile_is_discovered_with_published_figures(
    make_node, discover_node, profile: str
) -> None:
    want = EXPECTED[profile]
    node = make_node(profile)
    inv = discover_node(node)
    assert inv.driver_version == "580.95.05" and inv.cuda_driver_version == (13, 0)
    assert len(inv.gpus) == want.count
    for i, gpu in enumerate(inv.gpus):
        assert gpu.error is None and gpu.warnings == ()
        assert gpu.index == i
        assert gpu.uuid == node.profile.gpus[i].uuid
        assert (gpu.product_name, gpu.brand, gpu.architecture) == (
            want.product,
            want.brand,
            want.architecture,
        )
        assert gpu.cuda_compute_capability == want.cc
        assert gpu.memory_bytes == want.memory
        assert gpu.multiprocessors == want.sms
        assert (gpu.pci.pcie_generation, gpu.pci.pcie_link_width) == want.link
        assert gpu.pci.bus_id == node.profile.gpus[i].bus_id
        assert gpu.pci.bus_id == gpu.pci.bus_id.lower()
        assert gpu.ecc_enabled is True and gpu.compute_mode == "Default"
        assert gpu.mig_capable == bool(want.mig_profiles)
    assert tuple(g.pci.numa_node for g in inv.gpus) == want.numa
    assert tuple(g.pci.pcie_root for g in inv.gpus) == want.roots
    assert tuple(g.minor for g in inv.gpus) == want.minors
    for gpu in inv.gpus:
        assert tuple(p.name for p in gpu.mig_profiles) == want.mig_profiles


def test_mig_profile_table_of_a100_80gb(make_node, discover_node) -> None:
    """NVIDIA MIG user guide, A100-SXM4-80GB: SMs, engines, memory and placements."""
    gpu = discover_node(make_node("dgx-a100")).gpus[0]
    table = {
        p.name: (p.gi_profile_id, p.slice_count, p.multiprocessors, p.copy_engines, p.decoders,
                 p.jpeg_engines, p.ofa_engines, p.memory_bytes // MiB,
                 tuple((pl.start, pl.size) for pl in p.placements))
        for p in gpu.mig_profiles
    }  # fmt: skip
    assert table == {
        "1g.10gb": (19, 1, 14, 1, 0, 0, 0, 9728, tuple((s, 1) for s in range(7))),
        "1g.10gb+me": (20, 1, 14, 1, 1, 1, 1, 9728, tuple((s, 1) for s in range(7))),
        "1g.20gb": (15, 1, 14, 1, 1, 0, 0, 19968, ((0, 2), (2, 2), (4, 2), (6, 2))),
        "2g.20gb": (14, 2, 28, 2, 1, 0, 0, 19968, ((0, 2), (2, 2), (4, 2))),
        "3g.40gb": (9, 3, 42, 3, 2, 0, 0, 40192, ((0, 4), (4, 4))),
        "4g.40gb": (5, 4, 56, 4, 2, 0, 0, 40192, ((0, 4),)),
        "7g.80gb": (0, 7, 98, 7, 5, 1, 1, 80896, ((0, 8),)),
    }
    assert {p.name: p.ci_profile_id for p in gpu.mig_profiles}["3g.40gb"] == 2


def test_static_mig_instances_are_discovered_with_caps(make_node, discover_node) -> None:
    node = make_node("dgx-a100-mig")
    inv = discover_node(node)
    summary = {
        g.index: [
            (m.profile.name, m.gi_id, m.ci_id, m.placement.start, m.placement.size)
            for m in g.mig_instances
        ]
        for g in inv.gpus
        if g.mig_enabled
    }
    assert summary == {
        0: [("3g.40gb", 1, 0, 0, 4), ("2g.20gb", 5, 0, 4, 2), ("1g.10gb", 13, 0, 6, 1)],
        1: [("1g.10gb", 7 + s, 0, s, 1) for s in range(7)],
        4: [("4g.40gb", 1, 0, 0, 4), ("3g.40gb", 2, 0, 4, 4)],
        5: [],
    }
    assert [g.mig_enabled for g in inv.gpus] == [True, True, False, False, True, True, False, False]
    mig = inv.gpus[4].mig_instances[1]
    assert (mig.parent_uuid, mig.parent_index, mig.parent_minor) == (inv.gpus[4].uuid, 4, 4)
    assert mig.uuid.startswith("MIG-") and mig.uuid == node.profile.gpus[4].mig_instances[1].uuid
    assert (mig.gi_cap_minor, mig.ci_cap_minor) == (gi_cap_minor(4, 2), ci_cap_minor(4, 2, 0))
    # The minors discovery read are the ones the kernel lists for these capabilities.
    listing = dict(
        line.split()
        for line in node.host.proc("driver", "nvidia-caps", "mig-minors").read_text().splitlines()
    )
    assert int(listing["gpu4/gi2/access"]) == mig.gi_cap_minor
    assert int(listing["gpu4/gi2/ci0/access"]) == mig.ci_cap_minor


def test_lost_gpu_is_degraded_and_the_others_stay_complete(make_node, discover_node) -> None:
    node = make_node("dgx-a100-mig")
    node.library.inject_fault(3, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    node.library.inject_fault(6, "*", pynvml.NVML_ERROR_UNKNOWN)
    inv = discover_node(node)
    assert len(inv.gpus) == 8
    lost, broken = inv.gpus[3], inv.gpus[6]
    assert lost.degraded and "memory" in lost.error and "GPU is lost" in lost.error
    assert (
        lost.uuid == node.profile.gpus[3].uuid and lost.pci.bus_id == "0000:4e:00.0"
    )  # what could be read
    assert broken.degraded and broken.error.startswith("handle:") and broken.uuid == ""
    healthy = [g for g in inv.gpus if g.index not in (3, 6)]
    assert all(not g.degraded and g.memory_bytes == 80 * GiB and g.uuid for g in healthy)
    assert len(inv.gpus[1].mig_instances) == 7


def test_gpu_lost_on_an_optional_query_still_degrades(make_node, discover_node) -> None:
    node = make_node("dgx-h100")
    node.library.inject_fault(2, "nvmlDeviceGetEccMode", pynvml.NVML_ERROR_GPU_IS_LOST)
    gpu = discover_node(node).gpus[2]
    assert gpu.degraded and "ECC mode" in gpu.error


def test_optional_facts_fail_soft(make_node, discover_node) -> None:
    node = make_node("dgx-h100")
    lib = node.library
    lib.inject_fault(
        0, "nvmlDeviceGetEccMode", pynvml.NVML_ERROR_NOT_SUPPORTED
    )  # absent, not a fault
    lib.inject_fault(1, "nvmlDeviceGetMaxPcieLinkGeneration", pynvml.NVML_ERROR_UNKNOWN)
    lib.inject_fault(2, "nvmlDeviceGetMinorNumber", pynvml.NVML_ERROR_UNKNOWN)  # procfs fallback
    lib.inject_fault(3, "nvmlDeviceGetGpuInstanceProfileInfoV", pynvml.NVML_ERROR_UNKNOWN)
    (node.host.sys("bus", "pci", "devices", "0000:9d:00.0") / "numa_node").unlink()  # GPU 4
    inv = discover_node(node)
    g0, g1, g2, g3, g4 = inv.gpus[:5]
    assert g0.ecc_enabled is None and g0.warnings == () and not g0.degraded
    assert g1.pci.pcie_generation is None and not g1.degraded
    assert g1.warnings == (
        "PCIe generation: nvmlDeviceGetMaxPcieLinkGeneration: Unknown Error (NVML error 999)",
    )
    assert g2.minor == 2 and not g2.degraded and g2.warnings == ()
    assert (
        g3.mig_profiles == ()
        and g3.mig_capable
        and len(g3.warnings) == 1
        and "MIG profiles" in g3.warnings[0]
    )
    assert g4.pci.numa_node is None and not g4.degraded and "NUMA node" in g4.warnings[0]
    assert all(g.memory_bytes == 81559 * MiB for g in inv.gpus)


def test_unknown_minor_everywhere_degrades(make_node, discover_node) -> None:
    node = make_node("t4")
    node.library.inject_fault(0, "nvmlDeviceGetMinorNumber", pynvml.NVML_ERROR_UNKNOWN)
    node.host.proc("driver", "nvidia", "gpus", "0000:00:1e.0", "information").unlink()
    gpu = discover_node(node).gpus[0]
    assert gpu.degraded and gpu.minor == -1 and "minor" in gpu.error


def test_pcie_root_comes_from_the_sysfs_link(make_node, discover_node) -> None:
    node = make_node("t4")
    link = node.host.sys("bus", "pci", "devices", "0000:00:1e.0")
    target = node.host.sys("devices", "pci0000:3a", "0000:3a:02.0", "0000:00:1e.0")
    target.mkdir(parents=True)
    (target / "numa_node").write_text("1\n")
    link.unlink()
    link.symlink_to("../../../devices/pci0000:3a/0000:3a:02.0/0000:00:1e.0")
    pci = discover_node(node).gpus[0].pci
    assert (pci.pcie_root, pci.numa_node) == ("pci0000:3a", 1)


def test_removed_gpu_is_gone_from_the_next_discovery(make_node, discover_node) -> None:
    node = make_node("l4-x4")
    before = discover_node(node)
    node.remove_gpu(2)
    after = discover_node(node)
    assert [g.minor for g in before.gpus] == [2, 3, 0, 1]
    assert [g.minor for g in after.gpus] == [2, 3, 1]
    assert [g.index for g in after.gpus] == [0, 1, 2]


def test_cuda_version_from_nvml_integer(make_node, discover_node, tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "dra_driver/emulation/profiles/t4.yaml").read_text()
    path = tmp_path / "old.yaml"
    path.write_text(text.replace("13000", "12040").replace("580.95.05", "550.54.15"))
    inv = discover_node(make_node(path))
    assert (inv.driver_version, inv.cuda_driver_version) == ("550.54.15", (12, 4))


def test_discovery_leaves_nvml_shut_down(make_node, discover_node) -> None:
    node = make_node("dgx-a100")
    discover_node(node)
    discover_node(node)
    assert node.library._init_count == 0
    assert node.library.calls["nvmlInitWithFlags"] == 2 and node.library.calls["nvmlShutdown"] == 2


def test_no_driver_is_a_node_level_error(tmp_path: Path) -> None:
    """Without emulation on this GPU-less machine pynvml finds no libnvidia-ml: one clear error."""
    with pytest.raises(DiscoveryError, match="cannot initialise NVML"):
        discover(HostPaths(root=tmp_path), logging.getLogger("test"))
