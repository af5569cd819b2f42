"""Fractional GPUs (KEP-5075 consumable capacity): what is published, what a share holds.

``--consumable-gpus`` selects full GPUs (``all``, or product names and UUIDs)
that are published with ``allowMultipleAllocations: true``, so the scheduler
hands out slices of them to many claims, and two consumable capacities:

``memory``
    the GPU's memory (NVML total, as for every GPU); policy ``validRange``
    min = step = :data:`MEMORY_STEP` (1 MiB, the unit MPS limits take), max =
    the memory rounded down to a step, **default = that max**.
``computeShare``
    percent of the GPU's SMs, 100 in all; policy ``validRange`` 0..100 step 1,
    **default 0** (none reserved).

A claim that asks for no capacity therefore takes the whole GPU: it means what
it meant on an exclusive GPU (``nvidia.com/gpu: 1`` through the DeviceClass's
extended resource included), no later share fits beside it, and it is
prepared as a whole GPU, without MPS. A claim that asks for memory only gets
no SMs reserved and an SM limit of its memory fraction, rounded up
(:meth:`Share.thread_percentage`); one that asks for ``computeShare`` gets that
many percent reserved (the scheduler never reserves more than 100) and as its
limit. Full GPUs only: MIG devices and GPUs in MIG mode are never consumable,
nor is a device that consumes counters (dynamic MIG's full GPU). The
``multiprocessors`` capacity is left off consumable GPUs, since an unrequested
capacity without a policy would be consumed whole by every share.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dra_driver.gpu.hardware.consumable import ConsumableGpus
from dra_driver.gpu.hardware.devices import quantity
from dra_driver.gpu.hardware.inventory import Gpu, Inventory
from dra_driver.gpu.hardware.naming import gpu_device_name
from dra_driver.plugin.resources import Capacity, CapacityPolicy, Pool
from dra_driver.quantity import QuantityError
from dra_driver.quantity import parse as parse_quantity

if TYPE_CHECKING:
    from dra_driver.gpu.planning import Target

MEMORY = "memory"
COMPUTE = "computeShare"
MEMORY_STEP = 1024 * 1024
COMPUTE_TOTAL = 100
ENFORCING_DRIVER = 615
"""First driver branch (r615) assumed to run several MPS servers on one GPU in
EXCLUSIVE_PROCESS mode; see the README's table. Not verified on hardware."""


class ShareError(ValueError):
    """A share's allocation cannot be served as it is; the message says why."""


def memory_max(total_bytes: int) -> int:
    """The largest share of memory: the total rounded down to a step."""
    return total_bytes // MEMORY_STEP * MEMORY_STEP


def capacities(gpu: Gpu) -> dict[str, Capacity]:
    top = quantity(memory_max(gpu.memory_bytes), binary=True)
    return {
        MEMORY: Capacity(
            quantity(gpu.memory_bytes, binary=True),
            CapacityPolicy(
                default=top,
                valid_range_min=quantity(MEMORY_STEP, binary=True),
                valid_range_max=top,
                valid_range_step=quantity(MEMORY_STEP, binary=True),
            ),
        ),
        COMPUTE: Capacity(
            str(COMPUTE_TOTAL),
            CapacityPolicy(
                default="0",
                valid_range_min="0",
                valid_range_max=str(COMPUTE_TOTAL),
                valid_range_step="1",
            ),
        ),
    }


def consumable_pool(pool: Pool, inventory: Inventory, selection: ConsumableGpus) -> Pool:
    """``pool`` with the selected full GPUs made multi-allocatable; others unchanged."""
    if not selection:
        return pool
    gpus = {gpu_device_name(g): g for g in inventory.gpus if not g.mig_enabled}
    devices = []
    for d in pool.devices:
        gpu = gpus.get(d.name)
        if gpu is not None and not d.consumes_counters and selection.selects(gpu):
            capacity = {k: v for k, v in d.capacity.items() if k not in ("multiprocessors",)}
            capacity.update(capacities(gpu))
            d = dataclasses.replace(d, capacity=capacity, allow_multiple_allocations=True)
        devices.append(d)
    return dataclasses.replace(pool, devices=tuple(devices))


