"""The seam for ways of preparing a GPU: one small protocol per sharing strategy.

Where its parts live (so imports only go down): :class:`Unit` in
:mod:`dra_driver.gpu.checkpoint`, which records it; :class:`SharingStrategy`,
:class:`Steps` and the optional abilities :class:`ClaimCheck`,
:class:`DeviceCatalog` and :class:`SharedResources` in :mod:`dra_driver.gpu.planning`,
which asks them; here the contract below, :class:`NodeTools` (what the built-in
strategies are built from) and :class:`Materializes` (asked by the CDI spec).

A claim's devices are resolved against the inventory into
:class:`~dra_driver.gpu.planning.Target`\\ s.
For every target (admin-access targets excepted: they only get device nodes),
each registered strategy is asked whether it :meth:`~SharingStrategy.wants` it
given the device's effective config; the targets a strategy wants, grouped by
the config they came from, are planned into :class:`Unit`\\ s. A unit is what
one strategy does for some of a claim's devices, as JSON (``record``): it is
written to the checkpoint *before* anything is applied, so :meth:`undo` can
always run from the record alone (after a SIGKILL, in another process).

The pipeline (:mod:`dra_driver.gpu.preparing`) drives the rest and owns
ordering, locks, checkpoint states and rollback; a strategy only:

- decodes and validates its settings (``config``, a :class:`SharingDecoder`);
- plans without side effects (bad input raises ``ConfigError`` here);
- applies a unit step by step, calling ``steps.done(name)`` after each side
  effect and ``steps.record(...)`` whenever it learnt something undo needs that
  the plan could not know (an ID the hardware assigned), *before* the next
  step can fail;
- undoes a unit idempotently (every step may have happened or not), raising on
  any step that did not take effect, so a failed reset is retried, not ignored;
- adds its CDI container edits to each device it covers;
- removes what it may have left for a claim that has no record
  (:meth:`forget`) and, after a reboot, every file it keeps (:meth:`after_reboot`:
  hardware state is gone then, so no tool is run and no process signalled).

A rule over a whole claim (at most one MPS slot) is the optional
:class:`ClaimCheck` ability.

Devices created at prepare (dynamic MIG's partitions) use two more optional
abilities: :class:`DeviceCatalog` names them for planning, and
:class:`Materializes` hands the CDI spec the device that ``apply`` created.

Which strategies are asked: a strategy may declare, as class attributes,
``selects`` (the ``sharing.strategy`` values it acts on, None for a device
without a sharing config) and ``shares_only`` (True: only targets with a share
ID); :meth:`~dra_driver.gpu.planning.Strategies.asked` then leaves it out of every other target's
question. A strategy that declares neither is asked about every target.

Per-node state shared by several claims (one MPS control daemon serving the
shares of many claims on a GPU, say) is the optional :class:`SharedResources`
ability: a unit names shared keys, the pipeline records each key before
acquiring it, reference-counts it over all claims in the checkpoint, and
releases it when the last claim using it is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.hardware.consumable import MpsSlots
from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.planning import Target

if TYPE_CHECKING:
    from dra_driver.gpu.sharing.mpsdaemons import MpsDaemons
    from dra_driver.gpu.sharing.tools import GpuCommands


@dataclass(frozen=True)
class NodeTools:
    """What the built-in strategies are built from (each takes it as its one argument)."""

    commands: GpuCommands
    daemons: MpsDaemons
    inventory: Callable[[], Inventory]
    """The current discovery (share strategies map GPU names to UUIDs and read the
    driver version)."""
    slots: MpsSlots = field(default_factory=MpsSlots)
    """GPUs split into MPS slots (``--mps-slots``)."""


@runtime_checkable
class Materializes(Protocol):
    """Optional ability: after :meth:`SharingStrategy.apply`, the device it made for a
    target; the claim's CDI spec is built for that device instead of the target's."""

    def concrete(self, unit: Unit, target: Target) -> Gpu | MigInstance: ...
