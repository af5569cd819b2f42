"""The node's GPUs as discovered: plain, immutable data, no NVML handles.

Discovery fills these from NVML and sysfs; devices, CDI and sharing read them.
A GPU whose queries failed is still listed with ``error`` set, so one broken
GPU degrades itself rather than hiding the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigPlacement:
    start: int
    size: int


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile the GPU supports (with its default compute instance)."""

    name: str
    """NVIDIA's profile name, e.g. ``1g.10gb`` or ``1g.10gb+me``."""
    gi_profile_id: int
    ci_profile_id: int
    slice_count: int
    """Compute slices (the ``Ng`` in the name)."""
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[MigPlacement, ...] = ()
    instance_count: int = 0
    """How many instances of this profile the GPU takes at most (NVML ``instanceCount``;
    1 for ``+me`` profiles, which hold the GPU's only media-engine set); 0 = unknown."""


@dataclass(frozen=True)
class MigInstance:
    """A MIG device that already exists (static MIG): one GI with one CI."""

    uuid: str
    profile: MigProfile
    gi_id: int
    ci_id: int
    placement: MigPlacement
    parent_uuid: str
    parent_index: int
    parent_minor: int
    gi_cap_minor: int | None = None
    """Minor of ``/dev/nvidia-caps/nvidia-cap<N>`` granting access to the GI."""
    ci_cap_minor: int | None = None
    """Minor of ``/dev/nvidia-caps/nvidia-cap<N>`` granting access to the CI."""


@dataclass(frozen=True)
class MigGpuInstance:
    """A GPU instance that exists, with or without compute instances (which MIG devices
    need): what occupies the GPU's memory slices."""

    gi_id: int
    gi_profile_id: int
    placement: MigPlacement


@dataclass(frozen=True)
class PciInfo:
    bus_id: str
    """Lower-case ``dddd:bb:dd.f`` (NVML's 8-digit domain normalised to 4)."""
    pcie_root: str | None = None
    """``pci<domain>:<bus>`` of the root complex, from the sysfs device path."""
    numa_node: int | None = None
    numa_affinity: tuple[int, ...] = ()
    """NUMA nodes the GPU is equally close to (its own first), from the SLIT distances."""
    pcie_generation: int | None = None
    pcie_link_width: int | None = None


@dataclass(frozen=True)
class NvLinkInfo:
    active_links: int
    gpu_peers: tuple[str, ...]
    """PCI bus IDs of the GPUs at the other end of active links (bridges), sorted."""
    switch_links: int
    """Active links that end at an NVSwitch."""


@dataclass(frozen=True)
class FabricMembership:
    """The GPU fabric clique (multi-node NVLink partition) the GPU is registered in."""

    cluster_uuid: str
    clique_id: int


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    pci: PciInfo
    mig_capable: bool = False
    mig_enabled: bool = False
    ecc_enabled: bool | None = None
    compute_mode: str = "Default"
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink: NvLinkInfo | None = None
    fabric: FabricMembership | None = None
    mig_gpu_instances: tuple[MigGpuInstance, ...] = ()
    """Every existing GPU instance (read in MIG mode), including those without a CI."""
    error: str | None = None
    """Set when some NVML/sysfs query failed; the GPU is listed but marked degraded."""
    warnings: tuple[str, ...] = ()
    """Optional facts that could not be read (e.g. NUMA node); the GPU stays usable."""

    @property
    def degraded(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    """e.g. ``580.95.05``."""
    cuda_driver_version: tuple[int, int]
    """e.g. ``(13, 0)`` from ``nvmlSystemGetCudaDriverVersion``."""
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
