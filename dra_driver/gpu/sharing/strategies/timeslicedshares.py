"""Advisory fractional GPUs: shares that take turns on the GPU, with no limits at all.

The explicit choice for a fractional share whose config says ``sharing.strategy:
TimeSlicing``, e.g. on drivers that cannot enforce shares (before r615) or for
workloads MPS does not suit. It is what NVIDIA's "consumable shares" are: the
scheduler's accounting only. Nothing stops a process from allocating more memory
or using more SMs than its share, and a share that does can make the others fail
(out of memory) or run slowly. The time-slice is GPU-wide, so shares get the
GPU's Default one: a ``timeSlicingConfig.interval`` other than Default is refused.

Per GPU, the shared resource ``gpu-N/shares`` sets the compute mode to DEFAULT (so
every share's processes may open the GPU) with the first share and leaves it so,
as the whole-GPU time-slicing strategy does. Being the same resource as the MPS
shares' (held by one strategy at a time), it keeps advisory and enforced shares
off the same GPU: the first kind to arrive holds the GPU until its last share is
gone. Record: ``{"shares": {"<uuid>": ["<shareID>", ...]}}``; nothing to undo.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import ConfigError, DeviceConfig
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import devices_by_name
from dra_driver.gpu.planning import Steps, Target, gpu_name_of
from dra_driver.gpu.sharing.shares import ShareError, is_fractional, share_of
from dra_driver.gpu.sharing.slots import slot_target
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.strategies.mpsshares import SHARED
from dra_driver.gpu.sharing.strategies.timeslicing import NAME as TIME_SLICING
from dra_driver.gpu.sharing.strategies.timeslicing import TimeSlicing
from dra_driver.gpu.sharing.tools import GpuCommands, ToolError

NAME = "TimeSlicedShares"


class TimeSlicedSharesStrategy:
    name = NAME
    config = None

    selects = frozenset({TIME_SLICING})
    shares_only = True

    def __init__(self, node: NodeTools) -> None:
        self._commands: GpuCommands = node.commands
        self._inventory: Callable[[], Inventory] = node.inventory
        self._slots = node.slots

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Not a slot (``--mps-slots``): its slots are enforced (:mod:`.mpsslots` refuses)."""
        sharing = config.sharing
        return (
            is_fractional(target)
            and sharing is not None
            and sharing.strategy == TIME_SLICING
            and slot_target(target, self._slots) is None
        )

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        assert config.sharing is not None and isinstance(config.sharing.settings, TimeSlicing)
        if config.sharing.settings.interval != "Default":
            raise ConfigError(
                f"{config.origin}: sharing.timeSlicingConfig.interval: "
                f"{config.sharing.settings.interval!r} would change the time-slice of the "
                "whole GPU under other claims' shares; a share takes the GPU's Default "
                "(ask for the whole GPU to choose one)"
            )
        shares: dict[str, list[str]] = {}
        for t in targets:
            assert isinstance(t.device, Gpu) and t.share_id is not None
            try:
                share_of(t.device, t.consumed_capacity, f"device {t.name} share {t.share_id}")
            except ShareError as exc:
                raise ConfigError(str(exc)) from None
            shares.setdefault(t.uuid, []).append(t.share_id)
        devices = tuple(dict.fromkeys(t.name for t in targets))
        keys = tuple(dict.fromkeys(f"{gpu_name_of(t.name)}/{SHARED}" for t in targets))
        return [Unit(NAME, devices, record={"shares": shares}, shared=keys)]

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        found = devices_by_name(self._inventory()).get(key.split("/", 1)[0])
        if not isinstance(found, Gpu):
            raise ToolError(f"{key}: no such GPU on this node")
        self._commands.set_compute_mode(found.uuid, "DEFAULT")
        steps.done(f"compute-mode:{found.uuid}")
        return {"gpu": found.uuid, "computeMode": "DEFAULT"}

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        pass  # DEFAULT stays, as the whole-GPU time-slicing strategy leaves it

    def apply(self, unit: Unit, steps: Steps) -> None:
        pass

    def undo(self, unit: Unit, steps: Steps) -> None:
        pass

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits

    def forget(self, claim_uid: str) -> None:
        pass

    def after_reboot(self) -> None:
        pass
