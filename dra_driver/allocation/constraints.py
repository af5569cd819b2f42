"""Per-device checks of the allocator that need no allocation state: an attribute by
its qualified name, blocking taints, and a claim's ``matchAttribute`` /
``distinctAttribute`` constraints as devices are added to it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocation.model import Constraint, Device, Request

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def lookup_attribute(device: Device, driver: str, name: str) -> Mapping[str, Any] | None:
    attrs = device.raw.get("attributes") or {}
    if name in attrs:
        return attrs[name]  # type: ignore[no-any-return]
    domain, sep, ident = name.partition("/")
    if sep and domain == driver and ident in attrs:
        return attrs[ident]  # type: ignore[no-any-return]
    return None


def taint_blocks(device: Device, request: Request) -> bool:
    return any(
        t.effect in _BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in request.tolerations)
        for t in device.taints
    )


@dataclass
class ConstraintState:
    spec: Constraint
    values: list[Mapping[str, Any]] = field(default_factory=list)

    def add(self, request: Request, driver: str, device: Device) -> bool | None:
        """True/False: added/refused; None: does not apply to this request."""
        if not self.spec.applies(request):
            return None
        name = self.spec.match_attribute or self.spec.distinct_attribute
        value = lookup_attribute(device, driver, name)
        if value is None:
            return False
        if self.spec.match_attribute:
            if self.values and dict(value) != dict(self.values[0]):
                return False
        elif any(dict(value) == dict(v) for v in self.values):
            return False
        self.values.append(value)
        return True
