"""Writes the files a GPU node has under ``/sys``, ``/proc``, ``/dev`` and the driver root.

Discovery and CDI generation read the host only through :class:`HostPaths`;
pointed at this tree they see what they would see on the emulated node:

* ``sys/bus/pci/devices/<bdf>`` -> relative symlink into
  ``sys/devices/pci<dom>:<bus>/<root port>/<bdf>`` (the PCIe root is derived
  from the real link, as on a node), with ``numa_node``, ``vendor``, ``device``;
* ``sys/devices/system/node/node<N>/distance`` (the SLIT row of each NUMA node);
* ``proc/devices`` (``nvidia`` 195, dynamic ``nvidia-uvm``, ``nvidia-caps`` and
  ``nvidia-caps-imex-channels``; the IMEX files are :mod:`.imexhost`'s),
  ``proc/driver/nvidia/gpus/<bdf>/information`` (``Device Minor``),
  ``proc/driver/nvidia/capabilities/...`` and ``proc/driver/nvidia-caps/mig-minors``,
  ``proc/sys/kernel/random/boot_id``;
* ``dev/nvidia<minor>``, ``nvidiactl``, ``nvidia-uvm(-tools)``, ``nvidia-modeset``,
  ``dev/nvidia-caps/nvidia-cap<N>``: character devices when running as root,
  empty files otherwise;
* a driver root (``run/nvidia/driver``, as the GPU operator installs it) laid out
  as the profile's ``driverLayout`` says (:data:`LAYOUTS`: Debian's multiarch dir,
  RHEL's ``usr/lib64``, GKE's ``lib64``/``bin``), with the driver's libraries as
  real ELF shared objects carrying the driver's sonames (:mod:`.elfstub`: a real
  ``ldconfig`` registers them and ``dlopen`` loads them), their SONAME and ``.so``
  links as a driver install makes them, firmware, and tools (placeholders that the
  preparation helper's emulated tools replace).
"""

from __future__ import annotations

import contextlib
import os
import platform
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from dra_driver.emulation import imexhost
from dra_driver.emulation.elfstub import shared_object
from dra_driver.emulation.hardware import EmulatedGpu, EmulatedProfile
from dra_driver.gpu.host.hostpaths import HostPaths

NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
CTL_MINOR, MODESET_MINOR = 255, 254
DRIVER_ROOT = Path("run/nvidia/driver")


@dataclass(frozen=True)
class Layout:
    """Where a driver install puts its files, relative to the driver root."""

    lib_dir: str
    bin_dir: str
    firmware_dir: str


LAYOUTS = {
    "debian": Layout(f"usr/lib/{platform.machine()}-linux-gnu", "usr/bin", "lib/firmware/nvidia"),
    "rhel": Layout("usr/lib64", "usr/bin", "lib/firmware/nvidia"),
    "gke": Layout("lib64", "bin", "firmware/nvidia"),
}
"""By profile ``driverLayout``: Debian/Ubuntu packages and the GPU operator's driver
container, RHEL/Fedora packages, and GKE's ``/usr/local/nvidia``."""

_LIBRARIES = (
    # (file name before the driver version, SONAME; None: the versioned name itself)
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("libcudadebugger.so", "libcudadebugger.so.1"),
    ("libnvidia-gpucomp.so", None),
    ("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    ("libnvidia-opencl.so", "libnvidia-opencl.so.1"),
)
"""The driver's libraries with their real sonames (libnvidia-gpucomp's is versioned)."""
_DEV_LINKS = ("libcuda.so", "libnvidia-ml.so")
"""``.so`` links the driver's installer makes next to the SONAME links."""
_TOOLS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
          "nvidia-cuda-mps-server")  # fmt: skip
_PLACEHOLDER_TOOL = '#!/bin/sh\necho "$0: emulated node, no tool installed here" >&2\nexit 127\n'

# /proc/driver/nvidia-caps/mig-minors numbering: config 1, monitor 2, then per GPU minor
# (0..31) per GI id (0..14): the GI's access minor followed by its 8 CI access minors.
_GI_PER_GPU, _CI_PER_GI, _MAX_GPUS = 15, 8, 32


def gi_cap_minor(gpu_minor: int, gi_id: int) -> int:
    return 3 + (gpu_minor * _GI_PER_GPU + gi_id) * (_CI_PER_GI + 1)


