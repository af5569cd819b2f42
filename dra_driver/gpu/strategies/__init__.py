"""Ways of preparing a GPU, each one implementation of :class:`base.SharingStrategy`.

:func:`builtin` gives the preparer its strategies in apply order: Exclusive
(no config), TimeSlicing, MPS (whole GPUs and MIG devices), MpsShares and
TimeSlicedShares (fractional shares of consumable GPUs), and first of all
DynamicMIG when the node creates MIG instances at prepare. A new way is a new
module here and one more entry in that list.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.gpu.config import SharingDecoder
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.miginstances import MigInstances
from dra_driver.gpu.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing import GpuCommands
from dra_driver.gpu.strategies.base import (
    DeviceCatalog,
    Materializes,
    SharedResources,
    SharingStrategy,
    Steps,
    Strategies,
    Target,
    Unit,
)
from dra_driver.gpu.strategies.dynamicmig import DynamicMigStrategy
from dra_driver.gpu.strategies.exclusive import ExclusiveStrategy
from dra_driver.gpu.strategies.mps import MpsDecoder, MpsStrategy
from dra_driver.gpu.strategies.mpsshares import MpsSharesStrategy
from dra_driver.gpu.strategies.timeslicedshares import TimeSlicedSharesStrategy
from dra_driver.gpu.strategies.timeslicing import TimeSlicingDecoder, TimeSlicingStrategy

DECODERS: dict[str, SharingDecoder] = {
    TimeSlicingStrategy.name: TimeSlicingDecoder(),
    MpsStrategy.name: MpsDecoder(),
}
"""Settings decoders of the built-in strategies (stateless), for decoding configs alone."""


def builtin(
    commands: GpuCommands,
    daemons: MpsDaemons,
    inventory: Callable[[], Inventory],
    mig: MigInstances | None = None,
) -> Strategies:
    """``inventory``: the current discovery (share strategies map GPU names to UUIDs and
    read the driver version). With ``mig`` (``--mig-mode dynamic``) dynamic MIG comes
    first: its instances exist before anything else could act on them, and are destroyed
    last."""
    dynamic: list[SharingStrategy] = [DynamicMigStrategy(mig)] if mig is not None else []
    return Strategies(
        [
            *dynamic,
            ExclusiveStrategy(),
            TimeSlicingStrategy(commands),
            MpsStrategy(commands, daemons),
            MpsSharesStrategy(commands, daemons, inventory),
            TimeSlicedSharesStrategy(commands, inventory),
        ]
    )


__all__ = [
    "DECODERS",
    "DeviceCatalog",
    "DynamicMigStrategy",
    "Materializes",
    "SharedResources",
    "SharingStrategy",
    "Steps",
    "Strategies",
    "Target",
    "Unit",
    "builtin",
]
