"""What an emulated node's hardware is: the frozen records a profile parses into
(:mod:`.profile` reads and checks the YAML; the NVML, sysfs and tool emulations read
these)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dra_driver.errors import DriverError

DRIVER_LAYOUTS = ("debian", "rhel", "gke")
"""Driver installations an emulated node can have (``driverLayout``; hosttree.LAYOUTS)."""

REALISTIC_CALL_DELAYS: dict[str, float] = {
    "nvmlDeviceCreateGpuInstanceWithPlacement": 1.0,
    "nvmlDeviceCreateGpuInstance": 1.0,
    "nvmlGpuInstanceDestroy": 1.0,
    "nvmlGpuInstanceCreateComputeInstance": 0.2,
    "nvmlComputeInstanceDestroy": 0.2,
}
"""Seconds a MIG change takes on a real A100/H100, for ``callDelays: realistic``.

ESTIMATES, not measurements (no GPU was lent to measure them): NVIDIA's dynamic-MIG
driver notes give creating and destroying a GPU instance as "O(1 s)"
(perf-anchors.md); compute instances are taken as a fifth of that. Override per
function with a ``callDelays`` mapping in the profile."""


# Brand and architecture names as the NVML enums spell them (NVML_BRAND_<x>, NVML_DEVICE_ARCH_<x>).
BRANDS = ("NVIDIA", "TESLA", "QUADRO", "GEFORCE", "TITAN", "NVIDIA_RTX", "QUADRO_RTX")
ARCHITECTURES = (
    "KEPLER",
    "MAXWELL",
    "PASCAL",
    "VOLTA",
    "TURING",
    "AMPERE",
    "ADA",
    "HOPPER",
    "BLACKWELL",
)
GI_PROFILES = (
    "1_SLICE",
    "2_SLICE",
    "3_SLICE",
    "4_SLICE",
    "7_SLICE",
    "8_SLICE",
    "6_SLICE",
    "1_SLICE_REV1",
    "2_SLICE_REV1",
    "1_SLICE_REV2",
)


class ProfileError(DriverError, ValueError):
    """A profile name or file is unknown or malformed; the message names the field."""


@dataclass(frozen=True)
class EmulatedMigProfile:
    name: str
    nvml_profile: str
    """Suffix of the ``NVML_GPU_INSTANCE_PROFILE_<x>`` constant (the query index)."""
    id: int
    slices: int
    instances: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    placements: tuple[int, ...]
    placement_size: int


@dataclass(frozen=True)
class EmulatedModel:
    product_name: str
    brand: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_mib: int
    reserved_mib: int
    multiprocessors: int
    cores_per_multiprocessor: int
    pci_device_id: int
    pci_subsystem_id: int
    pcie_generation: int
    pcie_link_width: int
    ecc: bool
    mig_profiles: tuple[EmulatedMigProfile, ...] = ()
    nvlinks: int = 0
    """NVLink ports on the board (0: none); links beyond answer INVALID_ARGUMENT."""

    def mig_profile(self, name: str) -> EmulatedMigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@dataclass(frozen=True)
class EmulatedMigInstance:
    profile: EmulatedMigProfile
    start: int
    gi_id: int
    ci_id: int
    uuid: str


@dataclass(frozen=True)
class EmulatedFabric:
    """GPU fabric membership (multi-node NVLink), as ``nvmlDeviceGetGpuFabricInfoV`` reports it."""

    cluster_uuid: str
    clique_id: int
    state: int = 3
    """``NVML_GPU_FABRIC_STATE_*``: 3 = completed (registered with the fabric manager)."""


@dataclass(frozen=True)
class EmulatedGpu:
    index: int
    model: EmulatedModel
    bus_id: str
    """Lower-case ``dddd:bb:dd.f``."""
    pcie_root: str
    numa_node: int
    minor: int
    uuid: str
    mig_enabled: bool = False
    mig_instances: tuple[EmulatedMigInstance, ...] = ()
    faults: dict[str, int] = field(default_factory=dict)
    """C function name (or ``*``) -> NVML return code, injected for this GPU only."""
    nvlink_peers: tuple[tuple[int, int], ...] = ()
    """``(link, peer GPU index)`` for links bridged to another GPU of the node."""
    fabric: EmulatedFabric | None = None
    """Set on GPUs of a multi-node NVLink fabric: every link goes to an NVSwitch."""


@dataclass(frozen=True)
class EmulatedProfile:
    name: str
    driver_version: str
    cuda_driver_version: int
    """As NVML returns it: ``13000`` for CUDA 13.0."""
    gpus: tuple[EmulatedGpu, ...]
    source: str
    """The YAML text the profile came from (copied into the emulated root for tools)."""
    numa_distances: tuple[tuple[int, ...], ...] = ()
    """SLIT distances between NUMA nodes (``node<N>/distance`` in sysfs), row per node."""
    call_delays: dict[str, float] = field(default_factory=dict)
    """C function name -> seconds each call takes (emulated hardware latency)."""
    device_node_delay: float = 0.0
    """Seconds after a MIG instance is created until its ``/dev/nvidia-caps`` nodes exist."""
    driver_layout: str = "debian"
    """Where the driver's files sit under its root (:data:`~.hosttree.LAYOUTS`): ``debian``
    (multiarch lib dir), ``rhel`` (``usr/lib64``) or ``gke`` (``lib64`` and ``bin``)."""
    driver_loaded: bool = True
    """False: NVML's init answers "Driver Not Loaded" (the kernel module is not loaded)."""
