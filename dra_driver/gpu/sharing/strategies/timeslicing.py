"""Time-slicing: the pods of a claim take turns on a full GPU, with a chosen time-slice.

Config (GpuConfig only; MIG devices are always time-sliced and take no setting)::

    sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default|Short|Medium|Long}}

Apply, per full GPU: ``nvidia-smi -i <uuid> -c DEFAULT`` (several processes
may use it) then ``nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>``.
Undo: time-slice 0 (Default); the compute mode stays DEFAULT, as apply left it.
A failing reset fails the unprepare (the kubelet retries it, the GPU stays
reserved), so the next tenant never inherits a Long time-slice.
Record: ``{"gpu": <uuid>, "timeslice": <0..3>}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver.gpu.cdi.spec import ContainerEdits
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.config import GPU_CONFIG, DeviceConfig, enum, obj
from dra_driver.gpu.planning import Steps, Target
from dra_driver.gpu.sharing.shares import is_fractional
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.tools import GpuCommands

NAME = "TimeSlicing"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
"""Interval name -> ``nvidia-smi compute-policy --set-timeslice`` argument."""


@dataclass(frozen=True)
class TimeSlicing:
    interval: str = "Default"


@dataclass(frozen=True)
class TimeSlicingDecoder:
    field: str = "timeSlicingConfig"
    kinds: tuple[str, ...] = (GPU_CONFIG,)

    def decode(self, raw: object, path: str) -> TimeSlicing:
        settings = obj(raw if raw is not None else {}, path, ("interval",))
        return TimeSlicing(
            enum(settings.get("interval", "Default"), f"{path}.interval", tuple(INTERVALS))
        )


class TimeSlicingStrategy:
    name = NAME
    config = TimeSlicingDecoder()

    selects = frozenset({NAME})

    def __init__(self, node: NodeTools) -> None:
        self._commands: GpuCommands = node.commands

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Whole GPUs (a share of all of a consumable GPU included); a fractional share is
        :mod:`~dra_driver.gpu.sharing.strategies.timeslicedshares`' (the time-slice is GPU-wide)."""
        sharing = config.sharing
        return sharing is not None and sharing.strategy == NAME and not is_fractional(target)

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        assert config.sharing is not None and isinstance(config.sharing.settings, TimeSlicing)
        value = INTERVALS[config.sharing.settings.interval]
        by_gpu = {t.uuid: t for t in targets if t.type == "gpu"}  # MIG: nothing to set
        return [
            Unit(NAME, (t.name,), gpus=(uuid,), record={"gpu": uuid, "timeslice": value})
            for uuid, t in by_gpu.items()
        ]

    def apply(self, unit: Unit, steps: Steps) -> None:
        uuid = str(unit.record["gpu"])
        self._commands.set_compute_mode(uuid, "DEFAULT")
        steps.done(f"compute-mode:{uuid}")
        self._commands.set_timeslice(uuid, int(unit.record["timeslice"]))
        steps.done(f"timeslice:{uuid}")

    def undo(self, unit: Unit, steps: Steps) -> None:
        uuid = str(unit.record["gpu"])
        self._commands.set_timeslice(uuid, 0)
        steps.done(f"timeslice-reset:{uuid}")

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        return edits

    def forget(self, claim_uid: str) -> None:
        pass

    def after_reboot(self) -> None:
        pass
