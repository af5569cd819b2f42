"""The scheduler's structured allocator, in Python: one attempt for a set of claims on one node.

Depth-first over claims, then requests (``firstAvailable`` subrequests in
order), then device slots; each slot tries pools -> slices -> devices in the
scheduler's order, starting after the previous slot's device, and backtracks
on failure. The first complete solution wins; there is no scoring. Checks per
device, in the scheduler's order: in use, class then request selectors (CEL
errors abort the attempt), per-device node selection, consumable capacity,
counters, taints, constraints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocation import capacity as cap
from dra_driver.allocation.constraints import ConstraintState, taint_blocks
from dra_driver.allocation.inventory import AllocationFailed, Inventory
from dra_driver.allocation.model import (
    ALLOCATION_RESULTS_MAX,
    Claim,
    Device,
    DeviceClass,
    DeviceId,
    Node,
    Request,
)
from dra_driver.allocation.pools import Pool, device_on_node
from dra_driver.allocation.state import AllocatedState, add_consumption, remove_consumption
from dra_driver.quantity import Quantity


@dataclass(frozen=True)
class Choice:
    request: Request
    device_id: DeviceId
    device: Device
    consumed: Mapping[str, Quantity] | None = None
    """Capacity consumed on a shared (allowMultipleAllocations) device."""


@dataclass
class _Req:
    request: Request
    cls: DeviceClass
    count: int
    all_devices: list[tuple[DeviceId, Device, Pool]] | None = None


class Attempt:
    """One Allocate call: claims on a node; ``run()`` returns per-claim choices or None."""

    def __init__(
        self,
        inventory: Inventory,
        state: AllocatedState,
        node: Node,
        claims: list[Claim],
        allowed: Callable[[int, Request, DeviceId], bool] | None = None,
    ) -> None:
        """``allowed`` restricts ExactCount candidates (to check a given allocation)."""
        self.allowed = allowed
        self.inv = inventory
        self.state = state
        self.node = node
        self.claims = claims
        self.pools = inventory.pools(node)
        self.reqs: dict[tuple[int, int, int], _Req] = {}
        self.constraints: list[list[ConstraintState]] = []
        self.allocating: dict[DeviceId, set[int]] = {}
        self.allocating_capacity: dict[DeviceId, dict[str, Fraction]] = {}
        self.consumed_counters: dict[str, dict[str, dict[str, Fraction]]] = {}
        self.available_counters: dict[str, dict[str, dict[str, Fraction]]] = {}
        self.results: list[list[Choice]] = [[] for _ in claims]
        self.selected_sub: dict[tuple[int, int], int] = {}
        self._undo_stack: list[Any] = []

    # -- set-up ------------------------------------------------------------

    def _prepare(self) -> None:
        for ci, claim in enumerate(self.claims):
            min_claim = 0
            for ri, alternatives in enumerate(claim.requests):
                min_req = None
                for si, request in enumerate(alternatives):
                    data = self._request_data(claim, request)
                    self.reqs[(ci, ri, si)] = data
                    min_req = data.count if min_req is None else min(min_req, data.count)
                if (min_req or 0) > ALLOCATION_RESULTS_MAX - min_claim:
                    raise AllocationFailed(
                        f"claim {claim.key}, request {alternatives[0].base_name}: adding "
                        f"{min_req} devices exceeds the claim limit of {ALLOCATION_RESULTS_MAX}"
                    )
                min_claim += min_req or 0
            self.constraints.append([ConstraintState(c) for c in claim.constraints])

    def _request_data(self, claim: Claim, request: Request) -> _Req:
        cls = self.inv.classes.get(request.device_class)
        if cls is None:
            raise AllocationFailed(
                f"claim {claim.key}, request {request.result_name}: device class "
                f"{request.device_class} does not exist"
            )
        data = _Req(request, cls, request.count)
        if not request.all_devices:
            return data
        found = []
        for pool in self.pools:
            if pool.incomplete:
                raise AllocationFailed(
                    f"claim {claim.key}, request {request.result_name}: asks for all devices, "
                    f"but resource pool {pool.id} is currently being updated"
                )
            if pool.invalid:
                raise AllocationFailed(
                    f"claim {claim.key}, request {request.result_name}: asks for all devices, "
                    f"but resource pool {pool.id} is currently invalid"
                )
            for slice_ in pool.slices:
                for device in slice_.devices:
                    if not self.selectable(
                        claim, data, pool, slice_.per_device_node_selection, device
                    ):
                        continue
                    if not cap.fits(request.capacity, device.capacity, {}):
                        continue
                    found.append((DeviceId(pool.driver, pool.name, device.name), device, pool))
        data.all_devices = found
        data.count = len(found)
        return data

    # -- per-device checks ---------------------------------------------------

    def selectable(
        self, claim: Claim, data: _Req, pool: Pool, per_device: bool, device: Device
    ) -> bool:
        if not self.inv.selectors_match(
            f"class {data.cls.name}", data.cls.selectors, pool.driver, pool.name, device
        ):
            return False
        if not self.inv.selectors_match(
            f"claim {claim.key}", data.request.selectors, pool.driver, pool.name, device
        ):
            return False
        return not per_device or device_on_node(device, self.node)

    def in_use(self, device_id: DeviceId) -> bool:
        return device_id in self.state.in_use or bool(self.allocating.get(device_id))

    def capacity_in_use(self, device_id: DeviceId) -> bool:
        return device_id in self.state.shared or device_id in self.allocating_capacity

    def capacity_fits(self, request: Request, device_id: DeviceId, device: Device) -> bool:
        if request.capacity is None and not device.allow_multiple:
            return True  # consumes its whole capacity, which always fits an unshared device
        already = dict(self.state.shared_capacity(device_id))
        for name, amount in self.allocating_capacity.get(device_id, {}).items():
            already[name] = already.get(name, Fraction(0)) + amount
        return cap.fits(request.capacity, device.capacity, already)

    def _available(self, pool: Pool) -> dict[str, dict[str, Fraction]]:
        available = self.available_counters.get(pool.id)
        if available is None:
            available = {
                s: {c: q.value for c, q in counters.items()}
                for s, counters in pool.counter_sets.items()
            }
            for slice_ in pool.slices + pool.other_slices:
                for device in slice_.devices:
                    if not self.state.allocated(DeviceId(pool.driver, pool.name, device.name)):
                        continue
                    for set_name, counters in device.consumes.items():
                        for c, q in counters.items():
                            if c in available.get(set_name, {}):
                                available[set_name][c] -= q.value
            self.available_counters[pool.id] = available
        return available

    def reserve_counters(self, pool: Pool, device: Device) -> bool:
        consumed = self.consumed_counters.setdefault(pool.id, {})
        self._change_counters(consumed, device, +1)
        for set_name, counters in self._available(pool).items():
            for c, value in counters.items():
                if value < consumed.get(set_name, {}).get(c, Fraction(0)):
                    self._change_counters(consumed, device, -1)
                    return False
        return True

    def release_counters(self, pool: Pool, device: Device) -> None:
        self._change_counters(self.consumed_counters[pool.id], device, -1)

    @staticmethod
    def _change_counters(
        consumed: dict[str, dict[str, Fraction]], device: Device, sign: int
    ) -> None:
        for set_name, counters in device.consumes.items():
            target = consumed.setdefault(set_name, {})
            for c, q in counters.items():
                target[c] = target.get(c, Fraction(0)) + sign * q.value

    # -- placing one device, and undoing it ----------------------------------

    def place(
        self, ci: int, data: _Req, device_id: DeviceId, device: Device, pool: Pool, must: bool
    ) -> bool:
        request = data.request
        shared = device.allow_multiple
        if not shared and request.admin_access and ci in self.allocating.get(device_id, ()):
            return False
        if not request.admin_access and self.in_use(device_id):
            return False
        reserved = False
        if device.consumes and not (shared and self.capacity_in_use(device_id)):
            if not self.reserve_counters(pool, device):
                return False
            reserved = True
        undo: list[Any] = []

        def rollback() -> None:
            for step in reversed(undo):
                step()
            if reserved:
                self.release_counters(pool, device)

        if taint_blocks(device, request):
            rollback()
            return False
        for state in self.constraints[ci]:
            added = state.add(request, pool.driver, device)
            if added is False:
                rollback()
                if must:
                    raise AllocationFailed(
                        f"claim {self.claims[ci].key}, request {request.result_name}: cannot add "
                        f"device {device_id} because a claim constraint would not be satisfied"
                    )
                return False
            if added:
                undo.append(state.values.pop)
        if not shared:
            holders = self.allocating.setdefault(device_id, set())
            holders.add(ci)
            undo.append(lambda: holders.discard(ci))
        consumed = None
        if not self.capacity_fits(request, device_id, device):
            rollback()
            return False
        if shared:
            consumed = cap.consumption(request.capacity, device.capacity) or {}
            total = self.allocating_capacity.setdefault(device_id, {})
            add_consumption(total, consumed)

            def drop(total: dict[str, Fraction] = total, amounts: Any = consumed) -> None:
                remove_consumption(total, amounts)
                if not any(total.values()):
                    self.allocating_capacity.pop(device_id, None)

            undo.append(drop)
        self.results[ci].append(Choice(request, device_id, device, consumed))
        undo.append(self.results[ci].pop)
        self._undo_stack.append(rollback)
        return True

    # -- the search ----------------------------------------------------------

    def run(self) -> list[list[Choice]] | None:
        self._prepare()
        if not self._one(0, 0, 0, 0, False, (0, 0, 0)):
            if any(p.invalid for p in self.pools):
                raise AllocationFailed("invalid resource pools were encountered")
            return None
        return self.results

    def _too_few_left(self, ci: int, data: _Req, start: tuple[int, int, int], needed: int) -> bool:
        """Prune: fewer devices from ``start`` on can still match than slots remain.

        Only devices whose selectors were all evaluated already count as known
        misses, so no selector goes unevaluated that the scheduler's search
        would evaluate (a CEL error there must still surface).
        """
        possible = 0
        cls = data.cls.selectors
        for pi in range(start[0], len(self.pools)):
            pool = self.pools[pi]
            if pool.incomplete or pool.invalid:
                continue
            for sli in range(start[1] if pi == start[0] else 0, len(pool.slices)):
                devices = pool.slices[sli].devices
                first = start[2] if (pi, sli) == start[:2] else 0
                for device in devices[first:]:
                    if not data.request.admin_access and self.in_use(
                        DeviceId(pool.driver, pool.name, device.name)
                    ):
                        continue
                    known = self.inv.known(cls, device)
                    if known is True:
                        known = self.inv.known(data.request.selectors, device)
                    if known is None:
                        return False  # not evaluated yet: no pruning
                    possible += known
                    if possible >= needed:
                        return False
        return True

    def _undo_last(self) -> None:
        self._undo_stack.pop()()

    def _one(
        self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: tuple[int, int, int]
    ) -> bool:
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            return self._one(ci + 1, 0, 0, 0, False, (0, 0, 0))
        alternatives = claim.requests[ri]
        if not in_sub and alternatives[0].parent:
            for sub in range(len(alternatives)):
                if self._one(ci, ri, sub, 0, True, (0, 0, 0)):
                    self.selected_sub[(ci, ri)] = sub
                    return True
            return False
        data = self.reqs[(ci, ri, si)]
        if data.request.all_devices and not data.all_devices:
            return False
        if di >= data.count:
            return self._one(ci, ri + 1, 0, 0, False, (0, 0, 0))
        if data.count - di > ALLOCATION_RESULTS_MAX - len(self.results[ci]):
            return False
        if data.all_devices is not None:
            device_id, device, pool = data.all_devices[di]
            if not self.place(ci, data, device_id, device, pool, must=True):
                return False
            if self._one(ci, ri, si, di + 1, in_sub, (0, 0, 0)):
                return True
            self._undo_last()
            return False
        request = data.request
        if data.count - di > 1 and self._too_few_left(ci, data, start, data.count - di):
            return False
        for pi in range(start[0], len(self.pools)):
            pool = self.pools[pi]
            if pool.incomplete or pool.invalid:
                continue
            first_slice = start[1] if pi == start[0] else 0
            for sli in range(first_slice, len(pool.slices)):
                slice_ = pool.slices[sli]
                first_device = start[2] if (pi, sli) == start[:2] else 0
                for dvi in range(first_device, len(slice_.devices)):
                    device = slice_.devices[dvi]
                    device_id = DeviceId(pool.driver, pool.name, device.name)
                    if request.admin_access:
                        if ci in self.allocating.get(device_id, ()):
                            continue
                    elif self.in_use(device_id):
                        continue
                    if self.allowed is not None and not self.allowed(ci, request, device_id):
                        continue
                    per_device = slice_.per_device_node_selection
                    if not self.selectable(claim, data, pool, per_device, device):
                        continue
                    if not self.capacity_fits(request, device_id, device):
                        continue
                    if not self.place(ci, data, device_id, device, pool, must=False):
                        continue
                    if self._one(ci, ri, si, di + 1, in_sub, (pi, sli, dvi + 1)):
                        return True
                    self._undo_last()
        return False
