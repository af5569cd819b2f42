"""Everything an allocation attempt reads: slices, classes, nodes, and cached selector results.

Selector results are pure functions of (expression, device), so they are kept
for the whole run, not per attempt as the scheduler keeps them; the outcome is
the same, the work is done once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_driver.allocation.model import Device, DeviceClass, Node, Slice
from dra_driver.allocation.pools import Pool, SliceIndex, gather_pools
from dra_driver.cel import CelCompileError, CelError, CelRuntimeError, SelectorEvaluator, cel_device


class AllocationFailed(Exception):
    """Fatal for the scheduling attempt (the scheduler's Filter error), not "does not fit"."""


@dataclass(frozen=True)
class SelectorFailure:
    """Why a selector could not be evaluated on a device (for explain)."""

    owner: str
    index: int
    expression: str
    error: CelError


class Inventory:
    def __init__(
        self,
        slices: Iterable[Slice],
        classes: Mapping[str, DeviceClass],
        nodes: Iterable[Node],
        evaluator: SelectorEvaluator,
    ) -> None:
        self.slices = list(slices)
        self._index = SliceIndex(self.slices)
        self.classes = dict(classes)
        self.nodes = sorted(nodes, key=lambda n: n.name)
        self.evaluator = evaluator
        self._pools: dict[str, list[Pool]] = {}
        self._results: dict[tuple[str, int], bool | CelError] = {}

    def pools(self, node: Node) -> list[Pool]:
        pools = self._pools.get(node.name)
        if pools is None:
            pools = self._pools[node.name] = gather_pools(node, self._index)
        return pools

    def evaluate(self, expression: str, driver: str, device: Device) -> bool | CelError:
        key = (expression, id(device))
        result = self._results.get(key)
        if result is None:
            try:
                result = self.evaluator.matches(
                    expression, id(device), lambda: cel_device(driver, device.raw)
                )
            except (CelCompileError, CelRuntimeError) as err:
                result = err
            self._results[key] = result
        return result

    def known(self, expressions: tuple[str, ...], device: Device) -> bool | None:
        """All selectors already evaluated true (True), one false (False), else None."""
        for expression in expressions:
            result = self._results.get((expression, id(device)))
            if result is None:
                return None
            if result is not True:
                return False
        return True

    def selectors_match(
        self, owner: str, expressions: tuple[str, ...], driver: str, pool: str, device: Device
    ) -> bool:
        """All selectors true; raises AllocationFailed with the scheduler's wording on error."""
        for i, expression in enumerate(expressions):
            result = self.evaluate(expression, driver, device)
            if isinstance(result, CelCompileError):
                raise AllocationFailed(f"{owner}: selector #{i}: CEL compile error: {result}")
            if isinstance(result, CelError):
                raise AllocationFailed(
                    f"{owner}: selector #{i} on device {driver}/{pool}/{device.name}: "
                    f"CEL runtime error: {result}"
                )
            if not result:
                return False
        return True

    def first_failing_selector(
        self, owner: str, expressions: tuple[str, ...], driver: str, device: Device
    ) -> tuple[int, bool | CelError] | None:
        """The first selector that is false or errors, with its result (None: all true)."""
        for i, expression in enumerate(expressions):
            result = self.evaluate(expression, driver, device)
            if result is not True:
                return i, result
        return None
