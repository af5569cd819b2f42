"""Typed, driver-filtered view of an allocated ResourceClaim.

The plugin layer builds a :class:`Claim` from the API object so drivers never
touch raw dicts: only results and opaque configs of *this* driver are kept,
and subrequest names (``req/sub``) are reduced to the base request name the
kubelet matches containers against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ConfigSource = Literal["FromClass", "FromClaim"]


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends for a claim: enough to fetch it, not its content."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry of our driver."""

    request: str
    """Request name as allocated, possibly ``req/sub`` for firstAvailable."""
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: dict[str, str] = field(default_factory=dict)

    @property
    def base_request(self) -> str:
        """The top-level request name; the kubelet filters CDI IDs by this."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque config of our driver, class configs first, claim configs after."""

    source: ConfigSource
    requests: tuple[str, ...]
    """Request names it applies to; empty means every request of the claim."""
    parameters: dict[str, Any]

    def applies_to(self, request: str) -> bool:
        base = request.split("/", 1)[0]
        return not self.requests or request in self.requests or base in self.requests


@dataclass(frozen=True)
class Claim:
    """An allocated claim, reduced to what our driver must prepare."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()

    @property
    def uid(self) -> str:
        return self.ref.uid

    def configs_for(self, request: str) -> list[OpaqueConfig]:
        """Configs for one request in precedence order (later overrides earlier)."""
        return [c for c in self.configs if c.applies_to(request)]
