"""The narrow interface between the kubelet-plugin layer and a device driver.

The plugin layer owns sockets, claim fetching and validation, per-claim
ordering and slice publishing; a backend owns hardware and its own locking.
Backends report a per-claim failure by raising
:class:`~dra_driver.plugin.claims.PrepareError` (or any other
:class:`~dra_driver.errors.DriverError`); the plugin layer turns it into
that claim's ``error`` field and never fails the whole gRPC call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from dra_driver.plugin.claims import Claim, ClaimRef, PreparedDevice
from dra_driver.plugin.resources import Pool


class DeviceBackend(Protocol):
    """What a driver implements. Calls for one claim never overlap."""

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        """Make the claim's devices usable; idempotent, returns the same result when repeated.

        ``claim`` is validated: its reference by Kubernetes' name rules, every device
        allocated by this driver from this node's pool."""
        ...

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo :meth:`prepare`; succeeds for unknown or already unprepared claims."""
        ...

    def prepared_claims(self) -> Iterable[ClaimRef]:
        """Claims currently prepared on this node (for stale-claim cleanup)."""
        ...

    def pool(self) -> Pool:
        """The devices this node publishes now."""
        ...


HealthState = Literal["Healthy", "Unhealthy", "Unknown"]


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one published device, streamed to the kubelet (KEP-4680)."""

    pool: str
    device: str
    health: HealthState
    message: str = ""
    """Shown in the pod status; the kubelet truncates beyond 1024 characters."""
    timeout_s: int | None = None
    """How long the kubelet trusts this entry; None uses the plugin's default."""


@runtime_checkable
class HealthReporter(Protocol):
    """Optional backend ability; without it every published device is Healthy."""

    def device_health(self) -> list[DeviceHealth]:
        """Current health of the devices; cheap, called every health interval."""
        ...


@runtime_checkable
class ParallelClaims(Protocol):
    """Optional backend ability: ``prepare``/``unprepare`` of *different* claims may overlap.

    A backend that declares it serialises what must be serialised itself, across
    processes too (a second plugin instance during a rolling update). Without it the
    plugin layer runs one backend call at a time, and in rolling-update mode holds
    a file lock shared with the other instance. The same claim is never handled
    twice at once by one process either way.
    """

    supports_parallel_claims: bool


@runtime_checkable
class BackgroundWork(Protocol):
    """Optional backend ability: background work (e.g. health monitoring) that changes
    the pool or device health by itself.

    The plugin calls :meth:`start_background` once slices are being published, with
    a callback that republishes the pool and pushes health to the kubelet at once,
    and :meth:`stop_background` first thing on stop.
    """

    def start_background(self, notify: Callable[[], None]) -> None: ...

    def stop_background(self) -> None: ...


@runtime_checkable
class PreparedLookup(Protocol):
    """Optional backend ability: the result of a claim it has completely prepared, from
    its own records. The kubelet prepares a claim again for every pod that shares it;
    answered from here, those calls need no API server (and work during an outage)."""

    def prepared_devices(self, claim: ClaimRef) -> list[PreparedDevice] | None:
        """The devices of the claim with this UID if it is prepared; None otherwise."""
        ...


@runtime_checkable
class StatusReporter(Protocol):
    """Optional backend ability: say what keeps it from preparing claims right now."""

    def problems(self) -> list[str]:
        """Empty when fine; the plugin is not ready (``/readyz``) while not empty. Cheap:
        called on every readiness probe."""
        ...
