"""Enforced MPS slots (``--mps-slots``): a GPU split into N equal slots, published so that
the scheduler hands out and counts slots, for drivers before r615.

Before r615 an ``EXCLUSIVE_PROCESS`` GPU admits one MPS control daemon, so the
per-claim daemons of :mod:`dra_driver.gpu.sharing.strategies.mpsshares` cannot run
there. What can: ONE daemon per GPU whose *default* limits are one slot's
(:mod:`dra_driver.gpu.sharing.strategies.mpsslots`). A client can only tighten the
limits it inherits, so every client of that daemon, whatever ``CUDA_MPS_*`` it
sets or drops, gets at most one slot. For that to hold for every claim, every
claim must be exactly one slot, which the published request policies make so:

``memory``
    the GPU's memory; policy ``validValues`` = ``default`` = [slot memory], the
    total / N rounded down to :data:`~dra_driver.gpu.sharing.shares.MEMORY_STEP` (1 MiB).
``computeShare``
    100; policy ``validValues`` = ``default`` = [floor(100 / N)].

plus the int attribute ``mpsSlots: N`` for CEL selectors
(``'mpsSlots' in device.attributes["gpu.nvidia.com"]``; other GPUs lack it). A claim
that asks for no capacity gets the default: one slot, not the whole GPU. N + 1 slots
never fit:
memory alone makes sure of it, and a GPU too small for that (less than N(N+1)
MiB) is not split (:meth:`Slot.exact`; said at start). The ``multiprocessors``
capacity is left off as on every consumable GPU.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
from dra_driver.gpu.hardware.devices import quantity
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import gpu_device_name
from dra_driver.gpu.sharing.shares import (
    COMPUTE,
    COMPUTE_TOTAL,
    MEMORY,
    MEMORY_STEP,
    can_enforce,
    consumable_pool,
    say_consumable,
)
from dra_driver.plugin.resources import Capacity, CapacityPolicy, Pool

if TYPE_CHECKING:
    from dra_driver.gpu.planning import Target

ATTRIBUTE = "mpsSlots"
"""Int attribute of a slot GPU: its number of slots."""


@dataclass(frozen=True)
class Slot:
    """One of the N equal slots of a GPU."""

    count: int
    """N, the GPU's number of slots."""
    gpu_memory: int
    """The GPU's total memory, bytes."""

    @property
    def memory(self) -> int:
        """Bytes: the total / N, rounded down to a whole MiB."""
        return self.gpu_memory // self.count // MEMORY_STEP * MEMORY_STEP

    @property
    def memory_mib(self) -> int:
        return self.memory // MEMORY_STEP

    @property
    def percent(self) -> int:
        """The SM share: floor(100 / N) percent."""
        return COMPUTE_TOTAL // self.count

    @property
    def exact(self) -> bool:
        """N slots fit and N + 1 do not (the scheduler can never hand out one more)."""
        return 0 < self.count * self.memory <= self.gpu_memory < (self.count + 1) * self.memory


def slot_of(gpu: Gpu, slots: MpsSlots) -> Slot | None:
    """``gpu``'s slot when ``--mps-slots`` splits it (and it can be split exactly)."""
    n = slots.slots_of(gpu)
    if n is None:
        return None
    slot = Slot(count=n, gpu_memory=gpu.memory_bytes)
    return slot if slot.exact else None


def slot_target(target: Target, slots: MpsSlots) -> Slot | None:
    """The slot a share of a slot GPU is (None for anything else)."""
    if target.share_id is None or not isinstance(target.device, Gpu):
        return None
    return slot_of(target.device, slots)


def capacities(slot: Slot) -> dict[str, Capacity]:
    memory, percent = quantity(slot.memory, binary=True), str(slot.percent)
    return {
        MEMORY: Capacity(
            quantity(slot.gpu_memory, binary=True),
            CapacityPolicy(default=memory, valid_values=(memory,)),
        ),
        COMPUTE: Capacity(
            str(COMPUTE_TOTAL), CapacityPolicy(default=percent, valid_values=(percent,))
        ),
    }


def slot_pool(pool: Pool, inventory: Inventory, slots: MpsSlots) -> Pool:
    """``pool`` with the slot GPUs published as slots (also when ``--consumable-gpus``
    selected them too); other devices unchanged."""
    if not slots:
        return pool
    gpus = {gpu_device_name(g): g for g in inventory.gpus}
    devices = []
    for d in pool.devices:
        gpu = gpus.get(d.name)
        slot = slot_of(gpu, slots) if gpu is not None and not d.consumes_counters else None
        if slot is not None:
            capacity = {k: v for k, v in d.capacity.items() if k != "multiprocessors"}
            capacity.update(capacities(slot))
            d = dataclasses.replace(
                d,
                attributes={**d.attributes, ATTRIBUTE: slot.count},
                capacity=capacity,
                allow_multiple_allocations=True,
            )
        devices.append(d)
    return dataclasses.replace(pool, devices=tuple(devices))


def say_slots(
    slots: MpsSlots, consumable: ConsumableGpus, inventory: Inventory, log: logging.Logger
) -> None:
    """At start: which GPUs are split into slots, and every name or GPU that is not."""
    unmatched = slots.unmatched(inventory)
    if unmatched:
        log.warning(
            "--mps-slots names no GPU of this node: %s; this node has %s",
            ", ".join(unmatched),
            ", ".join(sorted({g.product_name for g in inventory.gpus})) or "no GPU",
        )
    split: dict[str, int] = {}
    counts = dict(slots.counts)
    for gpu in inventory.gpus:
        n = counts.get(gpu.uuid, counts.get(gpu.product_name))
        if n is None:
            continue
        if gpu.mig_enabled:
            log.warning("--mps-slots: %s is in MIG mode; it is not split into slots", gpu.uuid)
        elif slot_of(gpu, slots) is None:
            log.warning(
                "--mps-slots: %s has %d MiB, too little for %d slots of whole MiB that leave "
                "no room for one more; it is not split",
                gpu.uuid,
                gpu.memory_bytes // MEMORY_STEP,
                n,
            )
        else:
            split[gpu.uuid] = n
            if consumable.selects(gpu):
                log.warning(
                    "%s is selected by --consumable-gpus and --mps-slots: it is published "
                    "as %d slots",
                    gpu.uuid,
                    n,
                )
    if split and can_enforce(inventory.driver_version):
        log.info(
            "driver %s runs one MPS server per claim: slot claims get their own daemon "
            "(limits = one slot) rather than sharing one per GPU",
            inventory.driver_version,
        )
    log.info("MPS slot GPUs", extra={"slots": split})


def fractional_pool(
    pool: Pool, inventory: Inventory, consumable: ConsumableGpus, slots: MpsSlots
) -> Pool:
    """``pool`` with ``--consumable-gpus`` and then ``--mps-slots`` applied (slots win)."""
    return slot_pool(consumable_pool(pool, inventory, consumable), inventory, slots)


def say_fractional(
    consumable: ConsumableGpus, slots: MpsSlots, inventory: Inventory, log: logging.Logger
) -> None:
    """At start: what the two flags make of this node's GPUs."""
    if consumable:
        split = frozenset(g.uuid for g in inventory.gpus if slot_of(g, slots) is not None)
        say_consumable(consumable, inventory, log, split)
    if slots:
        say_slots(slots, consumable, inventory, log)
