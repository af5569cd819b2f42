"""Exclusive: the default when no config names a strategy; the device is used as it is.

Nothing is changed on the GPU (its compute mode and time-slice stay what the
admin set), so there is nothing to plan, apply or undo: the claim's CDI spec
alone grants the device. The scheduler never gives a device without
``allowMultipleAllocations`` to two claims, so the device is exclusive to the claim.
A share that holds all of a consumable GPU is exclusive too (nothing else fits
beside it) and is prepared here; a fractional share is left to the share
strategies (:mod:`~dra_driver.gpu.strategies.mpsshares`).
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.gpu.cdi import ContainerEdits
from dra_driver.gpu.config import DeviceConfig, SharingDecoder
from dra_driver.gpu.shares import is_fractional
from dra_driver.gpu.strategies.base import NodeTools, Steps, Target, Unit


class ExclusiveStrategy:
    name = "Exclusive"
    config: SharingDecoder | None = None
    selects = frozenset({None})

    def __init__(self, node: NodeTools) -> None:
        pass

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        return config.sharing is None and (target.share_id is None or not is_fractional(target))

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        return []

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
