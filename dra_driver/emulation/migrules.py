"""The emulated GPUs' MIG instances as data, and NVML's placement rules for them.

What a GPU instance (GI) and compute instance (CI) are in the emulation, the IDs
NVML gives them and the error codes its rules produce (``nvml.h``); kept apart
from :mod:`~dra_driver.emulation.migstate`, which keeps the instances in a
shared state file and applies the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_driver.emulation.hardware import EmulatedGpu, EmulatedMigProfile, EmulatedProfile

# NVML return codes the rules produce (nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23

_GI_ID_BASE = {8: 0, 4: 1, 2: 3, 1: 7}
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index (== profile id) by compute-slice count.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CI_SLICES_BY_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}


class MigRuleError(Exception):
    """An NVML call breaks a placement rule; ``code`` is what NVML returns."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def gi_id_for(start: int, size: int) -> int:
    """The GI ID NVML assigns to a placement (its node in the memory-slice tree)."""
    return _GI_ID_BASE.get(size, 0) + start // max(size, 1)


def ci_profiles_for(gi_slices: int) -> list[int]:
    """CI profile IDs a GI with ``gi_slices`` compute slices offers (no 3-of-4 split)."""
    return [
        CI_PROFILE_BY_SLICES[s]
        for s in sorted(CI_PROFILE_BY_SLICES)
        if s <= gi_slices and not (gi_slices == 4 and s == 3)
    ]


@dataclass
class ComputeInstance:
    ci_id: int
    profile_id: int
    """CI profile ID (``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE``)."""
    start: int
    """First compute slice within the GI."""
    uuid: str

    @property
    def slices(self) -> int:
        return CI_SLICES_BY_PROFILE[self.profile_id]


@dataclass
class GpuInstance:
    gi_id: int
    profile: EmulatedMigProfile
    start: int
    cis: dict[int, ComputeInstance] = field(default_factory=dict)

    @property
    def memory_slices(self) -> set[int]:
        return set(range(self.start, self.start + self.profile.placement_size))


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a CI) as NVML's device queries see it."""

    gpu: EmulatedGpu
    gi: GpuInstance
    ci: ComputeInstance

    @property
    def profile(self) -> EmulatedMigProfile:
        return self.gi.profile

    @property
    def uuid(self) -> str:
        return self.ci.uuid

    @property
    def gi_id(self) -> int:
        return self.gi.gi_id

    @property
    def ci_id(self) -> int:
        return self.ci.ci_id

    @property
    def start(self) -> int:
        return self.gi.start

    @property
    def full(self) -> bool:
        """The CI covers its whole GI (the MIG device has the GI profile's figures)."""
        return self.ci.slices >= self.gi.profile.slices

    @property
    def name(self) -> str:
        """Profile name as NVML prints it: ``3g.40gb``, or ``1c.3g.40gb`` for a smaller CI."""
        p = self.gi.profile
        return p.name if self.full else f"{self.ci.slices}c.{p.name}"

    @property
    def multiprocessors(self) -> int:
        p = self.gi.profile
        return p.multiprocessors if self.full else p.multiprocessors * self.ci.slices // p.slices


def initial_instances(profile: EmulatedProfile) -> dict[int, dict[int, GpuInstance]]:
    """The instances an administrator left in the profile (static MIG)."""
    out: dict[int, dict[int, GpuInstance]] = {}
    for gpu in profile.gpus:
        gis: dict[int, GpuInstance] = {}
        for m in gpu.mig_instances:
            gis[m.gi_id] = GpuInstance(
                gi_id=m.gi_id,
                profile=m.profile,
                start=m.start,
                cis={
                    m.ci_id: ComputeInstance(
                        m.ci_id, CI_PROFILE_BY_SLICES[m.profile.slices], 0, m.uuid
                    )
                },
            )
        out[gpu.index] = gis
    return out


def gi_json(gi: GpuInstance) -> dict[str, Any]:
    cis = [
        {"ciId": c.ci_id, "profileId": c.profile_id, "start": c.start, "uuid": c.uuid}
        for c in gi.cis.values()
    ]
    return {"giId": gi.gi_id, "profileId": gi.profile.id, "start": gi.start, "cis": cis}
