"""Discovers the node's GPUs through NVML and sysfs into a plain :class:`Inventory`.

One code path for real and emulated hardware: on a GPU node ``pynvml`` loads
``libnvidia-ml.so.1``; under emulation the emulated library is already
installed in ``pynvml`` and ``host`` points at the emulated tree.

Failure policy: a failure that concerns the whole node (NVML cannot start, no
driver version) raises :class:`DiscoveryError`. A failure on one GPU never
hides the others: if an essential fact (handle, UUID, minor, PCI address,
memory, compute capability) cannot be read, or NVML says the GPU is lost, the
GPU is listed with ``error`` set (degraded) and whatever was read; if an
optional fact fails (NUMA node, PCIe root, link, ECC, MIG details) it is left
unset with a line in ``warnings``. "Not supported" answers are not faults
(a T4 has no MIG mode) and leave the value unset silently.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from dra_driver.errors import DriverError
from dra_driver.gpu.hardware.inventory import (
    Gpu,
    Inventory,
    MigGpuInstance,
    MigInstance,
    MigPlacement,
    MigProfile,
    PciInfo,
)
from dra_driver.gpu.hardware.nvml import NVML_GPU_INSTANCE_PROFILE_COUNT, Handle, Nvml, NvmlError
from dra_driver.gpu.hardware.topology import fabric_membership, numa_affinity, nvlink_info
from dra_driver.gpu.host.hostpaths import HostPaths

T = TypeVar("T")

# NVML enum values -> the strings NVIDIA's DRA driver publishes.
BRANDS = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
          7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS",
          11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia",
          15: "GeForceRTX", 16: "TitanRTX"}  # fmt: skip
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}  # fmt: skip
COMPUTE_MODES = {0: "Default", 1: "ExclusiveThread", 2: "Prohibited", 3: "ExclusiveProcess"}
# CUDA cores per multiprocessor by compute capability (CUDA C Programming Guide, "Compute
# Capabilities"): NVML reports cores, not SMs, for a full GPU.
_CORES_PER_SM = {(3, 0): 192, (3, 5): 192, (3, 7): 192, (5, 0): 128, (5, 2): 128, (6, 0): 64,
                 (6, 1): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
                 (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}  # fmt: skip
# Default compute-instance profile index (covering the whole GI) by compute-slice count.
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_CAP_MINOR_LINE = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class DiscoveryError(DriverError, RuntimeError):
    """The node as a whole cannot be discovered (no NVML, no driver)."""


def normalise_bus_id(bus_id: str) -> str:
    """``00000000:07:00.0`` (NVML) -> ``0000:07:00.0`` (sysfs, lower case)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def pcie_root(host: HostPaths, bus_id: str) -> str:
    """``pci<domain>:<bus>`` from the sysfs device link, e.g. ``pci0000:00``."""
    devices = host.sys("devices").resolve()
    target = host.sys("bus", "pci", "devices", bus_id).resolve(strict=True)
    parts = target.relative_to(devices).parts
    if not parts or not parts[0].startswith("pci"):
        raise ValueError(f"sysfs path {target} of {bus_id} is not under a PCI root")
    return parts[0]


def numa_node(host: HostPaths, bus_id: str) -> int | None:
    """The GPU's NUMA node, or None when the firmware reports none (``-1``)."""
    value = int(host.sys("bus", "pci", "devices", bus_id, "numa_node").read_text().strip())
    return value if value >= 0 else None


def procfs_minor(host: HostPaths, bus_id: str) -> int:
    text = host.proc("driver", "nvidia", "gpus", bus_id, "information").read_text()
    match = _MINOR_LINE.search(text)
    if match is None:
        raise ValueError(f"no 'Device Minor' line in /proc/driver/nvidia/gpus/{bus_id}/information")
    return int(match.group(1))


