"""What is already allocated in the cluster: devices in use, shared capacity, counters.

Built from the claims' ``status.allocation`` (admin-access results do not
count), then updated as a simulation allocates claim after claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from dra_driver.allocation.model import AllocatedDevice, Claim, DeviceId
from dra_driver.quantity import Quantity


@dataclass
class AllocatedState:
    in_use: dict[DeviceId, str] = field(default_factory=dict)
    """Exclusively allocated devices -> the claim holding them."""
    shared: dict[DeviceId, dict[str, Fraction]] = field(default_factory=dict)
    """Devices allocated with a share ID -> capacity consumed by all shares."""
    sharers: dict[DeviceId, list[str]] = field(default_factory=dict)

    @classmethod
    def from_claims(cls, claims: Iterable[Claim]) -> AllocatedState:
        state = cls()
        for claim in claims:
            if claim.allocated:
                state.add(claim.key, claim.allocated)
        return state

    def add(self, claim_key: str, results: Iterable[AllocatedDevice]) -> None:
        for r in results:
            if r.admin_access:
                continue
            if r.share_id:
                used = self.shared.setdefault(r.device, {})
                for name, q in r.consumed.items():
                    used[name] = used.get(name, Fraction(0)) + q.value
                self.sharers.setdefault(r.device, []).append(claim_key)
            else:
                self.in_use[r.device] = claim_key

    def allocated(self, device: DeviceId) -> bool:
        """Counts against counters: exclusively or shared allocated."""
        return device in self.in_use or device in self.shared

    def shared_capacity(self, device: DeviceId) -> Mapping[str, Fraction]:
        return self.shared.get(device, {})


def add_consumption(total: dict[str, Fraction], amounts: Mapping[str, Quantity]) -> None:
    for name, q in amounts.items():
        total[name] = total.get(name, Fraction(0)) + q.value


def remove_consumption(total: dict[str, Fraction], amounts: Mapping[str, Quantity]) -> None:
    for name, q in amounts.items():
        total[name] -= q.value
