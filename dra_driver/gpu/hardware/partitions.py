"""Dynamic MIG: a MIG-mode GPU published as shared counters and every profile x placement.

With ``--mig-mode dynamic`` a GPU whose MIG mode is on is not published as the
MIG devices that happen to exist but as everything it could be cut into
(KEP-4815 partitionable devices): one counter set per GPU holding its memory
slices, multiprocessors, copy engines, decoders, encoders, JPEG and OFA
engines and memory, and one device per GPU-instance profile and possible
placement that consumes exactly the counters that placement takes. The
scheduler then packs claims the way the hardware allows: two devices that
share a memory slice can never both be allocated, and a ``+me`` profile that
holds the GPU's only media-engine set excludes another one through the OFA
and JPEG counters (and, exactly, a per-profile instance counter wherever NVML
says a profile has fewer instances than placements). The GPU instance is
created at prepare and destroyed at unprepare.

Decisions:

* MIG mode is never changed. A GPU with MIG disabled, or without MIG, stays a
  plain GPU on the same node (A100s cannot toggle MIG without a GPU reset;
  mixing MIG and non-MIG GPUs just works). Dynamic MIG is for GPUs an admin
  put in MIG mode.
* The whole GPU is published too (``gpu-<minor>``, type ``gpu``), consuming
  every counter, so a full-GPU claim and MIG claims exclude each other. In MIG
  mode CUDA runs only inside a GPU instance, so it is prepared as the
  instance that spans the whole GPU (:func:`whole_gpu_profile`, from the GPU's
  own profile list: ``7g.80gb`` on an A100 80GB) at placement 0 and publishes
  that instance's ``profile``, memory and multiprocessors: what the container
  really gets. A GPU with no such profile offers no whole GPU.
* Placements are listed from the highest start down within a profile, and
  small profiles before large ones: first-fit then leaves the low placements
  the big profiles need (a 4g or 7g instance can only start at 0).
* Instances this driver did not create (listed by the caller as not owned)
  are never touched: they stay published as static MIG devices, placements
  overlapping them are left out, their engines and memory are taken off the
  counters, and the whole GPU is not offered while they exist.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from dra_driver.gpu.hardware.inventory import Gpu, MigGpuInstance, MigPlacement, MigProfile
from dra_driver.gpu.hardware.naming import gpu_device_name, mig_name

MigMode = Literal["static", "dynamic"]
MIG_MODES: tuple[MigMode, ...] = ("static", "dynamic")
PlacementAttributes = Literal["full", "compact"]
"""What a dynamic MIG device carries: ``full`` (every attribute NVIDIA's driver publishes
on a MIG device, plus ours) or ``compact`` (eight, for large fleets:
:data:`~dra_driver.gpu.hardware.devices.COMPACT_DROPS` says which go and why)."""

OwnedInstance = tuple[str, int, int]
"""``(parent GPU UUID, GI profile ID, placement start)`` of a GPU instance we created."""

InstanceKey = tuple[str, int, int]
"""``(parent GPU UUID, GI ID, CI ID)`` of one MIG instance, as NVML scopes its events."""

_ENGINES = (
    ("multiprocessors", "multiprocessors"),
    ("copy-engines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpeg_engines"),
    ("ofa-engines", "ofa_engines"),
    ("memory", "memory_bytes"),
)


@dataclass(frozen=True)
class MigPartition:
    """A MIG device dynamic MIG creates on demand: one GI profile at one placement."""

    parent: Gpu
    profile: MigProfile
    placement: MigPlacement
    whole_gpu: bool = False
    """Published as the full GPU (``gpu-<minor>``), prepared as this all-spanning instance."""

    @property
    def name(self) -> str:
        if self.whole_gpu:
            return gpu_device_name(self.parent)
        return mig_name(self.parent.minor, self.profile, self.placement.start)

    def consumes(self) -> dict[str, int]:
        """Counters this device takes; the whole GPU takes all of them."""
        if self.whole_gpu:
            return capacity(self.parent)
        return consumption(self.profile, self.placement)

    @property
    def owned_key(self) -> OwnedInstance:
        return (self.parent.uuid, self.profile.gi_profile_id, self.placement.start)


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def memory_slice_count(gpu: Gpu) -> int:
    return max((p.start + p.size for m in gpu.mig_profiles for p in m.placements), default=0)


def whole_gpu_profile(gpu: Gpu) -> MigProfile | None:
    """The profile whose instance spans every memory and compute slice (``7g.80gb``)."""
    slices, compute = (
        memory_slice_count(gpu),
        max((p.slice_count for p in gpu.mig_profiles), default=0),
    )
    for profile in gpu.mig_profiles:
        if profile.slice_count == compute and MigPlacement(0, slices) in profile.placements:
            return profile
    return None


def _limited(profile: MigProfile) -> bool:
    """NVML allows fewer instances than the profile has placements (``+me``: one)."""
    return 0 < profile.instance_count < len(profile.placements)


def consumption(profile: MigProfile, placement: MigPlacement) -> dict[str, int]:
    """The counters one instance of ``profile`` at ``placement`` takes (zeros left out)."""
    used = {
        f"memory-slice-{i}": 1 for i in range(placement.start, placement.start + placement.size)
    }
    for counter, attr in _ENGINES:
        if value := getattr(profile, attr):
            used[counter] = value
    if _limited(profile):
        used[f"profile-{profile.gi_profile_id}-instances"] = 1
    return used


def _size(profile: MigProfile) -> tuple[int, int, int, int]:
    memory_slices = profile.placements[0].size if profile.placements else 0
    return memory_slices, profile.slice_count, profile.memory_bytes, profile.gi_profile_id


def partitions(gpu: Gpu) -> list[MigPartition]:
    """Every profile x possible placement, in scheduler preference order, whole GPU last."""
    out = [
        MigPartition(gpu, profile, placement)
        for profile in sorted(gpu.mig_profiles, key=_size)
        for placement in sorted(profile.placements, key=lambda p: -p.start)
    ]
    whole = whole_gpu_profile(gpu)
    if whole is not None:
        out.append(MigPartition(gpu, whole, MigPlacement(0, memory_slice_count(gpu)), True))
    return out


def capacity(gpu: Gpu) -> dict[str, int]:
    """The GPU's counters: per counter the most any single placement takes, instance
    counters at the profile's instance count (NVML figures; nothing invented)."""
    total: dict[str, int] = {}
    for part in partitions(gpu):
        for counter, value in consumption(part.profile, part.placement).items():
            total[counter] = max(total.get(counter, 0), value)
    for profile in gpu.mig_profiles:
        if _limited(profile):
            total[f"profile-{profile.gi_profile_id}-instances"] = profile.instance_count
    return total


