"""Consumable capacity (KEP-5075): what a request consumes of a device, and whether it fits.

With the feature on, the scheduler checks this for every device, shared or
not: a request naming a capacity the device lacks rules the device out, and
the consumed amount (the request rounded up to the policy, or the policy
default, or the whole capacity when not requested) plus what is already
consumed must stay within the device's capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from dra_driver.allocation.model import DeviceCapacity
from dra_driver.quantity import Quantity


def _ceil(q: Quantity) -> int:
    return math.ceil(q.value)


def consumed_amount(requested: Quantity | None, cap: DeviceCapacity) -> Quantity:
    policy = cap.policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return cap.value
    if policy is None:
        return requested
    if policy.range_min is not None:
        if requested.value < policy.range_min.value:
            return policy.range_min
        if policy.range_step is None:
            return requested
        step, low = _ceil(policy.range_step), _ceil(policy.range_min)
        n = -(-(_ceil(requested) - low) // step)
        return Quantity(Fraction(low + step * n))
    if policy.valid_values:
        for v in policy.valid_values:
            if requested.value <= v.value:
                return v
    return requested


def violates_policy(amount: Quantity, cap: DeviceCapacity) -> bool:
    policy = cap.policy
    if policy is None:
        return False
    if policy.default is not None and amount.value == policy.default.value:
        return False
    if policy.range_min is not None:
        if policy.range_max is not None and amount.value > policy.range_max.value:
            return True
        if policy.range_step is not None:
            offset = _ceil(amount) - _ceil(policy.range_min)
            return offset % _ceil(policy.range_step) != 0
        return False
    if policy.valid_values:
        return all(amount.value != v.value for v in policy.valid_values)
    return False


def consumption(
    requests: Mapping[str, Quantity] | None, capacity: Mapping[str, DeviceCapacity]
) -> dict[str, Quantity] | None:
    """What allocating the device consumes, or None if a requested capacity is missing."""
    if requests and any(name not in capacity for name in requests):
        return None
    return {
        name: consumed_amount((requests or {}).get(name), cap) for name, cap in capacity.items()
    }


def fits(
    requests: Mapping[str, Quantity] | None,
    capacity: Mapping[str, DeviceCapacity],
    already: Mapping[str, Fraction],
) -> bool:
    """Whether the request's consumption plus ``already`` stays within every capacity."""
    consumed = consumption(requests, capacity)
    if consumed is None:
        return False
    for name, cap in capacity.items():
        amount = consumed[name]
        if amount.value < 0 or violates_policy(amount, cap):
            return False
        if amount.value + already.get(name, Fraction(0)) > cap.value.value:
            return False
    return True
