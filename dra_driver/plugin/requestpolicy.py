"""Consumable capacity (KEP-5075): the API server's rules for a capacity's ``requestPolicy``.

A device with ``allowMultipleAllocations`` can be allocated to many claims; each
allocation consumes some of every capacity: the request rounded up by the
policy, or the policy's ``default`` when the claim asks for none, or the whole
capacity when there is no policy (so a capacity meant to be shared needs one).
Checked here, with the field path, so a bad policy never reaches the server.
Rules (k8s.io/kubernetes pkg/apis/resource/validation, v1.37): a policy only on
multi-allocatable devices; ``validValues`` (<= 10, ascending, unique, <= the
capacity, containing ``default``) or ``validRange`` (``min`` required,
``0 <= min <= max <= capacity``, ``default`` within, ``step > 0`` with
``min + step <= capacity`` and ``default``/``max`` a whole number of steps from
``min``), never both; ``default`` required with either.
"""

from __future__ import annotations

from fractions import Fraction

from dra_driver import quantity
from dra_driver.plugin.resources import Capacity, CapacityPolicy

MAX_VALID_VALUES = 10


class _Problems(list[str]):
    def quantity(self, value: str, where: str) -> Fraction | None:
        try:
            return quantity.parse(value)
        except quantity.QuantityError:
            self.append(f"{where}: {value!r} is not a quantity (examples: 80Gi, 100, 1Mi)")
            return None


def capacity_problems(at: str, cap: Capacity, multiple_allocations: bool) -> list[str]:
    """Every rule ``cap`` breaks, as ``<at>.<field>: what is wrong``; empty when valid."""
    problems = _Problems()
    value = problems.quantity(cap.value, f"{at}.value")
    p = cap.policy
    if p is None or value is None:
        return problems
    where = f"{at}.requestPolicy"
    if not multiple_allocations:
        return [f"{where}: only allowed on a device with allowMultipleAllocations"]
    has_range = p.valid_range_min is not None
    if p.valid_values and has_range:
        return [f"{where}: validValues and validRange are exclusive; set one"]
    if (p.valid_range_max is not None or p.valid_range_step is not None) and not has_range:
        return [f"{where}.validRange.min: required when max or step is set"]
    default = problems.quantity(p.default, f"{where}.default") if p.default else None
    if (p.valid_values or has_range) and p.default is None:
        problems.append(f"{where}.default: required with validValues or validRange")
    if p.valid_values:
        _valid_values(where, p, value, default, problems)
    elif has_range:
        _valid_range(where, p, value, default, problems)
    return problems


def _valid_values(
    where: str, p: CapacityPolicy, value: Fraction, default: Fraction | None, problems: _Problems
) -> None:
    options = [problems.quantity(v, f"{where}.validValues") for v in p.valid_values]
    known = [o for o in options if o is not None]
    if len(p.valid_values) > MAX_VALID_VALUES:
        problems.append(
            f"{where}.validValues: {len(p.valid_values)} values; at most {MAX_VALID_VALUES}"
        )
    if known != sorted(set(known)):
        problems.append(f"{where}.validValues: must be ascending, without duplicates")
    if known and known[-1] > value:
        problems.append(f"{where}.validValues: {p.valid_values[-1]} is above the capacity")
    if default is not None and default not in known:
        problems.append(f"{where}.default: {p.default} is not one of validValues")


def _valid_range(
    where: str, p: CapacityPolicy, value: Fraction, default: Fraction | None, problems: _Problems
) -> None:
    assert p.valid_range_min is not None
    low = problems.quantity(p.valid_range_min, f"{where}.validRange.min")
    high = step = None
    if p.valid_range_max is not None:
        high = problems.quantity(p.valid_range_max, f"{where}.validRange.max")
        if high is None:
            return
    if p.valid_range_step is not None:
        step = problems.quantity(p.valid_range_step, f"{where}.validRange.step")
    if low is None:
        return
    top = high if high is not None else value
    if not 0 <= low <= top <= value:
        problems.append(
            f"{where}.validRange: needs 0 <= min ({p.valid_range_min}) <= max "
            f"({p.valid_range_max or 'unset'}) <= the capacity"
        )
    if default is not None and not low <= default <= top:
        problems.append(f"{where}.default: {p.default} is outside validRange")
    if step is None:
        return
    if step <= 0 or low + step > value:
        problems.append(
            f"{where}.validRange.step: {p.valid_range_step} must be > 0 with "
            "min + step <= the capacity"
        )
        return
    for name, v in (("default", default), ("validRange.max", high)):
        if v is not None and (v - low) % step:
            problems.append(
                f"{where}.{name}: not min ({p.valid_range_min}) plus a whole number of steps "
                f"({p.valid_range_step})"
            )
