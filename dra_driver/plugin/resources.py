"""What a driver publishes: devices, counters and pools, as plain dataclasses.

These mirror ``resource.k8s.io/v1`` ResourceSlice content but stay independent
of any Kubernetes client; :mod:`dra_driver.plugin.slices` converts them to API
objects at the edge and enforces the API limits before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TaintEffect = Literal["None", "NoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Version:
    """A semantic-version attribute (``version`` in the API), e.g. ``8.0.0``."""

    value: str


@dataclass(frozen=True)
class ListValue:
    """A list-typed attribute (``ints``, ``bools``, ``strings``, ``versions``; KEP-5491).

    Needs the DRAListTypeAttributes gate (alpha in 1.36): without it the API server
    drops the attribute, which the publisher reports. ``matchAttribute`` on a list
    matches devices whose lists intersect.
    """

    values: tuple[bool, ...] | tuple[int, ...] | tuple[str, ...] | tuple[Version, ...]


AttributeValue = bool | int | str | Version | ListValue
"""bool, int and str map to ``bool``/``int``/``string``; :class:`Version` to ``version``;
:class:`ListValue` to the list form of its element type."""


@dataclass(frozen=True)
class CapacityPolicy:
    """``requestPolicy`` for consumable capacity (only with multiple allocations)."""

    default: str | None = None
    valid_values: tuple[str, ...] = ()
    valid_range_min: str | None = None
    valid_range_max: str | None = None
    valid_range_step: str | None = None


@dataclass(frozen=True)
class Capacity:
    """A quantity such as ``80Gi`` or ``132``; canonical Kubernetes quantity string."""

    value: str
    policy: CapacityPolicy | None = None


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    effect: TaintEffect
    value: str = ""
    time_added: str | None = None
    """RFC 3339 UTC seconds (``2026-11-24T10:00:00Z``) when the condition began; the API
    server fills in "now" when unset, so set it to keep republished slices unchanged."""


@dataclass(frozen=True)
class CounterConsumption:
    counter_set: str
    counters: dict[str, str]


@dataclass(frozen=True)
class Device:
    """One allocatable device. Unqualified attribute names belong to the driver's domain."""

    name: str
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    capacity: dict[str, Capacity] = field(default_factory=dict)
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple_allocations: bool = False


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: dict[str, str]


@dataclass(frozen=True)
class Pool:
    """Everything one node publishes for one driver; device order = scheduler preference."""

    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
