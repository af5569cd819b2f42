"""Device names, shared by publishing (slices) and preparing (claims).

Names follow NVIDIA's DRA driver so claims and tooling written for it keep
working: ``gpu-<minor>`` for a full GPU and
``gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`` for a MIG
device, the profile without dots or plus signs (``1g.10gb+me`` -> ``1g10gbme``).
Device order in a slice is scheduler preference, so names sort naturally.
"""

from __future__ import annotations

import re

from dra_driver.gpu.inventory import Gpu, Inventory, MigInstance

_NOT_DNS = re.compile(r"[^a-z0-9-]")
_GPU_PREFIX = re.compile(r"^(gpu-[0-9]+)(?:-|$)")


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(mig: MigInstance) -> str:
    profile = _NOT_DNS.sub("", mig.profile.name.lower())
    return f"gpu-{mig.parent_minor}-mig-{profile}-{mig.profile.gi_profile_id}-{mig.placement.start}"


def devices_by_name(inventory: Inventory) -> dict[str, Gpu | MigInstance]:
    """Every device this node could publish, by published name."""
    named: dict[str, Gpu | MigInstance] = {}
    for gpu in inventory.gpus:
        named[gpu_device_name(gpu)] = gpu
        for mig in gpu.mig_instances:
            named[mig_device_name(mig)] = mig
    return named


def gpu_name_of(device_name: str) -> str:
    """The full GPU a device name belongs to (``gpu-7-mig-...`` -> ``gpu-7``): what
    preparing locks, so claims on different GPUs never wait for each other."""
    m = _GPU_PREFIX.match(device_name)
    return m.group(1) if m else device_name