def ci_cap_minor(gpu_minor: int, gi_id: int, ci_id: int) -> int:
    return gi_cap_minor(gpu_minor, gi_id) + 1 + ci_id


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _device_node(path: Path, major: int, minor: int, char_nodes: bool, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if char_nodes:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(mode)
    else:
        path.touch(mode)


def _root_bus(gpu: EmulatedGpu) -> tuple[str, str]:
    """``(domain, bus)`` hex strings of the GPU's PCIe root, from ``pci<dom>:<bus>``."""
    dom, _, bus = gpu.pcie_root.removeprefix("pci").partition(":")
    return dom, bus


def _write_pci(host: HostPaths, gpu: EmulatedGpu) -> None:
    dom, bus = _root_bus(gpu)
    parts = [gpu.pcie_root]
    if gpu.bus_id.split(":")[1] != bus:  # behind a root port (and a switch, on a DGX)
        parts.append(f"{dom}:{bus}:01.0")
    parts.append(gpu.bus_id)
    device_dir = host.sys("devices", *parts)
    device_dir.mkdir(parents=True, exist_ok=True)
    _write(device_dir / "numa_node", f"{gpu.numa_node}\n", 0o444)
    _write(device_dir / "vendor", f"0x{gpu.model.pci_device_id & 0xFFFF:04x}\n", 0o444)
    _write(device_dir / "device", f"0x{gpu.model.pci_device_id >> 16:04x}\n", 0o444)
    _write(device_dir / "class", "0x030200\n", 0o444)
    link = host.sys("bus", "pci", "devices", gpu.bus_id)
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(device_dir, link.parent))


def _information(gpu: EmulatedGpu, driver_version: str) -> str:
    return (
        f"Model: \t\t {gpu.model.product_name}\n"
        f"IRQ:   \t\t {64 + gpu.minor}\n"
        f"GPU UUID: \t {gpu.uuid}\n"
        "Video BIOS: \t ??.??.??.??.??\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 47 bits\n"
        "DMA Mask: \t 0x7fffffffffff\n"
        f"Bus Location: \t {gpu.bus_id}\n"
        f"Device Minor: \t {gpu.minor}\n"
        f"GPU Firmware: \t {driver_version}\n"
        "GPU Excluded:\t No\n"
    )


