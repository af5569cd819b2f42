"""Driver installations other than the distro layout, as seen on real nodes.

The GKE-style layout was read off a real H100 node (tests/realgpu, 2026-11-23):
the driver is a read-only ``/usr/local/nvidia`` with ``bin/`` and ``lib64/``
and ``firmware/nvidia/<version>/``, while ``/usr/lib/libcuda.so.1`` is an
absolute link into it and ``/usr/bin/nvidia-smi`` a wrapper script. A plugin
that took ``/`` as the driver root there published specs with no libraries.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.cdiedits import EditsBuilder
from dra_driver.gpu.host.hostpaths import HostPaths, find_driver_root
from dra_driver.gpu.sharing.tools import GpuTools

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


def test_gke_files_keep_their_paths_under_the_root_and_the_hooks_find_them(
    tmp_path: Path,
) -> None:
    """NVIDIA's convention: each file at its host path relative to the driver root
    (``/usr/local/nvidia/lib64/x`` is ``/lib64/x`` in the container), the SONAME and
    ``libcuda.so`` links made by ``create-symlinks`` and ``/lib64`` added to the
    container's ld cache by ``update-ldcache``, whose loader need not search there."""
    nv = gke_node(tmp_path)
    host = HostPaths(root=tmp_path, driver_root=nv)
    view = HostPaths(root=Path("/"), driver_root=Path("/usr/local/nvidia"))
    hook = Path("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook")
    edits = EditsBuilder(
        host=host, driver_version=VERSION, hook=hook, runtime_host=view, majors=MAJORS
    ).common()
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    assert mounts == {
        f"/lib64/libcuda.so.{VERSION}": f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}",
        f"/lib64/libnvidia-ml.so.{VERSION}": f"/usr/local/nvidia/lib64/libnvidia-ml.so.{VERSION}",
        f"/lib64/libnvidia-ptxjitcompiler.so.{VERSION}": "/usr/local/nvidia/lib64/"
        f"libnvidia-ptxjitcompiler.so.{VERSION}",
        "/bin/nvidia-smi": "/usr/local/nvidia/bin/nvidia-smi",
        "/bin/nvidia-cuda-mps-control": "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
        f"/firmware/nvidia/{VERSION}/gsp_ga10x.bin": "/usr/local/nvidia/firmware/nvidia/"
        f"{VERSION}/gsp_ga10x.bin",
    }
    assert "NVIDIA_CTK_LIBCUDA_DIR=/lib64" in edits.env
    by_name = {h.args[1]: h for h in edits.hooks}
    assert [h.args[1] for h in edits.hooks] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification",
    ]  # fmt: skip
    assert all(h.path == str(hook) and h.hook_name == "createContainer" for h in edits.hooks)
    links = by_name["create-symlinks"].args[2:]
    assert sorted(links[1::2]) == sorted([
        f"libcuda.so.{VERSION}::/lib64/libcuda.so.1",
        f"libnvidia-ml.so.{VERSION}::/lib64/libnvidia-ml.so.1",
        f"libnvidia-ptxjitcompiler.so.{VERSION}::/lib64/libnvidia-ptxjitcompiler.so.1",
        "libcuda.so.1::/lib64/libcuda.so",
    ])  # fmt: skip
    assert set(links[0::2]) == {"--link"}
    assert by_name["update-ldcache"].args[2:] == ("--folder", "/lib64")
    assert by_name["enable-cuda-compat"].args[2:] == (f"--host-driver-version={VERSION}",)
