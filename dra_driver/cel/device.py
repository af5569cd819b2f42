"""The device as a CEL selector sees it (``device.driver``, ``.attributes``, ``.capacity``).

Built from the ResourceSlice JSON exactly as the scheduler's ``DeviceMatches``
does: unqualified names go under the driver's domain, ``version`` attributes
become semvers (a malformed one makes every selector on that device fail),
capacities become quantities. Engines convert this once more into their own
value model; both conversions are cached by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel.semver import Semver, SemverError, parse_semver
from dra_driver.quantity import Quantity, QuantityError, parse_quantity

AttributeValue = int | bool | str | Semver


class DeviceDataError(ValueError):
    """An attribute or capacity the scheduler cannot convert (a per-device CEL error)."""


@dataclass(frozen=True, eq=False)
class CelDevice:
    driver: str
    attributes: Mapping[str, Mapping[str, AttributeValue]] = field(default_factory=dict)
    capacity: Mapping[str, Mapping[str, Quantity]] = field(default_factory=dict)
    allow_multiple_allocations: bool = False


def split_name(driver: str, name: str) -> tuple[str, str]:
    """``dom/id`` -> (dom, id); an unqualified id belongs to the driver's domain."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def attribute_value(raw: Mapping[str, Any]) -> AttributeValue:
    """One API ``DeviceAttribute`` (exactly one of int, bool, string, version)."""
    if "int" in raw:
        return int(raw["int"])
    if "bool" in raw:
        return bool(raw["bool"])
    if "string" in raw:
        return str(raw["string"])
    if "version" in raw:
        try:
            return parse_semver(str(raw["version"]))
        except SemverError as err:
            raise DeviceDataError(f"parse semantic version: {err}") from err
    # List forms (DRAListTypeAttributes, alpha in 1.36): CEL sees a list.
    for key, scalar in (
        ("ints", "int"),
        ("bools", "bool"),
        ("strings", "string"),
        ("versions", "version"),
    ):
        if key in raw:
            return [attribute_value({scalar: v}) for v in raw[key] or ()]  # type: ignore[return-value]
    raise DeviceDataError(f"unsupported attribute value {dict(raw)!r}")


def cel_device(driver: str, device: Mapping[str, Any]) -> CelDevice:
    """Convert one ``spec.devices[]`` entry of a ResourceSlice."""
    attributes: dict[str, dict[str, AttributeValue]] = {}
    for name, raw in (device.get("attributes") or {}).items():
        domain, ident = split_name(driver, name)
        attributes.setdefault(domain, {})[ident] = attribute_value(raw)
    capacity: dict[str, dict[str, Quantity]] = {}
    for name, raw in (device.get("capacity") or {}).items():
        domain, ident = split_name(driver, name)
        try:
            capacity.setdefault(domain, {})[ident] = parse_quantity(str(raw.get("value", "")))
        except QuantityError as err:
            raise DeviceDataError(f"capacity {name}: {err}") from err
    return CelDevice(
        driver=driver,
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=bool(device.get("allowMultipleAllocations", False)),
    )
