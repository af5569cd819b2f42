"""Driver installations other than the distro layout, as seen on real nodes.

The GKE-style layout was read off a real H100 node (tests/realgpu, 2026-11-23):
the driver is a read-only ``/usr/local/nvidia`` with ``bin/`` and ``lib64/``
and ``firmware/nvidia/<version>/``, while ``/usr/lib/libcuda.so.1`` is an
absolute link into it and ``/usr/bin/nvidia-smi`` a wrapper script. A plugin
that took ``/`` as the driver root there published specs with no libraries.
"""

from __future__ import annotations

import platform
from pathlib import Path

from dra_driver.gpu.cdiedits import EditsBuilder
from dra_driver.gpu.hostpaths import HostPaths, find_driver_root
from dra_driver.gpu.sharing import GpuTools

VERSION = "580.159.04"
MAJORS = {"nvidia": 195, "nvidia-uvm": 238}


def gke_node(root: Path) -> Path:
    nv = root / "usr/local/nvidia"
    (nv / "bin").mkdir(parents=True)
    (nv / "lib64").mkdir()
    (nv / "lib").symlink_to("lib64")
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (nv / "bin" / tool).write_text("#!/bin/sh\n")
    for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        (nv / "lib64" / f"{lib}.{VERSION}").write_bytes(b"\x7fELF")
        (nv / "lib64" / f"{lib}.1").symlink_to(f"{lib}.{VERSION}")
    fw = nv / "firmware/nvidia" / VERSION
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"")
    # The image's own links and wrapper into the driver root.
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        (root / "usr/lib" / lib).symlink_to(f"/usr/local/nvidia/lib64/{lib}")
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi\n")
    return nv


def test_the_driver_root_is_where_nvml_is_not_where_links_are(tmp_path: Path) -> None:
    nv = gke_node(tmp_path)
    assert find_driver_root(HostPaths(root=tmp_path)) == nv


def test_a_distro_install_is_its_own_driver_root(tmp_path: Path) -> None:
    gke_node(tmp_path)  # a later candidate never wins over the host root itself
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / f"libnvidia-ml.so.{VERSION}").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{VERSION}")
    assert find_driver_root(HostPaths(root=tmp_path)) == tmp_path


def test_no_driver_root_without_nvml(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    assert find_driver_root(HostPaths(root=tmp_path)) is None


def test_tools_and_their_libraries_come_from_the_driver_root(tmp_path: Path) -> None:
    nv = gke_node(tmp_path)
    tools = GpuTools.for_host(HostPaths(root=tmp_path, driver_root=nv))
    assert tools.nvidia_smi == nv / "bin/nvidia-smi"
    assert tools.mps_control == nv / "bin/nvidia-cuda-mps-control"
    assert tools.env == {"LD_LIBRARY_PATH": str(nv / "lib64")}  # lib -> lib64 not twice


def test_lib64_libraries_land_where_the_containers_loader_looks(tmp_path: Path) -> None:
    nv = gke_node(tmp_path)
    host = HostPaths(root=tmp_path, driver_root=nv)
    view = HostPaths(root=Path("/"), driver_root=Path("/usr/local/nvidia"))
    edits = EditsBuilder(host=host, driver_version=VERSION, runtime_host=view, majors=MAJORS)
    mounts = {m.container_path: m.host_path for m in edits.common().mounts}
    arch = {"aarch64": "aarch64-linux-gnu"}.get(platform.machine(), "x86_64-linux-gnu")
    lib = f"/usr/lib/{arch}"
    assert mounts == {
        f"{lib}/libcuda.so.1": "/usr/local/nvidia/lib64/libcuda.so.1",
        f"{lib}/libcuda.so.{VERSION}": f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}",
        f"{lib}/libnvidia-ml.so.1": "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        f"{lib}/libnvidia-ml.so.{VERSION}": f"/usr/local/nvidia/lib64/libnvidia-ml.so.{VERSION}",
        f"{lib}/libnvidia-ptxjitcompiler.so.1": "/usr/local/nvidia/lib64/"
        "libnvidia-ptxjitcompiler.so.1",
        f"{lib}/libnvidia-ptxjitcompiler.so.{VERSION}": "/usr/local/nvidia/lib64/"
        f"libnvidia-ptxjitcompiler.so.{VERSION}",
        "/usr/bin/nvidia-smi": "/usr/local/nvidia/bin/nvidia-smi",
        "/usr/bin/nvidia-cuda-mps-control": "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin": "/usr/local/nvidia/firmware/nvidia/"
        f"{VERSION}/gsp_ga10x.bin",
    }
