"""``--shape minimal``: the driver's pool with one attribute per device, for a ratio.

A figure alone says little about what our rich devices cost; the same run on a
minimal pool says how much of it is inherent to the device count and the
sharing model. The minimal pool keeps what the allocator must honour to
allocate correctly and what the claim reads:

- device names and order, hence the same slices (the split is checked);
- counter sets and every ``consumesCounters`` (dynamic-MIG overlap);
- ``allowMultipleAllocations``, and on such devices every capacity with its
  ``requestPolicy`` (the allocator tracks consumption of each);
- taints (none in the emulator profiles, but the allocator honours them);
- on exclusive devices, only the capacities the claim's selectors read
  (``memory`` for ``whole`` and ``first-available``);
- exactly one attribute, the one the claim's rewritten selector tests
  (:class:`bench.fleet.claims.Minimal`): ``type`` for ``whole``, ``share:`` and
  ``first-available``, ``profile`` for ``mig:`` (empty on non-MIG devices).

The DeviceClasses keep their names and fields but select only
``device.driver``; their ``type`` test moves into the claim's selector.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bench.fleet.claims import Minimal
from bench.fleet.pools import DRIVER
from dra_driver.plugin.resources import Device, Pool
from dra_driver.plugin.slices import split_pool, validate_pool

CLASS_SELECTOR = f"device.driver == '{DRIVER}'"


def _device(device: Device, minimal: Minimal) -> Device:
    value = device.attributes.get(minimal.attribute)
    if minimal.only_type is not None and device.attributes.get("type") != minimal.only_type:
        value = ""
    if value is None:
        raise ValueError(f"device {device.name} has no attribute {minimal.attribute!r} to keep")
    shared = device.allow_multiple_allocations
    return replace(
        device,
        attributes={minimal.attribute: value},
        capacity={k: v for k, v in device.capacity.items() if shared or k in minimal.capacities},
    )


def _split(pool: Pool) -> list[tuple[int, tuple[str, ...]]]:
    return [(len(c.counter_sets), tuple(d.name for d in c.devices)) for c in split_pool(pool)]


def minimal_pool(pool: Pool, minimal: Minimal) -> Pool:
    """``pool`` reduced for ``minimal``; raises ValueError if its slices would split
    differently (a dropped list attribute can lift the 64-device limit)."""
    out = Pool(
        devices=tuple(_device(d, minimal) for d in pool.devices),
        counter_sets=pool.counter_sets,
    )
    if _split(out) != _split(pool):
        raise ValueError("the minimal pool would split into other slices than the driver's")
    validate_pool(out)
    return out


def minimal_classes(classes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DeviceClasses with their selectors reduced to the driver's name."""
    out = copy.deepcopy(list(classes))
    for cls in out:
        cls["spec"]["selectors"] = [{"cel": {"expression": CLASS_SELECTOR}}]
    return out
