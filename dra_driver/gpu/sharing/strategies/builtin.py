"""The built-in sharing strategies, registered in apply order (undo runs in reverse).

TimeSlicing, MPS (whole GPUs and MIG devices), MpsShares
and TimeSlicedShares (fractional shares of consumable GPUs), MpsSlots (slots of GPUs
split by ``--mps-slots`` on drivers before r615); first of all
DynamicMIG when the node creates MIG instances at prepare. A new strategy is one
module in this package, implementing :class:`~.base.SharingStrategy` with a
constructor that takes :class:`~.base.NodeTools`, and one line in
:data:`BUILTIN`.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.gpu.config import SharingDecoder
from dra_driver.gpu.hardware.consumable import MpsSlots
from dra_driver.gpu.hardware.inventory import Inventory
from dra_driver.gpu.planning import SharingStrategy, Strategies
from dra_driver.gpu.sharing.miginstances import MigInstances
from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
from dra_driver.gpu.sharing.strategies.base import NodeTools
from dra_driver.gpu.sharing.strategies.dynamicmig import DynamicMigStrategy
from dra_driver.gpu.sharing.strategies.mps import MpsStrategy
from dra_driver.gpu.sharing.strategies.mpsshares import MpsSharesStrategy
from dra_driver.gpu.sharing.strategies.mpsslots import MpsSlotsStrategy
from dra_driver.gpu.sharing.strategies.timeslicedshares import TimeSlicedSharesStrategy
from dra_driver.gpu.sharing.strategies.timeslicing import TimeSlicingStrategy
from dra_driver.gpu.sharing.tools import GpuCommands

BUILTIN = (
    TimeSlicingStrategy,
    MpsStrategy,
    MpsSharesStrategy,
    MpsSlotsStrategy,
    TimeSlicedSharesStrategy,
)
"""The strategy classes, in apply order; each is built with the node's :class:`NodeTools`."""

DECODERS: dict[str, SharingDecoder] = {
    cls.name: cls.config for cls in BUILTIN if cls.config is not None
}
"""Settings decoders of the built-in strategies (stateless), for decoding configs alone."""


def builtin(
    commands: GpuCommands,
    daemons: MpsDaemons,
    inventory: Callable[[], Inventory],
    mig: MigInstances | None = None,
    slots: MpsSlots | None = None,
) -> Strategies:
    """``inventory``: the current discovery. With ``mig`` (``--mig-mode dynamic``) dynamic
    MIG comes first: its instances exist before anything else could act on them, and are
    destroyed last. ``slots``: the GPUs split into MPS slots (``--mps-slots``)."""
    node = NodeTools(
        commands=commands, daemons=daemons, inventory=inventory, slots=slots or MpsSlots()
    )
    dynamic: list[SharingStrategy] = [DynamicMigStrategy(mig)] if mig is not None else []
    return Strategies([*dynamic, *(cls(node) for cls in BUILTIN)])
