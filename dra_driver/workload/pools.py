"""One node's pool as the daemon builds it, from an emulator profile: the driver's own
discovery and pool building (``build_pool``, then ``fractional_pool`` for
``--mig-mode``, ``--consumable-gpus`` and ``--mps-slots``), run once per node shape.

Shared by the fleet bench, the trace replay and ``dra-driver plan``, so all three
reason about exactly the devices a node publishes.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.emulation import EmulatedNode
from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
from dra_driver.gpu.hardware.devices import build_pool
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.partitions import MigMode, PlacementAttributes
from dra_driver.gpu.sharing.slots import fractional_pool
from dra_driver.plugin.resources import Pool
from dra_driver.plugin.slices import content_to_api, split_pool, validate_pool

DRIVER = "gpu.nvidia.com"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverFlags:
    """The daemon flags that change what a node publishes."""

    mig_mode: MigMode = "static"
    consumable: ConsumableGpus = field(default_factory=ConsumableGpus)
    slots: MpsSlots = field(default_factory=MpsSlots)
    placement_attributes: PlacementAttributes = "full"


def node_pool(profile: str | Path, flags: DriverFlags) -> Pool:
    """The pool the daemon builds on a node of ``profile`` (a built-in name or any
    profile file in the emulator's format); raises SliceValidationError if invalid."""
    with tempfile.TemporaryDirectory(prefix="dra-pool-") as root:
        node = EmulatedNode.create(profile, Path(root))
        with node.nvml():
            inventory = discover(node.host, logger)
    pool = build_pool(
        inventory,
        driver_name=DRIVER,
        mig_mode=flags.mig_mode,
        placement_attributes=flags.placement_attributes,
    )
    pool = fractional_pool(pool, inventory, flags.consumable, flags.slots)
    validate_pool(pool)
    return pool


def api_slices(pool: Pool) -> list[dict[str, Any]]:
    """The pool's slice specs as the API holds them (one node's, node-independent)."""
    return [content_to_api(c) for c in split_pool(pool)]


def api_devices(pool: Pool) -> list[dict[str, Any]]:
    """The pool's devices as the API holds them (one node's, node-independent)."""
    return [d for s in api_slices(pool) for d in s.get("devices", [])]