@dataclass(frozen=True)
class Share:
    """What the scheduler recorded for one allocation of a consumable GPU."""

    gpu_memory: int
    """The GPU's total memory, bytes."""
    memory: int
    """Bytes of memory consumed (a whole number of MiB)."""
    compute: int
    """Percent of SMs reserved (0: none)."""

    @property
    def whole(self) -> bool:
        """All of the GPU: nothing else can be allocated beside it."""
        return self.memory >= memory_max(self.gpu_memory) and self.compute in (0, COMPUTE_TOTAL)

    @property
    def memory_mib(self) -> int:
        return self.memory // MEMORY_STEP

    @property
    def thread_percentage(self) -> int:
        """The SM limit: the reserved percent, or the memory fraction rounded up."""
        if self.compute:
            return self.compute
        return max(1, min(COMPUTE_TOTAL, math.ceil(COMPUTE_TOTAL * self.memory / self.gpu_memory)))


def share_of(gpu: Gpu, consumed: Mapping[str, str], where: str) -> Share:
    """Read ``consumedCapacity``; raises :class:`ShareError` naming what is wrong."""
    memory = _amount(consumed, MEMORY, where)
    compute = _amount(consumed, COMPUTE, where, default=0)
    if memory <= 0 or memory % MEMORY_STEP or memory > gpu.memory_bytes:
        raise ShareError(
            f"{where}: consumedCapacity.{MEMORY} {consumed.get(MEMORY)!r} is not a whole number "
            f"of MiB between 1Mi and the GPU's {quantity(gpu.memory_bytes, binary=True)}"
        )
    if not 0 <= compute <= COMPUTE_TOTAL:
        raise ShareError(
            f"{where}: consumedCapacity.{COMPUTE} {consumed.get(COMPUTE)!r}; allowed 0..100"
        )
    return Share(gpu_memory=gpu.memory_bytes, memory=memory, compute=compute)


def is_fractional(target: Target) -> bool:
    """A share that must be held to its part of the GPU (less than all of it). Also True
    when the allocation cannot be read, so the share strategy reports why."""
    if target.share_id is None or not isinstance(target.device, Gpu):
        return False
    try:
        return not share_of(target.device, target.consumed_capacity, target.name).whole
    except ShareError:
        return True


def _amount(consumed: Mapping[str, str], key: str, where: str, default: int | None = None) -> int:
    raw = consumed.get(key)
    if raw is None:
        if default is not None:
            return default
        raise ShareError(
            f"{where}: the allocation has no consumedCapacity.{key}; was the device published "
            "with --consumable-gpus and allocated by a scheduler with DRAConsumableCapacity?"
        )
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        raise ShareError(f"{where}: consumedCapacity.{key}: {exc}") from None
    if value.denominator != 1:
        raise ShareError(f"{where}: consumedCapacity.{key} {raw!r} is not a whole number")
    return int(value)


def driver_branch(driver_version: str) -> int:
    """``615.20.01`` -> 615; 0 when the version has no leading number."""
    m = re.match(r"\d+", driver_version)
    return int(m.group()) if m else 0


def can_enforce(driver_version: str) -> bool:
    """Whether per-share MPS limits can be made unescapable on this driver (r615+)."""
    return driver_branch(driver_version) >= ENFORCING_DRIVER


def say_consumable(
    selection: ConsumableGpus,
    inventory: Inventory,
    log: logging.Logger,
    slot_gpus: frozenset[str] = frozenset(),
) -> None:
    """At start: what sharing will be on this node, so an admin sees it before a claim fails.
    ``slot_gpus``: UUIDs split into MPS slots instead (:mod:`dra_driver.gpu.sharing.slots`)."""
    shared = [
        g.uuid
        for g in inventory.gpus
        if not g.mig_enabled and selection.selects(g) and g.uuid not in slot_gpus
    ]
    unmatched = selection.unmatched(inventory)
    if unmatched:
        log.warning(
            "--consumable-gpus names no GPU of this node: %s; this node has %s",
            ", ".join(unmatched),
            ", ".join(sorted({g.product_name for g in inventory.gpus})) or "no GPU",
        )
    if shared and not can_enforce(inventory.driver_version):
        log.warning(
            "driver %s cannot enforce fractional shares (r%d+ runs one MPS server per share "
            "on an EXCLUSIVE_PROCESS GPU): a fractional share fails to prepare unless its "
            "config asks for advisory time-slicing (sharing.strategy: TimeSlicing); whole-GPU "
            "claims are unaffected",
            inventory.driver_version,
            ENFORCING_DRIVER,
        )
    log.info("consumable GPUs", extra={"gpus": shared})
