"""An emulated node in dynamic MIG mode for the prepare tests, and a child process that
prepares or unprepares a dynamic MIG claim and SIGKILLs itself after step N.

Usage: ``python -m tests.prepare.migsetup <root> <profile> prepare|unprepare <device>...``
with ``DRA_TEST_KILL_AT=N`` (counted from the first step of that call; 0: no kill, the
step names are printed). ``unprepare`` prepares first (not counted).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.emulation.node import EmulatedNode
from dra_driver.gpu.hardware.discovery import discover
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing.miginstances import MigInstances
from dra_driver.gpu.sharing.tools import GpuTools
from dra_driver.plugin.claims import ClaimRef
from tests.prepare.hosttree import claim

MIG_UID = "0a1b2c3d-0000-4000-8000-0000000d1a90"
MIG_REF = ClaimRef("ns", "dyn", MIG_UID)
LOG = logging.getLogger("test.prepare.dynamicmig")


@dataclass
class MigNode:
    node: EmulatedNode
    root: Path
    installed: AbstractContextManager[Any]

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def inventory(self) -> Inventory:
        return discover(self.node.host, LOG)

    def preparer(self, on_step: Callable[[str], None] | None = None, **kw: Any) -> ClaimPreparer:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return ClaimPreparer(
            driver_name="gpu.nvidia.com",
            inventory=self.inventory,  # discovered anew for every call: never stale here
            host=self.node.host,
            cdi_dir=self.cdi_dir,
            state_dir=self.state_dir,
            logger=LOG,
            tools=GpuTools(nvidia_smi=Path("/nonexistent"), mps_control=Path("/nonexistent")),
            mig_instances=MigInstances(host=self.node.host, logger=LOG, node_timeout_s=5),
            on_step=on_step,
            **kw,
        )

    def instances(self, gpu: int) -> list[tuple[int, str, int, list[int]]]:
        """``(gi_id, profile, start, [ci ids])`` of one GPU's instances now."""
        return [
            (gi.gi_id, gi.profile.name, gi.start, sorted(gi.cis))
            for gi in self.node.mig.gpu_instances(gpu)
        ]

    def close(self) -> None:
        self.installed.__exit__(None, None, None)


def open_mig_node(root: Path, profile: str) -> MigNode:
    """The node under ``root`` (created, or re-opened as a restarted plugin would)."""
    node = EmulatedNode.create(profile, root / "host")
    installed = node.nvml()
    installed.__enter__()
    return MigNode(node, root, installed)


def mig_claim(*devices: str, uid: str = MIG_UID):  # type: ignore[no-untyped-def]
    return claim(uid=uid, name="dyn", devices=[(f"r{i}", d) for i, d in enumerate(devices)])


def main() -> None:
    root, profile, call, *devices = sys.argv[1:]
    node = open_mig_node(Path(root), profile)
    kill_at = int(os.environ.get("DRA_TEST_KILL_AT", "0"))
    steps: list[str] = []
    counting = False

    def on_step(name: str) -> None:
        if not counting:
            return
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    preparer = node.preparer(on_step=on_step)
    if call == "unprepare":
        preparer.prepare(mig_claim(*devices))
        counting = True
        preparer.unprepare(MIG_REF)
    else:
        counting = True
        preparer.prepare(mig_claim(*devices))
    print("\n".join(steps))


if __name__ == "__main__":
    main()
