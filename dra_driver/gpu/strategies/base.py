"""The seam for ways of preparing a GPU: one small protocol per sharing strategy.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dra_driver.gpu.cdi import ContainerEdits
from dra_driver.gpu.config import DeviceConfig, SharingDecoder
from dra_driver.gpu.consumable import MpsSlots
from dra_driver.gpu.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.partitions import MigPartition

if TYPE_CHECKING:
    from dra_driver.gpu.mpsdaemons import MpsDaemons
    from dra_driver.gpu.planning import Target
    from dra_driver.gpu.sharing import GpuCommands


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


@dataclass(frozen=True)
class Unit:
    """What one strategy does for some devices of one claim; JSON in the checkpoint."""

    strategy: str
    """Name of the strategy that planned it (selects the strategy for undo)."""
    devices: tuple[str, ...]
    """Names of the claim's devices whose CDI edits it changes."""
    gpus: tuple[str, ...] = ()
    """UUIDs of GPUs whose settings it changes; two units never change one GPU."""
    record: Mapping[str, Any] = field(default_factory=dict)
    """Everything :meth:`SharingStrategy.undo` needs, JSON-serialisable."""
    shared: tuple[str, ...] = ()
    """Keys of per-node shared resources it uses (:class:`SharedResources`), each
    ``<GPU name>/<what>``, e.g. ``gpu-3/mps``, the GPU one of the claim's (it is locked)."""


class Steps(Protocol):
    """What a strategy reports to the pipeline while it acts."""

    def done(self, name: str) -> None:
        """One side effect took place (crash tests kill the process here)."""
        ...

    def record(self, record: Mapping[str, Any]) -> None:
        """Replace the unit's record in the checkpoint now (e.g. a hardware-assigned ID
        undo will need), before the next step can fail."""
        ...


class SharingStrategy(Protocol):
    """One way of preparing devices; see the module docstring for the contract."""

    @property
    def name(self) -> str:
        """Stable: stored in the checkpoint, and the ``sharing.strategy`` value if
        :attr:`config` is set."""
        ...

    @property
    def config(self) -> SharingDecoder | None:
        """Its settings decoder; None when no opaque config selects this strategy."""
        ...

    def wants(self, target: Target, config: DeviceConfig) -> bool:
        """Whether this strategy acts on ``target`` given its effective config."""
        ...

    def plan(self, claim_uid: str, targets: Sequence[Target], config: DeviceConfig) -> list[Unit]:
        """Units for ``targets`` (all wanted, all with ``config``); pure, raises
        ``ConfigError`` for settings that do not fit these devices."""
        ...

    def apply(self, unit: Unit, steps: Steps) -> None: ...

    def undo(self, unit: Unit, steps: Steps) -> None:
        """Idempotent; raises when a step did not take effect."""
        ...

    def edits(self, unit: Unit, device: str, edits: ContainerEdits) -> ContainerEdits:
        """``device``'s container edits with this unit's additions (after :meth:`apply`)."""
        ...

    def forget(self, claim_uid: str) -> None:
        """Remove what this strategy may have left for a claim the checkpoint does not know."""
        ...

    def after_reboot(self) -> None:
        """Remove every file this strategy keeps; state from the previous boot is gone."""
        ...


@runtime_checkable
class SharedResources(Protocol):
    """Optional ability: per-node resources shared by several claims' units."""

    def acquire(self, key: str, steps: Steps) -> Mapping[str, Any]:
        """Create the resource (the pipeline has recorded the key); returns its record."""
        ...

    def release(self, key: str, record: Mapping[str, Any], steps: Steps) -> None:
        """Idempotent undo of :meth:`acquire`, from the record (possibly empty: the
        process died before acquire returned)."""
        ...


@runtime_checkable
class ClaimCheck(Protocol):
    """Optional ability: a rule over all of a claim's targets a strategy wants, whatever
    config each came with (:meth:`SharingStrategy.plan` sees one config's targets)."""

    def check_claim(self, targets: Sequence[Target]) -> None:
        """Raises ``ConfigError`` when the claim cannot be prepared as a whole."""
        ...


@runtime_checkable
class DeviceCatalog(Protocol):
    """Optional ability: devices that do not exist yet but may be allocated (partitions
    a strategy creates at prepare), by published name. They take precedence over the
    inventory's devices of the same name."""

    def devices(self, inventory: Inventory, recorded: Sequence[Unit]) -> Mapping[str, MigPartition]:
        """``recorded``: this strategy's units in the checkpoint (what it made so far)."""
        ...


@runtime_checkable
class Materializes(Protocol):
    """Optional ability: after :meth:`SharingStrategy.apply`, the device it made for a
    target; the claim's CDI spec is built for that device instead of the target's."""

    def concrete(self, unit: Unit, target: Target) -> Gpu | MigInstance: ...
