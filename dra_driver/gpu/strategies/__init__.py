"""Ways of preparing a GPU, each one implementation of :class:`base.SharingStrategy`.

:func:`builtin` gives the preparer its strategies in apply order: Exclusive
(no config), TimeSlicing, MPS. A new way (dynamic MIG, consumable shares) is a
new module here and one more entry in that list.
"""

from __future__ import annotations

from dra_driver.gpu.config import SharingDecoder
from dra_driver.gpu.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing import GpuCommands
from dra_driver.gpu.strategies.base import (
    SharedResources,
    SharingStrategy,
    Steps,
    Strategies,
    Target,
    Unit,
)
from dra_driver.gpu.strategies.exclusive import ExclusiveStrategy
from dra_driver.gpu.strategies.mps import MpsDecoder, MpsStrategy
from dra_driver.gpu.strategies.timeslicing import TimeSlicingDecoder, TimeSlicingStrategy

DECODERS: dict[str, SharingDecoder] = {
    TimeSlicingStrategy.name: TimeSlicingDecoder(),
    MpsStrategy.name: MpsDecoder(),
}
"""Settings decoders of the built-in strategies (stateless), for decoding configs alone."""


def builtin(commands: GpuCommands, daemons: MpsDaemons) -> Strategies:
    return Strategies(
        [ExclusiveStrategy(), TimeSlicingStrategy(commands), MpsStrategy(commands, daemons)]
    )


__all__ = [
    "DECODERS",
    "SharedResources",
    "SharingStrategy",
    "Steps",
    "Strategies",
    "Target",
    "Unit",
    "builtin",
]
