"""Device names, shared by publishing (slices) and preparing (claims).

Names follow NVIDIA's DRA driver so claims and tooling written for it keep
working: ``gpu-<minor>`` for a full GPU and
``gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`` for a MIG
device, static or dynamic alike. The profile loses its dots and a ``+``
becomes a dash, as in NVIDIA's names: ``1g.10gb`` -> ``1g10gb``,
``1g.10gb+me`` -> ``1g10gb-me`` (so ``gpu-0-mig-1g10gb-me-20-0``). Device
order in a slice is scheduler preference, so names sort naturally.
"""

from __future__ import annotations

import re

from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance, MigProfile

_NOT_DNS = re.compile(r"[^a-z0-9-]")


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def profile_slug(profile_name: str) -> str:
    """``1g.10gb+me`` -> ``1g10gb-me``: a DNS-label fragment of a MIG profile name."""
    return _NOT_DNS.sub("", profile_name.lower().replace("+", "-"))


def mig_name(parent_minor: int, profile: MigProfile, start: int) -> str:
    """The name of a MIG device of ``profile`` at memory slice ``start``, static or dynamic."""
    slug = profile_slug(profile.name)
    return f"gpu-{parent_minor}-mig-{slug}-{profile.gi_profile_id}-{start}"


def mig_device_name(mig: MigInstance) -> str:
    return mig_name(mig.parent_minor, mig.profile, mig.placement.start)


def devices_by_name(inventory: Inventory) -> dict[str, Gpu | MigInstance]:
    """Every device this node could publish, by published name."""
    named: dict[str, Gpu | MigInstance] = {}
    for gpu in inventory.gpus:
        named[gpu_device_name(gpu)] = gpu
        for mig in gpu.mig_instances:
            named[mig_device_name(mig)] = mig
    return named
