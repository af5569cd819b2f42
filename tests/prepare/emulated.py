"""Claim preparation on the emulated nodes (profiles of dra_driver.emulation)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_driver.emulation import gputools
from dra_driver.emulation.node import EmulatedNode
from dra_driver.gpu.cdi.hooks import TOOLKIT_HOOK
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.tools import GpuTools
from tests.prepare.hosttree import state_dir_for

PROFILES_DIR = Path(__file__).parents[2] / "dra_driver" / "emulation" / "profiles"
# dgx-a100-mig-on has only MIG-mode GPUs without instances: nothing to prepare in static mode.
PROFILES = sorted(
    p.stem for p in PROFILES_DIR.glob("*.yaml") if p.stem not in ("models", "dgx-a100-mig-on")
)
GOLDEN_DIR = Path(__file__).parents[2] / "cdi" / "golden"
GOLDEN_UID = "00000000-0000-4000-8000-00000000c0de"


@dataclass
class EmulatedSetup:
    node: EmulatedNode
    inventory: Inventory
    record: Path
    tools: GpuTools
    cdi_dir: Path
    state_dir: Path

    def preparer(self, cdi_hook: Path = TOOLKIT_HOOK) -> ClaimPreparer:
        """``cdi_hook``: the hook binary the specs name (:func:`tests.conftest.cdi_hook` for
        containers that run them; the golden specs keep the toolkit's path)."""
        return ClaimPreparer(
            driver_name="gpu.nvidia.com",
            inventory=lambda: self.inventory,
            host=self.node.host,
            cdi_dir=self.cdi_dir,
            state_dir=self.state_dir,
            logger=logging.getLogger("test.prepare.emulated"),
            tools=self.tools,
            cdi_hook=cdi_hook,
        )

    def device_names(self) -> list[str]:
        return list(devices_by_name(self.inventory))


def emulated(profile: str | Path, root: Path) -> EmulatedSetup:
    node = EmulatedNode.create(profile, root / "host")
    with node.nvml():
        inventory = discover(node.host, logging.getLogger("test.discover"))
    record = root / "gputools.jsonl"
    paths = gputools.install(node.bin_dir, record)
    tools = GpuTools(
        nvidia_smi=paths[gputools.NVIDIA_SMI], mps_control=paths[gputools.MPS_CONTROL], timeout_s=10
    )
    return EmulatedSetup(node, inventory, record, tools, root / "cdi", state_dir_for(root))