def cap_minor(host: HostPaths, gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """Minor of ``/dev/nvidia-caps/nvidia-cap<N>`` for a GPU instance or compute instance."""
    parts = ["driver", "nvidia", "capabilities", f"gpu{gpu_minor}", "mig", f"gi{gi_id}"]
    if ci_id is not None:
        parts.append(f"ci{ci_id}")
    path = host.proc(*parts, "access")
    match = _CAP_MINOR_LINE.search(path.read_text())
    if match is None:
        raise ValueError(f"no DeviceFileMinor line in {path}")
    return int(match.group(1))


@dataclass
class _Probe:
    """Runs the queries for one GPU and records what failed, and how badly."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def essential(self, what: str, query: Callable[[], T], default: T) -> T:
        try:
            return query()
        except (NvmlError, OSError, ValueError) as exc:
            self.errors.append(f"{what}: {exc}")
            return default

    def optional(self, what: str, query: Callable[[], T], default: T) -> T:
        try:
            return query()
        except NvmlError as exc:
            if exc.gpu_lost:
                self.errors.append(f"{what}: {exc}")
            elif not exc.not_supported:
                self.warnings.append(f"{what}: {exc}")
            return default
        except (OSError, ValueError) as exc:
            self.warnings.append(f"{what}: {exc}")
            return default


def discover(host: HostPaths, logger: logging.Logger, *, nvml: Nvml | None = None) -> Inventory:
    """Everything discovery knows about this node's GPUs, as plain data."""
    started = time.perf_counter()
    session = nvml or Nvml()
    try:
        session.init()
    except NvmlError as exc:
        raise DiscoveryError(
            f"cannot initialise NVML (is the NVIDIA driver loaded?): {exc}"
        ) from exc
    try:
        try:
            driver_version = session.driver_version()
            cuda = session.cuda_driver_version()
            count = session.device_count()
        except NvmlError as exc:
            raise DiscoveryError(f"cannot read driver facts from NVML: {exc}") from exc
        gpus = tuple(_discover_gpu(session, host, index, logger) for index in range(count))
    finally:
        try:
            session.shutdown()
        except NvmlError as exc:
            logger.warning("NVML shutdown failed: %s", exc)
    inventory = Inventory(
        driver_version=driver_version,
        cuda_driver_version=(cuda // 1000, (cuda % 1000) // 10),
        gpus=gpus,
    )
    logger.info(
        "discovered GPUs",
        extra={
            "gpus": len(gpus),
            "degraded": sum(g.degraded for g in gpus),
            "mig_devices": sum(len(g.mig_instances) for g in gpus),
            "duration_ms": round((time.perf_counter() - started) * 1000, 1),
        },
    )
    return inventory


def _degraded_placeholder(index: int, error: str) -> Gpu:
    return Gpu(
        index=index, minor=-1, uuid="", product_name="", brand="", architecture="",
        cuda_compute_capability=(0, 0), memory_bytes=0, multiprocessors=0,
        pci=PciInfo(bus_id=""), error=error,
    )  # fmt: skip


def _discover_gpu(nvml: Nvml, host: HostPaths, index: int, logger: logging.Logger) -> Gpu:
    try:
        handle = nvml.handle_by_index(index)
    except NvmlError as exc:
        logger.error("GPU unusable: no NVML handle", extra={"gpu_index": index, "error": str(exc)})
        return _degraded_placeholder(index, f"handle: {exc}")
    probe = _Probe()
    uuid = probe.essential("uuid", lambda: nvml.uuid(handle), "")
    bus_id = probe.essential("PCI bus ID", lambda: normalise_bus_id(nvml.pci_bus_id(handle)), "")
    minor = probe.essential("minor", lambda: _minor(nvml, host, handle, bus_id), -1)
    name = probe.essential("name", lambda: nvml.name(handle), "")
    memory = probe.essential("memory", lambda: nvml.memory_total(handle), 0)
    cc = probe.essential("compute capability", lambda: nvml.compute_capability(handle), (0, 0))
    brand = probe.optional("brand", lambda: BRANDS.get(nvml.brand(handle), "Unknown"), "Unknown")
    arch = probe.optional(
        "architecture", lambda: ARCHITECTURES.get(nvml.architecture(handle), "Unknown"), "Unknown"
    )
    cores = probe.optional("GPU cores", lambda: nvml.num_gpu_cores(handle), 0)
    per_sm = _CORES_PER_SM.get(cc, 0)
    if cores and not per_sm:
        probe.warnings.append(f"multiprocessors: unknown cores per SM for compute capability {cc}")
    numa = probe.optional("NUMA node", lambda: numa_node(host, bus_id), None) if bus_id else None
    pci = PciInfo(
        bus_id=bus_id,
        pcie_root=probe.optional("PCIe root", lambda: pcie_root(host, bus_id), None)
        if bus_id
        else None,
        numa_node=numa,
        numa_affinity=probe.optional("NUMA distances", lambda: numa_affinity(host, numa), ())
        if numa is not None
        else (),
        pcie_generation=probe.optional(
            "PCIe generation", lambda: nvml.max_pcie_link_generation(handle), None
        ),
        pcie_link_width=probe.optional(
            "PCIe width", lambda: nvml.max_pcie_link_width(handle), None
        ),
    )
    ecc = probe.optional("ECC mode", lambda: bool(nvml.ecc_mode(handle)[0]), None)
    compute_mode = probe.optional(
        "compute mode", lambda: COMPUTE_MODES.get(nvml.compute_mode(handle), "Unknown"), "Default"
    )
    mig_mode = probe.optional("MIG mode", lambda: nvml.mig_mode(handle), None)
    profiles: tuple[MigProfile, ...] = ()
    instances: tuple[MigInstance, ...] = ()
    gpu_instances: tuple[MigGpuInstance, ...] = ()
    if mig_mode is not None:
        profiles = probe.optional("MIG profiles", lambda: _mig_profiles(nvml, handle), ())
        if mig_mode[0]:
            instances = probe.optional(
                "MIG devices",
                lambda: _mig_instances(nvml, host, handle, probe, profiles, uuid, index, minor),
                (),
            )
            gpu_instances = probe.optional(
                "GPU instances", lambda: _gpu_instances(nvml, handle, profiles), ()
            )
    gpu = Gpu(
        index=index,
        minor=minor,
        uuid=uuid,
        product_name=name,
        brand=brand,
        architecture=arch,
        cuda_compute_capability=cc,
        memory_bytes=memory,
        multiprocessors=cores // per_sm if per_sm else 0,
        pci=pci,
        mig_capable=mig_mode is not None,
        mig_enabled=bool(mig_mode and mig_mode[0]),
        ecc_enabled=ecc,
        compute_mode=compute_mode,
        mig_profiles=profiles,
        mig_instances=instances,
        nvlink=probe.optional("NVLink", lambda: nvlink_info(nvml, handle), None),
        fabric=probe.optional("GPU fabric", lambda: fabric_membership(nvml, handle), None),
        mig_gpu_instances=gpu_instances,
        error="; ".join(probe.errors) or None,
        warnings=tuple(probe.warnings),
    )
    if gpu.degraded:
        logger.error("GPU degraded", extra={"gpu_index": index, "uuid": uuid, "error": gpu.error})
    for warning in gpu.warnings:
        logger.warning("GPU fact unavailable", extra={"gpu_index": index, "detail": warning})
    return gpu


def _minor(nvml: Nvml, host: HostPaths, handle: Handle, bus_id: str) -> int:
    try:
        return nvml.minor_number(handle)
    except NvmlError:
        if not bus_id:
            raise
        return procfs_minor(host, bus_id)  # the kernel module's own record


def _mig_profiles(nvml: Nvml, handle: Handle) -> tuple[MigProfile, ...]:
    profiles: list[MigProfile] = []
    for index in range(NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.gpu_instance_profile_info(handle, index)
        except NvmlError as exc:
            if exc.not_supported or exc.code == 2:  # INVALID_ARGUMENT: index unknown to driver
                continue
            raise
        try:
            placements = nvml.gpu_instance_possible_placements(handle, info.id)
        except NvmlError as exc:
            if not exc.not_supported:
                raise
            placements = []
        profiles.append(
            MigProfile(
                name=info.name,
                gi_profile_id=info.id,
                ci_profile_id=_CI_PROFILE_BY_SLICES.get(info.slice_count, 0),
                slice_count=info.slice_count,
                memory_bytes=info.memory_mib * 1024 * 1024,
                multiprocessors=info.multiprocessors,
                copy_engines=info.copy_engines,
                decoders=info.decoders,
                encoders=info.encoders,
                jpeg_engines=info.jpeg_engines,
                ofa_engines=info.ofa_engines,
                placements=tuple(MigPlacement(start=s, size=n) for s, n in placements),
                instance_count=info.instance_count,
            )
        )
    return tuple(profiles)


def _gpu_instances(
    nvml: Nvml, handle: Handle, profiles: tuple[MigProfile, ...]
) -> tuple[MigGpuInstance, ...]:
    found = []
    for profile in profiles:
        for gi in nvml.gpu_instances(handle, profile.gi_profile_id):
            gi_id, profile_id, start, size = nvml.gpu_instance_info(gi)
            found.append(MigGpuInstance(gi_id, profile_id, MigPlacement(start=start, size=size)))
    return tuple(sorted(found, key=lambda g: g.gi_id))


def _mig_instances(
    nvml: Nvml,
    host: HostPaths,
    handle: Handle,
    probe: _Probe,
    profiles: tuple[MigProfile, ...],
    parent_uuid: str,
    parent_index: int,
    parent_minor: int,
) -> tuple[MigInstance, ...]:
    by_id = {p.gi_profile_id: p for p in profiles}
    found: list[MigInstance] = []
    for slot in range(nvml.max_mig_device_count(handle)):
        try:
            mig = nvml.mig_device_handle(handle, slot)
        except NvmlError as exc:
            if exc.code == 6:  # NOT_FOUND: this slot holds no MIG device
                continue
            raise
        uuid = nvml.uuid(mig)
        gi_id, ci_id = nvml.gpu_instance_id(mig), nvml.compute_instance_id(mig)
        gi = nvml.gpu_instance_by_id(handle, gi_id)
        _, profile_id, start, size = nvml.gpu_instance_info(gi)
        profile = by_id.get(profile_id)
        if profile is None:
            probe.warnings.append(f"MIG device {uuid}: GPU-instance profile {profile_id} unknown")
            continue
        ci_profile = nvml.compute_instance_profile_id(gi, ci_id)
        if ci_profile != profile.ci_profile_id:  # a CI smaller than its GI: describe what it has
            attrs = nvml.mig_device_attributes(mig)
            profile = MigProfile(
                name=f"{attrs.ci_slices}c.{profile.name}",
                gi_profile_id=profile.gi_profile_id,
                ci_profile_id=ci_profile,
                slice_count=profile.slice_count,
                memory_bytes=profile.memory_bytes,
                multiprocessors=attrs.multiprocessors,
                copy_engines=attrs.copy_engines,
                decoders=attrs.decoders,
                encoders=attrs.encoders,
                jpeg_engines=attrs.jpeg_engines,
                ofa_engines=attrs.ofa_engines,
                placements=profile.placements,
            )
        gi_minor: int | None = probe.optional(
            f"MIG {uuid} GI cap", functools.partial(cap_minor, host, parent_minor, gi_id), None
        )
        ci_minor: int | None = probe.optional(
            f"MIG {uuid} CI cap",
            functools.partial(cap_minor, host, parent_minor, gi_id, ci_id),
            None,
        )
        found.append(
            MigInstance(
                uuid=uuid,
                profile=profile,
                gi_id=gi_id,
                ci_id=ci_id,
                placement=MigPlacement(start=start, size=size),
                parent_uuid=parent_uuid,
                parent_index=parent_index,
                parent_minor=parent_minor,
                gi_cap_minor=gi_minor,
                ci_cap_minor=ci_minor,
            )
        )
    return tuple(sorted(found, key=lambda m: (m.placement.start, m.gi_id)))