def foreign_instances(gpu: Gpu, owned: Collection[OwnedInstance]) -> list[MigGpuInstance]:
    """GPU instances on ``gpu`` that this driver did not create."""
    return [
        gi
        for gi in gpu.mig_gpu_instances
        if (gpu.uuid, gi.gi_profile_id, gi.placement.start) not in owned
    ]


@dataclass(frozen=True)
class DynamicGpu:
    """What one MIG-mode GPU offers under dynamic MIG, given the instances others made."""

    counters: dict[str, int]
    partitions: tuple[MigPartition, ...]


def available(gpu: Gpu, owned: Collection[OwnedInstance] = ()) -> DynamicGpu:
    """Counters left after foreign instances, and the partitions that can still fit."""
    counters = capacity(gpu)
    profiles = {p.gi_profile_id: p for p in gpu.mig_profiles}
    foreign = foreign_instances(gpu, owned)
    taken: set[int] = set()
    for gi in foreign:
        taken |= set(range(gi.placement.start, gi.placement.start + gi.placement.size))
        profile = profiles.get(gi.gi_profile_id)
        if profile is not None:
            for counter, value in consumption(profile, gi.placement).items():
                counters[counter] = max(0, counters.get(counter, 0) - value)
    fits = tuple(
        part
        for part in partitions(gpu)
        if not (part.whole_gpu and foreign)
        and not taken & set(range(part.placement.start, part.placement.start + part.placement.size))
        and all(counters.get(c, 0) >= v for c, v in part.consumes().items())
    )
    return DynamicGpu(counters={c: v for c, v in counters.items() if v > 0}, partitions=fits)


def binding_counters(offer: DynamicGpu) -> frozenset[str]:
    """The counters worth publishing: memory slices, and every other counter that some
    set of slice-disjoint partitions could overdraw.

    Memory slices already keep overlapping placements apart; a counter that no set of
    non-overlapping placements can exceed (SMs, copy engines, memory on the GPUs NVML
    describes) adds nothing the allocator needs, only bytes every control-plane
    component holds per device. The bound is exact for slice-disjointness (a max-weight
    set of intervals) and ignores the other counters, so it can only keep too much.
    """
    parts = [(p.placement, p.consumes()) for p in offer.partitions if not p.whole_gpu]
    used = {c for p in offer.partitions for c in p.consumes()}
    keep = {c for c in used if c.startswith("memory-slice-")}
    end = max((at.start + at.size for at, _ in parts), default=0)
    for counter in used - keep:
        best = [0] * (end + 1)  # best[i]: the most of it placements within [i, end) take
        for i in range(end - 1, -1, -1):
            best[i] = max(
                [best[i + 1]]
                + [use.get(counter, 0) + best[i + at.size] for at, use in parts if at.start == i]
            )
        if best[0] > offer.counters.get(counter, 0):
            keep.add(counter)
    return frozenset(keep)


def partitions_by_name(
    gpus: Iterable[Gpu], owned: Collection[OwnedInstance] = ()
) -> dict[str, MigPartition]:
    """Every dynamic MIG device of these GPUs (MIG mode on), by published name."""
    return {
        part.name: part
        for gpu in gpus
        if gpu.mig_enabled
        for part in available(gpu, owned).partitions
    }


def catalog(gpus: Iterable[Gpu], owned: Collection[OwnedInstance] = ()) -> dict[str, MigPartition]:
    """Every partition a claim may name on these GPUs (MIG mode on), for preparing.

    Wider than what is published (a claim may come from an older pool generation):
    only a name that belongs to an existing instance somebody else made is left out,
    since that name is the static device of that instance. A partition that overlaps
    another instance fails at creation with NVML's own "insufficient resources".
    """
    out: dict[str, MigPartition] = {}
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        theirs = {(gi.gi_profile_id, gi.placement.start) for gi in foreign_instances(gpu, owned)}
        for part in partitions(gpu):
            if part.whole_gpu and theirs:
                continue
            if (part.profile.gi_profile_id, part.placement.start) not in theirs:
                out[part.name] = part
    return out
