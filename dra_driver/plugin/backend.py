"""The narrow interface between the kubelet-plugin layer and a device driver.

The plugin layer owns sockets, claim fetching, filtering, locking and slice
publishing; a backend owns hardware. Backends report a per-claim failure by
raising :class:`PrepareError`; the plugin layer turns it into that claim's
``error`` field and never fails the whole gRPC call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from dra_driver.plugin.claims import Claim, ClaimRef
from dra_driver.plugin.resources import Pool


class PrepareError(Exception):
    """A claim cannot be prepared or unprepared; the message goes to the kubelet."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        """True when retrying cannot help (bad config), False for transient faults."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet needs it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


class DeviceBackend(Protocol):
    """What a driver implements. Calls for one claim never overlap."""

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        """Make the claim's devices usable; idempotent, returns the same result when repeated."""
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
