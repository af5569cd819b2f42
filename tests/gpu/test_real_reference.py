"""The emulated H100 against what a real H100 reported (tests/gpu/data/h100-real).

Only what belongs to the board is compared: identity (UUID), where it sits (PCI
address, NUMA node of a VM, NVLink wiring and fabric membership) and the driver
version differ from node to node.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from dra_driver.commands.discover import inventory_data
from dra_driver.emulation.node import EmulatedNode
from dra_driver.gpu.hardware.discovery import discover

REAL = Path(__file__).parent / "data" / "h100-real"
PER_NODE = {"uuid", "pci", "index", "minor", "nvlink", "fabric"}


# Facts discovery learned to read after the recording (2026-11-23); the real answers
# for them are not on record, so they are left out of the comparison, not invented.
NOT_RECORDED = {"mig_gpu_instances"}
NOT_RECORDED_IN_PROFILES = {"instance_count"}


def board(gpu: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in gpu.items() if k not in PER_NODE | NOT_RECORDED}
    out["pci"] = {k: gpu["pci"][k] for k in ("pcie_generation", "pcie_link_width")}
    out["mig_profiles"] = [
        {k: v for k, v in p.items() if k not in NOT_RECORDED_IN_PROFILES}
        for p in gpu["mig_profiles"]
    ]
    return out


def test_emulated_h100_is_the_real_h100(tmp_path: Path) -> None:
    real = json.loads((REAL / "discover.json").read_text())
    node = EmulatedNode.create("dgx-h100", tmp_path / "host")
    with node.nvml():
        emulated = inventory_data(discover(node.host, logging.getLogger("t")))
    (real_gpu,) = real["gpus"]
    assert board(emulated["gpus"][0]) == board(real_gpu)
    assert emulated["cuda_driver_version"] == real["cuda_driver_version"]


def test_the_reference_is_what_nvidia_smi_said() -> None:
    """The recorded discovery and nvidia-smi -q agree (the reference is not hand-edited)."""
    real = json.loads((REAL / "discover.json").read_text())
    smi = (REAL / "nvidia-smi-q.txt").read_text()
    (gpu,) = real["gpus"]

    def field(name: str) -> str:
        m = re.search(rf"^\s*{re.escape(name)}\s+: (.*)$", smi, re.MULTILINE)
        assert m, name
        return m[1].strip()

    assert field("GPU UUID") == gpu["uuid"]
    assert field("Product Name") == gpu["product_name"]
    assert field("Driver Version") == real["driver_version"]
    assert field("Total") == f"{gpu['memory_bytes'] >> 20} MiB"  # first Total: FB memory
    assert field("Bus Id").lower() == "0000" + gpu["pci"]["bus_id"]