def _cap_file(minor: int, mode: int = 0o444) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def write_host_tree(
    profile: EmulatedProfile, root: Path, *, char_nodes: bool | None = None
) -> HostPaths:
    """Create (or refresh) the emulated node's files under ``root``; returns where they are."""
    if char_nodes is None:
        char_nodes = os.geteuid() == 0
    root.mkdir(parents=True, exist_ok=True)
    host = HostPaths(root=root, driver_root=root / DRIVER_ROOT)
    version = profile.driver_version

    _write(
        host.proc("devices"),
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n 10 misc\n"
        f"{NVIDIA_MAJOR} nvidia\n{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n"
        f"{imexhost.proc_devices_lines()}"
        "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n",
        0o444,
    )
    boot_id = host.proc("sys", "kernel", "random", "boot_id")
    if not boot_id.exists():  # refreshing a tree (plugin restart) is not a reboot
        _write(boot_id, f"{uuid.uuid4()}\n", 0o444)
    _write(
        host.proc("driver", "nvidia", "version"),
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n"
        "GCC version:  gcc version 12.3.0\n",
        0o444,
    )
    caps = host.proc("driver", "nvidia", "capabilities")
    _write(caps / "mig" / "config", _cap_file(1, 0o400), 0o444)
    _write(caps / "mig" / "monitor", _cap_file(2), 0o444)
    minors_lines = ["config 1", "monitor 2"]
    for gpu_minor in range(_MAX_GPUS):
        for gi in range(_GI_PER_GPU):
            minors_lines.append(f"gpu{gpu_minor}/gi{gi}/access {gi_cap_minor(gpu_minor, gi)}")
            minors_lines += [
                f"gpu{gpu_minor}/gi{gi}/ci{ci}/access {ci_cap_minor(gpu_minor, gi, ci)}"
                for ci in range(_CI_PER_GI)
            ]
    _write(host.proc("driver", "nvidia-caps", "mig-minors"), "\n".join(minors_lines) + "\n", 0o444)

    _device_node(host.dev("nvidiactl"), NVIDIA_MAJOR, CTL_MINOR, char_nodes)
    _device_node(host.dev("nvidia-modeset"), NVIDIA_MAJOR, MODESET_MINOR, char_nodes)
    _device_node(host.dev("nvidia-uvm"), UVM_MAJOR, 0, char_nodes)
    _device_node(host.dev("nvidia-uvm-tools"), UVM_MAJOR, 1, char_nodes)
    _device_node(host.dev("nvidia-caps", "nvidia-cap1"), CAPS_MAJOR, 1, char_nodes, 0o400)
    _device_node(host.dev("nvidia-caps", "nvidia-cap2"), CAPS_MAJOR, 2, char_nodes, 0o444)
    imexhost.write_imex_files(host, char_nodes, _write, _device_node)

    for node, row in enumerate(profile.numa_distances):
        _write(host.sys("devices", "system", "node", f"node{node}", "distance"),
               " ".join(str(d) for d in row) + "\n", 0o444)  # fmt: skip
    for gpu in profile.gpus:
        _write_pci(host, gpu)
        _write(host.proc("driver", "nvidia", "gpus", gpu.bus_id, "information"),
               _information(gpu, version), 0o444)  # fmt: skip
        _device_node(host.dev(f"nvidia{gpu.minor}"), NVIDIA_MAJOR, gpu.minor, char_nodes)
        # The MIG instances' capability entries follow the instances (migstate.MigState).

    layout = LAYOUTS[profile.driver_layout]
    write_libraries(host.driver(layout.lib_dir), version, profile.cuda_driver_version)
    firmware = host.driver(layout.firmware_dir, version)
    firmware.mkdir(parents=True, exist_ok=True)
    for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        (firmware / blob).touch(0o644)
    bin_dir = host.driver(layout.bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in _TOOLS:
        path = bin_dir / tool
        if not path.exists():  # never clobber an emulated tool installed by the preparation side
            _write(path, _PLACEHOLDER_TOOL, 0o755)
    return host


def write_libraries(lib_dir: Path, version: str, cuda_version: int) -> None:
    """The driver's libraries in ``lib_dir``: ``<name>.<version>`` ELF files and their
    links. ``libcuda``'s ``cuDriverGetVersion`` answers ``cuda_version`` (13000 = 13.0)."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name, soname in _LIBRARIES:
        real = lib_dir / f"{name}.{version}"
        functions = {"cuDriverGetVersion": cuda_version} if name == "libcuda.so" else {}
        data = shared_object(soname or real.name, functions)
        if not real.is_file() or real.read_bytes() != data:
            real.unlink(missing_ok=True)
            real.write_bytes(data)
            real.chmod(0o755)
        links = [(soname, real.name)] if soname else []
        if name in _DEV_LINKS and soname:
            links.append((name, soname))
        for link, target in links:
            path = lib_dir / link
            if not path.is_symlink():
                path.unlink(missing_ok=True)
                path.symlink_to(target)


def _mig_cap_paths(
    host: HostPaths, gpu_minor: int, gi_id: int, ci_id: int | None
) -> tuple[Path, Path]:
    """``(procfs access file, /dev node)`` of a GI's or CI's capability."""
    access = host.proc("driver", "nvidia", "capabilities", f"gpu{gpu_minor}", "mig", f"gi{gi_id}")
    if ci_id is None:
        minor = gi_cap_minor(gpu_minor, gi_id)
    else:
        access, minor = access / f"ci{ci_id}", ci_cap_minor(gpu_minor, gi_id, ci_id)
    return access / "access", host.dev("nvidia-caps", f"nvidia-cap{minor}")


def write_mig_caps(
    host: HostPaths,
    gpu_minor: int,
    gi_id: int,
    ci_id: int | None,
    *,
    device_node: bool = True,
    proc: bool = True,
    char_nodes: bool | None = None,
) -> None:
    """What the driver adds when a GI (``ci_id=None``) or CI is created: its capability's
    procfs access file and, once nvidia-modprobe made it, its ``/dev/nvidia-caps`` node."""
    access, node = _mig_cap_paths(host, gpu_minor, gi_id, ci_id)
    minor = int(node.name.removeprefix("nvidia-cap"))
    if proc:
        _write(access, _cap_file(minor), 0o444)
    if device_node:
        if char_nodes is None:
            char_nodes = os.geteuid() == 0
        _device_node(node, CAPS_MAJOR, minor, char_nodes, 0o444)


def remove_mig_caps(host: HostPaths, gpu_minor: int, gi_id: int | None, ci_id: int | None) -> None:
    """What goes away when a CI, a GI, or (``gi_id=None``) every instance of a GPU is destroyed."""
    mig_dir = host.proc("driver", "nvidia", "capabilities", f"gpu{gpu_minor}", "mig")
    if gi_id is None:
        gis = [int(d.name[2:]) for d in mig_dir.glob("gi*") if d.name[2:].isdigit()]
        for gi in gis:
            remove_mig_caps(host, gpu_minor, gi, None)
        return
    gi_dir = mig_dir / f"gi{gi_id}"
    if ci_id is None:
        cis = [int(d.name[2:]) for d in gi_dir.glob("ci*") if d.name[2:].isdigit()]
        for ci in cis:
            remove_mig_caps(host, gpu_minor, gi_id, ci)
    access, node = _mig_cap_paths(host, gpu_minor, gi_id, ci_id)
    access.unlink(missing_ok=True)
    node.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        access.parent.rmdir()


def remove_gpu_files(host: HostPaths, gpu: EmulatedGpu) -> None:
    """What the kernel removes when a GPU leaves the bus: its sysfs link, procfs entry and node."""
    link = host.sys("bus", "pci", "devices", gpu.bus_id)
    if link.is_symlink():
        link.unlink()
    info = host.proc("driver", "nvidia", "gpus", gpu.bus_id, "information")
    if info.exists():
        info.unlink()
        info.parent.rmdir()
    node = host.dev(f"nvidia{gpu.minor}")
    if node.exists():
        node.unlink()


def write_process_cgroup(host: HostPaths, pid: int, pod_uid: str | None) -> None:
    """``/proc/<pid>/cgroup`` of a process: in a pod's cgroup (systemd driver, cgroup v2,
    as the kubelet lays it out) or, without a pod, a system service's."""
    if pod_uid is None:
        line = "0::/system.slice/emulated.service\n"
    else:
        slug = pod_uid.replace("-", "_")
        line = (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slug}.slice/"
            f"cri-containerd-{pid:064x}.scope\n"
        )
    _write(host.proc(str(pid), "cgroup"), line, 0o444)
